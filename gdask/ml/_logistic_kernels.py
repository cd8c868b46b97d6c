"""Block kernels of gdask.ml.LogisticRegression: loss and gradient partials, predictions, Gram.

Every kernel takes device blocks (NumPy on emulated devices, CuPy on CUDA, array-api-strict on
strict emulated devices) and small operands that the block task has already moved to the blocks'
device. The code is written once against the array API standard (the namespace of the inputs); NumPy
blocks take a NumPy + numba fast path, and :func:`loss_grad` on CuPy blocks the numba.cuda kernel
(:func:`gdask.ml._cuda_kernels.loss_grad_cuda`). Row terms are computed in the block's dtype (for
float32 blocks they are as precise as the float32 raw predictions ``X @ w`` they come from, and
NumPy's SIMD float32 ``exp``/``log`` make them cheap), every sum is accumulated in float64, and
partials come back as host NumPy float64 data (moved explicitly with :func:`gdask.devices.to_numpy`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from gdask.devices import array_module, array_namespace, asarray_like, astype, to_numpy
from gdask.ml._kernels import block_kind

__all__ = ["loss_grad", "loss_grad_combine", "decision", "label_counts", "label_counts_combine",
           "encode_labels", "gram", "sq_norms"]


def _as_float(x: Any, dtype: Any, like: Any) -> Any:
    """A small operand in ``dtype`` on the device of block ``like`` (host data is moved there)."""
    if isinstance(x, (np.ndarray, np.generic)) and not isinstance(like, np.ndarray):
        return asarray_like(x, like, dtype=dtype)
    return astype(x, dtype) if hasattr(x, "shape") else asarray_like(x, like, dtype=dtype)


def _row_weights(y, w, class_w, xp=None):
    """Effective weight of each row (``sample_weight * class_weight[y]``) or ``None`` (all ones)."""
    if class_w is not None:
        cw = class_w[y] if isinstance(class_w, np.ndarray) else array_namespace(class_w).take(class_w, y)
        return cw if w is None else cw * w
    return w


def loss_grad(X, y, coef, intercept, w=None, class_w=None):
    """One block's partial of the (unscaled) weighted log-loss and its gradient.

    Parameters
    ----------
    X : (n, d) float block
    y : (n,) int32 block of class codes (0/1 for one coefficient row, else 0..K-1)
    coef : (K, d) float64, K = 1 for binary (sigmoid) or K = n_classes (multinomial softmax)
    intercept : (K,) float64
    w : (n,) float64 block of sample weights, or None
    class_w : (n_classes,) float64 weight per class, or None

    Returns
    -------
    tuple
        ``(sum_i s_i loss_i, grad_coef (K, d), grad_intercept (K,))`` as host float64 data, where
        ``s_i`` is the row's effective weight and ``loss_i`` the log-loss of row i (binomial for
        K = 1, multinomial otherwise), the objective scikit-learn's lbfgs solver minimises before
        it divides by the weight sum.
    """
    kind = block_kind(X)
    if kind != "numpy":
        ck = _cuda_kernels_for(X, coef)
        if ck is not None:
            return ck.loss_grad_cuda(X, y, coef, intercept, w, class_w)
        return loss_grad_xp(X, y, coef, intercept, w, class_w)
    s = _row_weights(y, w, class_w)
    dt = X.dtype
    c = np.asarray(coef).astype(dt, copy=False)
    b = np.asarray(intercept).astype(dt, copy=False)
    if c.shape[0] == 1:  # binomial
        z = X @ c[0] + b[0]
        total, r, gi = _binomial_numpy(z, y, s)
        gc = (X.T @ r.astype(dt, copy=False))[None, :]
    else:  # multinomial, classes along rows: (K, n) keeps every NumPy pass contiguous
        z = c @ X.T
        z += b[:, None]
        total, r, gi = _multinomial_numpy(z, y, s)
        gc = r @ X
    return (float(total), gc.astype(np.float64), np.atleast_1d(gi).astype(np.float64))


def _cuda_kernels_for(X: Any, coef: Any) -> Any:
    """The numba.cuda kernels for a CuPy block when they can run here and take ``coef``'s classes."""
    if block_kind(X) != "cupy":
        return None
    from gdask.ml import _cuda_kernels

    if not _cuda_kernels.usable() or not _cuda_kernels.logistic_fits(int(coef.shape[0])):
        return None
    return _cuda_kernels


