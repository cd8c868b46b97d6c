"""K-means on NumPy blocks: fused numba CPU kernels, one pass over a block each.

* :func:`lloyd_partial`: nearest center, (weighted) per-cluster sums and counts, inertia and the rows
  farthest from their centers (:func:`_lloyd_stats`).
* :func:`assign`: labels and the exact squared distance to the nearest center (:func:`_assign_rows`).
* :func:`nearest_update`: k-means||'s nearest candidate of each row brought to a new group of
  candidates (:func:`_nearer_rows`).

They share the tiled distance loop of :mod:`gdask.ml.kernels._cpu_common`. Weights are optional
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

__all__ = ["assign", "lloyd_partial", "nearest_update"]


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


@njit(nogil=True, fastmath=FASTMATH, cache=True)
def _nearer_rows(xt, norms, cands, seen, mind, label):  # pragma: no cover - compiled
    """k-means||'s nearest candidate brought to the candidates from ``seen`` on, in place: each row's
    nearest new one by the tiled expanded distances (ties: the first), its exact distance, and the
    row takes it when strictly nearer than its current one (``mind`` / ``label``), as
    :func:`_assign_rows` then a comparison would. A row whose nearest new candidate, by its expanded
    distance less that form's rounding error, is already farther than its current one skips the
    exact distance (late in the init most rows keep their candidate)."""
    d, n = xt.shape
    new = cands[seen:]
    k = new.shape[0]
    c2, cn, cmax = prepare_centers(new, xt.dtype)
    # the expanded form's error, and the exact distance's own (block-dtype differences: ~2 eps of it,
    # at most 2 (|x|^2 + |c|^2)), are within twice the expanded one
    emarg = 2.0 * expanded_error(xt)
    cmax2 = cmax * cmax
    dist = np.empty((k, TILE), xt.dtype)
    lab = np.empty(TILE, np.int32)
    m1 = np.empty(TILE, xt.dtype)
    low = np.empty(TILE, np.float64)
    for i0 in range(0, n, TILE):
        m = min(TILE, n - i0)
        tile_distances(xt, i0, m, c2, cn, dist)
        tile_argmin(dist, m, m1, lab)
        for i in range(m):  # the least the nearest new candidate's exact distance can be (vectorised)
            xn = norms[i0 + i]
            low[i] = xn + m1[i] - emarg * (xn + cmax2)
        for i in range(m):
            r = i0 + i
            if low[i] <= mind[r]:
                t = lab[i]
                ex = exact_sqdist(xt, r, new[t])
                if ex < mind[r]:
                    mind[r] = ex
                    label[r] = seen + t


def nearest_update(blk: np.ndarray, cands: np.ndarray, seen: int, mind: np.ndarray,
                   label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's nearest candidate among ``cands[:seen]`` (``label``, int32, and its exact squared
    distance ``mind``, float64) brought to all of ``cands`` (:func:`_nearer_rows`: the same bits as
    :func:`assign` on the new candidates followed by taking the strictly nearer, without the
    temporaries). Updates ``mind`` and ``label`` in place and returns them; the first candidates
    are the op's :func:`assign` (:func:`gdask.ml.kernels.nearest_update`)."""
    _nearer_rows(blk.T, row_norms(blk), np.ascontiguousarray(cands, dtype=blk.dtype), int(seen), mind, label)
    return mind, label


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
