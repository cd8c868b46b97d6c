"""Logistic loss and gradient on CuPy blocks: a numba.cuda kernel with the contract of
:func:`gdask.ml.kernels.loss_grad` (binomial and multinomial).

One thread per row in a grid-stride loop over tiles of ``blockDim`` rows: raw predictions in the
block's dtype, row terms in float64, residuals in shared memory; each gradient slot (row group,
class, feature) belongs to one thread, which adds the tile's residuals times that feature in row
order (no atomics); the loss takes a fixed reduction tree; per-thread-block partials are added in
thread-block order (:func:`gdask.ml.kernels._cuda_common.sum_partials`).
"""

# ruff: noqa: PLR1730, FURB136

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gdask.ml.kernels import _cuda_common as cuc
from gdask.ml.kernels import _logreg_cuda

__all__ = ["fits", "loss_grad"]

#: ``numba.cuda``, bound by :func:`gdask.ml.kernels._cuda_common.kernel` before a factory compiles
cuda: Any = None


def _make_logistic(dtype: np.dtype) -> Any:
    from numba import float64, from_dtype

    block_sum, _, _, dot = cuc.device_functions()
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



def fits(n_coef_rows: int) -> bool:
    """Whether :func:`loss_grad_cuda` takes ``n_coef_rows`` coefficient rows (1 for binary, else the
    number of classes): a tile's residuals must fit in shared memory."""
    return 8 * 32 * (int(n_coef_rows) + 1) <= cuc.SHARED_BUDGET


def loss_grad(X: Any, y: Any, coef: Any, intercept: Any, w: Any = None, class_w: Any = None, *,
                   stream: Any = None) -> tuple[float, np.ndarray, np.ndarray]:
    """One block's partial of the weighted log-loss and its gradient on the GPU, as
    :func:`gdask.ml.kernels.loss_grad`.

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
    xp = cuc.array_module_of(X)
    X = cuc.float_block(X, "X")
    n, d = X.shape
    dt = X.dtype
    c = np.asarray(cuc.to_host(coef), dtype=np.float64)
    b = np.atleast_1d(np.asarray(cuc.to_host(intercept), dtype=np.float64))
    if c.ndim != 2 or c.shape[1] != d or b.shape != (c.shape[0],):
        raise cuc.CudaKernelError(f"coef must be (K, {d}) and intercept (K,), got {c.shape} and {b.shape}")
    kc = c.shape[0]
    if tuple(y.shape) != (n,) or np.dtype(y.dtype).kind not in "iu":
        raise cuc.CudaKernelError(f"y must be ({n},) integer class codes (encode_labels), got {tuple(y.shape)} "
                                  f"{y.dtype}")
    if _logreg_cuda.fits(kc, d, dt.itemsize):  # binary: the kernel compiled for this size
        return _logreg_cuda.loss_grad_binary(xp, X, y, c, b, w, class_w, stream)
    tpb = cuc.threads()
    while 8 * tpb * (kc + 1) > cuc.SHARED_BUDGET and tpb > 32:
        tpb //= 2
    used = 8 * tpb * (kc + 1)
    if used > cuc.SHARED_BUDGET:
        raise cuc.CudaKernelError(f"{kc} classes need {used} bytes of shared memory per thread block, more than "
                              f"{cuc.SHARED_BUDGET}; use gdask.ml.kernels.loss_grad for that many classes")
    nf = kc * (d + 1)
    groups = max(1, tpb // nf)
    sh_acc = used + 8 * groups * nf <= cuc.SHARED_BUDGET
    if sh_acc:
        used += 8 * groups * nf
    else:  # slots go to the thread block's row of the partials: one owner per slot, no atomics
        groups = 1
    sh_c = used + dt.itemsize * kc * d <= cuc.SHARED_BUDGET
    used += dt.itemsize * kc * d if sh_c else 0
    grid = cuc.grid_for(n, tpb)
    kern = cuc.kernel("logistic", dt)
    with cuc.stream_scope(xp, stream):
        wv = xp.ascontiguousarray(xp.asarray(w, dtype=np.float64)) if w is not None else xp.empty(1, np.float64)
        cw = xp.asarray(np.asarray(cuc.to_host(class_w), dtype=np.float64)) if class_w is not None else xp.empty(1)
        part = xp.zeros(grid * nf, np.float64)  # one row of partials per thread block, added in order after
        part_loss = xp.zeros(grid, np.float64)
        if n:
            kern[grid, tpb, cuc.launch_stream(xp, stream), used](
                cuc.arg(X.T), cuc.arg(xp.asarray(y)), cuc.arg(xp.asarray(np.ascontiguousarray(c, dtype=dt).ravel())),
                cuc.arg(xp.asarray(b.astype(dt))), cuc.arg(wv), cuc.arg(cw), cuc.arg(part, True),
                cuc.arg(part_loss, True), w is not None, class_w is not None, sh_c, sh_acc, groups)
        g = cuc.to_host(cuc.sum_partials(xp, part, grid, nf, stream)).reshape(kc, d + 1)
        loss = float(cuc.to_host(cuc.sum_partials(xp, part_loss, grid, 1, stream))[0])
        return loss, np.ascontiguousarray(g[:, :d]), np.ascontiguousarray(g[:, d])



cuc.register("logistic", _make_logistic)
