"""K-means on CuPy blocks: numba.cuda kernels with the contracts of the CPU kernels.

* :func:`lloyd_partial` (kernel ``lloyd-stats``): nearest center, weighted per-cluster sums and counts,
  inertia, the rows farthest from their centers.
* :func:`assign` (kernel ``assign``): labels and the squared distance to the nearest center.
* :func:`first_pass_state` (kernel ``first-pass``): the above for Hamerly's bounds, with both bounds per
  row (used by :mod:`gdask.ml.kernels._hamerly_cuda`).

Every kernel runs one thread per row of the block in a grid-stride loop; the three share the device
functions of :func:`_make_parts`. Blocks are feature-major (``blk.T`` is a C-contiguous ``(d, n)``
array), so the threads of a warp that read feature ``j`` of consecutive rows read consecutive
addresses. Nothing copies the block: rows are read in its dtype and widened to float64 in registers
where a float64 result needs them. The centers sit in shared memory when they fit. The farthest rows
are kept per thread in registers, selected per thread block in shared memory (``N_FARTHEST`` rounds of
an arg-max reduction) and finished on the host among ``grid * N_FARTHEST`` candidates: no sort.

Sums are deterministic: within a thread block every (cluster, feature) sum has one owner thread that
adds its terms in row order (the rows of a tile of ``blockDim`` rows are grouped by cluster in shared
memory first); totals take a fixed reduction tree; thread blocks' partials are added in thread-block
order (:func:`gdask.ml.kernels._cuda_common.sum_partials`).
"""

# ruff: noqa: PLR1730, FURB136

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gdask.ml.kernels import _cuda_common as cuc
from gdask.ml.kernels import _lloyd_cuda
from gdask.ml.kernels._common import N_FARTHEST

__all__ = ["assign", "first_pass_state", "fits", "lloyd_partial"]

#: ``numba.cuda``, bound by :func:`gdask.ml.kernels._cuda_common.kernel` before a factory compiles
cuda: Any = None


def _make_parts(dtype: np.dtype) -> Any:
    """The device functions the K-means kernels share."""
    from numba import float64

    _, sqdist, _, _ = cuc.device_functions()
    inf = dtype.type(np.inf)
    q = N_FARTHEST
    none = np.iinfo(np.int64).max

    @cuda.jit(device=True)
    def nearest(xt, i, cs, off, k, d):
        """(label, best, second) of row ``i`` among the centers ``cs[off:]``, distances in the block's
        dtype; ties keep the lowest index, a NaN row gets cluster 0 (as on the CPU)."""
        lab = 0
        best = inf
        second = inf
        for c in range(k):
            a = sqdist(xt, i, cs, off + c * d, d)
            if c == 0:
                best = a
            elif a < best:
                second = best
                best = a
                lab = c
            elif a < second:
                second = a
        return lab, best, second

    @cuda.jit(device=True)
    def keep_far(tv, ti, tl, thr, di, i, lab):
        """Keep row ``i`` among this thread's farthest rows when it beats the nearest of them."""
        if di > thr:
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
        return thr

    @cuda.jit(device=True)
    def tile_sums(xt, w, weighted, lab, base, f64, i64, k, sh_sums, part_sums):
        """Add the tile's rows (this thread's row has cluster ``lab``, -1 past the end) to this thread
        block's sums and counts without atomics: the tile's rows are grouped by cluster (in row order),
        then each (cluster, feature) sum belongs to one thread, which adds that cluster's rows in row
        order. Shared layout as :func:`_layout`."""
        d = xt.shape[0]
        kd = k * d
        tid = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        bid = cuda.blockIdx.x
        lab0 = 2 * tpb
        perm0 = 3 * tpb
        st0 = 4 * tpb
        cnt0 = st0 + k + 1
        sum0 = cnt0 + k
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

    @cuda.jit(device=True)
    def start_stats(f64, k, d, sh_sums, part_sums):
        """Zero this thread block's counts and sums (shared, or its row of ``part_sums``)."""
        tid = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        cnt0 = 4 * tpb + k + 1
        for p in range(tid, k, tpb):
            f64[cnt0 + p] = 0.0
        if sh_sums:
            for p in range(tid, k * d, tpb):
                f64[cnt0 + k + p] = 0.0
        else:
            for p in range(tid, k * d, tpb):
                part_sums[cuda.blockIdx.x * k * d + p] = 0.0

    @cuda.jit(device=True)
    def finish_stats(f64, i64, k, d, sh_sums, part_sums, part_counts):
        """Write this thread block's counts (and shared sums) to its row of the partials."""
        tid = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        bid = cuda.blockIdx.x
        cnt0 = 4 * tpb + k + 1
        for p in range(tid, k, tpb):
            part_counts[bid * k + p] = f64[cnt0 + p]
        if sh_sums:
            for p in range(tid, k * d, tpb):
                part_sums[bid * k * d + p] = f64[cnt0 + k + p]

    @cuda.jit(device=True)
    def block_far(f64, i64, tv, ti, tl, far_d, far_i, far_l):
        """This thread block's q farthest rows: q rounds of an arg-max over the threads' candidates
        (larger distance first, then lower row index)."""
        tid = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        out0 = cuda.blockIdx.x * q
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

    return nearest, keep_far, tile_sums, start_stats, finish_stats, block_far


