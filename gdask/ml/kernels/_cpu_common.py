"""numba helpers the CPU K-means kernels share (``_kmeans_cpu``, ``_hamerly_cpu``), inlined into each
kernel at numba's IR level, and the per-block row norms.

Blocks are feature-major (``blk.T`` is a C-contiguous ``(d, n)`` array): the kernels walk a tile of
:data:`TILE` consecutive rows one feature at a time, so the inner loops are SIMD loops over rows.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
from numba import njit

from gdask.devices import worker_state

#: rows per tile of the tiled kernels
TILE = 128

#: the kernels' fast-math flags: reassociation (vectorised sums) and contraction (FMA), but no
#: 'nnan' / 'ninf': with them LLVM may rewrite ``v < m`` as ``not v >= m``, true for NaN, and a row
#: with NaN would take the last center instead of the first (scikit-learn's and the CUDA kernels')
FASTMATH = {"reassoc", "contract", "arcp", "nsz", "afn"}

#: the worker state space of the row norms of the blocks a worker holds
NORMS_SPACE = "kmeans-row-norms"
_norms_lock = threading.Lock()


@njit(inline="always")
def prepare_centers(centers, dtype):  # pragma: no cover - compiled
    """``-2 c`` and ``|c|^2`` per center in ``dtype``, and the largest ``|c|``."""
    k, d = centers.shape
    c2 = np.empty((k, d), dtype)
    cn = np.empty(k, dtype)
    cmax = 0.0
    for c in range(k):
        s = 0.0
        for j in range(d):
            c2[c, j] = -2.0 * centers[c, j]
            s += centers[c, j] * centers[c, j]
        cn[c] = s
        cmax = max(cmax, np.sqrt(s))
    return c2, cn, cmax


@njit(inline="always")
def tile_distances(xt, i0, m, c2, cn, dist):  # pragma: no cover - compiled
    """``dist[c, :m] = |c|^2 - 2 x.c`` for the tile's rows ``i0 .. i0 + m``, register-blocked: 4
    features x 2 centers per pass over the tile, so each loaded x vector feeds 8 FMAs and the 8
    weights stay in registers."""
    d = xt.shape[0]
    k = c2.shape[0]
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
        c = 0
        while c + 2 <= k:
            a0, a1, a2, a3 = c2[c, j], c2[c, j + 1], c2[c, j + 2], c2[c, j + 3]
            b0, b1, b2, b3 = c2[c + 1, j], c2[c + 1, j + 1], c2[c + 1, j + 2], c2[c + 1, j + 3]
            da = dist[c]
            db = dist[c + 1]
            for i in range(m):
                u0, u1, u2, u3 = x0[i], x1[i], x2[i], x3[i]
                da[i] += a0 * u0 + a1 * u1 + a2 * u2 + a3 * u3
                db[i] += b0 * u0 + b1 * u1 + b2 * u2 + b3 * u3
            c += 2
        if c < k:
            a0, a1, a2, a3 = c2[c, j], c2[c, j + 1], c2[c, j + 2], c2[c, j + 3]
            da = dist[c]
            for i in range(m):
                da[i] += a0 * x0[i] + a1 * x1[i] + a2 * x2[i] + a3 * x3[i]
        j += 4
    while j < d:
        x0 = xt[j, i0:i0 + m]
        for c in range(k):
            w0 = c2[c, j]
            dr = dist[c]
            for i in range(m):
                dr[i] += w0 * x0[i]
        j += 1


@njit(inline="always")
def tile_argmin(dist, m, mind, lab):  # pragma: no cover - compiled
    """Nearest center of each of the tile's rows, vectorised over rows (selects, no branches); ties
    keep the lowest index. ``lab`` is int32 (one 8-lane vector per 8 float32 rows: int64 labels
    halve the lanes and LLVM then leaves the loop scalar), and two centers per pass over the tile
    halve the loads and stores of ``mind`` / ``lab``."""
    k = dist.shape[0]
    d0 = dist[0]
    for i in range(m):
        mind[i] = d0[i]
        lab[i] = 0
    c = 1
    while c + 2 <= k:
        da = dist[c]
        db = dist[c + 1]
        ca = np.int32(c)
        cb = np.int32(c + 1)
        for i in range(m):
            mi = mind[i]
            li = lab[i]
            va = da[i]
            li = ca if va < mi else li
            mi = va if va < mi else mi
            vb = db[i]
            li = cb if vb < mi else li
            mi = vb if vb < mi else mi
            mind[i] = mi
            lab[i] = li
        c += 2
    if c < k:
        da = dist[c]
        ca = np.int32(c)
        for i in range(m):
            va = da[i]
            mi = mind[i]
            lab[i] = ca if va < mi else lab[i]
            mind[i] = va if va < mi else mi


@njit(inline="always")
def tile_argmin2(dist, m, mind, mind2, lab):  # pragma: no cover - compiled
    """:func:`tile_argmin` and the second smallest value of each row (int32 ``lab``, two centers per
    pass over the tile, as :func:`tile_argmin`)."""
    k = dist.shape[0]
    d0 = dist[0]
    for i in range(m):
        mind[i] = d0[i]
        lab[i] = 0
        mind2[i] = np.inf
    c = 1
    while c + 2 <= k:
        da = dist[c]
        db = dist[c + 1]
        ca = np.int32(c)
        cb = np.int32(c + 1)
        for i in range(m):
            mi = mind[i]
            m2 = mind2[i]
            li = lab[i]
            va = da[i]
            m2 = min(m2, max(va, mi))  # the new second smallest, without branches
            li = ca if va < mi else li
            mi = min(va, mi)
            vb = db[i]
            m2 = min(m2, max(vb, mi))
            li = cb if vb < mi else li
            mi = min(vb, mi)
            mind[i] = mi
            mind2[i] = m2
            lab[i] = li
        c += 2
    if c < k:
        dr = dist[c]
        cc = np.int32(c)
        for i in range(m):
            v = dr[i]
            mi = mind[i]
            mind2[i] = min(mind2[i], max(v, mi))
            mind[i] = min(v, mi)
            lab[i] = cc if v < mi else lab[i]


@njit(inline="always")
def tile_add_rows(xt, i0, m, w, lab, acc, counts):  # pragma: no cover - compiled
    """Add the tile's rows ``i0 .. i0 + m`` (times ``w[i]`` when weighted) to ``acc[:, lab[i]]``,
    ``acc`` the per-cluster sums feature-major (``(d, k)`` float64), and their weights to ``counts``.

    Four features per pass over the tile: the reads are contiguous runs of a feature row (a
    row-major scatter reads each row across ``d`` feature rows), and the four adds of a row go to
    four independent accumulators. Each ``acc[j, c]`` still receives its rows in row order: the same
    sums, bit for bit, as adding row after row."""
    d = xt.shape[0]
    j = 0
    while j + 4 <= d:
        x0 = xt[j, i0:i0 + m]
        x1 = xt[j + 1, i0:i0 + m]
        x2 = xt[j + 2, i0:i0 + m]
        x3 = xt[j + 3, i0:i0 + m]
        a0 = acc[j]
        a1 = acc[j + 1]
        a2 = acc[j + 2]
        a3 = acc[j + 3]
        for i in range(m):
            li = lab[i]
            if w is None:
                a0[li] += x0[i]
                a1[li] += x1[i]
                a2[li] += x2[i]
                a3[li] += x3[i]
            else:
                wi = w[i0 + i]
                a0[li] += wi * x0[i]
                a1[li] += wi * x1[i]
                a2[li] += wi * x2[i]
                a3[li] += wi * x3[i]
        j += 4
    while j < d:
        x0 = xt[j, i0:i0 + m]
        a0 = acc[j]
        for i in range(m):
            if w is None:
                a0[lab[i]] += x0[i]
            else:
                a0[lab[i]] += w[i0 + i] * x0[i]
        j += 1
    for i in range(m):
        if w is None:
            counts[lab[i]] += 1.0
        else:
            counts[lab[i]] += w[i0 + i]


@njit(inline="always")
def acc_to_sums(acc, sums):  # pragma: no cover - compiled
    """Write :func:`tile_add_rows`' feature-major ``acc`` into the ``(k, d)`` ``sums``."""
    d, k = acc.shape
    for c in range(k):
        for j in range(d):
            sums[c, j] = acc[j, c]


