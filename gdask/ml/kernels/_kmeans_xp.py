"""K-means written once against the array API standard: the reference the fast kernels are tested
against, and what blocks of other namespaces run (``array_api_strict`` on ``emulated-strict``
devices; CuPy where the numba.cuda kernels cannot run)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gdask.devices import array_namespace, asarray_like, astype, to_numpy
from gdask.ml.kernels._common import N_FARTHEST, XP_CHUNK, device_of

__all__ = ["assign", "cluster_sums", "expanded_distances", "lloyd_partial"]


def expanded_distances(x: Any, c: Any, with_norms: bool = False) -> Any:
    """``|c|^2 - 2 x.c`` (plus ``|x|^2`` when ``with_norms``) for every row and center, in the dtype of
    ``x`` and ``c``, with coincident centers given bit-identical columns: a matrix product may round
    equal columns differently (BLAS kernels treat edge columns apart), which would scatter rows among
    centers that are really one and keep them from being empty. Distances are computed for the
    distinct centers and spread to their copies."""
    xp = array_namespace(x)
    host = to_numpy(c)
    _, first, inverse = np.unique(host, axis=0, return_index=True, return_inverse=True)
    if first.shape[0] < host.shape[0]:
        cu = xp.take(c, asarray_like(first.astype(np.int64), x), axis=0)
        return xp.take(expanded_distances(x, cu, with_norms), asarray_like(inverse.reshape(-1).astype(np.int64), x),
                       axis=1)
    if with_norms:
        return xp.sum(x * x, axis=1)[:, None] - 2.0 * (x @ c.T) + xp.sum(c * c, axis=1)[None, :]
    return xp.sum(c * c, axis=1)[None, :] - 2 * (x @ c.T)


def assign(blk: Any, centers: Any) -> tuple[Any, Any]:
    """Labels from the expanded distances in the block's dtype (ties to the lower center), the
    squared distance to the chosen center summed in float64."""
    xp = array_namespace(blk)
    c = astype(centers, blk.dtype)
    d2 = expanded_distances(blk, c)
    labels = xp.argmin(d2, axis=1)
    diff = blk - xp.take(c, labels, axis=0)
    return xp.astype(labels, xp.int32), xp.sum(diff * diff, axis=1, dtype=xp.float64)


def cluster_sums(labels: Any, rows: Any, w: Any, k: int) -> tuple[Any, Any]:
    """Per-cluster sums ``(k, d)`` of the rows (times ``w``) and per-cluster weight ``(k,)``, float64:
    a scatter-add written as one-hot products, in slices of :data:`XP_CHUNK` rows (the standard has
    no scatter-add; ``array_api_extra.at(x)[i].add(v)`` adds once per distinct index)."""
    import array_api_extra as xpx

    xp = array_namespace(rows)
    n, d = rows.shape
    sums = xp.zeros((k, d), dtype=xp.float64, device=device_of(rows))
    counts = xp.zeros((k,), dtype=xp.float64, device=device_of(rows))
    for s in range(0, n, XP_CHUNK):
        e = min(n, s + XP_CHUNK)
        oh = xpx.one_hot(labels[s:e], k, dtype=xp.float64, xp=xp)
        if w is not None:
            oh = oh * w[s:e, None]
        sums = sums + oh.T @ xp.astype(rows[s:e, ...], xp.float64)
        counts = counts + xp.sum(oh, axis=0)
    return sums, counts


def lloyd_partial(blk: Any, centers: Any, w: Any = None) -> dict:
    """One block's Lloyd statistics as device arrays (the farthest rows in the order of their
    distance, larger first, then lower row index)."""
    xp = array_namespace(blk)
    k = centers.shape[0]
    n = blk.shape[0]
    labels, mind = assign(blk, centers)
    ww = None if w is None else xp.astype(w, xp.float64)
    sums, counts = cluster_sums(labels, blk, ww, k)
    inertia = xp.sum(mind) if ww is None else xp.sum(mind * ww)
    idx = xp.argsort(mind, descending=True, stable=True)[:min(N_FARTHEST, n)]
    far_w = xp.ones(idx.shape, dtype=xp.float64, device=device_of(blk)) if ww is None else xp.take(ww, idx)
    return {"sums": sums, "counts": counts, "inertia": inertia, "far_d": xp.take(mind, idx),
            "far_label": xp.astype(xp.take(labels, idx), xp.int64), "far_rows": xp.take(blk, idx, axis=0),
            "far_w": far_w}
