"""Fused K-means block kernels: distances + argmin + partial sums in one pass over a block.

Blocks are feature-major (``blk.T`` is a C-contiguous ``(d, n)`` array), so the inner loops walk
consecutive rows of one feature: SIMD lanes on CPU (numba), threads on GPU (CuPy).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from gdask.gdataset._blocks import array_module

_TILE = 128


@njit(nogil=True, fastmath=True, cache=True)
def _lloyd_numba(xt, centers, sums, counts, labels, want_labels):  # pragma: no cover - compiled
    d, n = xt.shape
    k = centers.shape[0]
    c2 = np.empty((k, d), xt.dtype)
    cn = np.empty(k, xt.dtype)
    for c in range(k):
        s = 0.0
        for j in range(d):
            c2[c, j] = -2.0 * centers[c, j]
            s += centers[c, j] * centers[c, j]
        cn[c] = s
    dist = np.empty((k, _TILE), xt.dtype)
    lab = np.empty(_TILE, np.int64)
    mind = np.empty(_TILE, xt.dtype)
    xn = np.empty(_TILE, xt.dtype)
    inertia = 0.0
    for i0 in range(0, n, _TILE):
        m = min(_TILE, n - i0)
        for c in range(k):
            dr = dist[c]
            v = cn[c]
            for i in range(m):
                dr[i] = v
        j = 0
        while j + 4 <= d:
            x0 = xt[j, i0:i0 + m]
            x1 = xt[j + 1, i0:i0 + m]
            x2 = xt[j + 2, i0:i0 + m]
            x3 = xt[j + 3, i0:i0 + m]
            for c in range(k):
                w0 = c2[c, j]
                w1 = c2[c, j + 1]
                w2 = c2[c, j + 2]
                w3 = c2[c, j + 3]
                dr = dist[c]
                for i in range(m):
                    dr[i] += w0 * x0[i] + w1 * x1[i] + w2 * x2[i] + w3 * x3[i]
            j += 4
        while j < d:
            x0 = xt[j, i0:i0 + m]
            for c in range(k):
                w0 = c2[c, j]
                dr = dist[c]
                for i in range(m):
                    dr[i] += w0 * x0[i]
            j += 1
        for i in range(m):
            best = 0
            bd = dist[0, i]
            for c in range(1, k):
                if dist[c, i] < bd:
                    bd = dist[c, i]
                    best = c
            lab[i] = best
            mind[i] = bd
            counts[best] += 1.0
            if want_labels:
                labels[i0 + i] = best
        # ||x||^2 per row (vectorised over rows), so inertia = ||x||^2 + min(||c||^2 - 2 x.c)
        for i in range(m):
            xn[i] = 0.0
        for j in range(d):
            xr = xt[j, i0:i0 + m]
            for i in range(m):
                xn[i] += xr[i] * xr[i]
        # row-major scatter: consecutive adds hit different features, so no dependency chain
        for i in range(m):
            srow = sums[lab[i]]
            for j in range(d):
                srow[j] += xt[j, i0 + i]
            inertia += max(xn[i] + mind[i], 0.0)
    return inertia


def _is_cupy(x) -> bool:
    return array_module(x) is not np


def _cupy_assign(blk, centers):
    import cupy as cp

    c = centers.astype(blk.dtype, copy=False)
    d2 = (c * c).sum(axis=1)[None, :] - 2.0 * (blk @ c.T)
    labels = d2.argmin(axis=1)
    diff = blk - c[labels]
    return labels, (diff * diff).sum(axis=1, dtype=cp.float64)


def lloyd_partial(blk, centers):
    """One block's Lloyd statistics: ``(sums (k, d) float64, counts (k,) float64, inertia)``."""
    k, d = centers.shape
    if _is_cupy(blk):
        import cupy as cp

        labels, mind = _cupy_assign(blk, centers)
        sums = cp.zeros((k, d), cp.float64)
        cp.add.at(sums, labels, blk.astype(cp.float64))
        counts = cp.bincount(labels, minlength=k).astype(cp.float64)
        return sums, counts, float(mind.sum())
    sums = np.zeros((k, d), np.float64)
    counts = np.zeros(k, np.float64)
    c = np.ascontiguousarray(centers, dtype=blk.dtype)
    inertia = _lloyd_numba(blk.T, c, sums, counts, np.empty(0, np.int64), False)
    return sums, counts, inertia


def lloyd_combine(parts):
    sums, counts, inertia = parts[0]
    for s, c, i in parts[1:]:
        sums = sums + s
        counts = counts + c
        inertia = inertia + i
    return sums, counts, inertia


def assign(blk, centers):
    """Labels (int32) and squared distance to the nearest center (float64) of one block's rows."""
    if _is_cupy(blk):
        labels, mind = _cupy_assign(blk, centers)
        return labels.astype("int32"), mind
    n = blk.shape[0]
    k, d = centers.shape
    c = np.ascontiguousarray(centers, dtype=blk.dtype)
    labels = np.empty(n, np.int64)
    _lloyd_numba(blk.T, c, np.zeros((k, d)), np.zeros(k), labels, True)
    diff = blk - c[labels]
    return labels.astype(np.int32), np.einsum("ij,ij->i", diff, diff, dtype=np.float64)


def labels_block(blk, centers):
    return assign(blk, centers)[0]


def min_sqdist(blk, centers):
    return assign(blk, centers)[1]