@njit(inline="always")
def exact_sqdist(xt, i, crow):  # pragma: no cover - compiled
    """``|x_i - c|^2`` without cancellation: differences in the block's dtype, summed in float64."""
    di = 0.0
    for j in range(xt.shape[0]):
        v = xt[j, i] - crow[j]
        di += v * v
    return di


@njit(inline="always")
def expanded_error(xt):  # pragma: no cover - compiled
    """``m`` such that the expanded distance ``|x|^2 + |c|^2 - 2 x.c`` (the products in the block's
    dtype) is within ``m (|x|^2 + |c|^2)`` of the exact one: ``2 (d + 8) eps``."""
    return 2.0 * (xt.shape[0] + 8) * (1.1920929e-07 if xt.itemsize == 4 else 2.220446049250313e-16)


@njit(inline="always")
def smallest(v):  # pragma: no cover - compiled
    out = v[0]
    for t in range(1, v.shape[0]):
        out = min(out, v[t])
    return out


@njit(inline="always")
def keep_farthest(di, row, label, topv, topi, topl):  # pragma: no cover - compiled
    """Put row ``row`` (squared distance ``di`` to its center ``label``) in place of the nearest of
    the kept rows; returns the new threshold (the nearest kept distance)."""
    t_min = 0
    for t in range(1, topv.shape[0]):
        if topv[t] < topv[t_min]:
            t_min = t
    topv[t_min] = di
    topi[t_min] = row
    topl[t_min] = label
    return smallest(topv)


