"""Hamerly's bounds for K-means: the same assignments as Lloyd with far fewer distance computations.

Each row keeps its label, an upper bound on the distance to its center and a lower bound on the
distance to every other center (Hamerly, "Making k-means even faster", SDM 2010). When the centers
move, the bounds move by at most the centers' drift; a row whose upper bound stays below its lower
bound (and below half the distance from its center to the nearest other center) cannot change
cluster and is not looked at again. Only the other rows get distances computed, exactly, in
float64. Every block also keeps its per-cluster sums, moved row by row when a row changes cluster,
so an iteration late in a fit touches a few bytes per row instead of the whole block.

The state lives with the worker that holds the block, in the worker's state space of the fit
(:func:`gdask.devices.worker_state`, dropped by the iteration engine when the fit ends), keyed by
the block array itself (checked by identity through a weak reference). A block whose state is
missing (moved to another worker, recomputed after a worker was lost) is rebuilt from the fit's
*history* (the centers of every earlier bounds pass): the same first pass and the same steps, so
the same bits as if it had never been lost. A caller without the history at hand gets
``{"missing": True}`` back and asks again with it.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from numba import njit

from gdask.devices import array_namespace, asarray_like, current_device, to_numpy, worker_state
from gdask.ml import _kernels

#: when more than this fraction of a block's rows must be looked at again (early iterations, when
#: centers move a lot), a full tiled pass that rebuilds the bounds is cheaper than row by row: the
#: step gives up as soon as it has met that many
FULL_PASS_FRACTION = 0.2

logger = logging.getLogger("gdask.ml")

#: what a bounds pass returns for a block without state when the caller gave no history
MISSING = {"missing": True}


@dataclass
class BlockBounds:
    """Per-row bounds of one block and its per-cluster sums, valid for ``centers``."""

    ref: Any  # weakref to the block
    centers: Any  # (k, d) float64, the centers the bounds and labels refer to
    labels: Any  # (n,) int32
    upper: Any  # (n,) float64
    lower: Any  # (n,) float64
    sums: Any  # (k, d) float64
    counts: Any  # (k,) float64
    far: Any = None  # after a full pass: (squared distances, rows, labels) of the farthest rows
    sxx: float = float("nan")  # sum_i w_i |x_i|^2 in float64, from the full pass (for the inertia at the end)
    memo: Any = None  # the last passes' (centers, partial): a pass asked again gets the same answer


#: passes a block remembers: a loop that resumes after a failure may repeat the last one or two
MEMO = 3


def _get(token: str, blk: Any) -> BlockBounds | None:
    st = (worker_state(token, create=False) or {}).get(id(blk))
    if st is None or st.ref() is not blk:
        return None
    return st


def _put(token: str, blk: Any, st: BlockBounds) -> None:
    space = worker_state(token)
    if id(blk) not in space:  # a block's first state (not every step): drop those of blocks this process let go
        for key in [key for key, s in space.items() if s.ref() is None]:
            del space[key]
    space[id(blk)] = st


def _pop(token: str, blk: Any) -> None:
    space = worker_state(token, create=False)
    if space is not None:
        space.pop(id(blk), None)


def _center_geometry(centers: np.ndarray, old: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, float, float,
                                                                      np.ndarray]:
    """Drift per center, half the distance to the nearest other center, the largest drift (its
    center and value), the second largest, and the center-to-center distances."""
    drift = np.sqrt(((centers - old) ** 2).sum(1))
    k = centers.shape[0]
    cc = np.sqrt(np.maximum(((centers[:, None, :] - centers[None, :, :]) ** 2).sum(-1), 0.0))
    if k > 1:
        off = cc + np.diag(np.full(k, np.inf))
        half = 0.5 * off.min(1)
        m1 = int(np.argmax(drift))
        d1 = float(drift[m1])
        d2 = float(np.max(np.delete(drift, m1)))
    else:
        half = np.full(1, np.inf)
        m1, d1, d2 = 0, float(drift[0]), 0.0
    return drift, half, m1, d1, d2, cc


#: rows per tile of a bounds step, at most: the rows that fail their bounds are gathered feature by
#: feature, and long tiles make each feature's reads one long forward stream that the hardware
#: prefetches (short ones jump between features every few cache lines); capped so the gathered
#: rows (float64) take at most ``_STEP_BUFFER`` bytes
_STEP_TILE = 4096
_STEP_BUFFER = 1 << 20


@njit(nogil=True, fastmath={"reassoc", "contract"}, cache=True)
def _hamerly_numba(xt, w, cf, labels, upper, lower, sums, counts, drift, half, m1, d1, d2, cc,  # pragma: no cover
                   limit):  # compiled
    """One bounds step; ``looked`` > ``limit`` rows failing their bounds aborts it (returns changed = -1,
    the state is then half moved and must be rebuilt by a full pass)."""
    d, n = xt.shape
    k = cf.shape[0]
    weighted = w.shape[0] > 0
    changed = 0
    looked = 0
    tile = max(64, min(_STEP_TILE, _STEP_BUFFER // (8 * max(d, 1))))
    idx = np.empty(tile, np.int64)
    zt = np.empty(tile, np.float64)
    xb = np.empty((tile, d), np.float64)
    for i0 in range(0, n, tile):
        m = min(tile, n - i0)
        cnt = 0
        for i in range(i0, i0 + m):  # move the bounds by the drift; keep the rows they no longer settle
            a = labels[i]
            u = upper[i] + drift[a]
            lo = lower[i] - (d2 if a == m1 else d1)
            upper[i] = u
            lower[i] = lo
            z = max(lo, half[a])
            if u > z:
                idx[cnt] = i
                zt[cnt] = z
                cnt += 1
        if cnt == 0:
            continue
        looked += cnt
        if looked > limit:  # most rows fail their bounds: a full pass is cheaper than this step
            return -1, looked
        # gather those rows feature by feature: the block is feature-major, so each feature's part
        # of the tile is one short contiguous read instead of d scattered loads per row
        for j in range(d):
            xrow = xt[j]
            for t in range(cnt):
                xb[t, j] = xrow[idx[t]]
        for t in range(cnt):
            i = idx[t]
            a = labels[i]
            xr = xb[t]
            ca = cf[a]
            acc = 0.0
            for j in range(d):
                v = xr[j] - ca[j]
                acc += v * v
            u = np.sqrt(acc)
            upper[i] = u
            if u <= zt[t]:
                continue
            best = acc  # look at the other centers (squared distances; the root of the best two only)
            bi = a
            second = np.inf
            skipped = np.inf
            for c in range(k):
                if c == a:
                    continue
                if cc[a, c] >= 2.0 * u:  # d(x, c) >= cc - u >= u: c cannot win (Elkan's pruning)
                    skipped = min(skipped, cc[a, c] - u)  # ... and bounds d(x, c) from below
                    continue
                crow = cf[c]
                acc = 0.0
                for j in range(d):
                    v = xr[j] - crow[j]
                    acc += v * v
                if acc < best or (acc == best and c < bi):
                    second = best
                    best = acc
                    bi = c
                elif acc < second:
                    second = acc
            best = np.sqrt(best)
            second = min(np.sqrt(second), skipped)
            upper[i] = best
            lower[i] = second
            if bi != a:
                wi = w[i] if weighted else 1.0
                sa = sums[a]
                sb = sums[bi]
                for j in range(d):
                    x = wi * xr[j]
                    sa[j] -= x
                    sb[j] += x
                counts[a] -= wi
                counts[bi] += wi
                labels[i] = bi
                changed += 1
    return changed, looked


@njit(nogil=True, cache=True)
def _assigned_sqdist(xt, cf, labels, out):  # pragma: no cover - compiled
    d, n = xt.shape
    for i in range(n):
        out[i] = 0.0
    for j in range(d):
        xr = xt[j]
        for i in range(n):
            v = xr[i] - cf[labels[i], j]
            out[i] += v * v


def _first_pass(blk: Any, cf: np.ndarray, w: Any) -> BlockBounds:
    """Full pass (Lloyd's tiled kernel): labels, per-cluster sums and the bounds, from the
    expanded-form distances widened by their rounding error. NumPy blocks: the numba kernel; CuPy
    blocks: the numba.cuda kernel (:func:`gdask.ml._cuda_kernels.first_pass_cuda`); others: the
    array API reference (:func:`_first_pass_xp`)."""
    kind = _kernels.block_kind(blk)
    if kind != "numpy":
        ck = _kernels._cuda_for(blk, *cf.shape)
        if ck is not None:
            return ck.first_pass_cuda(blk, cf, w)
        return _first_pass_xp(blk, cf, w)
    n, d = blk.shape
    k = cf.shape[0]
    ww = None if w is None else np.asarray(w, dtype=np.float64)
    # labels and both bounds in one allocation: from 4 MiB NumPy asks for huge pages, which
    # saves most of the page faults of first touching a new state (a few ms per block)
    buf = np.empty(2 * n + (n + 1) // 2, np.float64)
    ul = buf[:2 * n].reshape(2, n)
    labels = buf[2 * n:].view(np.int32)[:n]
    sums = np.zeros((k, d), np.float64)
    counts = np.zeros(k, np.float64)
    q = min(_kernels.N_FARTHEST, n)  # the farthest rows, for empty clusters (as lloyd_partial)
    topv, topi, topl = np.full(q, -1.0), np.zeros(q, np.int64), np.zeros(q, np.int64)
    _, sxx = _kernels._lloyd_numba(blk.T, _kernels._NO_WEIGHTS if ww is None else np.ascontiguousarray(ww),
                                   np.ascontiguousarray(cf, dtype=blk.dtype), sums, counts, labels, labels,
                                   False, topv, topi, topl, ul, _kernels.row_norms(blk))
    keep = topv >= 0
    return BlockBounds(weakref.ref(blk), np.asarray(cf), labels, ul[0], ul[1], sums, counts,
                       (topv[keep], topi[keep], topl[keep]), sxx)


def _first_pass_xp(blk: Any, cf: np.ndarray, w: Any) -> BlockBounds:
    """:func:`_first_pass` written against the array API standard (the reference): distances in
    float64, the lower bound widened by the expanded form's rounding error."""
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
        own = labels[:, None] == xp.arange(k, device=_kernels._device(blk))[None, :]
        e = (d + 8) * float(np.finfo(np.float64).eps) * (xp.sqrt(xn) + float(np.sqrt((cf * cf).sum(1).max()))) ** 2
        lower = xp.sqrt(xp.clip(xp.min(xp.where(own, xp.inf, d2), axis=1) - e, min=0.0))
    else:
        lower = xp.full((n,), xp.inf, dtype=xp.float64, device=_kernels._device(blk))
    ww = None if w is None else xp.astype(w, xp.float64)
    sums, counts = _kernels.cluster_sums(labels, x, ww, k)
    top = xp.argsort(upper, descending=True, stable=True)[:min(_kernels.N_FARTHEST, n)]
    tu = xp.take(upper, top)
    far = (to_numpy(tu * tu), to_numpy(top), to_numpy(xp.take(labels, top)))  # small: to the host now
    sxx = float(xp.sum(xn) if ww is None else xp.sum(xn * ww))
    return BlockBounds(weakref.ref(blk), c, xp.astype(labels, xp.int32), upper, lower, sums, counts, far, sxx)


def _expand(mask: Any, vals: Any, old: Any) -> Any:
    """``old`` with ``vals`` put at the positions where ``mask`` is true, in order (a scatter to the
    increasing positions of a mask, as a gather: the standard's arrays take no integer-array
    assignment)."""
    xp = array_namespace(old)
    m = vals.shape[0]
    if m == 0:
        return old
    pos = xp.cumulative_sum(xp.astype(mask, xp.int64)) - 1
    return xp.where(mask, xp.take(vals, xp.clip(pos, min=0, max=m - 1), axis=0), old)


def _step_xp(blk: Any, cf: np.ndarray, st: BlockBounds, w: Any) -> int:
    """The bounds step written against the array API standard (the reference of the numba and CUDA
    steps; what blocks of other namespaces run). Returns the rows that changed cluster; the state's
    labels, bounds, sums and counts are replaced by new arrays."""
    xp = array_namespace(blk)
    k = cf.shape[0]
    c = asarray_like(np.asarray(cf, dtype=np.float64), blk)
    drift, half, m1, d1, d2, _ = _center_geometry(cf, to_numpy(st.centers))
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
        u = _expand(fail, ui, u)
        far = ui > xp.take(z, idx)
        j = xp.nonzero(far)[0]
        if j.shape[0]:
            mask = _expand(fail, far, xp.zeros_like(fail))  # the rows whose cluster is in doubt
            x, ai = xp.take(x, j, axis=0), xp.take(ai, j)
            sq = xp.sum((x[:, None, :] - c[None, :, :]) ** 2, axis=-1)
            dist = xp.sqrt(xp.clip(sq, min=0.0))
            new = xp.argmin(dist, axis=1)
            best = xp.min(dist, axis=1)
            if k > 1:
                own = new[:, None] == xp.arange(k, device=_kernels._device(blk))[None, :]
                second = xp.min(xp.where(own, xp.inf, dist), axis=1)
            else:
                second = xp.full(best.shape, xp.inf, dtype=xp.float64, device=_kernels._device(blk))
            moved = new != ai
            changed = int(xp.sum(xp.astype(moved, xp.int64)))
            if changed:
                ww = xp.ones(j.shape, dtype=xp.float64, device=_kernels._device(blk)) if w is None else \
                    xp.take(xp.take(xp.astype(w, xp.float64), idx), j)
                wm = xp.where(moved, ww, 0.0)
                add_s, add_c = _kernels.cluster_sums(new, x, wm, k)
                sub_s, sub_c = _kernels.cluster_sums(ai, x, wm, k)
                st.sums = st.sums + add_s - sub_s
                st.counts = st.counts + add_c - sub_c
            a = _expand(mask, xp.astype(new, a.dtype), a)
            u = _expand(mask, best, u)
            lo = _expand(mask, second, lo)
    st.labels, st.upper, st.lower = a, u, lo
    return changed


def _step(blk: Any, cf: np.ndarray, st: BlockBounds, w: Any) -> int:
    """One bounds step on a CuPy block (the CUDA kernel, else the reference) or another non-NumPy
    block (the reference); the new state arrays are charged to the device."""
    ck = _kernels._cuda_for(blk, *cf.shape)
    if ck is not None:
        return ck.bounds_step_cuda(blk, cf, st, w)
    changed = _step_xp(blk, cf, st, w)
    _charge(st)
    return changed


def _to_np(x: Any) -> np.ndarray:
    return to_numpy(x)


def _charge(st: BlockBounds) -> None:
    """Count the per-row state against the device's memory (CUDA arrays are allocated there)."""
    dev = current_device()
    for arr in (st.labels, st.upper, st.lower):
        dev.adopt(arr)


def _update(blk: Any, centers: Any, token: str, w: Any,
            history: Sequence[np.ndarray] | None) -> tuple[BlockBounds | None, int]:
    """Bring the block's state to ``centers``: a full first pass, or one bounds step (a block
    without state first replays ``history``). ``None`` when the device has no memory left for the
    state (the caller then runs plain Lloyd)."""
    try:
        if history and _get(token, blk) is None:  # lost: rebuild it exactly as it was built
            for c in history:
                _update_state(blk, c, token, w)
        return _update_state(blk, centers, token, w)
    except MemoryError:
        _pop(token, blk)
        return None, blk.shape[0]


def _update_state(blk: Any, centers: Any, token: str, w: Any) -> tuple[BlockBounds, int]:
    cf = np.asarray(_to_np(centers), dtype=np.float64)
    st = _get(token, blk)
    full = st is None or st.labels.shape[0] != blk.shape[0] or tuple(st.centers.shape) != cf.shape
    changed = 0
    numpy_block = _kernels.block_kind(blk) == "numpy"
    if not full:
        if numpy_block:  # the step gives up once too many rows fail their bounds
            drift, half, m1, d1, d2, cc = _center_geometry(cf, st.centers)
            wv = _kernels._NO_WEIGHTS if w is None else np.ascontiguousarray(w, dtype=np.float64)
            changed, _ = _hamerly_numba(blk.T, wv, cf, st.labels, st.upper, st.lower, st.sums, st.counts,
                                        drift, half, m1, d1, d2, cc, int(FULL_PASS_FRACTION * blk.shape[0]))
            full = changed < 0
        else:
            changed = _step(blk, cf, st, w)
        if not full:
            st.far = None  # a step computes no exact distances for most rows
            st.centers = cf if numpy_block else asarray_like(cf, blk)
    if full:
        old = None if st is None else st.labels
        st = _first_pass(blk, cf, w)
        _charge(st)
        changed = blk.shape[0] if old is None or tuple(old.shape) != tuple(st.labels.shape) else \
            int(np.count_nonzero(to_numpy(old) != to_numpy(st.labels)))
    _put(token, blk, st)
    return st, changed


def bounds_partial(blk: Any, centers: Any, token: str, w: Any = None,
                   history: Sequence[np.ndarray] | None = None) -> dict[str, Any]:
    """Lloyd statistics of one block for ``centers`` (as :func:`gdask.ml._kernels.lloyd_partial`),
    from the block's bounds when it has them. ``inertia`` is not computed (NaN). The farthest rows
    come with a full pass only; after a bounds step an empty cluster takes a separate pass.

    ``history``: the centers of the fit's earlier bounds passes, oldest first (``[]`` on the first
    one). A block without state replays them; without ``history`` such a block returns
    :data:`MISSING` and the caller asks again with it. A block asked for one of its last
    :data:`MEMO` passes again (a loop resumed after a failure repeats passes that some blocks had
    already done) returns that pass's result unchanged, so the state evolves as if there had been
    no failure."""
    st = _get(token, blk)
    if st is None and history is None:
        return dict(MISSING)
    cf = np.asarray(_to_np(centers), dtype=np.float64)
    for c, out in (st.memo or ()) if st is not None else ():
        if np.array_equal(c, cf):  # the same pass again (a resumed loop): the same answer, state untouched
            return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in out.items()}
    st, changed = _update(blk, centers, token, w, history)
    if st is None:
        return _kernels.lloyd_partial(blk, centers, w)
    if st.far is None:
        dist, idx, lab = np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64)
    else:
        dist, idx, lab = st.far
    out = {"sums": np.array(_to_np(st.sums), copy=True), "counts": np.array(_to_np(st.counts), copy=True),
           "inertia": float("nan"), "changed": changed, "far_d": dist, "far_label": lab,
           "far_rows": _to_np(_take(blk, idx)),
           "far_w": np.ones(idx.size) if w is None else _to_np(_take(w, idx)).astype(np.float64)}
    st.memo = [*(st.memo or ())[-(MEMO - 1):], (cf, {k: (v.copy() if isinstance(v, np.ndarray) else v)
                                                     for k, v in out.items()})]
    return out


