"""The K-means pass on CuPy blocks at the memory roofline (issue #24): one numba.cuda kernel reads
every row once and gives the nearest center, the weighted per-cluster sums and counts, the inertia
and the rows farthest from their centers, with the contract of :func:`gdask.ml.kernels.lloyd_partial`.

How it gets there (``benchmarks/gpu_static.py`` checks each point on the compiled SASS):

* compiled per size: the features ``d``, the clusters ``k``, the thread block and the weighting are
  compile-time constants (:func:`gdask.ml.kernels._cuda_common.kernel` caches one kernel per
  combination), so the distance loops unroll, the row sits in registers and no index is checked at
  run time; indices are 32-bit unsigned;
* distances in the expanded form of the CPU kernels and the array API reference, ``|c|^2 - 2 x.c``,
  one fused multiply-add per (center, feature), the ``-2 c`` and ``|c|^2`` in shared memory (every
  thread reads the same address: a broadcast); ties go to the lower center, a NaN row to cluster 0;
* coalesced reads of the feature-major block (the threads of a warp read consecutive rows of one
  feature), each value read from HBM once and kept in a shared tile for the sums;
* the sums without atomics: a group of ``G`` threads (a warp) owns the rows ``g G .. g G + G - 1``
  of each tile and adds them in row order, thread ``j`` feature ``j``, into the group's own
  per-cluster sums in shared memory (float64);
* a fixed row partition: the rows are cut into segments of :data:`SEG` rows, whatever the grid;
  each segment's sums, counts and inertia are one row of the partials, written by the thread block
  that ran it and added in segment order on the device: the same bits for any grid, any SM count;
* the farthest rows: the expanded distance, widened by its rounding error (as on the CPU), tells
  which rows may be among the ``N_FARTHEST`` farthest of their group; only those get the exact
  distance (differences summed in float64), and the host picks the farthest of all candidates.
"""

# ruff: noqa: PLR1730, FURB136

from __future__ import annotations

from typing import Any

import numpy as np

from gdask.ml.kernels import _cuda_common as cuc
from gdask.ml.kernels._common import N_FARTHEST

__all__ = ["fits", "shared_bytes", "stats"]

#: ``numba.cuda``, bound by :func:`gdask.ml.kernels._cuda_common.kernel` before a factory compiles
cuda: Any = None

#: rows per segment: the fixed row partition of the partials (a multiple of any thread block)
SEG = 1 << 13
#: the largest ``d`` and ``k`` compiled per size (the row and the scores sit in registers)
MAX_D = 64
MAX_K = 32


