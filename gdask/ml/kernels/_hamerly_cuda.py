"""Hamerly's bounds on CuPy blocks: numba.cuda kernels with the contracts of the CPU kernels.

* :func:`first_pass`: the state from a full pass (kernel ``first-pass`` of
  :mod:`gdask.ml.kernels._kmeans_cuda`), as :func:`gdask.ml.kernels._hamerly_cpu.first_pass`.
* :func:`sweep` / :func:`step` (kernels ``hamerly`` and ``moves``): one bounds step in place, as
  :func:`gdask.ml.kernels._hamerly_xp.step`. The step records the rows that change cluster and moves
  them between the per-cluster sums afterwards, in row order: the same bits every run.
"""

# ruff: noqa: PLR1730, FURB136

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np

from gdask.ml.kernels import _cuda_common as cuc
from gdask.ml.kernels._common import BlockBounds, center_geometry
from gdask.ml.kernels._hamerly_xp import assigned_sqdist
from gdask.ml.kernels._kmeans_cuda import first_pass_state

__all__ = ["assigned_sqdist", "first_pass", "step", "sweep"]

#: ``numba.cuda``, bound by :func:`gdask.ml.kernels._cuda_common.kernel` before a factory compiles
cuda: Any = None


def first_pass(blk: Any, centers: Any, w: Any = None, *, stream: Any = None) -> BlockBounds:
    """The bounds of a block from a full pass, as :func:`gdask.ml.kernels._hamerly_cpu.first_pass`.

    Labels come from the distances in the block's dtype (ties to the lower index). The upper bound
    is the float64 distance to the float64 center; the lower bound is the second smallest distance
    less its worst rounding error (centers cast to the block's dtype, ``(d + 8) eps (|x| + max|c|)^2``),
    ``inf`` for one cluster. Sums, counts and ``sxx`` (``sum w |x|^2``) are float64; the farthest
    rows (squared distances, rows, labels) come on the host. The state's arrays are device arrays.
    See :func:`gdask.ml.kernels._kmeans_cuda.lloyd_partial` for the parameters.
    """
    r = first_pass_state(blk, centers, w, stream=stream)
    xp = r["xp"]
    k, d = r["cf"].shape
    with cuc.stream_scope(xp, stream):
        return BlockBounds(weakref.ref(blk), xp.asarray(r["cf"]), r["labels"], r["upper"], r["lower"],
                           r["sums"].reshape(k, d), r["counts"], r["far"], float(r["totals"][1]))


def _make_hamerly(dtype: np.dtype) -> Any:
    from numba import float64, int64

    _, _, sqdist64, _ = cuc.device_functions()

    @cuda.jit
    def hamerly(xt, cf, labels, upper, lower, drift, half, cc, m1, d1, d2, out, moved_i, moved_old, sh_c):
        d = xt.shape[0]
        n = xt.shape[1]
        k = drift.shape[0]
        tid = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        # dynamic shared memory, 8-byte words: a counter, then the centers (float64) if they fit
        i64 = cuda.shared.array(0, int64)
        f64 = cuda.shared.array(0, float64)
        if tid == 0:
            i64[0] = 0
        if sh_c:
            for p in range(tid, k * d, tpb):
                f64[2 + p] = cf[p]
        cuda.syncthreads()
        looked = 0
        i = cuda.blockIdx.x * tpb + tid
        stride = cuda.gridDim.x * tpb
        while i < n:  # move the bounds by the drift; look again at the rows they no longer settle
            a = labels[i]
            u = upper[i] + drift[a]
            lo = lower[i] - (d2 if a == m1 else d1)
            z = half[a] if half[a] > lo else lo
            if u > z:
                looked += 1
                if sh_c:
                    acc = sqdist64(xt, i, f64, 2 + a * d, d)
                else:
                    acc = sqdist64(xt, i, cf, a * d, d)
                u = math.sqrt(acc)
                if u > z:
                    best = acc
                    bi = a
                    second = math.inf
                    skipped = math.inf
                    for c in range(k):
                        if c == a:
                            continue
                        if cc[a * k + c] >= 2.0 * u:  # d(x, c) >= cc - u >= u: c cannot win (Elkan)
                            if cc[a * k + c] - u < skipped:
                                skipped = cc[a * k + c] - u
                            continue
                        if sh_c:
                            acc = sqdist64(xt, i, f64, 2 + c * d, d)
                        else:
                            acc = sqdist64(xt, i, cf, c * d, d)
                        if acc < best or (acc == best and c < bi):
                            second = best
                            best = acc
                            bi = c
                        elif acc < second:
                            second = acc
                    u = math.sqrt(best)
                    lo = math.sqrt(second)
                    if skipped < lo:
                        lo = skipped
                    if bi != a:  # a move: recorded (in any order); the sums move afterwards, in row order
                        slot = cuda.atomic.add(out, 0, 1)
                        moved_i[slot] = i
                        moved_old[slot] = a
                        labels[i] = bi
            upper[i] = u
            lower[i] = lo
            i += stride
        if looked:
            cuda.atomic.add(i64, 0, looked)
        cuda.syncthreads()
        if tid == 0:
            cuda.atomic.add(out, 1, i64[0])

    return hamerly


