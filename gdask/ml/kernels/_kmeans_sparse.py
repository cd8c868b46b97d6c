"""K-means on CSR blocks (SciPy on emulated devices, ``cupyx.scipy.sparse`` on CUDA): matrix products,
O(nnz) work and memory per block besides ``(rows, k)`` dense temporaries; never a dense copy of the block.

* Distances: ``|c|^2 - 2 X C^T`` in the block's dtype (``|x|^2`` is the same for every center, so the
  argmin needs none), the nearest center by ``argmin`` (ties to the lower center, as scikit-learn).
* Exact squared distance to the chosen center, in float64, as scikit-learn's sparse kernels compute it:
  ``|c|^2 + sum over the row's stored entries of (x_j - c_j)^2 - c_j^2``.
* Per-cluster sums: ``X^T @ onehot`` (weighted), float64.

The centers and weights come on the block's device (the block task moved them there).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gdask.devices import array_module, sparse_row_ids, sparse_row_sums, sparse_rows, to_numpy, with_data
from gdask.ml.kernels._common import N_FARTHEST

__all__ = ["assign", "distances", "lloyd_partial", "sq_row_norms"]


def _xp(blk: Any) -> Any:
    """NumPy or CuPy: the library of the block's arrays."""
    return array_module(blk.data)


def _centers(blk: Any, centers: Any) -> Any:
    """The centers in the block's dtype, C-contiguous, on its device."""
    xp = _xp(blk)
    return xp.ascontiguousarray(xp.asarray(centers, dtype=blk.dtype))


def _cross(blk: Any, c: Any) -> Any:
    """``X @ c.T`` (rows x centers, the block's dtype), with coincident centers given bit-identical columns
    (equal columns of a product may round differently; rows would then scatter among centers that are one)."""
    xp = _xp(blk)
    first, inverse = _distinct_rows(to_numpy(c))
    if first.shape[0] < c.shape[0]:
        cu = c[xp.asarray(first)]
        return _cross(blk, cu)[:, xp.asarray(inverse)]
    return blk @ xp.ascontiguousarray(c.T)


def _distinct_rows(host: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the first of each distinct row, every row's index among those): by the rows' bytes, linear in
    the centers' size (``np.unique(axis=0)`` is slow for many features)."""
    seen: dict[bytes, int] = {}
    first, inverse = [], []
    for i, row in enumerate(np.ascontiguousarray(host)):
        j = seen.setdefault(row.tobytes(), len(first))
        if j == len(first):
            first.append(i)
        inverse.append(j)
    return np.asarray(first, dtype=np.int64), np.asarray(inverse, dtype=np.int64)


def expanded_distances(blk: Any, c: Any) -> Any:
    """``|c|^2 - 2 x.c`` for every row and center, in the block's dtype."""
    return (c * c).sum(axis=1)[None, :] - 2 * _cross(blk, c)


def exact_sqdist(blk: Any, c: Any, labels: Any) -> Any:
    """Squared distance (float64) of every row to center ``labels[row]``: ``|c|^2`` plus, over the row's
    stored entries, ``(x_j - c_j)^2 - c_j^2``; clipped at 0."""
    xp = _xp(blk)
    c64 = xp.asarray(c, dtype=xp.float64)
    cn = (c64 * c64).sum(axis=1)
    rows = sparse_row_ids(blk)
    cj = c64[labels[rows], blk.indices]
    diff = blk.data.astype(xp.float64) - cj
    d2 = cn[labels] + sparse_row_sums(blk, diff * diff - cj * cj)
    return xp.maximum(d2, 0.0)


def sq_row_norms(blk: Any) -> Any:
    """``|x|^2`` per row, float64."""
    xp = _xp(blk)
    v = blk.data.astype(xp.float64)
    return sparse_row_sums(blk, v * v)


def assign(blk: Any, centers: Any) -> tuple[Any, Any]:
    """Labels (int32) and exact squared distance to the nearest center (float64) of one block's rows."""
    xp = _xp(blk)
    c = _centers(blk, centers)
    labels = xp.argmin(expanded_distances(blk, c), axis=1).astype(xp.int32)
    return labels, exact_sqdist(blk, c, labels)


def distances(blk: Any, centers: Any) -> Any:
    """Euclidean distances of the rows to the centers, ``sqrt(|x|^2 - 2 x.c + |c|^2)`` (clipped at 0),
    dense ``(rows, k)`` in the block's dtype (scikit-learn's ``euclidean_distances``)."""
    xp = _xp(blk)
    c = _centers(blk, centers)
    d2 = expanded_distances(blk, c) + sq_row_norms(blk).astype(blk.dtype)[:, None]
    return xp.sqrt(xp.maximum(d2, 0))


def cluster_sums(blk: Any, labels: Any, w: Any, k: int) -> tuple[Any, Any]:
    """Per-cluster sums ``(k, d)`` of the rows (times ``w``) and weights ``(k,)``, float64: ``X^T @ onehot``
    (the block's values widened to float64 first: an O(nnz) copy, not a dense one)."""
    xp = _xp(blk)
    n = blk.shape[0]
    oh = xp.zeros((n, k), dtype=xp.float64)
    oh[xp.arange(n), labels] = 1.0 if w is None else w
    x64 = blk if blk.dtype == np.float64 else with_data(blk, blk.data.astype(xp.float64))
    sums = xp.ascontiguousarray((x64.T @ oh).T)
    return sums, oh.sum(axis=0)


def lloyd_partial(blk: Any, centers: Any, w: Any = None) -> dict:
    """One block's Lloyd statistics (see :func:`gdask.ml.kernels.lloyd_partial`); the farthest rows come
    dense (at most :data:`N_FARTHEST` of them)."""
    xp = _xp(blk)
    k = centers.shape[0]
    n = blk.shape[0]
    labels, mind = assign(blk, centers)
    ww = None if w is None else xp.asarray(w, dtype=xp.float64)
    sums, counts = cluster_sums(blk, labels, ww, k)
    inertia = float(mind.sum() if ww is None else (mind * ww).sum())
    idx = to_numpy(_farthest(mind, min(N_FARTHEST, n)))
    far_w = np.ones(idx.size) if ww is None else to_numpy(ww)[idx]
    return {"sums": sums, "counts": counts, "inertia": inertia, "far_d": to_numpy(mind)[idx],
            "far_label": to_numpy(labels)[idx].astype(np.int64), "far_rows": sparse_rows(blk, idx),
            "far_w": far_w}


def _farthest(mind: Any, q: int) -> np.ndarray:
    """Indices of the ``q`` largest distances, larger first, equal ones in row order."""
    host = to_numpy(mind)
    return np.argsort(-host, kind="stable")[:q]