#: the inertia from per-cluster sums (:func:`bounds_labels`) is used while it keeps at least this
#: fraction of the magnitude of the terms it is the difference of (it then loses at most ~3 of
#: float64's ~16 digits); below, an exact pass over the block computes it
CANCELLATION_LIMIT = 1e-3


def _inertia_from_sums(st: BlockBounds) -> float | None:
    """``sum_i w_i |x_i - c_{label_i}|^2`` from the state's per-cluster sums: ``sum w|x|^2
    - 2 sum_c c . S_c + sum_c W_c |c|^2`` (float64). ``None`` when it cancels too badly to be
    trusted (e.g. data far from the origin against its spread, or an inertia of about zero)."""
    c = _to_np(st.centers)
    cs = (c * _to_np(st.sums)).sum(1)
    cc = _to_np(st.counts) * (c * c).sum(1)
    value = st.sxx - 2.0 * cs.sum() + cc.sum()
    magnitude = st.sxx + 2.0 * np.abs(cs).sum() + cc.sum()
    if not np.isfinite(value) or value <= CANCELLATION_LIMIT * magnitude:
        return None
    return float(value)


def bounds_labels(blk: Any, centers: Any, token: str, w: Any = None,
                  history: Sequence[np.ndarray] | None = None) -> tuple[Any, float]:
    """Labels (int32) for ``centers`` and the block's inertia (the sum of ``w`` times the squared
    distance of each row to its center), from the block's bounds; ends the fit for this block (its
    state is freed). The inertia comes from the per-cluster sums the bounds keep (``sum w |x|^2``
    came with the full pass that built them) instead of a distance per row, unless that cancels
    badly. A block without state replays ``history`` first (see :func:`bounds_partial`)."""
    st, _ = _update(blk, centers, token, w, history)
    _pop(token, blk)
    if st is None:
        labels, mind = _kernels.assign(blk, centers)
        return labels, weighted_total(mind, w)
    inertia = _inertia_from_sums(st)
    if inertia is None:
        if isinstance(blk, np.ndarray):
            mind = np.empty(blk.shape[0], np.float64)
            _assigned_sqdist(blk.T, st.centers, st.labels, mind)
        else:
            xp = array_namespace(blk)
            diff = xp.astype(blk, xp.float64) - xp.take(asarray_like(to_numpy(st.centers), blk), st.labels, axis=0)
            mind = xp.sum(diff * diff, axis=1)
        inertia = weighted_total(mind, w)
    return st.labels, inertia


def _take(x: Any, idx: np.ndarray) -> Any:
    """Rows ``idx`` (host indices) of a block or weights, on the block's device."""
    if isinstance(x, np.ndarray):
        return x[idx]
    return array_namespace(x).take(x, asarray_like(np.asarray(idx, dtype=np.int64), x), axis=0)


def weighted_total(values: Any, w: Any) -> float:
    """``sum(values * w)`` (``sum(values)`` without weights) as a Python float."""
    if isinstance(values, np.ndarray) and (w is None or isinstance(w, np.ndarray)):
        return float(values.sum() if w is None else (values * w).sum())
    xp = array_namespace(values, w)
    return float(xp.sum(values) if w is None else xp.sum(values * w))