def _make_moves(dtype: np.dtype) -> Any:
    from numba import float64

    @cuda.jit
    def moves(xt, w, rows, old, new, sums, counts, weighted):
        """Move the (weighted) rows that changed cluster between the per-cluster sums and counts: one
        thread per (cluster, feature) sum and per count, adding the moves in row order (``rows``
        sorted): the same bits every run, unlike atomic adds."""
        d = xt.shape[0]
        k = counts.shape[0]
        kd = k * d
        m = rows.shape[0]
        s = cuda.grid(1)
        stride = cuda.gridsize(1)
        while s < kd + k:
            if s < kd:
                c = s // d
                j = s - c * d
            else:
                c = s - kd
                j = -1
            acc = 0.0
            for p in range(m):
                o = old[p]
                nw = new[p]
                if o == c or nw == c:
                    r = rows[p]
                    v = w[r] if weighted else 1.0
                    if j >= 0:
                        v *= float64(xt[j, r])
                    if nw == c:
                        acc += v
                    else:
                        acc -= v
            if j >= 0:
                sums[s] += acc
            else:
                counts[c] += acc
            s += stride

    return moves


def sweep(blk: Any, centers: Any, old_centers: Any, labels: Any, upper: Any, lower: Any, sums: Any, counts: Any,
          w: Any = None, *, stream: Any = None) -> tuple[int, int]:
    """One Hamerly step in place, as :func:`gdask.ml.kernels._hamerly_cpu.step` without its early exit.

    Parameters
    ----------
    blk : (n, d) float32 or float64 device array
    centers, old_centers : (k, d) float64 (host or device): the new centers and those the bounds refer to
    labels : (n,) int32 device array; upper, lower : (n,) float64 device arrays
    sums : (k, d) C-contiguous float64 device array; counts : (k,) float64 device array
    w : (n,) device array of row weights, or None
    stream : cupy.cuda.Stream, optional

    Returns
    -------
    tuple of int
        ``(changed, looked)``: rows that changed cluster (their weighted rows moved between ``sums``
        and ``counts``, in row order, so the same bits every run), rows whose bounds failed and got
        their distance recomputed (float64).
    """
    xp = cuc.array_module_of(blk)
    blk = cuc.float_block(blk)
    n, d = blk.shape
    cf = np.asarray(cuc.to_host(centers), dtype=np.float64)
    old = np.asarray(cuc.to_host(old_centers), dtype=np.float64)
    k = cf.shape[0]
    if cf.shape != (k, d) or old.shape != cf.shape or tuple(sums.shape) != (k, d) or tuple(counts.shape) != (k,):
        raise cuc.CudaKernelError(f"centers {cf.shape}, old centers {old.shape}, sums {tuple(sums.shape)} and "
                                  f"counts {tuple(counts.shape)} must be (k, {d}), (k, {d}), (k, {d}) and (k,)")
    for name, a, dt in (("labels", labels, np.int32), ("upper", upper, np.float64), ("lower", lower, np.float64)):
        if tuple(a.shape) != (n,) or a.dtype != dt:
            raise cuc.CudaKernelError(f"{name} must be a ({n},) {np.dtype(dt).name} array, got {tuple(a.shape)} "
                                      f"{a.dtype}")
    if not sums.flags.c_contiguous:
        raise cuc.CudaKernelError("sums must be C-contiguous (it is updated in place through a flat view)")
    drift, half, m1, d1, d2, ccd = center_geometry(cf, old)
    tpb = cuc.threads()
    grid = cuc.grid_for(n, tpb)
    sh_c = 8 * (2 + k * d) <= cuc.SHARED_BUDGET
    with cuc.stream_scope(xp, stream):
        wv = xp.ascontiguousarray(xp.asarray(w, dtype=np.float64)) if w is not None else xp.empty(1, np.float64)
        out = xp.zeros(2, np.int64)
        moved_i = xp.empty(max(n, 1), np.int64)
        moved_old = xp.empty(max(n, 1), np.int32)
        if n:
            shmem = 8 * (2 + (k * d if sh_c else 0))
            cuc.kernel("hamerly", blk.dtype)[grid, tpb, cuc.launch_stream(xp, stream), shmem](
                cuc.arg(blk.T), cuc.arg(xp.asarray(cf.ravel())), cuc.arg(labels, True), cuc.arg(upper, True),
                cuc.arg(lower, True), cuc.arg(xp.asarray(drift)), cuc.arg(xp.asarray(half)),
                cuc.arg(xp.asarray(ccd.ravel())), int(m1), float(d1), float(d2), cuc.arg(out, True),
                cuc.arg(moved_i, True), cuc.arg(moved_old, True), sh_c)
        changed, looked = (int(v) for v in cuc.to_host(out))
        if changed:
            order = xp.argsort(moved_i[:changed])  # row order: the moves are added in it
            rows = xp.ascontiguousarray(moved_i[:changed][order])
            old_l = xp.ascontiguousarray(moved_old[:changed][order])
            new_l = xp.ascontiguousarray(labels[rows])
            slots = k * d + k
            mgrid = max(1, min(-(-slots // tpb), cuc.SIM_MAX_BLOCKS if cuc.simulating() else 1024))
            cuc.kernel("moves", blk.dtype)[mgrid, tpb, cuc.launch_stream(xp, stream)](
                cuc.arg(blk.T), cuc.arg(wv), cuc.arg(rows), cuc.arg(old_l), cuc.arg(new_l),
                cuc.arg(sums.reshape(k * d), True), cuc.arg(counts, True), w is not None)
    return changed, looked


def step(blk: Any, centers: Any, st: BlockBounds, w: Any = None, limit: int | None = None, *,
         stream: Any = None) -> int:
    """Bring a block's bounds state from ``st.centers`` to ``centers`` in place, as
    :func:`gdask.ml.kernels._hamerly_xp.step`: labels, bounds, sums and counts updated (``st.centers`` and
    ``st.far`` left to the caller, as there). Returns the number of rows that changed cluster; never
    gives up (``limit`` is ignored)."""
    changed, _ = sweep(blk, centers, st.centers, st.labels, st.upper, st.lower, st.sums, st.counts, w,
                       stream=stream)
    return changed


cuc.register("hamerly", _make_hamerly)
cuc.register("moves", _make_moves)