def _geometry(d: int, tpb: int) -> tuple[int, int, int, int, int, int]:
    """How a group of threads adds its rows: ``(G, V, LW, H, M, DP)``: ``G`` threads a group, ``V``
    features a thread reads at once (a vector load), ``LW`` threads a row, ``H`` rows at once (each
    with its own copy of the sums), ``M`` vectors a thread per row, ``DP`` the tile's row pitch."""
    g = min(32, tpb)
    v = 2 if d % 2 == 0 else 1
    lpr = -(-d // v)
    lw = min(lpr, g)
    h = g // lw
    m = -(-lpr // lw)
    dp = -(-d // 4) * 4 + 4  # a multiple of 4 words (16-byte rows), 4 banks apart: no conflicts
    return g, v, lw, h, m, dp


def shared_bytes(k: int, d: int, tpb: int, itemsize: int) -> int:
    """Static shared memory of the kernel for ``k`` clusters, ``d`` features, ``tpb`` threads."""
    g, _, _, h, _, dp = _geometry(d, tpb)
    ng = tpb // g
    words64 = 2 * tpb + ng * k + ng * N_FARTHEST * 2 + ng  # weights, distances, counts, farthest rows
    return 8 * words64 + itemsize * (k * d + k + dp * tpb + ng * h * k * d) + 4 * (tpb + ng * k + ng)


def _threads(k: int, d: int, itemsize: int) -> int:
    """The thread block for the size: the simulator's, or the largest of 128 / 64 / 32 threads whose
    shared memory fits the budget (0: none)."""
    if cuc.simulating():
        t = cuc.threads()
        return t if shared_bytes(k, d, t, itemsize) <= cuc.SHARED_BUDGET else 0
    for t in (128, 64, 32):
        if shared_bytes(k, d, t, itemsize) <= cuc.SHARED_BUDGET:
            return t
    return 0


def fits(k: int, d: int, itemsize: int) -> bool:
    """Whether the per-size kernel takes ``k`` clusters of ``d`` features (else the general one)."""
    t = _threads(k, d, itemsize)
    return t > 0 and 1 <= d <= MAX_D and 1 <= k <= min(MAX_K, t)


def _make_pass(dtype: np.dtype, d: int, k: int, tpb: int, seg: int, weighted: bool) -> Any:  # noqa: C901
    from numba import float64, from_dtype, int32, int64, uint32

    nbdt = from_dtype(dtype)
    D, K, T = d, k, tpb  # noqa: N806 - compile-time constants
    G, V, LW, H, M, DP = _geometry(d, tpb)  # noqa: N806
    NG = T // G  # noqa: N806
    KD = K * D  # noqa: N806
    ST = seg // T  # noqa: N806 - tiles per segment
    q = N_FARTHEST
    S_TILE, S_ACC, S_CNT, S_FAR = DP * T, NG * H * KD, NG * K, NG * q  # noqa: N806 - shared sizes
    big = dtype.type(np.inf)
    zero = dtype.type(0)
    marg = 2.0 * (D + 8) * float(np.finfo(dtype).eps)

    @cuda.jit(device=True)
    def block_sum(red, val, tid):
        red[tid] = val
        cuda.syncthreads()
        s = uint32(T // 2)
        while s > 0:
            if tid < s:
                red[tid] += red[tid + s]
            cuda.syncthreads()
            s //= uint32(2)
        out = red[0]
        cuda.syncthreads()
        return out

    @cuda.jit
    def lloyd_pass(xt, w, c2, cn, cen, cmax2, part_sums, part_counts, part_tot, far_d, far_i, far_l):
        n = uint32(xt.shape[1])
        tid = uint32(cuda.threadIdx.x)
        lane = tid % uint32(G)
        grp = tid // uint32(G)
        hl = lane // uint32(LW)  # the row of the H at once this thread adds
        ln = lane - hl * uint32(LW)
        sc = cuda.shared.array(KD, nbdt)
        scn = cuda.shared.array(K, nbdt)
        tile = cuda.shared.array(S_TILE, nbdt)  # the tile's rows, row-major, pitch DP
        acc = cuda.shared.array(S_ACC, nbdt)  # per group and row slot: the segment's sums
        labs = cuda.shared.array(T, int32)
        wts = cuda.shared.array(T, float64)
        dis = cuda.shared.array(T, float64)
        icnt = cuda.shared.array(S_CNT, int32)  # unweighted counts: integer atomics, exact
        fcnt = cuda.shared.array(S_CNT, float64)
        fv = cuda.shared.array(S_FAR, float64)
        fi = cuda.shared.array(S_FAR, int64)  # row index * 64 + label
        gthr = cuda.shared.array(NG, float64)
        gflag = cuda.shared.array(NG, int32)
        xr = cuda.local.array(D, nbdt)  # unrolled: registers
        for p in range(tid, KD, T):
            sc[p] = c2[p]
        for p in range(tid, K, T):
            scn[p] = cn[p]
        for p in range(tid, S_ACC, T):
            acc[p] = zero
        for p in range(tid, S_CNT, T):
            icnt[p] = 0
        for p in range(tid, S_FAR, T):
            fv[p] = -1.0
            fi[p] = -1
        for p in range(tid, NG, T):
            gthr[p] = -1.0
            gflag[p] = 0
        cuda.syncthreads()
        nseg = (n + uint32(seg - 1)) // uint32(seg)
        sg = uint32(cuda.blockIdx.x)
        abase = (grp * uint32(H) + hl) * uint32(KD) + uint32(V) * ln
        while sg < nseg:
            my_in = 0.0
            mycnt = 0.0  # weighted counts: thread `lane` of each group counts cluster `lane`
            for tt in range(ST):
                base = sg * uint32(seg) + uint32(tt * T)
                if base >= n:  # the same for the whole block
                    break
                i = base + tid
                lab = int32(0)  # a row past the end adds zeros with weight 0 to cluster 0
                wi = 0.0
                di = -1.0
                if i < n:
                    for j in range(D):
                        v = xt[j, i]
                        xr[j] = v
                        tile[tid * uint32(DP) + uint32(j)] = v
                    best = big
                    for c in range(K % 4):  # the first K % 4 centers one at a time
                        s0 = scn[c]
                        for j in range(D):
                            s0 += xr[j] * sc[c * D + j]
                        if s0 < best:  # ties keep the lower center; a NaN row stays in cluster 0
                            best = s0
                            lab = int32(c)
                    c = uint32(K % 4)
                    while c < uint32(K):  # then four a round: four independent chains
                        s0 = scn[c]
                        s1 = scn[c + uint32(1)]
                        s2 = scn[c + uint32(2)]
                        s3 = scn[c + uint32(3)]
                        for j in range(D):
                            s0 += xr[j] * sc[c * uint32(D) + uint32(j)]
                            s1 += xr[j] * sc[(c + uint32(1)) * uint32(D) + uint32(j)]
                            s2 += xr[j] * sc[(c + uint32(2)) * uint32(D) + uint32(j)]
                            s3 += xr[j] * sc[(c + uint32(3)) * uint32(D) + uint32(j)]
                        if s0 < best:
                            best = s0
                            lab = int32(c)
                        if s1 < best:
                            best = s1
                            lab = int32(c + uint32(1))
                        if s2 < best:
                            best = s2
                            lab = int32(c + uint32(2))
                        if s3 < best:
                            best = s3
                            lab = int32(c + uint32(3))
                        c += uint32(4)
                    xn32 = xr[0] * xr[0]
                    for j in range(1, D):
                        xn32 += xr[j] * xr[j]
                    xn = float64(xn32)
                    de = xn + float64(best)
                    de = de if de > 0.0 else 0.0
                    wi = w[i] if weighted else 1.0
                    my_in += wi * de
                    if not weighted:
                        cuda.atomic.add(icnt, grp * uint32(K) + uint32(lab), int32(1))  # integers: any order, same sum
                    if de + marg * (xn + cmax2) > gthr[grp]:  # rare: may be among the group's farthest
                        ex = 0.0  # rare
                        for j in range(D):  # rare
                            v64 = float64(xr[j]) - cen[lab * D + j]  # rare
                            ex += v64 * v64  # rare
                        di = ex  # rare
                        gflag[grp] = 1  # rare
                else:
                    for j in range(D):
                        tile[tid * uint32(DP) + uint32(j)] = zero
                labs[tid] = lab
                wts[tid] = wi
                dis[tid] = di
                cuda.syncthreads()
                # the group's rows in order, H at a time (each row slot its own sums): one owner per
                # (slot, cluster, feature), V features a thread
                rb = grp * uint32(G) + hl
                while rb < (grp + uint32(1)) * uint32(G):
                    if hl < uint32(H):
                        o = abase + uint32(labs[rb]) * uint32(D)
                        xo = rb * uint32(DP) + uint32(V) * ln
                        wr = nbdt(wts[rb]) if weighted else nbdt(1.0)
                        for m in range(M):
                            f = uint32(m * V * LW)
                            if uint32(V) * ln + f < uint32(D):
                                if V == 2:  # both loads before both stores: paired 8-byte accesses
                                    x0 = tile[xo + f]
                                    x1 = tile[xo + f + uint32(1)]
                                    a0 = acc[o + f]
                                    a1 = acc[o + f + uint32(1)]
                                    if weighted:
                                        x0 *= wr
                                        x1 *= wr
                                    acc[o + f] = a0 + x0
                                    acc[o + f + uint32(1)] = a1 + x1
                                else:
                                    acc[o + f] += wr * tile[xo + f] if weighted else tile[xo + f]
                    rb += uint32(H)
                if weighted:
                    for rr in range(G):
                        if lane == uint32(labs[grp * uint32(G) + uint32(rr)]):
                            mycnt += wts[grp * uint32(G) + uint32(rr)]
                if lane == 0 and gflag[grp] != 0:  # rare: the group's farthest rows, in row order
                    gflag[grp] = 0  # rare
                    f0 = grp * uint32(q)  # rare
                    for rr in range(G):  # rare
                        r = grp * uint32(G) + uint32(rr)  # rare
                        dr = dis[r]  # rare
                        if dr > gthr[grp]:  # rare: in place of the nearest kept row
                            tm = uint32(0)  # rarer
                            for t in range(1, q):  # rarer
                                if fv[f0 + uint32(t)] < fv[f0 + tm]:  # rarer
                                    tm = uint32(t)  # rarer
                            fv[f0 + tm] = dr  # rarer
                            fi[f0 + tm] = int64(base + r) * 64 + int64(labs[r])  # rarer
                            nthr = fv[f0]  # rarer
                            for t in range(1, q):  # rarer
                                if fv[f0 + uint32(t)] < nthr:  # rarer
                                    nthr = fv[f0 + uint32(t)]  # rarer
                            gthr[grp] = nthr  # rarer
                cuda.syncthreads()
            tot = block_sum(dis, my_in, tid)
            if tid == 0:
                part_tot[sg * uint32(2)] = tot
                part_tot[sg * uint32(2) + uint32(1)] = 0.0
            if weighted and lane < uint32(K):
                fcnt[grp * uint32(K) + lane] = mycnt
            cuda.syncthreads()
            for p in range(tid, KD, T):  # this segment's partials: groups and row slots added in order
                s64 = 0.0
                for g in range(NG * H):
                    s64 += float64(acc[g * KD + p])
                    acc[g * KD + p] = zero
                part_sums[sg * uint32(KD) + p] = s64
            for p in range(tid, K, T):
                s64 = 0.0
                for g in range(NG):
                    if weighted:
                        s64 += fcnt[g * K + p]
                    else:
                        s64 += float64(icnt[g * K + p])
                        icnt[g * K + p] = 0
                part_counts[sg * uint32(K) + p] = s64
            cuda.syncthreads()
            sg += uint32(cuda.gridDim.x)
        out0 = uint32(cuda.blockIdx.x) * uint32(S_FAR)
        for p in range(tid, S_FAR, T):
            far_d[out0 + p] = fv[p]
            code = fi[p]
            far_i[out0 + p] = code >> 6 if code >= 0 else -1
            far_l[out0 + p] = int32(code & 63) if code >= 0 else 0

    return lloyd_pass


cuc.register("lloyd-pass", _make_pass)


def stats(blk: Any, cf: np.ndarray, w: Any, stream: Any) -> dict[str, Any]:
    """Run the per-size pass on ``blk`` (a float block of :func:`gdask.ml.kernels._cuda_common.float_block`)
    for the float64 centers ``cf``: the dict of ``_kmeans_cuda._stats_run`` (``sums``, ``counts``,
    ``totals``, ``far``)."""
    xp = cuc.array_module_of(blk)
    n, d = blk.shape
    dt = blk.dtype
    k = cf.shape[0]
    tpb = _threads(k, d, dt.itemsize)
    if n >= 2**32 - SEG:
        raise cuc.CudaKernelError(f"a block of {n} rows is too long for 32-bit row indices; split it in blocks "
                                  "of under 4e9 rows")
    nseg = max(1, -(-n // SEG))
    grid = max(1, min(nseg, cuc.SIM_MAX_BLOCKS if cuc.simulating() else 4 * _sm_count()))
    q = N_FARTHEST
    ng = tpb // min(32, tpb)
    c2 = np.ascontiguousarray(-2.0 * cf).astype(dt).ravel()
    cn = (cf * cf).sum(1).astype(dt)
    cmax2 = float((cf * cf).sum(1).max())
    kern = cuc.kernel("lloyd-pass", dt, (d, k, tpb, SEG, w is not None))
    with cuc.stream_scope(xp, stream):
        wv = cuc.weights_vector(xp, w, n)
        part_sums = xp.zeros(nseg * k * d, np.float64)
        part_counts = xp.zeros(nseg * k, np.float64)
        part_tot = xp.zeros(nseg * 2, np.float64)
        far_d = xp.full(grid * ng * q, -1.0)
        far_i = xp.full(grid * ng * q, -1, np.int64)
        far_l = xp.zeros(grid * ng * q, np.int32)
        if n:
            kern[grid, tpb, cuc.launch_stream(xp, stream)](
                cuc.arg(blk.T), cuc.arg(wv), cuc.arg(xp.asarray(c2)), cuc.arg(xp.asarray(cn)),
                cuc.arg(xp.asarray(cf.ravel())), cmax2, cuc.arg(part_sums, True), cuc.arg(part_counts, True),
                cuc.arg(part_tot, True), cuc.arg(far_d, True), cuc.arg(far_i, True), cuc.arg(far_l, True))
        out: dict[str, Any] = {"xp": xp, "blk": blk, "cf": cf}
        out["sums"] = cuc.sum_partials(xp, part_sums, nseg, k * d, stream)
        out["counts"] = cuc.sum_partials(xp, part_counts, nseg, k, stream)
        out["totals"] = cuc.to_host(cuc.sum_partials(xp, part_tot, nseg, 2, stream))
        out["far"] = cuc.select_far(cuc.to_host(far_d), cuc.to_host(far_i), cuc.to_host(far_l), min(q, n))
    return out


def _sm_count() -> int:
    cuc.grid_for(1, 1)  # reads the SM count once
    return cuc._SM_COUNT[0] if cuc._SM_COUNT else 1
