"""numba.cuda kernels for the hot passes of gdask.ml, with the contracts of the CPU kernels.

* :func:`lloyd_partial_cuda` / :func:`assign_cuda`: one K-means pass over a block (nearest center,
  weighted per-cluster sums and counts, inertia, the rows farthest from their centers), as
  :func:`gdask.ml._kernels.lloyd_partial` / :func:`gdask.ml._kernels.assign`.
* :func:`first_pass_cuda` / :func:`bounds_step_cuda`: Hamerly's bounds, as
  :func:`gdask.ml._bounds._first_pass` / :func:`gdask.ml._bounds._step_xp`.
* :func:`loss_grad_cuda`: the weighted logistic loss and its gradient (binomial and multinomial), as
  :func:`gdask.ml._logistic_kernels.loss_grad`.

Every kernel runs one thread per row of the block in a grid-stride loop. Blocks are feature-major
(``blk.T`` is a C-contiguous ``(d, n)`` array), so the threads of a warp that read feature ``j`` of
consecutive rows read consecutive addresses. Nothing copies the block: rows are read in its dtype
and widened to float64 in registers where a float64 result needs them. Small operands (centers,
coefficients) sit in shared memory when they fit. The farthest rows are kept per thread in
registers, selected per thread block in shared memory (``N_FARTHEST`` rounds of an arg-max
reduction) and finished on the host among ``grid * N_FARTHEST`` candidates: no sort of the block.

Sums are deterministic: no floating-point atomics. Within a thread block every sum has one owner
thread that adds its terms in row order (K-means: the rows of a tile of ``blockDim`` rows are
grouped by cluster in shared memory first; logistic: one thread per (row group, class, feature)
slot; totals: a fixed reduction tree); each thread block writes its partials to its own row of a
``(grid, ...)`` buffer, and a second small kernel (:func:`_sum_partials`) adds the rows in
thread-block order. The bounds step records the rows that change cluster and moves them between the
per-cluster sums afterwards, in row order. So a kernel run twice on the same block with the same
grid gives the same bits (gdask's seeded fits are bit-reproducible); against the CPU kernels the
results agree to rounding (another summation order). Integer counters still use atomics (exact).

Inputs are CuPy arrays (or any object with ``__cuda_array_interface__``), and the kernels run on the
caller's stream (``stream=``, by default CuPy's current stream). Under the CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) they take NumPy arrays and run on the simulator's default stream, with
small thread blocks: that is how the kernels are tested without a GPU. Small results come back as
host NumPy data, per-row results stay device arrays, as from the CPU functions.

numba.cuda is imported on the first call (``import gdask`` and this module do not import it), and
each kernel is compiled once per block dtype (:data:`_KERNELS`). The simulator runs one launch at a
time: call these functions from one thread when ``NUMBA_ENABLE_CUDASIM=1``. gdask's block functions
(:mod:`gdask.ml._kernels`, ``_bounds``, ``_logistic_kernels``) call these for CuPy blocks when
:func:`usable` (numba.cuda with a driver, not the simulator) and fall back to their array API code
otherwise, or for more clusters / classes than shared memory holds (:func:`lloyd_fits`,
:func:`logistic_fits`).
"""

# Kernels spell out min / max as comparisons: numba's built-in CUDA target fails to type the
# builtins for floats (checked with numba 0.68 compiling PTX for sm_90).
# ruff: noqa: PLR1730, FURB136

from __future__ import annotations

import logging
import math
import threading
import weakref
from contextlib import nullcontext
from typing import Any

import numpy as np

from gdask.ml import _bounds, _kernels

__all__ = ["assign_cuda", "bounds_step_cuda", "bounds_sweep_cuda", "first_pass_cuda", "lloyd_fits",
           "lloyd_partial_cuda", "logistic_fits", "loss_grad_cuda", "usable"]

logger = logging.getLogger("gdask.ml")

#: the ``numba.cuda`` module once a kernel was asked for; kernels name it as a module global, which
#: the simulator swaps for its own per-launch module
cuda: Any = None

#: threads per block on a GPU, and in the simulator (where every thread is a Python thread)
THREADS = 256
SIM_THREADS = 32
#: blocks per multiprocessor of a grid on a GPU; the whole grid in the simulator, kept small so that
#: its grid-stride loops run several rounds on small test blocks
BLOCKS_PER_SM = 4
SIM_MAX_BLOCKS = 4
#: shared memory a kernel asks for at most (bytes): under the 48 KiB a block gets without opting in
SHARED_BUDGET = 40 * 1024

_lock = threading.RLock()  # a factory asks for the shared device functions under it
#: compiled kernels (numba dispatchers), by kernel name and block dtype
_KERNELS: dict[tuple[str, str], Any] = {}
_SM_COUNT: list[int] = []


class CudaKernelError(ValueError):
    """A block or an operand that the CUDA kernels cannot take (the message names the fix)."""


def _numba_cuda() -> Any:
    global cuda
    if cuda is None:
        from numba import cuda as numba_cuda

        cuda = numba_cuda
    return cuda


