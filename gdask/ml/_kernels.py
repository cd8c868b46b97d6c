"""K-means block kernels: distances + argmin + partial sums in one pass over a block.

One contract, three implementations, chosen per block:

* NumPy blocks (emulated devices): fused numba CPU kernels (:func:`_lloyd_numba`).
* CuPy blocks (CUDA): the numba.cuda kernels of :mod:`gdask.ml._cuda_kernels`, on the worker's
  stream (the array API code below where they cannot run: no numba.cuda, or more clusters than
  their shared memory holds).
* Any other array API array (``array_api_strict`` on ``emulated-strict`` devices): the reference,
  written once against the array API standard (:func:`lloyd_partial_xp`, :func:`assign_xp`), which
  the fast kernels are tested against.

Blocks are feature-major (``blk.T`` is a C-contiguous ``(d, n)`` array), so the inner loops walk
consecutive rows of one feature: SIMD lanes on CPU (numba), threads on GPU. Small operands (the
centers, weights) come on the blocks' device (the block task moved them there). Per-block results are
device arrays (NumPy on emulated devices); the block task moves them to the host.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import numpy as np
from numba import njit

from gdask.devices import array_module, array_namespace, astype, to_numpy, worker_state

logger = logging.getLogger("gdask.ml")

_TILE = 128


@njit(nogil=True, fastmath=True, cache=True)
def _lloyd_numba(xt, w, centers, sums, counts, labels, rowd, want_rows, topv, topi, topl, sec,  # pragma: no cover
                 norms):  # compiled
    # norms: |x|^2 per row in float64 (see row_norms), used unless want_rows
    d, n = xt.shape
    weighted = w.shape[0] > 0
    # bounds mode (Hamerly, gdask.ml._bounds): labels, and in sec[0] / sec[1] an upper bound on the
    # distance to the chosen center / a lower bound on the distance to any other, from the expanded
    # form widened by its worst rounding error, ~(d + 8) eps (|x| + |c|)^2
    want_sec = sec.shape[0] > 0
    marg = (d + 8) * (1.1920929e-07 if xt.itemsize == 4 else 2.220446049250313e-16)
    cmax = 0.0
    q = topv.shape[0]
    thr = topv[0]
    for t in range(1, q):
        thr = min(thr, topv[t])
    k = centers.shape[0]
    c2 = np.empty((k, d), xt.dtype)
    cn = np.empty(k, xt.dtype)
    for c in range(k):
        s = 0.0
        for j in range(d):
            c2[c, j] = -2.0 * centers[c, j]
            s += centers[c, j] * centers[c, j]
        cn[c] = s
        cmax = max(cmax, np.sqrt(s))
    dist = np.empty((k, _TILE), xt.dtype)
    lab = np.empty(_TILE, np.int64)
    mind = np.empty(_TILE, xt.dtype)
    mind2 = np.empty(_TILE if want_sec else 0, xt.dtype)
    xn = np.empty(_TILE, np.float64)  # |x|^2 in float64: exact products, and sum_i w_i |x_i|^2 for the bounds
    inertia = 0.0
    sxx = 0.0
    for i0 in range(0, n, _TILE):
        m = min(_TILE, n - i0)
        for c in range(k):
            dr = dist[c]
            v = cn[c]
            for i in range(m):
                dr[i] = v
        # dist[c] = ||c||^2 - 2 x.c, register-blocked: 4 features x 2 centers per pass over the
        # tile, so each loaded x vector feeds 8 FMAs and the 8 weights stay in registers
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
        # argmin over centers, vectorised over rows (selects, no branches); ties keep the lowest index
        for i in range(m):
            mind[i] = dist[0, i]
            lab[i] = 0
        if want_sec:
            for i in range(m):
                mind2[i] = np.inf
            for c in range(1, k):
                dr = dist[c]
                for i in range(m):
                    v = dr[i]
                    mi = mind[i]
                    mind2[i] = min(mind2[i], max(v, mi))  # the new second smallest, without branches
                    mind[i] = min(v, mi)
                    lab[i] = c if v < mi else lab[i]
        else:
            for c in range(1, k):
                dr = dist[c]
                for i in range(m):
                    v = dr[i]
                    better = v < mind[i]
                    mind[i] = v if better else mind[i]
                    lab[i] = c if better else lab[i]
        if not want_rows:  # ||x||^2 per row: distance to the chosen center in expanded form
            for i in range(m):
                xn[i] = norms[i0 + i]
        if want_sec:  # bounds, vectorised over the tile's rows
            for i in range(m):
                e = marg * (np.sqrt(xn[i]) + cmax) ** 2
                sec[0, i0 + i] = np.sqrt(max(xn[i] + mind[i], 0.0) + e)
                sec[1, i0 + i] = np.sqrt(max(xn[i] + mind2[i] - e, 0.0))
                labels[i0 + i] = lab[i]
            if weighted:
                for i in range(m):
                    sxx += w[i0 + i] * xn[i]
            else:
                for i in range(m):
                    sxx += xn[i]
        # row-major scatter: consecutive adds hit different features, so no dependency chain
        for i in range(m):
            li = lab[i]
            wi = w[i0 + i] if weighted else 1.0
            counts[li] += wi
            srow = sums[li]
            if want_rows:  # exact squared distance (no cancellation), riding on the same loads
                crow = centers[li]
                di = 0.0
                for j in range(d):
                    x = xt[j, i0 + i]
                    srow[j] += wi * x
                    v = x - crow[j]
                    di += v * v
                labels[i0 + i] = li
                rowd[i0 + i] = di
            elif weighted:
                for j in range(d):
                    srow[j] += wi * xt[j, i0 + i]
                di = max(xn[i] + mind[i], 0.0)
            else:
                for j in range(d):
                    srow[j] += xt[j, i0 + i]
                di = max(xn[i] + mind[i], 0.0)
            inertia += wi * di
            if q and di > thr:  # keep the q rows farthest from their centers (empty-cluster relocation)
                t_min = 0
                for t in range(1, q):
                    if topv[t] < topv[t_min]:
                        t_min = t
                topv[t_min] = di
                topi[t_min] = i0 + i
                topl[t_min] = li
                thr = topv[0]
                for t in range(1, q):
                    thr = min(thr, topv[t])
    return inertia, sxx


@njit(nogil=True, fastmath=True, cache=True)
def _row_norms_numba(xt, out):  # pragma: no cover - compiled
    d, n = xt.shape
    for i in range(n):
        out[i] = 0.0
    for j in range(d):  # vectorised over rows, one feature at a time
        xr = xt[j]
        for i in range(n):
            v = np.float64(xr[i])
            out[i] += v * v


#: the worker state space of the row norms of the blocks a worker holds
_NORMS_SPACE = "kmeans-row-norms"
_norms_lock = threading.Lock()


def row_norms(blk: np.ndarray) -> np.ndarray:
    """``|x|^2`` of each row of a NumPy block, in float64, computed once per block and kept while
    the block lives (8 bytes per row), in the worker's state (:func:`gdask.devices.worker_state`):
    every full pass of a fit needs them and they never change (blocks are immutable). Keyed by the
    block object: a fresh view of the same data computes them again."""
    key = id(blk)
    cache = worker_state(_NORMS_SPACE)
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


def block_kind(x: Any) -> str:
    """Which implementation a block takes: "numpy" (numba CPU kernels), "cupy" (numba.cuda kernels)
    or "xp" (the array API reference)."""
    if isinstance(x, np.ndarray):
        return "numpy"
    return "cupy" if array_module(x).__name__ == "cupy" else "xp"


def cuda_kernels() -> Any:
    """:mod:`gdask.ml._cuda_kernels` when its kernels can run on CuPy blocks in this process, else
    ``None`` (numba.cuda missing or without a driver, or the CUDA simulator, which runs on NumPy)."""
    from gdask.ml import _cuda_kernels

    return _cuda_kernels if _cuda_kernels.usable() else None


#: rows per block kept as candidates for empty clusters; more empty clusters than this at once take
#: an extra pass (``_farthest_rows`` in ``gdask.ml._kmeans``)
N_FARTHEST = 8

#: rows per slice of the array API reference's one-hot products (bounds its (rows, k) temporaries)
XP_CHUNK = 1 << 15


def _cuda_for(blk: Any, k: int, d: int) -> Any:
    """The CUDA kernels for a CuPy block with ``k`` centers of ``d`` features, or None."""
    if block_kind(blk) != "cupy":
        return None
    ck = cuda_kernels()
    return ck if ck is not None and ck.lloyd_fits(k, d, blk.dtype.itemsize) else None


def lloyd_partial(blk, centers, w=None):
    """One block's Lloyd statistics, a dict: ``sums (k, d)`` and ``counts (k,)`` (float64, weighted
    by the rows' ``w`` if given), ``inertia``, and the block's rows farthest from their centers
    (``far_d``, ``far_label``, ``far_rows``, ``far_w``), which empty clusters take as scikit-learn
    does, without another pass over the data. Ties between equally far rows go to the lower row."""
    k, d = centers.shape
    q = min(N_FARTHEST, blk.shape[0])
    kind = block_kind(blk)
    if kind != "numpy":
        ck = _cuda_for(blk, k, d)
        if ck is not None:
            return ck.lloyd_partial_cuda(blk, centers, w)
        return lloyd_partial_xp(blk, centers, w)
    sums = np.zeros((k, d), np.float64)
    counts = np.zeros(k, np.float64)
    c = np.ascontiguousarray(centers, dtype=blk.dtype)
    topv = np.full(q, -1.0)
    topi = np.zeros(q, np.int64)
    topl = np.zeros(q, np.int64)
    wv = _NO_WEIGHTS if w is None else np.ascontiguousarray(w, dtype=np.float64)
    inertia, _ = _lloyd_numba(blk.T, wv, c, sums, counts, topi, topv, False, topv, topi, topl, _NO_SEC,
                              row_norms(blk))
    keep = topv >= 0
    idx = topi[keep]
    return {"sums": sums, "counts": counts, "inertia": inertia, "far_d": topv[keep], "far_label": topl[keep],
            "far_rows": np.asarray(blk[idx]), "far_w": np.ones(idx.size) if w is None else wv[idx]}


_NO_WEIGHTS = np.empty(0, np.float64)
_NO_SEC = np.empty((0, 0), np.float64)


_FAR = ("far_d", "far_label", "far_rows", "far_w")


def lloyd_combine(parts):
    """Add Lloyd partials; keep the ``N_FARTHEST`` farthest rows over all of them."""
    out = dict(parts[0])
    for p in parts[1:]:
        out["sums"] = out["sums"] + p["sums"]
        out["counts"] = out["counts"] + p["counts"]
        out["inertia"] = out["inertia"] + p["inertia"]
        out["changed"] = out.get("changed", 0) + p.get("changed", 0)
        for key in _FAR:
            out[key] = np.concatenate([out[key], p[key]])
    if len(out["far_d"]) > N_FARTHEST:
        top = np.argsort(-out["far_d"], kind="stable")[:N_FARTHEST]
        for key in _FAR:
            out[key] = out[key][top]
    return out


def assign(blk, centers):
    """Labels (int32) and exact squared distance to the nearest center (float64) of one block's rows."""
    if block_kind(blk) != "numpy":
        ck = _cuda_for(blk, *centers.shape)
        if ck is not None:
            return ck.assign_cuda(blk, centers)
        return assign_xp(blk, centers)
    n = blk.shape[0]
    k, d = centers.shape
    c = np.ascontiguousarray(centers, dtype=blk.dtype)
    labels = np.empty(n, np.int32)
    mind = np.empty(n, np.float64)
    _lloyd_numba(blk.T, _NO_WEIGHTS, c, np.zeros((k, d)), np.zeros(k), labels, mind, True, np.empty(0),
                 np.empty(0, np.int64), np.empty(0, np.int64), _NO_SEC, _NO_WEIGHTS)
    return labels, mind


