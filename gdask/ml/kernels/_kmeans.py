"""K-means block ops: one pass over a block each, dispatched to its backend
(:func:`gdask.ml.kernels._dispatch.kernels_for`), and the combination of their partials.

Small operands (the centers, weights) come on the blocks' device (the block task moved them there).
Per-block results are device arrays (NumPy on emulated devices); the block task moves them to the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gdask.devices import array_namespace
from gdask.ml.kernels import _dispatch
from gdask.ml.kernels._common import FAR, N_FARTHEST

__all__ = ["assign", "labels_block", "lloyd_combine", "lloyd_partial", "min_sqdist", "nearest_update", "next_centers"]


def lloyd_partial(blk: Any, centers: Any, w: Any = None) -> dict:
    """One block's Lloyd statistics, a dict: ``sums (k, d)`` and ``counts (k,)`` (float64, weighted
    by the rows' ``w`` if given), ``inertia``, and the block's rows farthest from their centers
    (``far_d``, ``far_label``, ``far_rows``, ``far_w``), which empty clusters take as scikit-learn
    does, without another pass over the data. Ties between equally far rows go to the lower row."""
    return _dispatch.kernels_for("kmeans", blk, clusters=centers.shape[0]).lloyd_partial(blk, centers, w)


def lloyd_combine(parts: list[dict]) -> dict:
    """Add Lloyd partials; keep the ``N_FARTHEST`` farthest rows over all of them."""
    out = dict(parts[0])
    for p in parts[1:]:
        out["sums"] = out["sums"] + p["sums"]
        out["counts"] = out["counts"] + p["counts"]
        out["inertia"] = out["inertia"] + p["inertia"]
        for key in ("changed", "bounded", "rebuilt"):  # bounds passes' counts (absent from Lloyd's)
            out[key] = out.get(key, 0) + p.get(key, 0)
        for key in FAR:
            out[key] = np.concatenate([out[key], p[key]])
    if len(out["far_d"]) > N_FARTHEST:
        top = np.argsort(-out["far_d"], kind="stable")[:N_FARTHEST]
        for key in FAR:
            out[key] = out[key][top]
    return out


def assign(blk: Any, centers: Any) -> tuple[Any, Any]:
    """Labels (int32) and exact squared distance to the nearest center (float64) of one block's rows."""
    return _dispatch.kernels_for("kmeans", blk, clusters=centers.shape[0]).assign(blk, centers)


def nearest_update(blk: Any, cands: Any, seen: int, mind: Any = None, label: Any = None) -> tuple[Any, Any]:
    """k-means||'s nearest candidate of each row: ``label`` (int32) and ``mind`` (its squared
    distance, float64) over ``cands[:seen]`` (``None`` when ``seen`` is 0) brought to all of
    ``cands``; a row's candidate changes only for a strictly nearer one. Returns ``(mind, label)``
    (the CPU kernel updates the given arrays in place, and skips the exact distance of rows whose
    nearest new candidate cannot be nearer; other backends assign the new candidates and take the
    nearer)."""
    impl = _dispatch.kernels_for("kmeans", blk, clusters=int(cands.shape[0]) - int(seen))
    if mind is not None and hasattr(impl, "nearest_update"):
        return impl.nearest_update(blk, cands, seen, mind, label)
    new_label, new_mind = impl.assign(blk, cands[seen:, :])
    if mind is None:  # the first candidates: the rows' nearest among them
        return new_mind, new_label
    xp = array_namespace(new_mind)
    nearer = new_mind < mind
    return xp.where(nearer, new_mind, mind), xp.where(nearer, new_label + seen, label)


def labels_block(blk: Any, centers: Any) -> Any:
    return assign(blk, centers)[0]


def min_sqdist(blk: Any, centers: Any) -> Any:
    return assign(blk, centers)[1]


def next_centers(sums: np.ndarray, counts: np.ndarray, centers: np.ndarray,
                 far: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray | None:
    """The centers after one Lloyd pass, as scikit-learn computes them (its
    ``_relocate_empty_clusters_dense`` then ``_average_centers``), in float64.

    Parameters
    ----------
    sums, counts : (k, d), (k,) float64
        Weighted per-cluster sums and weights of the pass (all blocks combined).
    centers : (k, d)
        The centers the pass assigned the rows to (returned unchanged where nothing moved them).
    far : (squared distances, labels, rows, weights)
        Rows farthest from their centers, at least as many as there are empty clusters (or all rows
        there are), with their exact squared distances; equal distances keep their order.

    Returns
    -------
    (k, d) float64, or ``None`` when more clusters are empty than ``far`` has rows and those rows
    are not all at distance 0 (the caller then finds more, e.g. with ``_farthest_rows``).

    Empty clusters (weight 0), in increasing order, take the farthest rows, farthest first: each
    such row leaves its cluster's sum and weight for a cluster of its own. Nothing moves when every
    row sits on its center (scikit-learn: "more clusters than non-duplicate samples"). Then every
    cluster with weight takes the mean of its rows, and a cluster still without weight takes the
    place of the heaviest one (the first of the heaviest) as scikit-learn's loop leaves it: that
    cluster's mean when it comes first, else its (weighted) sum.
    """
    sums = np.array(sums, dtype=np.float64)
    counts = np.array(counts, dtype=np.float64)
    empty = np.flatnonzero(counts == 0)
    if empty.size:
        dists, labels, rows, ws = (np.asarray(a) for a in far)
        if dists.size and float(dists.max()) > 0:
            if empty.size > dists.size:
                return None
            order = np.argsort(-dists, kind="stable")[:empty.size]
            for new_c, j in zip(empty, order):
                old_c = int(labels[j])
                x = ws[j] * rows[j].astype(np.float64)
                sums[old_c] -= x
                counts[old_c] -= ws[j]
                sums[new_c] = x
                counts[new_c] = ws[j]
    out = np.asarray(centers, dtype=np.float64).copy()
    heaviest = int(np.argmax(counts))
    for j in range(counts.shape[0]):
        if counts[j] > 0:
            out[j] = sums[j] / counts[j]
        else:
            out[j] = out[heaviest] if heaviest < j else sums[heaviest]
    return out
