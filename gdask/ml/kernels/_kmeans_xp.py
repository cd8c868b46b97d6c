"""K-means written once against the array API standard: the reference the fast kernels are tested
against, and what blocks of other namespaces run (``array_api_strict`` on ``emulated-strict``
devices; CuPy where the numba.cuda kernels cannot run)."""

from __future__ import annotations

from typing import Any

from gdask.devices import array_namespace, astype
from gdask.ml.kernels._common import N_FARTHEST, XP_CHUNK, device_of

__all__ = ["assign", "cluster_sums", "lloyd_partial"]


def assign(blk: Any, centers: Any) -> tuple[Any, Any]:
    """Labels from the expanded distances in the block's dtype (ties to the lower center), the
    squared distance to the chosen center summed in float64."""
    xp = array_namespace(blk)
    c = astype(centers, blk.dtype)
    d2 = xp.sum(c * c, axis=1)[None, :] - 2 * (blk @ c.T)
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
