"""Hamerly's bounds for K-means: the same assignments as Lloyd with far fewer distance computations.

Each row keeps its label, an upper bound on the distance to its center and a lower bound on the
distance to every other center (Hamerly, "Making k-means even faster", SDM 2010). When the centers
move, the bounds move by at most the centers' drift; a row whose upper bound stays below its lower
bound (and below half the distance from its center to the nearest other center) cannot change
cluster and is not looked at again. Only the other rows get distances computed: on the GPU and
the array-API path exactly, in float64; on the CPU through the full pass's tiled distance loop,
with bounds widened by its rounding error. Every block also keeps its per-cluster sums, moved row
by row when a row changes cluster, so an iteration late in a fit touches a few bytes per row
instead of the whole block.

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
from typing import Any, Sequence

import numpy as np

from gdask.devices import asarray_like, astype, current_device, to_numpy, worker_state
from gdask.ml.kernels import _dispatch
from gdask.ml.kernels._common import BlockBounds, take_rows, weighted_total
from gdask.ml.kernels._kmeans import assign, lloyd_partial

__all__ = ["CANCELLATION_LIMIT", "FULL_PASS_FRACTION", "MEMO", "MISSING", "bounds_labels", "bounds_partial"]

logger = logging.getLogger("gdask.ml")

#: when more than this fraction of a block's rows must be looked at again (early iterations, when
#: centers move a lot), a full tiled pass that rebuilds the bounds is cheaper than row by row: the
#: step gives up as soon as it has met that many (a backend's kernels may set their own)
FULL_PASS_FRACTION = 0.2


#: what a bounds pass returns for a block without state when the caller gave no history
MISSING = {"missing": True}


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


def _charge(st: BlockBounds) -> None:
    """Count the per-row state against the device's memory (CUDA arrays are allocated there)."""
    dev = current_device()
    for arr in (st.labels, st.upper, st.lower):
        dev.adopt(arr)


def _update(blk: Any, centers: Any, token: str, w: Any, history: Sequence[np.ndarray] | None,
            st: BlockBounds | None) -> tuple[BlockBounds | None, int]:
    """Bring the block's state ``st`` (:func:`_get`; None: none yet) to ``centers``: a full first
    pass, or one bounds step (a block without state first replays ``history``). ``None`` when the
    device has no memory left for the state (the caller then runs plain Lloyd)."""
    try:
        if history and st is None:  # lost: rebuild it exactly as it was built
            for c in history:
                st, _ = _update_state(blk, c, token, w, st)
        return _update_state(blk, centers, token, w, st)
    except MemoryError:
        _pop(token, blk)
        return None, blk.shape[0]


def _update_state(blk: Any, centers: Any, token: str, w: Any, st: BlockBounds | None) -> tuple[BlockBounds, int]:
    """:func:`_update` from the block's state ``st`` (None: none yet)."""
    cf = np.asarray(to_numpy(centers), dtype=np.float64)
    full = st is None or st.labels.shape[0] != blk.shape[0] or tuple(st.centers.shape) != cf.shape
    changed = 0
    backend = _dispatch.backend_for(blk, clusters=cf.shape[0])
    impl = _dispatch.kernels_for("hamerly", blk, clusters=cf.shape[0])
    if not full:
        # the CPU step gives up (-1) once too many rows fail their bounds: a full pass is cheaper
        limit = int(getattr(impl, "FULL_PASS_FRACTION", FULL_PASS_FRACTION) * blk.shape[0])
        changed = impl.step(blk, cf, st, w, limit)
        full = changed < 0
        if backend == "xp":  # new state arrays, on the device
            _charge(st)
        if not full:
            st.far = None  # a step computes no exact distances for most rows
            st.centers = cf if backend == "cpu" else asarray_like(cf, blk)
    if full:
        old = None if st is None else st.labels
        if backend == "cpu" and st is not None and old.shape == (blk.shape[0],):
            # a rebuild writes over the state it replaces (fresh memory costs its page faults)
            old = old.copy()
            st = impl.first_pass(blk, cf, w, reuse=st)
        else:
            st = impl.first_pass(blk, cf, w)
        _charge(st)
        changed = blk.shape[0] if old is None or tuple(old.shape) != tuple(st.labels.shape) else \
            int(np.count_nonzero(to_numpy(old) != to_numpy(st.labels)))
        _put(token, blk, st)  # a new state (a step changes the one in the space in place)
    return st, changed