def loss_grad_xp(X, y, coef, intercept, w=None, class_w=None):
    """:func:`loss_grad` written against the array API standard (the reference of the NumPy and CUDA
    kernels; what blocks of other namespaces run)."""
    xp = array_namespace(X)
    s = _row_weights(y, w, class_w)
    dt = X.dtype
    c = _as_float(coef, dt, X)
    b = _as_float(intercept, dt, X)
    if c.shape[0] == 1:  # binomial
        z = X @ c[0, :] + b[0]
        total, r, gi = _binomial_xp(z, y, s, xp)
        gc = (X.T @ xp.astype(r, dt))[None, :]
    else:
        z = X @ c.T + b[None, :]
        total, r, gi = _multinomial_xp(z, y, s, xp)
        gc = (X.T @ xp.astype(r, dt)).T
    return (float(total), to_numpy(xp.astype(gc, xp.float64)),
            np.atleast_1d(to_numpy(xp.astype(gi, xp.float64))))


# -- any array API namespace: vectorised ----------------------------------------------------------
def _binomial_xp(z, y, s, xp):
    """loss = log(1 + exp(z)) - y z; residual sigmoid(z) - y (times the row weights)."""
    yf = xp.astype(y, z.dtype)
    e = xp.exp(-xp.abs(z))                  # in (0, 1]: never overflows
    q = 1 / (1 + e)                         # sigmoid(|z|)
    loss = xp.where(z > 0, z, 0.0) - xp.log(q) - yf * z
    r = xp.where(z >= 0, q, 1 - q) - yf     # sigmoid(z) - y
    if s is None:
        return xp.sum(loss, dtype=xp.float64), r, xp.sum(r, dtype=xp.float64)
    r = r * s
    return xp.sum(loss * s), r, xp.sum(r)


def _multinomial_xp(z, y, s, xp):
    """loss = logsumexp(z) - z[y]; residual softmax(z) - onehot(y) (times the row weights)."""
    import array_api_extra as xpx

    m = xp.max(z, axis=1, keepdims=True)
    ez = xp.exp(z - m)
    tot = xp.sum(ez, axis=1, keepdims=True)
    yi = xp.astype(y, xp.int64)
    loss = (m + xp.log(tot))[:, 0] - xp.take_along_axis(z, yi[:, None], axis=1)[:, 0]
    p = ez / tot - xpx.one_hot(yi, z.shape[1], dtype=z.dtype, xp=xp)
    if s is None:
        return xp.sum(loss, dtype=xp.float64), p, xp.sum(p, axis=0, dtype=xp.float64)
    p = p * s[:, None]
    return xp.sum(loss * s), p, xp.sum(p, axis=0)


# -- NumPy: SIMD exp/log from NumPy, the rest fused in one numba pass ------------------------------
_NO_WEIGHTS = np.ones(1)
_FM = {"reassoc", "contract", "arcp"}  # no 'nnan'/'ninf': NaN and inf must still show in the sums


def _binomial_numpy(z, y, s):
    q = np.abs(z)
    np.negative(q, out=q)
    e = np.exp(q, out=q)                    # exp(-|z|) in (0, 1]
    q = 1 + e
    np.reciprocal(q, out=q)                 # sigmoid(|z|)
    logq = np.log(q)
    r = np.empty_like(z)
    total, gi = _binomial_rows(z, q, logq, y, _NO_WEIGHTS if s is None else s, s is not None, r)
    return total, r, gi


@njit(nogil=True, cache=True, fastmath=_FM)
def _binomial_rows(z, q, logq, y, s, has_s, r):  # pragma: no cover - compiled
    loss = 0.0
    gsum = 0.0
    for i in range(z.shape[0]):
        zi = z[i]
        yi = y[i]
        p = q[i] if zi >= 0 else 1 - q[i]
        li = max(zi, 0.0) - logq[i] - yi * zi
        wi = s[i] if has_s else 1.0
        ri = wi * (p - yi)
        loss += wi * li
        gsum += ri
        r[i] = ri
    return loss, gsum


def _multinomial_numpy(z, y, s):
    """``z`` is (K, n): raw predictions of each class along a row. Returns the loss, the residuals
    ``s (softmax - onehot)`` as (K, n) in z's dtype and their row sums."""
    k, n = z.shape
    z -= z.max(axis=0)                      # z - max over the classes
    ez = np.exp(z)
    tot = ez.sum(axis=0)
    logtot = np.log(tot)
    ez /= tot                               # softmax
    total = _multinomial_cols(z, ez, logtot, y, _NO_WEIGHTS if s is None else s, s is not None)
    if s is not None:
        ez *= s.astype(ez.dtype)
    return total, ez, ez.sum(axis=1, dtype=np.float64)