def labels_block(blk, centers):
    return assign(blk, centers)[0]


def min_sqdist(blk, centers):
    return assign(blk, centers)[1]


# -- the array API reference ------------------------------------------------------------------------
def assign_xp(blk, centers):
    """:func:`assign` written against the array API standard: labels from the expanded distances in
    the block's dtype (ties to the lower center), the squared distance to the chosen center summed
    in float64."""
    xp = array_namespace(blk)
    c = astype(centers, blk.dtype)
    d2 = xp.sum(c * c, axis=1)[None, :] - 2 * (blk @ c.T)
    labels = xp.argmin(d2, axis=1)
    diff = blk - xp.take(c, labels, axis=0)
    return xp.astype(labels, xp.int32), xp.sum(diff * diff, axis=1, dtype=xp.float64)


def cluster_sums(labels, rows, w, k: int):
    """Per-cluster sums ``(k, d)`` of the rows (times ``w``) and per-cluster weight ``(k,)``, float64:
    a scatter-add written as one-hot products, in slices of :data:`XP_CHUNK` rows (the standard has
    no scatter-add; ``array_api_extra.at(x)[i].add(v)`` adds once per distinct index)."""
    import array_api_extra as xpx

    xp = array_namespace(rows)
    n, d = rows.shape
    sums = xp.zeros((k, d), dtype=xp.float64, device=_device(rows))
    counts = xp.zeros((k,), dtype=xp.float64, device=_device(rows))
    for s in range(0, n, XP_CHUNK):
        e = min(n, s + XP_CHUNK)
        oh = xpx.one_hot(labels[s:e], k, dtype=xp.float64, xp=xp)
        if w is not None:
            oh = oh * w[s:e, None]
        sums = sums + oh.T @ xp.astype(rows[s:e, ...], xp.float64)
        counts = counts + xp.sum(oh, axis=0)
    return sums, counts