def _make_lloyd_stats(dtype: np.dtype) -> Any:
    from numba import float64, from_dtype, int32, int64

    block_sum, _, sqdist64, _ = cuc.device_functions()
    nearest, keep_far, tile_sums, start_stats, finish_stats, block_far = cuc.kernel("kmeans-parts", dtype)
    nbdt = from_dtype(dtype)
    isz = dtype.itemsize
    is64 = dtype == np.float64
    q = N_FARTHEST

    @cuda.jit
    def lloyd_stats(xt, w, cen, k, part_sums, part_counts, part_tot, far_d, far_i, far_l, weighted, sh_sums, sh_c):
        d = xt.shape[0]
        n = xt.shape[1]
        kd = k * d
        tid = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        bid = cuda.blockIdx.x
        f64 = cuda.shared.array(0, float64)
        i64 = cuda.shared.array(0, int64)
        dts = cuda.shared.array(0, nbdt)
        c0 = (4 * tpb + 2 * k + 1 + (kd if sh_sums else 0)) * 8 // isz
        start_stats(f64, k, d, sh_sums, part_sums)
        if sh_c:
            for p in range(tid, kd, tpb):
                dts[c0 + p] = cen[p]
        tv = cuda.local.array(q, float64)
        ti = cuda.local.array(q, int64)
        tl = cuda.local.array(q, int32)
        for t in range(q):
            tv[t] = -1.0
            ti[t] = -1
            tl[t] = 0
        thr = -1.0
        my_inertia = 0.0
        cuda.syncthreads()
        base = bid * tpb
        stride = cuda.gridDim.x * tpb
        while base < n:  # one tile of tpb rows per round: the same trip count for the whole block
            i = base + tid
            lab = -1
            if i < n:
                if sh_c:
                    lab, best, _ = nearest(xt, i, dts, c0, k, d)
                else:
                    lab, best, _ = nearest(xt, i, cen, 0, k, d)
                if is64:
                    di = float64(best)
                elif sh_c:
                    di = sqdist64(xt, i, dts, c0 + lab * d, d)
                else:
                    di = sqdist64(xt, i, cen, lab * d, d)
                wi = w[i] if weighted else 1.0
                my_inertia += wi * di
                thr = keep_far(tv, ti, tl, thr, di, i, lab)
            tile_sums(xt, w, weighted, lab, base, f64, i64, k, sh_sums, part_sums)
            base += stride
        finish_stats(f64, i64, k, d, sh_sums, part_sums, part_counts)
        tot = block_sum(f64, my_inertia)  # a fixed tree over the threads: the same bits every run
        if tid == 0:
            part_tot[bid * 2] = tot
        if tid == 0:
            part_tot[bid * 2 + 1] = 0.0  # sum w |x|^2: the first pass's
        block_far(f64, i64, tv, ti, tl, far_d, far_i, far_l)

    return lloyd_stats


