"""Hamerly's bounds on NumPy blocks: numba CPU kernels.

* :func:`first_pass`: a full tiled pass (the distance loop of the Lloyd kernel) that builds labels,
  both bounds, per-cluster sums and counts, ``sum w |x|^2`` and the farthest rows
  (:func:`_first_pass_numba`).
* :func:`step`: one bounds step, row by row (:func:`_step_numba`); it gives up (returns -1) once too
  many rows fail their bounds, when a full pass is cheaper.
* :func:`assigned_sqdist`: squared distance of each row to its labelled center (float64).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
from numba import njit

from gdask.ml.kernels._common import N_FARTHEST, BlockBounds, center_geometry
from gdask.ml.kernels._cpu_common import (
    FASTMATH,
    TILE,
    exact_sqdist,
    expanded_error,
    keep_farthest,
    prepare_centers,
    row_norms,
    smallest,
    tile_argmin2,
    tile_distances,
)

__all__ = ["assigned_sqdist", "first_pass", "step"]

#: rows per tile of a bounds step, at most: the rows that fail their bounds are gathered feature by
#: feature, and long tiles make each feature's reads one long forward stream that the hardware
#: prefetches (short ones jump between features every few cache lines); capped so the gathered
#: rows (float64) take at most ``_STEP_BUFFER`` bytes
_STEP_TILE = 4096
_STEP_BUFFER = 1 << 20
#: a bounds step first looks at every this many rows: when the rows failing their bounds there
#: (times this) exceed the step's limit, it gives up before moving anything
_SCAN_STRIDE = 8


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
        for i in range(m):
            li = lab[i]
            srow = sums[li]
            if w is None:
                for j in range(d):
                    srow[j] += xt[j, i0 + i]
                counts[li] += 1.0
            else:
                wi = w[i0 + i]
                for j in range(d):
                    srow[j] += wi * xt[j, i0 + i]
                counts[li] += wi
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
    return sxx


@njit(nogil=True, fastmath={"reassoc", "contract"}, cache=True)
def _step_numba(xt, w, cf, labels, upper, lower, sums, counts, drift, half, m1, d1, d2, cc,  # pragma: no cover
                limit):  # compiled
    """One bounds step; ``looked`` > ``limit`` rows failing their bounds aborts it (returns changed = -1,
    the state is then half moved and must be rebuilt by a full pass). A sample of every
    :data:`_SCAN_STRIDE`-th row estimates ``looked`` first: above ``limit``, it aborts at once (the
    state untouched)."""
    d, n = xt.shape
    k = cf.shape[0]
    if limit < n:  # a look at every 8th row first: most of them failing their bounds, give up now,
        est = 0    # before any distance work (a step that gave up half way cost as much as the full pass)
        for i in range(0, n, _SCAN_STRIDE):
            a = labels[i]
            est += upper[i] + drift[a] > max(lower[i] - (d2 if a == m1 else d1), half[a])
        if est * _SCAN_STRIDE > limit:
            return -1, est * _SCAN_STRIDE
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
                wi = 1.0 if w is None else w[i]
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
                       (topv[keep], topi[keep], topl[keep]), sxx, buffer=buf)


#: NumPy asks the kernel for transparent huge pages from this size of allocation: a state buffer a
#: little smaller is rounded up to it (a fresh state faults in 2 MiB pages, not hundreds of 4 KiB
#: ones: 6 ms less per 750k rows measured; at most 3 MiB more per block)
_HUGE = 1 << 22


def _new_state_buffer(n: int) -> np.ndarray:
    """Labels and both bounds of ``n`` rows in one allocation (float64 words: bounds, then int32 labels)."""
    words = 2 * n + (n + 1) // 2
    if _HUGE // 4 <= 8 * words < _HUGE:
        words = _HUGE // 8
    return np.empty(words, np.float64)


def step(blk: np.ndarray, cf: np.ndarray, st: BlockBounds, w: Any, limit: int) -> int:
    """Bring the state from ``st.centers`` to ``cf`` in place (labels, bounds, sums, counts); returns
    the rows that changed cluster, or -1 when more than ``limit`` rows failed their bounds (the state
    is then half moved: rebuild it with :func:`first_pass`)."""
    drift, half, m1, d1, d2, cc = center_geometry(cf, st.centers)
    changed, _ = _step_numba(blk.T, _weights(w), cf, st.labels, st.upper, st.lower, st.sums, st.counts, drift,
                             half, m1, d1, d2, cc, int(limit))
    return changed


def assigned_sqdist(blk: np.ndarray, centers: Any, labels: np.ndarray) -> np.ndarray:
    """``|x_i - c_{label_i}|^2`` per row, float64."""
    out = np.empty(blk.shape[0], np.float64)
    _assigned_sqdist(blk.T, np.asarray(centers, dtype=np.float64), labels, out)
    return out