@njit(cache=True)
def _one(x):  # pragma: no cover - compiled
    return x + 1


def start_numba() -> None:
    """Start numba's CPU target in this process: its first kernel call, whichever it is, first imports
    ~100 of numba's own modules (~0.25 s here); this tiny kernel takes that cost (and loads from numba's
    cache in ~3 ms after it, compiled once)."""
    _one(1)


@njit(nogil=True, cache=True)
def _row_norms_numba(xt, out):  # pragma: no cover - compiled
    d, n = xt.shape
    for i in range(n):
        out[i] = 0.0
    for j in range(d):  # vectorised over rows, one feature at a time
        xr = xt[j]
        for i in range(n):
            v = np.float64(xr[i])
            out[i] += v * v


def row_norms(blk: np.ndarray) -> np.ndarray:
    """``|x|^2`` of each row of a NumPy block, in float64, computed once per block and kept while
    the block lives (8 bytes per row), in the worker's state (:func:`gdask.devices.worker_state`):
    every full pass of a fit needs them and they never change (blocks are immutable). Keyed by the
    block object: a fresh view of the same data computes them again."""
    key = id(blk)
    cache = worker_state(NORMS_SPACE)
    hit = cache.get(key)
    if hit is not None and hit[0]() is blk:
        return hit[1]
    out = np.empty(blk.shape[0], np.float64)
    _row_norms_numba(blk.T, out)
    try:
        ref = weakref.ref(blk, lambda r, cache=cache, key=key: _forget_norms(cache, key, r))
    except TypeError:  # not weak-referenceable: nothing to key a cache on
        return out
    with _norms_lock:
        cache[key] = (ref, out)
    return out


def _forget_norms(cache: dict, key: int, ref: weakref.ref) -> None:
    with _norms_lock:
        if key in cache and cache[key][0] is ref:
            del cache[key]