def _make_first_pass(dtype: np.dtype) -> Any:
    from numba import float64, from_dtype, int32, int64

    block_sum, _, _, _ = cuc.device_functions()
    nearest, keep_far, tile_sums, start_stats, finish_stats, block_far = cuc.kernel("kmeans-parts", dtype)
    nbdt = from_dtype(dtype)
    isz = dtype.itemsize
    eps = float(np.finfo(dtype).eps)
    q = N_FARTHEST

    @cuda.jit
    def first_pass(xt, w, cen, cen64, k, part_sums, part_counts, part_tot, far_d, far_i, far_l, labels, upper,
                   lower, cmax, weighted, sh_sums, sh_c):
        d = xt.shape[0]
        n = xt.shape[1]
        kd = k * d
        tid = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        bid = cuda.blockIdx.x
        f64 = cuda.shared.array(0, float64)
        i64 = cuda.shared.array(0, int64)
        dts = cuda.shared.array(0, nbdt)
        c0 = (4 * tpb + 2 * k + 1 + (kd if sh_sums else 0)) * 8 // isz
        start_stats(f64, k, d, sh_sums, part_sums)
        if sh_c:
            for p in range(tid, kd, tpb):
                dts[c0 + p] = cen[p]
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
        while base < n:
            i = base + tid
            lab = -1
            if i < n:
                if sh_c:
                    lab, best, second = nearest(xt, i, dts, c0, k, d)
                else:
                    lab, best, second = nearest(xt, i, cen, 0, k, d)
                # exact distance to the float64 center, |x|^2 for the rounding margin
                xn = 0.0
                di = 0.0
                for j in range(d):
                    x = float64(xt[j, i])
                    xn += x * x
                    v = x - cen64[lab * d + j]
                    di += v * v
                e = (d + 8) * eps * (math.sqrt(xn) + cmax) ** 2
                labels[i] = lab
                upper[i] = math.sqrt(di)
                lo2 = float64(second) - e
                lower[i] = math.sqrt(lo2 if lo2 > 0.0 else 0.0)
                wi = w[i] if weighted else 1.0
                my_inertia += wi * di
                my_sxx += wi * xn
                thr = keep_far(tv, ti, tl, thr, di, i, lab)
            tile_sums(xt, w, weighted, lab, base, f64, i64, k, sh_sums, part_sums)
            base += stride
        finish_stats(f64, i64, k, d, sh_sums, part_sums, part_counts)
        tot = block_sum(f64, my_inertia)
        if tid == 0:
            part_tot[bid * 2] = tot
        tot = block_sum(f64, my_sxx)
        if tid == 0:
            part_tot[bid * 2 + 1] = tot
        block_far(f64, i64, tv, ti, tl, far_d, far_i, far_l)

    return first_pass


def _make_assign(dtype: np.dtype) -> Any:
    from numba import float64, from_dtype

    _, _, sqdist64, _ = cuc.device_functions()
    nearest = cuc.kernel("kmeans-parts", dtype)[0]
    nbdt = from_dtype(dtype)
    is64 = dtype == np.float64

    @cuda.jit
    def assign(xt, cen, k, labels, rowd, sh_c):
        d = xt.shape[0]
        n = xt.shape[1]
        tid = cuda.threadIdx.x
        tpb = cuda.blockDim.x
        dts = cuda.shared.array(0, nbdt)
        if sh_c:
            for p in range(tid, k * d, tpb):
                dts[p] = cen[p]
        cuda.syncthreads()
        i = cuda.blockIdx.x * tpb + tid
        stride = cuda.gridDim.x * tpb
        while i < n:
            if sh_c:
                lab, best, _ = nearest(xt, i, dts, 0, k, d)
            else:
                lab, best, _ = nearest(xt, i, cen, 0, k, d)
            if is64:
                di = float64(best)
            elif sh_c:
                di = sqdist64(xt, i, dts, lab * d, d)
            else:
                di = sqdist64(xt, i, cen, lab * d, d)
            labels[i] = lab
            rowd[i] = di
            i += stride

    return assign


cuc.register("kmeans-parts", _make_parts)
cuc.register("lloyd-stats", _make_lloyd_stats)
cuc.register("first-pass", _make_first_pass)
cuc.register("assign", _make_assign)


