"""Hamerly's bounds on NumPy blocks: numba CPU kernels.

* :func:`first_pass`: a full tiled pass (the distance loop of the Lloyd kernel) that builds labels,
  both bounds, per-cluster sums and counts, ``sum w |x|^2`` and the farthest rows
  (:func:`_first_pass_numba`).
* :func:`step`: one bounds step (:func:`_step_numba`): the rows that fail their bounds go through the
  full pass's tiled distance loop, gathered a chunk of rows at a time; it gives up (returns -1) once
  too many rows fail their bounds, when a full pass is cheaper.
* :func:`assigned_sqdist`: squared distance of each row to its labelled center (float64).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
from numba import njit

from gdask.devices import context
from gdask.ml.kernels._common import N_FARTHEST, BlockBounds, center_geometry
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
    tile_argmin2,
    tile_distances,
)

__all__ = ["FULL_PASS_FRACTION", "assigned_sqdist", "bounds", "first_pass", "give_back", "step"]

#: a step gives up for a full pass beyond this fraction of rows failing their bounds. Measured on 8
#: blocks of 187,500 x 24 float32 rows in main memory, K=20: a step costs ~1.9 ms + 5.6 ms x the failing
#: fraction (the scan, then gathering the failing rows touches most of the block's cache lines from
#: ~10%: 2.8 ms at 17%, 4.0 at 34%, 5.0 at 48%, 5.6 at 57%, 6.4 at 73%), the full pass that rebuilds the
#: bounds 6.2-6.4 ms and Lloyd's 5.6-5.9. Whole default fits on uniform rows: 0.4 -> 0.6 took 4.9-5.0 s
#: -> 4.7-4.8 s (fewer steps gave up, and the loop went back to Lloyd's passes less), the same on
#: Gaussian rows and on clustered ones
FULL_PASS_FRACTION = 0.6

#: a bounds step first looks at one row in this many: when the rows failing their bounds there
#: (scaled to the block) exceed the step's limit, it gives up before moving anything
_SCAN_STRIDE = 8

#: a step looks at this many consecutive rows at a time: their bounds in one SIMD loop, then the
#: failing ones gathered feature by feature (one long forward read per feature: on a block in main
#: memory, gathering 23% of a 187,500 x 24 float32 block's rows took 1.3-1.4 ms in chunks of 8,192
#: rows, 1.9 in chunks of 512, 2.4 a tile of 128 failing rows at a time, whose 24 short reads the
#: prefetchers did not follow; the block's 18 MB stream in ~0.8 ms)
_SCAN_CHUNK = 8192

#: ... in runs of this many consecutive rows, one run every ``_SCAN_STRIDE`` runs: the look reads an
#: eighth of the bounds' cache lines (every 8th row alone touched all of them: ~the cost of a full scan)
_SCAN_RUN = 256


@njit(nogil=True, fastmath=FASTMATH, cache=True)
def _first_pass_numba(xt, w, centers, norms, sums, counts, labels, bounds, topv, topi,  # pragma: no cover
                      topl):  # compiled
    """Labels, and in ``bounds[0]`` / ``bounds[1]`` an upper bound on the distance to the chosen
    center / a lower bound on the distance to any other, from the expanded form widened by its worst
    rounding error, ~(d + 8) eps (|x| + |c|)^2; sums, counts and the farthest rows (by their exact
    distances) as the Lloyd kernel. Returns ``sum_i w_i |x_i|^2`` (float64, from ``norms``)."""
    d, n = xt.shape
    k = centers.shape[0]
    marg = (d + 8) * (1.1920929e-07 if xt.itemsize == 4 else 2.220446049250313e-16)
    c2, cn, cmax = prepare_centers(centers, xt.dtype)
    emarg = expanded_error(xt)
    cmax2 = cmax * cmax
    dist = np.empty((k, TILE), xt.dtype)
    acc = np.zeros((d, k), np.float64)  # the sums, feature-major (tile_add_rows)
    lab = np.empty(TILE, np.int32)
    mind = np.empty(TILE, xt.dtype)
    mind2 = np.empty(TILE, xt.dtype)
    xn = np.empty(TILE, np.float64)  # the tile's |x|^2: sum_i w_i |x_i|^2 vectorises over it
    thr = smallest(topv)
    sxx = 0.0
    for i0 in range(0, n, TILE):
        m = min(TILE, n - i0)
        tile_distances(xt, i0, m, c2, cn, dist)
        tile_argmin2(dist, m, mind, mind2, lab)
        for i in range(m):
            xn[i] = norms[i0 + i]
        up = bounds[0, i0:i0 + m]
        lo = bounds[1, i0:i0 + m]
        lb = labels[i0:i0 + m]
        for i in range(m):  # bounds, vectorised over the tile's rows (r * r, not ** 2: a pow call stays scalar)
            r = np.sqrt(xn[i]) + cmax
            e = marg * (r * r)
            up[i] = np.sqrt(max(xn[i] + mind[i], 0.0) + e)
            lo[i] = np.sqrt(max(xn[i] + mind2[i] - e, 0.0))
            lb[i] = lab[i]
        if w is None:
            for i in range(m):
                sxx += xn[i]
        else:
            for i in range(m):
                sxx += w[i0 + i] * xn[i]
        tile_add_rows(xt, i0, m, w, lab, acc, counts)
        top = -np.inf  # the farthest rows' screen, vectorised over the tile's rows (as the Lloyd kernel)
        for i in range(m):
            xn[i] = max(xn[i] + mind[i], 0.0) + emarg * (xn[i] + cmax2)
            top = max(top, xn[i])
        if top <= thr:
            continue
        for i in range(m):
            if xn[i] > thr:  # may be among the q farthest: its exact distance decides
                li = lab[i]
                ex = exact_sqdist(xt, i0 + i, centers[li])
                if ex > thr:
                    thr = keep_farthest(ex, i0 + i, li, topv, topi, topl)
    acc_to_sums(acc, sums)
    return sxx


@njit(inline="always")
def _step_tile(w, rows, xg, t0, c2, cn, cmax, marg, norms, labels, upper, lower, du, dl, sums, counts, dist, mind,
               mind2, lab):  # pragma: no cover - compiled
    """A tile of the failing ``rows`` of a bounds step, gathered feature-major in ``xg`` from column
    ``t0``: their distances by the full pass's tiled loop, both bounds set as a full pass sets them
    (stored against the block's accumulated drifts ``du`` / ``dl``), and the rows that change
    cluster moved between the sums. Returns how many changed."""
    d = xg.shape[0]
    m = rows.shape[0]
    tile_distances(xg, t0, m, c2, cn, dist)
    tile_argmin2(dist, m, mind, mind2, lab)
    changed = 0
    for t in range(m):
        r = rows[t]
        xn = norms[r]
        rr = np.sqrt(xn) + cmax
        e = marg * (rr * rr)
        a = labels[r]
        b = lab[t]
        upper[r] = np.sqrt(max(xn + mind[t], 0.0) + e) - du[b]
        lower[r] = np.sqrt(max(xn + mind2[t] - e, 0.0)) + dl[b]
        if b != a:
            wi = 1.0 if w is None else w[r]
            sa = sums[a]
            sb = sums[b]
            for j in range(d):
                x = wi * xg[j, t0 + t]
                sa[j] -= x
                sb[j] += x
            counts[a] -= wi
            counts[b] += wi
            labels[r] = b
            changed += 1
    return changed


@njit(inline="always")
def _gather(xt, idx, cnt, xg):  # pragma: no cover - compiled
    """Rows ``idx[:cnt]`` (in order) of the feature-major block ``xt`` into the columns of ``xg``, four
    features at a time: four forward reads of the block at once keep more of its cache lines on
    their way than one feature after the next (a chunk's 8,192 rows of 187,500 x 24 float32, 6-20%
    of them gathered: 0.82-0.95 ms a block against 1.23-1.38 one feature at a time)."""
    d = xt.shape[0]
    j = 0
    while j + 4 <= d:
        x0, x1, x2, x3 = xt[j], xt[j + 1], xt[j + 2], xt[j + 3]
        y0, y1, y2, y3 = xg[j], xg[j + 1], xg[j + 2], xg[j + 3]
        for t in range(cnt):
            r = idx[t]
            y0[t] = x0[r]
            y1[t] = x1[r]
            y2[t] = x2[r]
            y3[t] = x3[r]
        j += 4
    while j < d:
        xrow = xt[j]
        grow = xg[j]
        for t in range(cnt):
            grow[t] = xrow[idx[t]]
        j += 1


@njit(nogil=True, fastmath=FASTMATH, cache=True)
def _step_numba(xt, w, centers, norms, labels, upper, lower, du, dl, half, sums, counts,  # pragma: no cover
                limit, xg, idx, fail):  # compiled
    """One bounds step; more than ``limit`` rows failing their bounds aborts it (returns changed = -1,
    the state is then half moved and must be rebuilt by a full pass). A sample of one row in
    :data:`_SCAN_STRIDE` (runs of :data:`_SCAN_RUN` rows) estimates that count first: above
    ``limit``, it aborts at once (the state untouched).

    A row's bounds are kept against the block's accumulated drifts (Hamerly's bounds moved by every
    step since): its upper bound is ``upper + du[label]``, its lower bound ``lower - dl[label]``, with
    ``du[c]`` the sum of center ``c``'s drifts and ``dl[c]`` that of the largest drift of the other
    centers, over the steps since the full pass (this step's included). So the scan only reads the
    bounds (20 bytes a row, not 36 read and written) and writes those of the failing rows.

    The rows that fail their bounds are gathered, :data:`_SCAN_CHUNK` rows' worth at a time, into a
    feature-major buffer and go through the full pass's tiled distance loop, a tile at a time
    (``centers`` in the block's dtype): their labels and both bounds come out as a full pass would
    make them, at the full pass's cost per row (SIMD over rows) instead of a scalar loop over every
    center per row."""
    d, n = xt.shape
    k = centers.shape[0]
    if limit < n:  # a look at one row in 8 first: most of them failing their bounds, give up now, before
        est = 0    # any distance work (a step that gave up half way cost as much as the full pass)
        seen = 0
        for s0 in range(0, n, _SCAN_STRIDE * _SCAN_RUN):
            for i in range(s0, min(s0 + _SCAN_RUN, n)):
                a = labels[i]
                est += upper[i] + du[a] > max(lower[i] - dl[a], half[a])
            seen += min(_SCAN_RUN, n - s0)
        if est * n > limit * seen:
            return -1, (est * n) // seen
    marg = (d + 8) * (1.1920929e-07 if xt.itemsize == 4 else 2.220446049250313e-16)
    c2, cn, cmax = prepare_centers(centers, xt.dtype)
    dist = np.empty((k, TILE), xt.dtype)
    lab = np.empty(TILE, np.int32)
    mind = np.empty(TILE, xt.dtype)
    mind2 = np.empty(TILE, xt.dtype)
    chunk = xg.shape[1]  # xg: the chunk's failing rows, feature-major; idx: their indices; fail: the flags
    changed = 0
    looked = 0
    for s0 in range(0, n, chunk):
        e = min(n, s0 + chunk)
        for i in range(s0, e):  # flag the rows their moved bounds no longer settle (no branches, no stores)
            a = labels[i]
            fail[i - s0] = upper[i] + du[a] > max(lower[i] - dl[a], half[a])
        cnt = 0
        for i in range(s0, e):  # the flagged rows' indices, in order (a store per row, no branch)
            idx[cnt] = i
            cnt += fail[i - s0]
        looked += cnt
        if looked > limit:  # most rows fail their bounds: a full pass is cheaper than this step
            return -1, looked
        _gather(xt, idx, cnt, xg)
        for t0 in range(0, cnt, TILE):
            m = min(TILE, cnt - t0)
            changed += _step_tile(w, idx[t0:t0 + m], xg, t0, c2, cn, cmax, marg, norms, labels, upper, lower, du,
                                  dl, sums, counts, dist, mind, mind2, lab)
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


def _weights(w: Any) -> np.ndarray | None:
    return None if w is None else np.ascontiguousarray(w, dtype=np.float64)


def first_pass(blk: np.ndarray, cf: np.ndarray, w: Any = None, reuse: BlockBounds | None = None) -> BlockBounds:
    """A block's bounds state for centers ``cf`` (float64) from a full pass; ``reuse``: an earlier
    state of the block whose labels and bounds are overwritten (no new memory to fault in)."""
    n, d = blk.shape
    k = cf.shape[0]
    words = 2 * n + (n + 1) // 2
    old = None if reuse is None else reuse.buffer
    buf = old if isinstance(old, np.ndarray) and old.size >= words else _new_state_buffer(n)
    ul = buf[:2 * n].reshape(2, n)
    labels = buf[2 * n:].view(np.int32)[:n]
    sums = np.zeros((k, d), np.float64)
    counts = np.zeros(k, np.float64)
    q = max(1, min(N_FARTHEST, n))  # the farthest rows, for empty clusters (as lloyd_partial)
    topv, topi, topl = np.full(q, -1.0), np.zeros(q, np.int64), np.zeros(q, np.int64)
    sxx = _first_pass_numba(blk.T, _weights(w), np.ascontiguousarray(cf, dtype=blk.dtype), row_norms(blk), sums,
                            counts, labels, ul, topv, topi, topl)
    keep = topv >= 0
    return BlockBounds(weakref.ref(blk), np.asarray(cf), labels, ul[0], ul[1], sums, counts,
                       (topv[keep], topi[keep], topl[keep]), sxx, buffer=buf,
                       scratch=None if reuse is None else reuse.scratch)


#: NumPy asks the kernel for transparent huge pages from this size of allocation: a state buffer a
#: little smaller is rounded up to it (a fresh state faults in 2 MiB pages, not hundreds of 4 KiB
#: ones: 6 ms less per 750k rows measured; at most 3 MiB more per block)
_HUGE = 1 << 22


def _new_state_buffer(n: int) -> np.ndarray:
    """Labels and both bounds of ``n`` rows in one allocation (float64 words: bounds, then int32
    labels): a buffer a finished fit gave back if one fits (:func:`give_back`: fresh memory costs
    its page faults, 1.4 ms per 187,500-row block measured on a worker, a fifth of the full pass that
    fills it), else a new one."""
    words = 2 * n + (n + 1) // 2
    if _HUGE // 4 <= 8 * words < _HUGE:
        words = _HUGE // 8
    buf = context().state.spares.take(words, np.dtype(np.float64))
    return np.empty(words, np.float64) if buf is None else buf


def give_back(st: BlockBounds) -> None:
    """Hand a finished state's buffer to the next fit's blocks (this process's
    :class:`~gdask.devices.SpareBuffers`); the state's labels and bounds, views of it, are gone."""
    buf = st.buffer
    st.buffer = st.labels = st.upper = st.lower = st.scratch = None
    if isinstance(buf, np.ndarray):
        context().state.spares.give(buf)


def step(blk: np.ndarray, cf: np.ndarray, st: BlockBounds, w: Any, limit: int) -> int:
    """Bring the state from ``st.centers`` to ``cf`` in place (labels, bounds, sums, counts); returns
    the rows that changed cluster, or -1 when more than ``limit`` rows failed their bounds (the state
    is then half moved: rebuild it with :func:`first_pass`)."""
    drift, half, m1, d1, d2, _ = center_geometry(cf, st.centers)
    other = np.full(drift.shape[0], d1)  # each center's rows' lower bounds move by the largest drift of the others
    other[m1] = d2
    du, dl = (drift, other) if st.moved is None else (st.moved[0] + drift, st.moved[1] + other)
    n, d = blk.shape
    chunk = min(_SCAN_CHUNK, n)
    if st.scratch is None or st.scratch[0].shape != (d, chunk) or st.scratch[0].dtype != blk.dtype:
        # kept with the state: fresh buffers cost their page faults every step in a worker process
        # (distributed's nanny sets MALLOC_TRIM_THRESHOLD_, so glibc maps every allocation this large anew):
        # 3.76 -> 3.66 ms a step with it set (8 blocks of 187,500 x 24 float32 rows in turn, median of 480);
        # the block's row norms with them (the state is the block's): no look-up in the worker's state a step
        st.scratch = (np.empty((d, chunk), blk.dtype), np.empty(chunk, np.int64), np.empty(chunk, np.bool_),
                      row_norms(blk))
    xg, idx, fail, norms = st.scratch
    changed, _ = _step_numba(blk.T, _weights(w), np.ascontiguousarray(cf, dtype=blk.dtype), norms,
                             st.labels, st.upper, st.lower, du, dl, half, st.sums, st.counts, int(limit), xg, idx,
                             fail)
    if changed >= 0:
        st.moved = (du, dl)
    return changed


def bounds(st: BlockBounds) -> tuple[np.ndarray, np.ndarray]:
    """Each row's upper bound on the distance to its center and lower bound on the distance to any
    other (float64), from a state the CPU kernels keep (bounds kept against the accumulated drifts)."""
    if st.moved is None:
        return st.upper.copy(), st.lower.copy()
    du, dl = st.moved
    return st.upper + du[st.labels], st.lower - dl[st.labels]


def assigned_sqdist(blk: np.ndarray, centers: Any, labels: np.ndarray) -> np.ndarray:
    """``|x_i - c_{label_i}|^2`` per row, float64."""
    out = np.empty(blk.shape[0], np.float64)
    _assigned_sqdist(blk.T, np.asarray(centers, dtype=np.float64), labels, out)
    return out