def _device(x):
    from array_api_compat import device

    return device(x)


def lloyd_partial_xp(blk, centers, w=None):
    """:func:`lloyd_partial` written against the array API standard (the reference of the fast kernels,
    and what blocks of other namespaces run). Returns device arrays (the farthest rows in the order
    of their distance, larger first, then lower row index)."""
    xp = array_namespace(blk)
    k = centers.shape[0]
    n = blk.shape[0]
    labels, mind = assign_xp(blk, centers)
    ww = None if w is None else xp.astype(w, xp.float64)
    sums, counts = cluster_sums(labels, blk, ww, k)
    inertia = xp.sum(mind) if ww is None else xp.sum(mind * ww)
    idx = xp.argsort(mind, descending=True, stable=True)[:min(N_FARTHEST, n)]
    far_w = xp.ones(idx.shape, dtype=xp.float64, device=_device(blk)) if ww is None else xp.take(ww, idx)
    return {"sums": sums, "counts": counts, "inertia": inertia, "far_d": xp.take(mind, idx),
            "far_label": xp.astype(xp.take(labels, idx), xp.int64), "far_rows": xp.take(blk, idx, axis=0),
            "far_w": far_w}


def host(x: Any) -> Any:
    """A block kernel's result on the host (dict values, tuples and 0-d arrays too): what the block
    task does with it (for tests and callers outside block tasks)."""
    if isinstance(x, dict):
        return {key: host(v) for key, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(host(v) for v in x)
    out = to_numpy(x)
    return out[()] if getattr(out, "ndim", None) == 0 else out