# -- host side ---------------------------------------------------------------------------------------
def _base_words(tpb: int, k: int) -> int:
    """8-byte words of shared memory the statistics kernels need whatever fits: scratch, the tile's
    labels and grouping, the clusters' starts and counts."""
    return 4 * tpb + 2 * k + 1


def _layout(k: int, d: int, tpb: int, itemsize: int) -> tuple[bool, bool, int]:
    """Whether the sums and the centers fit in shared memory, and the bytes to ask for. Layout, in
    8-byte words: [0, tpb) float64 scratch, [tpb, 2 tpb) int64 scratch, the tile's labels (tpb), its
    rows grouped by cluster (tpb), where each cluster's rows start (k + 1), this thread block's counts
    (k) and sums (k d, when they fit), then the centers in the block's dtype (when they fit)."""
    used = 8 * _base_words(tpb, k)
    if used > cuc.SHARED_BUDGET:
        raise cuc.CudaKernelError(f"{k} clusters need {used} bytes of shared memory per thread block, more than "
                                 f"{cuc.SHARED_BUDGET}; use the array API path of gdask.ml.kernels for that many "
                                 "clusters")
    sh_sums = used + 8 * k * d <= cuc.SHARED_BUDGET
    used += 8 * k * d if sh_sums else 0
    sh_c = used + itemsize * k * d <= cuc.SHARED_BUDGET
    return sh_sums, sh_c, used + (itemsize * k * d if sh_c else 0)


def fits(k: int, d: int = 1, itemsize: int = 4) -> bool:
    """Whether the K-means kernels take ``k`` clusters (their shared memory holds the per-cluster
    bookkeeping of a thread block); beyond, the array API code runs."""
    return 8 * _base_words(cuc.THREADS, k) <= cuc.SHARED_BUDGET


def _centers(blk: Any, centers: Any) -> np.ndarray:
    cf = np.asarray(cuc.to_host(centers), dtype=np.float64)
    d = blk.shape[1]
    if cf.ndim != 2 or cf.shape[1] != d or cf.shape[0] < 1:
        raise cuc.CudaKernelError(f"centers must be a (k, {d}) array with k >= 1 for a block of {d} features, "
                                 f"got shape {cf.shape}")
    return cf


def _stats_run(blk: Any, centers: Any, w: Any, stream: Any, bounds: bool) -> dict[str, Any]:
    """Launch ``lloyd-stats`` (``bounds`` False) or ``first-pass`` and add the partials."""
    xp = cuc.array_module_of(blk)
    blk = cuc.float_block(blk)
    n, d = blk.shape
    dt = blk.dtype
    cf = _centers(blk, centers)
    k = cf.shape[0]
    if not bounds and _lloyd_cuda.fits(k, d, dt.itemsize):  # the kernel compiled for this size
        return _lloyd_cuda.stats(blk, cf, w, stream)
    q = N_FARTHEST
    tpb = cuc.threads()
    grid = cuc.grid_for(n, tpb)
    sh_sums, sh_c, shmem = _layout(k, d, tpb, dt.itemsize)
    with cuc.stream_scope(xp, stream):
        cen = xp.asarray(np.ascontiguousarray(cf, dtype=dt).ravel())
        wv = cuc.weights_vector(xp, w, n)
        # one row of partials per thread block, added in thread-block order afterwards (no atomics)
        part_sums = xp.zeros(grid * k * d, np.float64)
        part_counts = xp.zeros(grid * k, np.float64)
        part_tot = xp.zeros(grid * 2, np.float64)
        far_d = xp.full(grid * q, -1.0)
        far_i = xp.full(grid * q, -1, np.int64)
        far_l = xp.zeros(grid * q, np.int32)
        out: dict[str, Any] = {"xp": xp, "blk": blk, "cf": cf}
        if bounds:
            out["labels"] = labels = xp.empty(n, np.int32)
            out["upper"] = upper = xp.empty(n, np.float64)
            out["lower"] = lower = xp.empty(n, np.float64)
        if n:
            launch = (grid, tpb, cuc.launch_stream(xp, stream), shmem)
            common = (cuc.arg(blk.T), cuc.arg(wv), cuc.arg(cen))
            parts = (k, cuc.arg(part_sums, True), cuc.arg(part_counts, True), cuc.arg(part_tot, True),
                     cuc.arg(far_d, True), cuc.arg(far_i, True), cuc.arg(far_l, True))
            if bounds:
                cmax = float(np.sqrt((cf * cf).sum(1).max()))
                cuc.kernel("first-pass", dt)[launch](*common, cuc.arg(xp.asarray(cf.ravel())), *parts,
                                                    cuc.arg(labels, True), cuc.arg(upper, True), cuc.arg(lower, True),
                                                    cmax, w is not None, sh_sums, sh_c)
            else:
                cuc.kernel("lloyd-stats", dt)[launch](*common, *parts, w is not None, sh_sums, sh_c)
        out["sums"] = cuc.sum_partials(xp, part_sums, grid, k * d, stream)
        out["counts"] = cuc.sum_partials(xp, part_counts, grid, k, stream)
        out["totals"] = cuc.to_host(cuc.sum_partials(xp, part_tot, grid, 2, stream))
        out["far"] = cuc.select_far(cuc.to_host(far_d), cuc.to_host(far_i), cuc.to_host(far_l), min(q, n))
    return out


