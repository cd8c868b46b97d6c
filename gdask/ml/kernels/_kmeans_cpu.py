"""K-means on NumPy blocks: fused numba CPU kernels, one pass over a block each.

* :func:`lloyd_partial`: nearest center, (weighted) per-cluster sums and counts, inertia and the rows
  farthest from their centers (:func:`_lloyd_stats`).
* :func:`assign`: labels and the exact squared distance to the nearest center (:func:`_assign_rows`).

Both share the tiled distance loop of :mod:`gdask.ml.kernels._cpu_common`. Weights are optional
arguments: numba compiles the unweighted kernel for ``w=None`` (the weight branches are pruned).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from gdask.ml.kernels._common import N_FARTHEST
from gdask.ml.kernels._cpu_common import (
    FASTMATH,
    TILE,
    acc_to_sums,
    exact_sqdist,
    expanded_error,
    keep_farthest,
    prepare_centers,
    row_norms,
    smallest,
    tile_add_rows,
    tile_argmin,
    tile_distances,
)

__all__ = ["assign", "lloyd_partial"]


@njit(nogil=True, fastmath=FASTMATH, cache=True)
def _lloyd_stats(xt, w, centers, norms, sums, counts, topv, topi, topl):  # pragma: no cover - compiled
    """Set ``sums`` (zeros on entry) and add to ``counts`` the block's rows per nearest center; returns the inertia
    (from the expanded distances and ``norms``, |x|^2 per row in float64) and keeps the ``q`` rows
    farthest from their centers in ``topv`` / ``topi`` / ``topl``, ranked by their exact distances:
    a row whose expanded distance, widened by its rounding error, beats the nearest kept row gets its
    exact distance computed (the others cannot beat it)."""
    d, n = xt.shape
    k = centers.shape[0]
    c2, cn, cmax = prepare_centers(centers, xt.dtype)
    marg = expanded_error(xt)
    cmax2 = cmax * cmax
    dist = np.empty((k, TILE), xt.dtype)
    acc = np.zeros((d, k), np.float64)  # the sums, feature-major (tile_add_rows)
    lab = np.empty(TILE, np.int32)
    mind = np.empty(TILE, xt.dtype)
    di = np.empty(TILE, np.float64)  # the tile's squared distances (expanded), then their upper bounds
    thr = smallest(topv)
    inertia = 0.0
    for i0 in range(0, n, TILE):
        m = min(TILE, n - i0)
        tile_distances(xt, i0, m, c2, cn, dist)
        tile_argmin(dist, m, mind, lab)
        tile_add_rows(xt, i0, m, w, lab, acc, counts)
        # the inertia and the farthest rows' screen, vectorised over the tile's rows
        for i in range(m):
            di[i] = max(norms[i0 + i] + mind[i], 0.0)
        if w is None:
            for i in range(m):
                inertia += di[i]
        else:
            for i in range(m):
                inertia += w[i0 + i] * di[i]
        top = -np.inf
        for i in range(m):
            di[i] += marg * (norms[i0 + i] + cmax2)
            top = max(top, di[i])
        if top <= thr:  # no row of the tile may be among the q farthest
            continue
        for i in range(m):
            if di[i] > thr:  # may be among the q farthest (empty-cluster relocation)
                li = lab[i]
                ex = exact_sqdist(xt, i0 + i, centers[li])
                if ex > thr:
                    thr = keep_farthest(ex, i0 + i, li, topv, topi, topl)
    acc_to_sums(acc, sums)
    return inertia


@njit(nogil=True, fastmath=FASTMATH, cache=True)
def _assign_rows(xt, centers, labels, rowd):  # pragma: no cover - compiled
    """Labels and the exact squared distance (no cancellation) of each row to its nearest center
    (row by row: a feature-major pass gathering each row's center coordinate was slower)."""
    d, n = xt.shape
    k = centers.shape[0]
    c2, cn, _ = prepare_centers(centers, xt.dtype)
    dist = np.empty((k, TILE), xt.dtype)
    lab = np.empty(TILE, np.int32)
    mind = np.empty(TILE, xt.dtype)
    for i0 in range(0, n, TILE):
        m = min(TILE, n - i0)
        tile_distances(xt, i0, m, c2, cn, dist)
        tile_argmin(dist, m, mind, lab)
        for i in range(m):
            li = lab[i]
            labels[i0 + i] = li
            rowd[i0 + i] = exact_sqdist(xt, i0 + i, centers[li])


def lloyd_partial(blk: np.ndarray, centers: np.ndarray, w: np.ndarray | None = None) -> dict:
    """One block's Lloyd statistics (see :func:`gdask.ml.kernels.lloyd_partial`)."""
    k, d = centers.shape
    q = max(1, min(N_FARTHEST, blk.shape[0]))  # one slot at least: the kernel reads topv[0]
    sums = np.zeros((k, d), np.float64)
    counts = np.zeros(k, np.float64)
    c = np.ascontiguousarray(centers, dtype=blk.dtype)
    topv = np.full(q, -1.0)
    topi = np.zeros(q, np.int64)
    topl = np.zeros(q, np.int64)
    wv = None if w is None else np.ascontiguousarray(w, dtype=np.float64)
    inertia = _lloyd_stats(blk.T, wv, c, row_norms(blk), sums, counts, topv, topi, topl)
    keep = topv >= 0
    idx = topi[keep]
    return {"sums": sums, "counts": counts, "inertia": inertia, "far_d": topv[keep], "far_label": topl[keep],
            "far_rows": np.asarray(blk[idx]), "far_w": np.ones(idx.size) if wv is None else wv[idx]}


def assign(blk: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Labels (int32) and exact squared distance to the nearest center (float64) of one block's rows."""
    c = np.ascontiguousarray(centers, dtype=blk.dtype)
    labels = np.empty(blk.shape[0], np.int32)
    mind = np.empty(blk.shape[0], np.float64)
    _assign_rows(blk.T, c, labels, mind)
    return labels, mind
