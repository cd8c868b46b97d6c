"""Hamerly's bounds written against the array API standard: the reference of the numba and CUDA
kernels, and what blocks of other namespaces run. Distances are float64."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from gdask.devices import array_namespace, asarray_like, to_numpy
from gdask.ml.kernels._common import N_FARTHEST, BlockBounds, center_geometry, device_of
from gdask.ml.kernels._kmeans_xp import cluster_sums

__all__ = ["assigned_sqdist", "expand", "first_pass", "step"]


def first_pass(blk: Any, cf: np.ndarray, w: Any = None) -> BlockBounds:
    """A block's bounds state from a full pass: distances in float64, the lower bound widened by the
    expanded form's rounding error."""
    xp = array_namespace(blk)
    n, d = blk.shape
    k = cf.shape[0]
    c = asarray_like(np.asarray(cf, dtype=np.float64), blk)
    x = xp.astype(blk, xp.float64)
    xn = xp.sum(x * x, axis=1)
    d2 = xn[:, None] - 2.0 * (x @ c.T) + xp.sum(c * c, axis=1)[None, :]
    labels = xp.argmin(d2, axis=1)
    diff = x - xp.take(c, labels, axis=0)
    upper = xp.sqrt(xp.sum(diff * diff, axis=1))
    if k > 1:
        own = labels[:, None] == xp.arange(k, device=device_of(blk))[None, :]
        e = (d + 8) * float(np.finfo(np.float64).eps) * (xp.sqrt(xn) + float(np.sqrt((cf * cf).sum(1).max()))) ** 2
        lower = xp.sqrt(xp.clip(xp.min(xp.where(own, xp.inf, d2), axis=1) - e, min=0.0))
    else:
        lower = xp.full((n,), xp.inf, dtype=xp.float64, device=device_of(blk))
    ww = None if w is None else xp.astype(w, xp.float64)
    sums, counts = cluster_sums(labels, x, ww, k)
    top = xp.argsort(upper, descending=True, stable=True)[:min(N_FARTHEST, n)]
    tu = xp.take(upper, top)
    far = (to_numpy(tu * tu), to_numpy(top), to_numpy(xp.take(labels, top)))  # small: to the host now
    sxx = float(xp.sum(xn) if ww is None else xp.sum(xn * ww))
    return BlockBounds(weakref.ref(blk), c, xp.astype(labels, xp.int32), upper, lower, sums, counts, far, sxx)


def expand(mask: Any, vals: Any, old: Any) -> Any:
    """``old`` with ``vals`` put at the positions where ``mask`` is true, in order (a scatter to the
    increasing positions of a mask, as a gather: the standard's arrays take no integer-array
    assignment)."""
    xp = array_namespace(old)
    m = vals.shape[0]
    if m == 0:
        return old
    pos = xp.cumulative_sum(xp.astype(mask, xp.int64)) - 1
    return xp.where(mask, xp.take(vals, xp.clip(pos, min=0, max=m - 1), axis=0), old)


def step(blk: Any, cf: np.ndarray, st: BlockBounds, w: Any, limit: int | None = None) -> int:
    """One bounds step: returns the rows that changed cluster; the state's labels, bounds, sums and
    counts are replaced by new arrays. Never gives up (``limit`` is ignored)."""
    xp = array_namespace(blk)
    k = cf.shape[0]
    c = asarray_like(np.asarray(cf, dtype=np.float64), blk)
    drift, half, m1, d1, d2, _ = center_geometry(cf, to_numpy(st.centers))
    a = st.labels
    u = st.upper + xp.take(asarray_like(drift, blk), a)
    lo = st.lower - (d1 + (d2 - d1) * xp.astype(a == int(m1), xp.float64))
    z = xp.maximum(lo, xp.take(asarray_like(half, blk), a))
    fail = u > z
    idx = xp.nonzero(fail)[0]
    changed = 0
    if idx.shape[0]:
        x = xp.astype(xp.take(blk, idx, axis=0), xp.float64)
        ai = xp.take(a, idx)
        diff = x - xp.take(c, ai, axis=0)
        ui = xp.sqrt(xp.sum(diff * diff, axis=1))
        u = expand(fail, ui, u)
        far = ui > xp.take(z, idx)
        j = xp.nonzero(far)[0]
        if j.shape[0]:
            mask = expand(fail, far, xp.zeros_like(fail))  # the rows whose cluster is in doubt
            x, ai = xp.take(x, j, axis=0), xp.take(ai, j)
            sq = xp.sum((x[:, None, :] - c[None, :, :]) ** 2, axis=-1)
            dist = xp.sqrt(xp.clip(sq, min=0.0))
            new = xp.argmin(dist, axis=1)
            best = xp.min(dist, axis=1)
            if k > 1:
                own = new[:, None] == xp.arange(k, device=device_of(blk))[None, :]
                second = xp.min(xp.where(own, xp.inf, dist), axis=1)
            else:
                second = xp.full(best.shape, xp.inf, dtype=xp.float64, device=device_of(blk))
            moved = new != ai
            changed = int(xp.sum(xp.astype(moved, xp.int64)))
            if changed:
                ww = xp.ones(j.shape, dtype=xp.float64, device=device_of(blk)) if w is None else \
                    xp.take(xp.take(xp.astype(w, xp.float64), idx), j)
                wm = xp.where(moved, ww, 0.0)
                add_s, add_c = cluster_sums(new, x, wm, k)
                sub_s, sub_c = cluster_sums(ai, x, wm, k)
                st.sums = st.sums + add_s - sub_s
                st.counts = st.counts + add_c - sub_c
            a = expand(mask, xp.astype(new, a.dtype), a)
            u = expand(mask, best, u)
            lo = expand(mask, second, lo)
    st.labels, st.upper, st.lower = a, u, lo
    return changed


def assigned_sqdist(blk: Any, centers: Any, labels: Any) -> Any:
    """``|x_i - c_{label_i}|^2`` per row, float64, on the block's device."""
    xp = array_namespace(blk)
    diff = xp.astype(blk, xp.float64) - xp.take(asarray_like(to_numpy(centers), blk), labels, axis=0)
    return xp.sum(diff * diff, axis=1)
