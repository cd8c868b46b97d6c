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
#: prefetches (short ones jump between features every few cache lines); capped so each of the two
#: buffers of gathered rows (float64) takes at most ``_STEP_BUFFER`` bytes
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


@njit(nogil=True, fastmath={"contract"}, cache=True)
def _step_numba(xt, w, cf, labels, upper, lower, sums, counts, drift, half, m1, d1, d2, cc,  # pragma: no cover
                limit):  # compiled
    """One bounds step; ``looked`` > ``limit`` rows failing their bounds aborts it (returns changed = -1,
    the state is then half moved and must be rebuilt by a full pass). A sample of every
    :data:`_SCAN_STRIDE`-th row estimates ``looked`` first: above ``limit``, it aborts at once (the
    state untouched).

    Per tile of rows: the bounds move by the drift; the rows they no longer settle are gathered
    feature by feature (feature-major, as the block) with their distance to their own center, all
    vectorised over those rows; the rows still unsettled then get their distances to every center,
    again vectorised over rows (no per-center pruning: a SIMD pass over all ``k`` costs less than
    branching per center, and gives the exact second-nearest distance, a tighter lower bound). Each
    distance sums its features in order (no reassociation) and the labels take the lowest index among
    equal distances: a full pass's labels. Changed rows move their sums and counts in row order.
    ``cc`` (center-center distances) is not used here."""
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
    idx = np.empty(tile, np.int64)  # the tile's unsettled rows
    zt = np.empty(tile, np.float64)  # ... the bound their distance to their own center must beat
    lt = np.empty(tile, np.int32)  # ... their labels
    acc = np.empty(tile, np.float64)
    xg = np.empty((d, tile), np.float64)  # ... their features
    sel = np.empty(tile, np.int64)  # those still unsettled after their own distance
    xh = np.empty((d, tile), np.float64)  # ... their features
    dist = np.empty(tile, np.float64)
    best = np.empty(tile, np.float64)
    second = np.empty(tile, np.float64)
    bi = np.empty(tile, np.int32)
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
        for t in range(cnt):
            lt[t] = labels[idx[t]]
            acc[t] = 0.0
        for j in range(d):  # gather feature by feature (one forward read per feature), own distance
            xrow = xt[j]
            g = xg[j]
            for t in range(cnt):
                v = np.float64(xrow[idx[t]])
                g[t] = v
                e = v - cf[lt[t], j]
                acc[t] += e * e
        cnt2 = 0
        for t in range(cnt):
            u = np.sqrt(acc[t])
            upper[idx[t]] = u
            if u > zt[t]:
                sel[cnt2] = t
                cnt2 += 1
        if cnt2 == 0:
            continue
        for j in range(d):
            g = xg[j]
            h = xh[j]
            for s in range(cnt2):
                h[s] = g[sel[s]]
        for s in range(cnt2):
            best[s] = np.inf
            second[s] = np.inf
            bi[s] = 0
        for c in range(k):  # every center, vectorised over the rows (selects, no branches)
            for s in range(cnt2):
                dist[s] = 0.0
            for j in range(d):
                cj = cf[c, j]
                h = xh[j]
                for s in range(cnt2):
                    e = h[s] - cj
                    dist[s] += e * e
            ci = np.int32(c)
            for s in range(cnt2):
                dv = dist[s]
                b = best[s]
                sc = second[s]
                second[s] = b if dv < b else (dv if dv < sc else sc)
                bi[s] = ci if dv < b else bi[s]
                best[s] = dv if dv < b else b
        for s in range(cnt2):  # row order: the sums change as a full pass's assignment would
            t = sel[s]
            i = idx[t]
            a = lt[t]
            b = bi[s]
            upper[i] = np.sqrt(best[s])
            lower[i] = np.sqrt(second[s])
            if b != a:
                wi = 1.0 if w is None else w[i]
                sa = sums[a]
                sb = sums[b]
                for j in range(d):
                    x = wi * xh[j, s]
                    sa[j] -= x
                    sb[j] += x
                counts[a] -= wi
                counts[b] += wi
                labels[i] = b
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


def first_pass(blk: np.ndarray, cf: np.ndarray, w: Any = None) -> BlockBounds:
    """A block's bounds state for centers ``cf`` (float64) from a full pass."""
    n, d = blk.shape
    k = cf.shape[0]
    # labels and both bounds in one allocation: from 4 MiB NumPy asks for huge pages, which
    # saves most of the page faults of first touching a new state (a few ms per block)
    buf = np.empty(2 * n + (n + 1) // 2, np.float64)
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
                       (topv[keep], topi[keep], topl[keep]), sxx)


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