def lloyd_partial(blk: Any, centers: Any, w: Any = None, *, stream: Any = None) -> dict[str, Any]:
    """One block's Lloyd statistics on the GPU, as :func:`gdask.ml.kernels.lloyd_partial`.

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
    r = _stats_run(blk, centers, w, stream, bounds=False)
    xp = r["xp"]
    k, d = r["cf"].shape
    fd, fi, fl = r["far"]
    with cuc.stream_scope(xp, stream):
        far_rows = cuc.to_host(r["blk"][xp.asarray(fi)])
        far_w = np.ones(fi.size) if w is None else cuc.to_host(xp.asarray(w)[xp.asarray(fi)]).astype(np.float64)
        return {"sums": cuc.to_host(r["sums"]).reshape(k, d), "counts": cuc.to_host(r["counts"]),
                "inertia": float(r["totals"][0]), "far_d": fd, "far_label": fl, "far_rows": far_rows,
                "far_w": far_w}


def first_pass_state(blk: Any, centers: Any, w: Any = None, *, stream: Any = None) -> dict[str, Any]:
    """The device arrays of a bounds state's full pass: ``labels``, ``upper``, ``lower``, ``sums``,
    ``counts``, ``far`` (host) and ``totals`` (host: inertia, ``sum w |x|^2``); see
    :func:`gdask.ml.kernels._hamerly_cuda.first_pass`."""
    return _stats_run(blk, centers, w, stream, bounds=True)


def assign(blk: Any, centers: Any, *, stream: Any = None) -> tuple[Any, Any]:
    """Labels (int32) and squared distance to the nearest center (float64) of each row, as device
    arrays, as :func:`gdask.ml.kernels.assign`. The argmin uses the block's dtype (ties to the
    lower index); the distance is recomputed in float64 from the rows and the centers cast to the
    block's dtype. See :func:`lloyd_partial` for the parameters."""
    xp = cuc.array_module_of(blk)
    blk = cuc.float_block(blk)
    n, d = blk.shape
    dt = blk.dtype
    cf = _centers(blk, centers)
    k = cf.shape[0]
    tpb = cuc.threads()
    grid = cuc.grid_for(n, tpb)
    sh_c = dt.itemsize * k * d <= cuc.SHARED_BUDGET
    with cuc.stream_scope(xp, stream):
        cen = xp.asarray(np.ascontiguousarray(cf, dtype=dt).ravel())
        labels = xp.empty(n, np.int32)
        rowd = xp.empty(n, np.float64)
        if n:
            cuc.kernel("assign", dt)[grid, tpb, cuc.launch_stream(xp, stream), dt.itemsize * k * d if sh_c else 0](
                cuc.arg(blk.T), cuc.arg(cen), k, cuc.arg(labels, True), cuc.arg(rowd, True), sh_c)
    return labels, rowd