@njit(nogil=True, cache=True, fastmath=_FM)
def _multinomial_cols(zs, p, logtot, y, s, has_s):  # pragma: no cover - compiled
    """Sum of s_i (log(sum exp(zs[:, i])) - zs[y_i, i]); subtracts the one-hot from ``p`` in place."""
    loss = 0.0
    for i in range(zs.shape[1]):
        yi = y[i]
        wi = s[i] if has_s else 1.0
        loss += wi * (logtot[i] - zs[yi, i])
        p[yi, i] -= 1
    return loss


def loss_grad_combine(parts: list) -> tuple:
    """Add ``loss_grad`` partials."""
    loss, gc, gi = parts[0]
    gc = gc.copy()
    gi = gi.copy()
    for p in parts[1:]:
        loss += p[0]
        gc += p[1]
        gi += p[2]
    return (loss, gc, gi)


def decision(X, coef, intercept):
    """``X @ coef.T + intercept`` of one block, shape (n, K), as scikit-learn computes it."""
    if isinstance(X, np.ndarray):
        return np.ascontiguousarray(X @ np.asarray(coef).T + np.asarray(intercept))
    xp = array_namespace(X)
    c = _as_float(coef, xp.result_type(X.dtype, coef.dtype) if hasattr(coef, "dtype") else X.dtype, X)
    out = X @ c.T + _as_float(intercept, c.dtype, X)[None, :]
    return array_module(X).ascontiguousarray(out) if array_module(X).__name__ == "cupy" else out


def label_counts(y, w=None):
    """Distinct labels of a block and their (weighted) counts, on the host; NaN count separately."""
    if isinstance(y, np.ndarray):
        if y.dtype.kind == "f":
            nan = int(np.isnan(y).sum())
            if nan:
                return np.empty(0, y.dtype), np.empty(0), nan
        vals, inv = np.unique(y, return_inverse=True)
        counts = np.bincount(inv.ravel(), weights=None if w is None else w, minlength=vals.shape[0])
        return vals, counts.astype(np.float64), 0
    import array_api_extra as xpx

    xp = array_namespace(y)
    if xp.isdtype(y.dtype, "real floating"):
        nan = int(xp.sum(xp.astype(xp.isnan(y), xp.int64)))
        if nan:
            return np.empty(0, to_numpy(y[:0]).dtype), np.empty(0), nan
    vals, inv = xp.unique_inverse(y)
    oh = xpx.one_hot(xp.reshape(inv, (-1,)), vals.shape[0], dtype=xp.float64, xp=xp)
    if w is not None:
        oh = oh * xp.astype(w, xp.float64)[:, None]
    return to_numpy(vals), to_numpy(xp.sum(oh, axis=0)), 0


def label_counts_combine(parts: list) -> tuple:
    vals = np.concatenate([p[0] for p in parts])
    counts = np.concatenate([p[1] for p in parts])
    nan = sum(p[2] for p in parts)
    uniq, inv = np.unique(vals, return_inverse=True)
    return uniq, np.bincount(inv.ravel(), weights=counts, minlength=uniq.shape[0]), nan


def encode_labels(y, classes):
    """Class code (int32) of each label: its index in the sorted ``classes``."""
    if isinstance(y, np.ndarray):
        return np.searchsorted(np.asarray(classes), y).astype(np.int32)
    xp = array_namespace(y)
    return xp.astype(xp.searchsorted(_as_float(classes, y.dtype, y), y), xp.int32)


def gram(X, w=None, class_w=None, y=None):
    """``[X, 1]^T diag(s) [X, 1]`` of one block in float64 (``s``: row weights), for the step size
    of gradient descent."""
    xp = np if isinstance(X, np.ndarray) else array_namespace(X)
    s = _row_weights(y, w, class_w)
    Xs = X if s is None else X * astype(s, X.dtype)[:, None]
    d = X.shape[1]
    out = np.empty((d + 1, d + 1))
    out[:d, :d] = to_numpy(X.T @ Xs)
    col = to_numpy(xp.sum(Xs, axis=0, dtype=xp.float64))
    out[:d, d] = col
    out[d, :d] = col
    out[d, d] = float(X.shape[0] if s is None else xp.sum(s))
    return out


def sq_norms(X, w=None, class_w=None, y=None):
    """Trace of :func:`gram`: ``sum_i s_i (||x_i||^2 + 1)``, for many features."""
    xp = np if isinstance(X, np.ndarray) else array_namespace(X)
    s = _row_weights(y, w, class_w)
    rows = xp.sum(X * X, axis=1, dtype=xp.float64) + 1
    return float(xp.sum(rows) if s is None else xp.sum(rows * s))