def bounds_partial(blk: Any, centers: Any, token: str, w: Any = None,
                   history: Sequence[np.ndarray] | None = None) -> dict[str, Any]:
    """Lloyd statistics of one block for ``centers`` (as :func:`gdask.ml.kernels.lloyd_partial`),
    from the block's bounds when it has them. ``inertia`` is not computed (NaN). The farthest rows
    come with a full pass only; after a bounds step an empty cluster takes a separate pass.
    ``bounded`` is 1 and ``rebuilt`` 1 when the block ran a full pass (its first, or a step that gave
    up), 0 after a step (both summed by :func:`~gdask.ml.kernels.lloyd_combine`).

    ``history``: the centers of the fit's earlier bounds passes, oldest first (``[]`` on the first
    one). A block without state replays them; without ``history`` such a block returns
    :data:`MISSING` and the caller asks again with it. A block asked for one of its last
    :data:`MEMO` passes again (a loop resumed after a failure repeats passes that some blocks had
    already done) returns that pass's result unchanged, so the state evolves as if there had been
    no failure."""
    st = _get(token, blk)
    if st is None and history is None:
        return dict(MISSING)
    cf = np.asarray(to_numpy(centers), dtype=np.float64)
    key = cf.tobytes()  # the centers' bits (memcmp, not an array comparison per remembered pass)
    for c, out in (st.memo or ()) if st is not None else ():
        if c == key:  # the same pass again (a resumed loop): the same answer, state untouched
            return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in out.items()}
    st, changed = _update(blk, cf, token, w, history, st)
    if st is None:
        return lloyd_partial(blk, centers, w)
    if st.far is None:
        dist, idx, lab = np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64)
    else:
        dist, idx, lab = st.far
    out = {"sums": np.array(to_numpy(st.sums), copy=True), "counts": np.array(to_numpy(st.counts), copy=True),
           "inertia": float("nan"), "changed": changed, "bounded": 1, "rebuilt": int(st.far is not None),
           "far_d": dist, "far_label": lab,
           "far_rows": to_numpy(take_rows(blk, idx)),
           "far_w": np.ones(idx.size) if w is None else to_numpy(take_rows(w, idx)).astype(np.float64)}
    st.memo = [*(st.memo or ())[-(MEMO - 1):], (key, {k: (v.copy() if isinstance(v, np.ndarray) else v)
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
    c = to_numpy(st.centers)
    cs = (c * to_numpy(st.sums)).sum(1)
    cc = to_numpy(st.counts) * (c * c).sum(1)
    value = st.sxx - 2.0 * cs.sum() + cc.sum()
    magnitude = st.sxx + 2.0 * np.abs(cs).sum() + cc.sum()
    if not np.isfinite(value) or value <= CANCELLATION_LIMIT * magnitude:
        return None
    return float(value)


def bounds_labels(blk: Any, centers: Any, token: str, w: Any = None,
                  history: Sequence[np.ndarray] | None = None, dtype: Any = None) -> tuple[Any, float]:
    """Labels (int32) for ``centers`` and the block's inertia (the sum of ``w`` times the squared
    distance of each row to its center), from the block's bounds; ends the fit for this block (its
    state is freed). The inertia comes from the per-cluster sums the bounds keep (``sum w |x|^2``
    came with the full pass that built them) instead of a distance per row, unless that cancels
    badly. A block without state replays ``history`` first (see :func:`bounds_partial`).

    ``dtype``: the labels as a new array of that type, and the state's memory goes to the next
    fit's blocks (a backend that keeps spare buffers); ``False``: no labels (None), the same.
    Default: the state's own int32 labels."""
    st, _ = _update(blk, centers, token, w, history, _get(token, blk))
    _pop(token, blk)
    if st is None:
        labels, mind = assign(blk, centers)
        return _labels_as(labels, dtype), weighted_total(mind, w)
    impl = _dispatch.kernels_for("hamerly", blk, clusters=st.centers.shape[0])
    inertia = _inertia_from_sums(st)
    if inertia is None:
        mind = impl.assigned_sqdist(blk, st.centers, st.labels)
        inertia = weighted_total(mind, w)
    labels = _labels_as(st.labels, dtype)
    if dtype is not None and hasattr(impl, "give_back"):  # the labels are a copy: the buffer goes back
        impl.give_back(st)
    return labels, inertia


def _labels_as(labels: Any, dtype: Any) -> Any:
    """``labels`` as :func:`bounds_labels` hands them out for ``dtype`` (None: as they are)."""
    if dtype is None:
        return labels
    return None if dtype is False else astype(labels, dtype, copy=True)