def simulating() -> bool:
    """Whether numba runs CUDA kernels in its simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    from numba.core import config

    return bool(config.ENABLE_CUDASIM)


_USABLE: list[bool] = []


def usable() -> bool:
    """Whether the kernels can run on CuPy blocks in this process: numba.cuda imports and sees a driver
    and a GPU, and the simulator (which runs on NumPy arrays) is off. Checked once per process; when
    not, the reason is logged once and CuPy blocks take the array API code."""
    if simulating():
        return False
    if not _USABLE:
        with _lock:
            if not _USABLE:
                try:
                    ok = bool(_numba_cuda().is_available()) and _smoke_test()
                    why = "numba.cuda finds no usable GPU or driver, or its test kernel gave a wrong sum"
                except Exception as e:  # noqa: BLE001 - numba.cuda missing or broken: reported, then not used
                    ok, why = False, f"numba.cuda cannot be used: {type(e).__name__}: {e}"
                if not ok:
                    logger.warning("gdask: %s; CuPy blocks run the array API code instead of the CUDA kernels", why)
                _USABLE.append(ok)
    return _USABLE[0]

# -- host side: inputs, streams, launch shapes ------------------------------------------------------
def _array_module(x: Any) -> Any:
    """The array module that holds the kernels' inputs and outputs: NumPy under the simulator, else
    CuPy (for any object with ``__cuda_array_interface__``)."""
    if simulating():
        if not isinstance(x, np.ndarray):
            raise CudaKernelError(f"the CUDA simulator runs kernels on NumPy arrays, got {type(x).__name__}; "
                                  "pass the block as a NumPy array when NUMBA_ENABLE_CUDASIM=1")
        return np
    if not hasattr(x, "__cuda_array_interface__"):
        raise CudaKernelError(f"the CUDA kernels need a device array (CuPy), got {type(x).__name__}; move the "
                              "block to the GPU first (cupy.asarray), use the CPU kernels of gdask.ml._kernels, "
                              "or set NUMBA_ENABLE_CUDASIM=1 to run the kernels on NumPy in the simulator")
    import cupy

    return cupy


def _float_block(blk: Any, name: str = "block") -> Any:
    xp = _array_module(blk)
    blk = xp.asarray(blk)
    if blk.ndim != 2 or blk.dtype not in (np.float32, np.float64) or blk.shape[1] < 1:
        raise CudaKernelError(f"the {name} must be a 2-D float32 or float64 array with at least one column, got "
                              f"shape {blk.shape} dtype {blk.dtype}; convert it with .astype(numpy.float32) first")
    return blk


def _stream_scope(xp: Any, stream: Any) -> Any:
    """Context in which CuPy's allocations and copies run on ``stream`` (nothing to do otherwise)."""
    if xp is np or stream is None:
        return nullcontext()
    return stream


def _launch_stream(xp: Any, stream: Any) -> Any:
    """The numba stream to launch on: the caller's CuPy stream (default: CuPy's current one)."""
    if xp is np:
        return 0
    if stream is None:
        stream = xp.cuda.get_current_stream()
    ptr = int(getattr(stream, "ptr", 0))
    return cuda.external_stream(ptr) if ptr else cuda.default_stream()


def _arg(x: Any, out: bool = False) -> Any:
    """A kernel argument: device arrays without numba's host synchronisation on the exporter's
    stream (the kernel runs on that stream); in the simulator, inputs are not copied back."""
    if simulating():
        return x if out else cuda.In(x)
    return cuda.as_cuda_array(x, sync=False)


def _threads() -> int:
    return SIM_THREADS if simulating() else THREADS


