"""The binary logistic loss and gradient on CuPy blocks at the memory roofline (issue #24): one
numba.cuda kernel compiled per number of features reads every row once, with the contract of
:func:`gdask.ml.kernels._logistic_cuda.loss_grad` for one coefficient row.

* ``d``, the thread block and the weighting are compile-time constants: the row sits in registers,
  ``x.w`` is ``d`` fused multiply-adds against coefficients in shared memory (a broadcast), indices
  are 32-bit unsigned;
* coalesced reads of the feature-major block (consecutive threads, consecutive rows of a feature);
* the row terms (loss ``log(1 + e^z) - y z``, residual ``sigmoid(z) - y``) in float64 from the
  raw prediction in the block's dtype, as the other backends;
* the gradient without atomics: each thread adds ``residual x`` of its own rows to its own ``d + 1``
  sums in registers (the block's dtype); at the end of a segment of :data:`SEG` rows the threads'
  sums are added in thread order in float64, one row of partials per segment, the segments added in
  order on the device: a fixed row partition, the same bits for any grid.
"""

# ruff: noqa: PLR1730, FURB136

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gdask.ml.kernels import _cuda_common as cuc

__all__ = ["fits", "loss_grad_binary"]

#: ``numba.cuda``, bound by :func:`gdask.ml.kernels._cuda_common.kernel` before a factory compiles
cuda: Any = None

#: rows per segment: the fixed row partition of the partials (a multiple of any thread block)
SEG = 1 << 13
MAX_D = 64


def _threads() -> int:
    return cuc.threads() if cuc.simulating() else 128


def shared_bytes(d: int, tpb: int, itemsize: int) -> int:
    return itemsize * (d + tpb * (d + 1)) + 8 * tpb


def fits(n_coef_rows: int, d: int, itemsize: int) -> bool:
    """Whether the per-size kernel takes the problem: binary (one coefficient row), ``d <= 64``."""
    return n_coef_rows == 1 and 1 <= d <= MAX_D and shared_bytes(d, _threads(), itemsize) <= cuc.SHARED_BUDGET


def _make_binary(dtype: np.dtype, d: int, tpb: int, seg: int, weighted: bool, has_cw: bool) -> Any:
    from numba import float64, from_dtype, uint32

    nbdt = from_dtype(dtype)
    D, T = d, tpb  # noqa: N806 - compile-time constants
    D1 = D + 1  # noqa: N806
    ST = seg // T  # noqa: N806
    S_G = T * D1  # noqa: N806
    zero = dtype.type(0)

    @cuda.jit
    def logistic_binary(xt, y, coef, icpt, w, cw, part, part_loss):
        n = uint32(xt.shape[1])
        tid = uint32(cuda.threadIdx.x)
        sc = cuda.shared.array(D, nbdt)
        gsh = cuda.shared.array(S_G, nbdt)  # the threads' sums at the end of a segment
        red = cuda.shared.array(T, float64)
        xr = cuda.local.array(D, nbdt)  # unrolled: registers
        gr = cuda.local.array(D1, nbdt)  # this thread's gradient sums, the intercept's last
        for p in range(tid, D, T):
            sc[p] = coef[p]
        b = icpt[0]
        cuda.syncthreads()
        nseg = (n + uint32(seg - 1)) // uint32(seg)
        sg = uint32(cuda.blockIdx.x)
        while sg < nseg:
            for j in range(D1):
                gr[j] = zero
            my_loss = 0.0
            for tt in range(ST):
                i = sg * uint32(seg) + uint32(tt * T) + tid
                if i < n:
                    for j in range(D):
                        xr[j] = xt[j, i]
                    zc = b
                    for j in range(D):
                        zc += xr[j] * sc[j]
                    z = float64(zc)
                    yi = y[i]
                    s = w[i] if weighted else 1.0
                    if has_cw:
                        s *= cw[yi]
                    e = math.exp(-abs(z))
                    sig = 1.0 / (1.0 + e)
                    p = sig if z >= 0 else e * sig
                    my_loss += s * ((z if z > 0.0 else 0.0) + math.log1p(e) - yi * z)
                    r = nbdt(s * (p - yi))
                    for j in range(D):
                        gr[j] += r * xr[j]
                    gr[D] += r
            # this segment's partials: the threads' sums added in thread order, in float64
            for j in range(D1):
                gsh[j * T + tid] = gr[j]
            red[tid] = my_loss
            cuda.syncthreads()
            for p in range(tid, D1, T):
                acc = 0.0
                for t in range(T):
                    acc += float64(gsh[p * T + t])
                part[sg * uint32(D1) + p] = acc
            if tid == 0:
                acc = 0.0
                for t in range(T):
                    acc += red[t]
                part_loss[sg] = acc
            cuda.syncthreads()
            sg += uint32(cuda.gridDim.x)

    return logistic_binary


cuc.register("logistic-binary", _make_binary)


def loss_grad_binary(xp: Any, X: Any, y: Any, c: np.ndarray, b: np.ndarray, w: Any, class_w: Any,
                     stream: Any) -> tuple[float, np.ndarray, np.ndarray]:
    """The per-size kernel's ``(loss, grad_coef (1, d), grad_intercept (1,))`` (host float64) for the
    checked inputs of :func:`gdask.ml.kernels._logistic_cuda.loss_grad`."""
    n, d = X.shape
    dt = X.dtype
    tpb = _threads()
    nseg = max(1, -(-n // SEG))
    grid = max(1, min(nseg, cuc.SIM_MAX_BLOCKS if cuc.simulating() else 4 * _sm_count()))
    kern = cuc.kernel("logistic-binary", dt, (d, tpb, SEG, w is not None, class_w is not None))
    with cuc.stream_scope(xp, stream):
        wv = xp.ascontiguousarray(xp.asarray(w, dtype=np.float64)) if w is not None else xp.empty(1, np.float64)
        cw = xp.asarray(np.asarray(cuc.to_host(class_w), dtype=np.float64)) if class_w is not None else xp.empty(1)
        part = xp.zeros(nseg * (d + 1), np.float64)
        part_loss = xp.zeros(nseg, np.float64)
        if n:
            kern[grid, tpb, cuc.launch_stream(xp, stream)](
                cuc.arg(X.T), cuc.arg(xp.asarray(y)), cuc.arg(xp.asarray(np.ascontiguousarray(c[0], dtype=dt))),
                cuc.arg(xp.asarray(b.astype(dt))), cuc.arg(wv), cuc.arg(cw), cuc.arg(part, True),
                cuc.arg(part_loss, True))
        g = cuc.to_host(cuc.sum_partials(xp, part, nseg, d + 1, stream))
        loss = float(cuc.to_host(cuc.sum_partials(xp, part_loss, nseg, 1, stream))[0])
    return loss, np.ascontiguousarray(g[:d]).reshape(1, d), np.ascontiguousarray(g[d:])


def _sm_count() -> int:
    cuc.grid_for(1, 1)  # reads the SM count once
    return cuc._SM_COUNT[0] if cuc._SM_COUNT else 1
