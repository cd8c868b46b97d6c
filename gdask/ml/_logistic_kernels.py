"""Block kernels of gdask.ml.LogisticRegression: loss and gradient partials, predictions, Gram.

Every kernel takes device blocks (NumPy on emulated devices, CuPy on CUDA) and small host operands
that the block task has already moved to the device's array module; it works through the ``xp``
array-module pattern, so one code path serves both. Row terms are computed in the block's dtype
(for float32 blocks they are as precise as the float32 raw predictions ``X @ w`` they come from,
and NumPy's SIMD float32 ``exp``/``log`` make them cheap), every sum is accumulated in float64, and
partials come back as host NumPy float64 data.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from gdask.devices import array_module, to_numpy

__all__ = ["loss_grad", "loss_grad_combine", "decision", "label_counts", "label_counts_combine",
           "encode_labels", "gram", "sq_norms"]


def _as_float(x: Any, dtype: Any, xp) -> Any:
    return x.astype(dtype, copy=False) if hasattr(x, "astype") else xp.asarray(x, dtype=dtype)


def _row_weights(y, w, class_w, xp):
    """Effective weight of each row (``sample_weight * class_weight[y]``) or ``None`` (all ones)."""
    if class_w is not None:
        cw = class_w[y]
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
    xp = array_module(X)
    s = _row_weights(y, w, class_w, xp)
    dt = X.dtype
    c = _as_float(coef, dt, xp)
    b = _as_float(intercept, dt, xp)
    if c.shape[0] == 1:  # binomial
        z = X @ c[0] + b[0]
        total, r, gi = _binomial_numpy(z, y, s) if xp is np else _binomial_xp(z, y, s, xp)
        gc = (X.T @ r.astype(dt, copy=False))[None, :]
    elif xp is np:  # multinomial, classes along rows: (K, n) keeps every NumPy pass contiguous
        z = c @ X.T
        z += b[:, None]
        total, r, gi = _multinomial_numpy(z, y, s)
        gc = r @ X
    else:
        z = X @ c.T + b
        total, r, gi = _multinomial_xp(z, y, s, xp)
        gc = (X.T @ r.astype(dt, copy=False)).T
    return (float(total), to_numpy(gc).astype(np.float64), np.atleast_1d(to_numpy(gi)).astype(np.float64))


# -- CuPy (and any array module): vectorised ------------------------------------------------------
def _binomial_xp(z, y, s, xp):
    """loss = log(1 + exp(z)) - y z; residual sigmoid(z) - y (times the row weights)."""
    yf = y.astype(z.dtype)
    e = xp.exp(-xp.abs(z))                  # in (0, 1]: never overflows
    q = 1 / (1 + e)                         # sigmoid(|z|)
    loss = xp.maximum(z, 0) - xp.log(q) - yf * z
    r = xp.where(z >= 0, q, 1 - q) - yf     # sigmoid(z) - y
    if s is None:
        return loss.sum(dtype=np.float64), r, r.sum(dtype=np.float64)
    r = r * s
    return (loss * s).sum(), r, r.sum()


def _multinomial_xp(z, y, s, xp):
    """loss = logsumexp(z) - z[y]; residual softmax(z) - onehot(y) (times the row weights)."""
    rows = xp.arange(z.shape[0])
    m = z.max(axis=1, keepdims=True)
    ez = xp.exp(z - m)
    tot = ez.sum(axis=1, keepdims=True)
    loss = (m + xp.log(tot))[:, 0] - z[rows, y]
    p = ez / tot
    p[rows, y] -= 1
    if s is None:
        return loss.sum(dtype=np.float64), p, p.sum(axis=0, dtype=np.float64)
    p = p * s[:, None]
    return (loss * s).sum(), p, p.sum(axis=0)


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
    xp = array_module(X)
    out = X @ xp.asarray(coef).T + xp.asarray(intercept)
    return xp.ascontiguousarray(out)


def label_counts(y, w=None):
    """Distinct labels of a block and their (weighted) counts, on the host; NaN count separately."""
    xp = array_module(y)
    if y.dtype.kind == "f":
        nan = int(xp.isnan(y).sum())
        if nan:
            return np.empty(0, y.dtype), np.empty(0), nan
    vals, inv = xp.unique(y, return_inverse=True)
    counts = xp.bincount(inv.ravel(), weights=None if w is None else w, minlength=vals.shape[0])
    return to_numpy(vals), to_numpy(counts).astype(np.float64), 0


def label_counts_combine(parts: list) -> tuple:
    vals = np.concatenate([p[0] for p in parts])
    counts = np.concatenate([p[1] for p in parts])
    nan = sum(p[2] for p in parts)
    uniq, inv = np.unique(vals, return_inverse=True)
    return uniq, np.bincount(inv.ravel(), weights=counts, minlength=uniq.shape[0]), nan


def encode_labels(y, classes):
    """Class code (int32) of each label: its index in the sorted ``classes``."""
    xp = array_module(y)
    return xp.searchsorted(xp.asarray(classes), y).astype(np.int32)


def gram(X, w=None, class_w=None, y=None):
    """``[X, 1]^T diag(s) [X, 1]`` of one block in float64 (``s``: row weights), for the step size
    of gradient descent."""
    xp = array_module(X)
    s = _row_weights(y, w, class_w, xp)
    Xs = X if s is None else X * s.astype(X.dtype)[:, None]
    d = X.shape[1]
    out = np.empty((d + 1, d + 1))
    out[:d, :d] = to_numpy(X.T @ Xs)
    col = to_numpy(Xs.sum(axis=0, dtype=np.float64))
    out[:d, d] = col
    out[d, :d] = col
    out[d, d] = float(X.shape[0] if s is None else s.sum())
    return out


def sq_norms(X, w=None, class_w=None, y=None):
    """Trace of :func:`gram`: ``sum_i s_i (||x_i||^2 + 1)``, for many features."""
    xp = array_module(X)
    s = _row_weights(y, w, class_w, xp)
    rows = (X * X).sum(axis=1, dtype=np.float64) + 1
    return float(rows.sum() if s is None else (rows * s).sum())