def _grid(n: int, tpb: int) -> int:
    """Blocks of a grid over ``n`` rows: enough to fill the device, fewer when rows run out."""
    if simulating():
        cap = SIM_MAX_BLOCKS
    else:
        if not _SM_COUNT:
            _SM_COUNT.append(int(cuda.get_current_device().MULTIPROCESSOR_COUNT))
        cap = BLOCKS_PER_SM * _SM_COUNT[0]
    return max(1, min(cap, -(-n // tpb)))


def _host(x: Any) -> np.ndarray:
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _kernel(name: str, dtype: Any) -> Any:
    key = (name, np.dtype(dtype).name)
    with _lock:
        kern = _KERNELS.get(key)
        if kern is None:
            _numba_cuda()
            kern = _KERNELS[key] = _FACTORIES[name](np.dtype(dtype))
    return kern


# -- device functions shared by the kernels ---------------------------------------------------------
def _make_common(_: np.dtype) -> tuple[Any, Any, Any, Any]:
    from numba import float64

    @cuda.jit(device=True)
    def block_sum(red, val):
        """Sum of ``val`` over the thread block (a tree in ``red[:blockDim]``), returned to all."""
        tid = cuda.threadIdx.x
        red[tid] = val
        cuda.syncthreads()
        s = cuda.blockDim.x // 2
        while s > 0:
            if tid < s:
                red[tid] += red[tid + s]
            cuda.syncthreads()
            s //= 2
        out = red[0]
        cuda.syncthreads()
        return out

    @cuda.jit(device=True)
    def sqdist(xt, i, cs, off, d):
        """Squared distance of row ``i`` to ``cs[off:off + d]``, in the block's dtype."""
        v = xt[0, i] - cs[off]
        acc = v * v
        for j in range(1, d):
            v = xt[j, i] - cs[off + j]
            acc += v * v
        return acc

    @cuda.jit(device=True)
    def sqdist64(xt, i, cs, off, d):
        """Squared distance of row ``i`` to ``cs[off:off + d]``, both widened to float64."""
        acc = 0.0
        for j in range(d):
            v = float64(xt[j, i]) - float64(cs[off + j])
            acc += v * v
        return acc

    @cuda.jit(device=True)
    def dot(xt, i, cs, off, d):
        """``x_i . cs[off:off + d]`` in the block's dtype."""
        acc = xt[0, i] * cs[off]
        for j in range(1, d):
            acc += xt[j, i] * cs[off + j]
        return acc

    return block_sum, sqdist, sqdist64, dot


def _common() -> tuple[Any, Any, Any, Any]:
    return _kernel("common", np.float64)


# -- K-means: nearest center, sums, counts, inertia, farthest rows (and the bounds' first pass) ------
def _make_lloyd(dtype: np.dtype) -> Any:
    from numba import float64, from_dtype, int32, int64

    block_sum, sqdist, sqdist64, _ = _common()
    nbdt = from_dtype(dtype)
    isz = dtype.itemsize
    is64 = dtype == np.float64
    eps = float(np.finfo(dtype).eps)
    inf = dtype.type(np.inf)
    q = _kernels.N_FARTHEST
    none = np.iinfo(np.int64).max

    @cuda.jit
    def lloyd(xt, w, cen, cen64, k, part_sums, part_counts, part_tot, far_d, far_i, far_l, labels, rowd, lower,
              cmax, weighted, want_rows, want_stats, want_bounds, sh_sums, sh_c):
        d = xt.shape[0]
        n = xt.shape[1]
        kd = k * d
        tid = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        bid = cuda.blockIdx.x
        # dynamic shared memory, in 8-byte words: [0, tpb) float64 scratch, [tpb, 2 tpb) int64 scratch,
        # the tile's labels (tpb), its rows grouped by cluster (tpb), where each cluster's rows start
        # (k + 1), this thread block's counts (k) and sums (k d, when they fit), then the centers in
        # the block's dtype (when they fit)
        f64 = cuda.shared.array(0, float64)
        i64 = cuda.shared.array(0, int64)
        dts = cuda.shared.array(0, nbdt)
        lab0 = 2 * tpb
        perm0 = 3 * tpb
        st0 = 4 * tpb
        cnt0 = st0 + k + 1
        sum0 = cnt0 + k
        c0 = (sum0 + (kd if sh_sums else 0)) * 8 // isz
        for p in range(tid, k, tpb):
            f64[cnt0 + p] = 0.0
        if want_stats:
            if sh_sums:
                for p in range(tid, kd, tpb):
                    f64[sum0 + p] = 0.0
            else:  # this thread block's row of the partial sums, in global memory
                for p in range(tid, kd, tpb):
                    part_sums[bid * kd + p] = 0.0
        if sh_c:
            for p in range(tid, kd, tpb):
                dts[c0 + p] = cen[p]
        # the q rows farthest from their centers among this thread's rows
        tv = cuda.local.array(q, float64)
        ti = cuda.local.array(q, int64)
        tl = cuda.local.array(q, int32)
        for t in range(q):
            tv[t] = -1.0
            ti[t] = -1
            tl[t] = 0
        thr = -1.0
        my_inertia = 0.0
        my_sxx = 0.0
        cuda.syncthreads()
        base = bid * tpb
        stride = cuda.gridDim.x * tpb
        while base < n:  # one tile of tpb rows per round: the same trip count for the whole block
            i = base + tid
            lab = -1
            if i < n:
                lab = 0
                best = inf
                second = inf
                for c in range(k):  # ties keep the lowest index; a NaN row gets cluster 0, as on the CPU
                    if sh_c:
                        a = sqdist(xt, i, dts, c0 + c * d, d)
                    else:
                        a = sqdist(xt, i, cen, c * d, d)
                    if c == 0:
                        best = a
                    elif a < best:
                        second = best
                        best = a
                        lab = c
                    elif a < second:
                        second = a
                xn = 0.0
                if want_bounds:  # exact distance to the float64 center, |x|^2 for the rounding margin
                    di = 0.0
                    for j in range(d):
                        x = float64(xt[j, i])
                        xn += x * x
                        v = x - cen64[lab * d + j]
                        di += v * v
                    e = (d + 8) * eps * (math.sqrt(xn) + cmax) ** 2
                    labels[i] = lab
                    rowd[i] = math.sqrt(di)
                    lo2 = float64(second) - e
                    lower[i] = math.sqrt(lo2 if lo2 > 0.0 else 0.0)
                elif is64:
                    di = float64(best)
                elif sh_c:
                    di = sqdist64(xt, i, dts, c0 + lab * d, d)
                else:
                    di = sqdist64(xt, i, cen, lab * d, d)
                if want_rows and not want_bounds:
                    labels[i] = lab
                    rowd[i] = di
                if want_stats:
                    wi = w[i] if weighted else 1.0
                    my_inertia += wi * di
                    my_sxx += wi * xn
                    if di > thr:  # replace the nearest of the kept rows
                        tm = 0
                        for t in range(1, q):
                            if tv[t] < tv[tm]:
                                tm = t
                        tv[tm] = di
                        ti[tm] = i
                        tl[tm] = lab
                        thr = tv[0]
                        for t in range(1, q):
                            if tv[t] < thr:
                                thr = tv[t]
            if want_stats:
                # sums and counts without atomics, so that they come out the same bits every run: the
                # tile's rows are grouped by cluster (in row order), then each (cluster, feature) sum
                # belongs to one thread, which adds that cluster's rows in row order
                i64[lab0 + tid] = lab
                cuda.syncthreads()
                for c in range(tid, k, tpb):
                    m = 0
                    for r in range(tpb):
                        if i64[lab0 + r] == c:
                            m += 1
                    i64[st0 + c] = m
                cuda.syncthreads()
                if tid == 0:  # exclusive prefix sum: where each cluster's rows start
                    acc_i = 0
                    for c in range(k):
                        m = i64[st0 + c]
                        i64[st0 + c] = acc_i
                        acc_i += m
                    i64[st0 + k] = acc_i
                cuda.syncthreads()
                if lab >= 0:
                    rank = 0
                    for r in range(tid):
                        if i64[lab0 + r] == lab:
                            rank += 1
                    i64[perm0 + i64[st0 + lab] + rank] = tid
                cuda.syncthreads()
                for s in range(tid, kd, tpb):
                    c = s // d
                    j = s - c * d
                    acc = 0.0
                    for p in range(i64[st0 + c], i64[st0 + c + 1]):
                        r = base + i64[perm0 + p]
                        if weighted:
                            acc += w[r] * float64(xt[j, r])
                        else:
                            acc += float64(xt[j, r])
                    if sh_sums:
                        f64[sum0 + s] += acc
                    else:
                        part_sums[bid * kd + s] += acc
                for c in range(tid, k, tpb):
                    acc = 0.0
                    for p in range(i64[st0 + c], i64[st0 + c + 1]):
                        acc += w[base + i64[perm0 + p]] if weighted else 1.0
                    f64[cnt0 + c] += acc
                cuda.syncthreads()
            base += stride
        if want_stats:
            for p in range(tid, k, tpb):
                part_counts[bid * k + p] = f64[cnt0 + p]
            if sh_sums:
                for p in range(tid, kd, tpb):
                    part_sums[bid * kd + p] = f64[sum0 + p]
            tot = block_sum(f64, my_inertia)  # a fixed tree over the threads: the same bits every run
            if tid == 0:
                part_tot[bid * 2] = tot
            tot = block_sum(f64, my_sxx)
            if tid == 0:
                part_tot[bid * 2 + 1] = tot
            # the block's q farthest rows: q rounds of an arg-max over the threads' candidates
            # (larger distance first, then lower row index)
            out0 = bid * q
            for r in range(q):
                mv = -1.0
                mi = none
                ms = 0
                for t in range(q):
                    if tv[t] >= 0.0 and (tv[t] > mv or (tv[t] == mv and ti[t] < mi)):
                        mv = tv[t]
                        mi = ti[t]
                        ms = t
                f64[tid] = mv
                i64[tpb + tid] = mi
                cuda.syncthreads()
                s = tpb // 2
                while s > 0:
                    if tid < s:
                        ov = f64[tid + s]
                        oi = i64[tpb + tid + s]
                        if ov > f64[tid] or (ov == f64[tid] and oi < i64[tpb + tid]):
                            f64[tid] = ov
                            i64[tpb + tid] = oi
                    cuda.syncthreads()
                    s //= 2
                wv = f64[0]
                wr = i64[tpb]
                cuda.syncthreads()
                if wv < 0.0:  # every thread sees it: no candidate left in this block
                    break
                if mi == wr:
                    far_d[out0 + r] = wv
                    far_i[out0 + r] = wr
                    far_l[out0 + r] = tl[ms]
                    tv[ms] = -1.0

    return lloyd


def _make_rowsum(_: np.dtype) -> Any:
    @cuda.jit
    def rowsum(part, out):
        """``out[c] = sum_r part[r, c]`` adding the rows in order: the fixed-order reduction of the
        thread blocks' partials (one thread per column)."""
        col = cuda.grid(1)
        stride = cuda.gridsize(1)
        while col < part.shape[1]:
            acc = 0.0
            for r in range(part.shape[0]):
                acc += part[r, col]
            out[col] = acc
            col += stride

    return rowsum


def _sum_partials(xp: Any, part: Any, rows: int, cols: int, stream: Any) -> Any:
    """The column sums of the ``(rows, cols)`` float64 partials (one row per thread block), rows added
    in thread-block order on the device: a deterministic result, unlike atomic adds."""
    out = xp.zeros(cols, np.float64)
    if rows and cols:
        tpb = _threads()
        grid = max(1, min(-(-cols // tpb), SIM_MAX_BLOCKS if simulating() else 1024))
        _kernel("rowsum", np.float64)[grid, tpb, _launch_stream(xp, stream)](_arg(part.reshape(rows, cols)),
                                                                             _arg(out, True))
    return out


def _lloyd_base_words(tpb: int, k: int) -> int:
    """8-byte words of shared memory the Lloyd kernel needs whatever fits: scratch, the tile's labels
    and grouping, the clusters' starts and counts."""
    return 4 * tpb + 2 * k + 1


def _lloyd_shared(k: int, d: int, tpb: int, itemsize: int) -> tuple[bool, bool, int]:
    """Whether the sums and the centers fit in shared memory, and the bytes to ask for."""
    used = 8 * _lloyd_base_words(tpb, k)
    if used > SHARED_BUDGET:
        raise CudaKernelError(f"{k} clusters need {used} bytes of shared memory per thread block, more than "
                              f"{SHARED_BUDGET}; use the array API path of gdask.ml._kernels for that many clusters")
    sh_sums = used + 8 * k * d <= SHARED_BUDGET
    used += 8 * k * d if sh_sums else 0
    sh_c = used + itemsize * k * d <= SHARED_BUDGET
    return sh_sums, sh_c, used + (itemsize * k * d if sh_c else 0)


def lloyd_fits(k: int, d: int, itemsize: int = 4) -> bool:
    """Whether the K-means kernels take ``k`` clusters (their shared memory holds the per-cluster
    bookkeeping of a thread block); beyond, the array API code runs."""
    return 8 * _lloyd_base_words(THREADS, k) <= SHARED_BUDGET


def _lloyd_run(blk: Any, centers: Any, w: Any, stream: Any, *, want_rows: bool, want_stats: bool,
               want_bounds: bool) -> dict[str, Any]:
    xp = _array_module(blk)
    blk = _float_block(blk)
    n, d = blk.shape
    dt = blk.dtype
    cf = np.asarray(_host(centers), dtype=np.float64)
    if cf.ndim != 2 or cf.shape[1] != d or cf.shape[0] < 1:
        raise CudaKernelError(f"centers must be a (k, {d}) array with k >= 1 for a block of {d} features, "
                              f"got shape {cf.shape}")
    k = cf.shape[0]
    q = _kernels.N_FARTHEST
    tpb = _threads()
    grid = _grid(n, tpb)
    sh_sums, sh_c, shmem = _lloyd_shared(k, d, tpb, dt.itemsize)
    kern = _kernel("lloyd", dt)
    with _stream_scope(xp, stream):
        cen = xp.asarray(np.ascontiguousarray(cf, dtype=dt).ravel())
        cen64 = xp.asarray(cf.ravel()) if want_bounds else cen
        wv = xp.ascontiguousarray(xp.asarray(w, dtype=np.float64)) if w is not None else xp.empty(1, np.float64)
        if w is not None and wv.shape != (n,):
            raise CudaKernelError(f"weights must have one entry per row ({n}), got shape {wv.shape}")
        # one row of partials per thread block, added in thread-block order afterwards (no atomics)
        part_sums = xp.zeros(grid * k * d if want_stats else 1, np.float64)
        part_counts = xp.zeros(grid * k if want_stats else 1, np.float64)
        part_tot = xp.zeros(grid * 2, np.float64)
        far_d = xp.full(grid * q, -1.0)
        far_i = xp.full(grid * q, -1, np.int64)
        far_l = xp.zeros(grid * q, np.int32)
        rows = want_rows or want_bounds
        labels = xp.empty(n if rows else 1, np.int32)
        rowd = xp.empty(n if rows else 1, np.float64)
        lower = xp.empty(n if want_bounds else 1, np.float64)
        cmax = float(np.sqrt((cf * cf).sum(1).max()))
        if n:
            kern[grid, tpb, _launch_stream(xp, stream), shmem](
                _arg(blk.T), _arg(wv), _arg(cen), _arg(cen64), k, _arg(part_sums, True), _arg(part_counts, True),
                _arg(part_tot, True), _arg(far_d, True), _arg(far_i, True), _arg(far_l, True), _arg(labels, True),
                _arg(rowd, True), _arg(lower, True), cmax, w is not None, bool(want_rows), bool(want_stats),
                bool(want_bounds), sh_sums, sh_c)
        out: dict[str, Any] = {"xp": xp, "blk": blk, "labels": labels, "rowd": rowd, "lower": lower, "cf": cf}
        if want_stats:
            out["sums"] = _sum_partials(xp, part_sums, grid, k * d, stream)
            out["counts"] = _sum_partials(xp, part_counts, grid, k, stream)
            out["totals"] = _host(_sum_partials(xp, part_tot, grid, 2, stream))
            out["far"] = _select_far(_host(far_d), _host(far_i), _host(far_l), min(q, n))
    return out


def _select_far(fd: np.ndarray, fi: np.ndarray, fl: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray,
                                                                                   np.ndarray]:
    """The ``q`` farthest of the thread blocks' candidates (larger distance first, then lower row):
    a partition, not a sort, of ``grid * N_FARTHEST`` values."""
    keep = fi >= 0
    fd, fi, fl = fd[keep], fi[keep], fl[keep].astype(np.int64)
    if fd.size > q:
        t = np.partition(fd, fd.size - q)[fd.size - q]  # the q-th largest distance
        above = np.flatnonzero(fd > t)
        tied = np.flatnonzero(fd == t)
        sel = np.concatenate([above, tied[np.argsort(fi[tied], kind="stable")][:q - above.size]])
        fd, fi, fl = fd[sel], fi[sel], fl[sel]
    return fd, fi, fl


def lloyd_partial_cuda(blk: Any, centers: Any, w: Any = None, *, stream: Any = None) -> dict[str, Any]:
    """One block's Lloyd statistics on the GPU, as :func:`gdask.ml._kernels.lloyd_partial`.

    Parameters
    ----------
    blk : (n, d) float32 or float64 device array, feature-major (Fortran order) for coalesced reads
    centers : (k, d) array (host or device); distances use it in the block's dtype
    w : (n,) device array of row weights, or None
    stream : cupy.cuda.Stream, optional
        Stream to run on; CuPy's current stream by default. Ignored by the simulator.

    Returns
    -------
    dict
        ``sums (k, d)`` and ``counts (k,)`` (host float64, weighted by ``w``), ``inertia`` (float,
        the weighted sum of squared distances of the rows to their centers, in float64), and the
        ``min(N_FARTHEST, n)`` rows farthest from their centers: ``far_d`` (squared distances),
        ``far_label`` (int64), ``far_rows`` (host, the block's dtype) and ``far_w`` (float64).
        Ties between equally far rows go to the lower row index.

    Raises
    ------
    CudaKernelError
        For a block that is not a 2-D float32/float64 device array (a NumPy array outside the
        simulator), centers of the wrong shape, or more clusters than shared memory holds.
    """
    r = _lloyd_run(blk, centers, w, stream, want_rows=False, want_stats=True, want_bounds=False)
    xp = r["xp"]
    k, d = r["cf"].shape
    fd, fi, fl = r["far"]
    with _stream_scope(xp, stream):
        far_rows = _host(r["blk"][xp.asarray(fi)])
        far_w = np.ones(fi.size) if w is None else _host(xp.asarray(w)[xp.asarray(fi)]).astype(np.float64)
        return {"sums": _host(r["sums"]).reshape(k, d), "counts": _host(r["counts"]),
                "inertia": float(r["totals"][0]), "far_d": fd, "far_label": fl, "far_rows": far_rows,
                "far_w": far_w}


def assign_cuda(blk: Any, centers: Any, *, stream: Any = None) -> tuple[Any, Any]:
    """Labels (int32) and squared distance to the nearest center (float64) of each row, as device
    arrays, as :func:`gdask.ml._kernels.assign`. The argmin uses the block's dtype (ties to the
    lower index); the distance is recomputed in float64 from the rows and the centers cast to the
    block's dtype. See :func:`lloyd_partial_cuda` for the parameters."""
    r = _lloyd_run(blk, centers, None, stream, want_rows=True, want_stats=False, want_bounds=False)
    return r["labels"], r["rowd"]


# -- Hamerly's bounds --------------------------------------------------------------------------------
def first_pass_cuda(blk: Any, centers: Any, w: Any = None, *, stream: Any = None) -> _bounds.BlockBounds:
    """The bounds of a block from a full pass, as :func:`gdask.ml._bounds._first_pass`.

    Labels come from the distances in the block's dtype (ties to the lower index). The upper bound
    is the float64 distance to the float64 center; the lower bound is the second smallest distance
    less its worst rounding error (centers cast to the block's dtype, ``(d + 8) eps (|x| + max|c|)^2``),
    ``inf`` for one cluster. Sums, counts and ``sxx`` (``sum w |x|^2``) are float64; the farthest
    rows (squared distances, rows, labels) come on the host. The state's arrays are device arrays.
    See :func:`lloyd_partial_cuda` for the parameters.
    """
    r = _lloyd_run(blk, centers, w, stream, want_rows=True, want_stats=True, want_bounds=True)
    xp = r["xp"]
    k, d = r["cf"].shape
    with _stream_scope(xp, stream):
        return _bounds.BlockBounds(weakref.ref(blk), xp.asarray(r["cf"]), r["labels"], r["rowd"], r["lower"],
                                   r["sums"].reshape(k, d), r["counts"], r["far"], float(r["totals"][1]))


def _make_hamerly(dtype: np.dtype) -> Any:
    from numba import float64, int64

    _, _, sqdist64, _ = _common()

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


def bounds_sweep_cuda(blk: Any, centers: Any, old_centers: Any, labels: Any, upper: Any, lower: Any, sums: Any,
                      counts: Any, w: Any = None, *, stream: Any = None) -> tuple[int, int]:
    """One Hamerly step in place, as :func:`gdask.ml._bounds._hamerly_numba` without its early exit.

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
    xp = _array_module(blk)
    blk = _float_block(blk)
    n, d = blk.shape
    cf = np.asarray(_host(centers), dtype=np.float64)
    old = np.asarray(_host(old_centers), dtype=np.float64)
    k = cf.shape[0]
    if cf.shape != (k, d) or old.shape != cf.shape or tuple(sums.shape) != (k, d) or tuple(counts.shape) != (k,):
        raise CudaKernelError(f"centers {cf.shape}, old centers {old.shape}, sums {tuple(sums.shape)} and counts "
                              f"{tuple(counts.shape)} must be (k, {d}), (k, {d}), (k, {d}) and (k,)")
    for name, a, dt in (("labels", labels, np.int32), ("upper", upper, np.float64), ("lower", lower, np.float64)):
        if tuple(a.shape) != (n,) or a.dtype != dt:
            raise CudaKernelError(f"{name} must be a ({n},) {np.dtype(dt).name} array, got {tuple(a.shape)} {a.dtype}")
    if not sums.flags.c_contiguous:
        raise CudaKernelError("sums must be C-contiguous (it is updated in place through a flat view)")
    drift, half, m1, d1, d2, cc = _bounds._center_geometry(cf, old)
    tpb = _threads()
    grid = _grid(n, tpb)
    sh_c = 8 * (2 + k * d) <= SHARED_BUDGET
    with _stream_scope(xp, stream):
        wv = xp.ascontiguousarray(xp.asarray(w, dtype=np.float64)) if w is not None else xp.empty(1, np.float64)
        out = xp.zeros(2, np.int64)
        moved_i = xp.empty(max(n, 1), np.int64)
        moved_old = xp.empty(max(n, 1), np.int32)
        if n:
            _kernel("hamerly", blk.dtype)[grid, tpb, _launch_stream(xp, stream), 8 * (2 + (k * d if sh_c else 0))](
                _arg(blk.T), _arg(xp.asarray(cf.ravel())), _arg(labels, True), _arg(upper, True), _arg(lower, True),
                _arg(xp.asarray(drift)), _arg(xp.asarray(half)), _arg(xp.asarray(cc.ravel())), int(m1), float(d1),
                float(d2), _arg(out, True), _arg(moved_i, True), _arg(moved_old, True), sh_c)
        changed, looked = (int(v) for v in _host(out))
        if changed:
            order = xp.argsort(moved_i[:changed])  # row order: the moves are added in it
            rows = xp.ascontiguousarray(moved_i[:changed][order])
            old_l = xp.ascontiguousarray(moved_old[:changed][order])
            new_l = xp.ascontiguousarray(labels[rows])
            slots = k * d + k
            mgrid = max(1, min(-(-slots // tpb), SIM_MAX_BLOCKS if simulating() else 1024))
            _kernel("moves", blk.dtype)[mgrid, tpb, _launch_stream(xp, stream)](
                _arg(blk.T), _arg(wv), _arg(rows), _arg(old_l), _arg(new_l), _arg(sums.reshape(k * d), True),
                _arg(counts, True), w is not None)
    return changed, looked


def bounds_step_cuda(blk: Any, centers: Any, st: _bounds.BlockBounds, w: Any = None, *, stream: Any = None) -> int:
    """Bring a block's bounds state from ``st.centers`` to ``centers`` in place, as
    :func:`gdask.ml._bounds._step_xp`: labels, bounds, sums and counts updated (``st.centers`` and
    ``st.far`` left to the caller, as there). Returns the number of rows that changed cluster."""
    changed, _ = bounds_sweep_cuda(blk, centers, st.centers, st.labels, st.upper, st.lower, st.sums, st.counts, w,
                                   stream=stream)
    return changed


# -- logistic regression: loss and gradient ----------------------------------------------------------
def _make_logistic(dtype: np.dtype) -> Any:
    from numba import float64, from_dtype

    block_sum, _, _, dot = _common()
    nbdt = from_dtype(dtype)
    isz = dtype.itemsize

    @cuda.jit
    def logistic(xt, y, coef, icpt, w, cw, part, part_loss, weighted, has_cw, sh_c, sh_acc, groups):
        d = xt.shape[0]
        n = xt.shape[1]
        kc = icpt.shape[0]
        nf = kc * (d + 1)  # gradient slots: (class, feature), feature d being the intercept
        tid = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        # dynamic shared memory, 8-byte words: [0, tpb) scratch, the tile's residuals (tpb x kc),
        # the gradient slots of `groups` row groups (when they fit), then the coefficients (dtype)
        f64 = cuda.shared.array(0, float64)
        dts = cuda.shared.array(0, nbdt)
        r0 = tpb
        a0 = r0 + tpb * kc
        c0 = (a0 + (groups * nf if sh_acc else 0)) * 8 // isz
        bid = cuda.blockIdx.x
        if sh_acc:
            for p in range(tid, groups * nf, tpb):
                f64[a0 + p] = 0.0
        else:  # one row group: this thread block's row of the partials, each slot owned by one thread
            for p in range(tid, nf, tpb):
                part[bid * nf + p] = 0.0
        if sh_c:
            for p in range(tid, kc * d, tpb):
                dts[c0 + p] = coef[p]
        cuda.syncthreads()
        my_loss = 0.0
        base = cuda.blockIdx.x * tpb
        stride = cuda.gridDim.x * tpb
        while base < n:  # the same trip count for the whole block: it synchronises inside
            i = base + tid
            if i < n:
                yi = y[i]
                s = w[i] if weighted else 1.0
                if has_cw:
                    s *= cw[yi]
                for c in range(kc):  # raw predictions, in the block's dtype
                    if sh_c:
                        zc = dot(xt, i, dts, c0 + c * d, d)
                    else:
                        zc = dot(xt, i, coef, c * d, d)
                    f64[r0 + tid * kc + c] = float64(zc + icpt[c])
                if kc == 1:  # loss log(1 + e^z) - y z, residual sigmoid(z) - y
                    z = f64[r0 + tid]
                    e = math.exp(-abs(z))
                    sig = 1.0 / (1.0 + e)
                    p = sig if z >= 0 else e * sig
                    loss = (z if z > 0.0 else 0.0) + math.log1p(e) - yi * z
                    f64[r0 + tid] = s * (p - yi)
                else:  # loss logsumexp(z) - z_y, residual softmax(z) - onehot(y)
                    m = f64[r0 + tid * kc]
                    for c in range(1, kc):
                        if f64[r0 + tid * kc + c] > m:
                            m = f64[r0 + tid * kc + c]
                    tot = 0.0
                    for c in range(kc):
                        tot += math.exp(f64[r0 + tid * kc + c] - m)
                    loss = m + math.log(tot) - f64[r0 + tid * kc + yi]
                    for c in range(kc):
                        p = math.exp(f64[r0 + tid * kc + c] - m) / tot
                        f64[r0 + tid * kc + c] = s * (p - (1.0 if c == yi else 0.0))
                my_loss += s * loss
            else:
                for c in range(kc):
                    f64[r0 + tid * kc + c] = 0.0
            cuda.syncthreads()
            # gradient: each slot (row group g, class c, feature j) belongs to one thread, which
            # adds the residuals times feature j over the tile's rows of its group
            m_rows = n - base if n - base < tpb else tpb
            sp = tid
            while sp < groups * nf:
                g = sp // nf
                f = sp - g * nf
                c = f // (d + 1)
                j = f - c * (d + 1)
                acc = 0.0
                r = g
                if j == d:
                    while r < m_rows:
                        acc += f64[r0 + r * kc + c]
                        r += groups
                else:
                    while r < m_rows:
                        acc += f64[r0 + r * kc + c] * float64(xt[j, base + r])
                        r += groups
                if sh_acc:
                    f64[a0 + sp] += acc
                else:
                    part[bid * nf + sp] += acc
                sp += tpb
            cuda.syncthreads()
            base += stride
        tot = block_sum(f64, my_loss)  # a fixed tree: the same bits every run
        if tid == 0:
            part_loss[bid] = tot
        if sh_acc:  # this thread block's partials, the row groups added in order
            for f in range(tid, nf, tpb):
                acc = 0.0
                for g in range(groups):
                    acc += f64[a0 + g * nf + f]
                part[bid * nf + f] = acc

    return logistic


def _smoke_test() -> bool:
    """Compile and run the smallest kernel once on CuPy arrays (numba.cuda may import and see a GPU yet
    lack the compiler it needs, e.g. libNVVM)."""
    import cupy

    part = cupy.arange(6, dtype=np.float64).reshape(2, 3)
    out = _sum_partials(cupy, part, 2, 3, None)
    cupy.cuda.get_current_stream().synchronize()
    return bool((out.get() == np.array([3.0, 5.0, 7.0])).all())


def logistic_fits(n_coef_rows: int) -> bool:
    """Whether :func:`loss_grad_cuda` takes ``n_coef_rows`` coefficient rows (1 for binary, else the
    number of classes): a tile's residuals must fit in shared memory."""
    return 8 * 32 * (int(n_coef_rows) + 1) <= SHARED_BUDGET


def loss_grad_cuda(X: Any, y: Any, coef: Any, intercept: Any, w: Any = None, class_w: Any = None, *,
                   stream: Any = None) -> tuple[float, np.ndarray, np.ndarray]:
    """One block's partial of the weighted log-loss and its gradient on the GPU, as
    :func:`gdask.ml._logistic_kernels.loss_grad`.

    Parameters
    ----------
    X : (n, d) float32 or float64 device array, feature-major for coalesced reads
    y : (n,) integer device array of class codes (0/1 for one coefficient row, else 0..K-1)
    coef : (K, d) and intercept : (K,), host or device; the raw predictions use them in X's dtype
    w : (n,) device array of sample weights, or None
    class_w : (n_classes,) weight per class (host or device), or None
    stream : cupy.cuda.Stream, optional

    Returns
    -------
    tuple
        ``(sum_i s_i loss_i, grad_coef (K, d), grad_intercept (K,))``, host float64; the row terms are
        float64 from the raw predictions, every sum float64.

    Raises
    ------
    CudaKernelError
        For inputs of the wrong kind or shape, or so many classes that a tile's residuals do not fit
        in shared memory.
    """
    xp = _array_module(X)
    X = _float_block(X, "X")
    n, d = X.shape
    dt = X.dtype
    c = np.asarray(_host(coef), dtype=np.float64)
    b = np.atleast_1d(np.asarray(_host(intercept), dtype=np.float64))
    if c.ndim != 2 or c.shape[1] != d or b.shape != (c.shape[0],):
        raise CudaKernelError(f"coef must be (K, {d}) and intercept (K,), got {c.shape} and {b.shape}")
    kc = c.shape[0]
    if tuple(y.shape) != (n,) or np.dtype(y.dtype).kind not in "iu":
        raise CudaKernelError(f"y must be ({n},) integer class codes (encode_labels), got {tuple(y.shape)} {y.dtype}")
    tpb = _threads()
    while 8 * tpb * (kc + 1) > SHARED_BUDGET and tpb > 32:
        tpb //= 2
    used = 8 * tpb * (kc + 1)
    if used > SHARED_BUDGET:
        raise CudaKernelError(f"{kc} classes need {used} bytes of shared memory per thread block, more than "
                              f"{SHARED_BUDGET}; use gdask.ml._logistic_kernels.loss_grad for that many classes")
    nf = kc * (d + 1)
    groups = max(1, tpb // nf)
    sh_acc = used + 8 * groups * nf <= SHARED_BUDGET
    if sh_acc:
        used += 8 * groups * nf
    else:  # slots go to the thread block's row of the partials: one owner per slot, no atomics
        groups = 1
    sh_c = used + dt.itemsize * kc * d <= SHARED_BUDGET
    used += dt.itemsize * kc * d if sh_c else 0
    grid = _grid(n, tpb)
    kern = _kernel("logistic", dt)
    with _stream_scope(xp, stream):
        wv = xp.ascontiguousarray(xp.asarray(w, dtype=np.float64)) if w is not None else xp.empty(1, np.float64)
        cw = xp.asarray(np.asarray(_host(class_w), dtype=np.float64)) if class_w is not None else xp.empty(1)
        part = xp.zeros(grid * nf, np.float64)  # one row of partials per thread block, added in order after
        part_loss = xp.zeros(grid, np.float64)
        if n:
            kern[grid, tpb, _launch_stream(xp, stream), used](
                _arg(X.T), _arg(xp.asarray(y)), _arg(xp.asarray(np.ascontiguousarray(c, dtype=dt).ravel())),
                _arg(xp.asarray(b.astype(dt))), _arg(wv), _arg(cw), _arg(part, True), _arg(part_loss, True),
                w is not None, class_w is not None, sh_c, sh_acc, groups)
        g = _host(_sum_partials(xp, part, grid, nf, stream)).reshape(kc, d + 1)
        loss = float(_host(_sum_partials(xp, part_loss, grid, 1, stream))[0])
        return loss, np.ascontiguousarray(g[:, :d]), np.ascontiguousarray(g[:, d])


_FACTORIES = {"common": _make_common, "lloyd": _make_lloyd, "rowsum": _make_rowsum, "hamerly": _make_hamerly,
              "moves": _make_moves, "logistic": _make_logistic}
