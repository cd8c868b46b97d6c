"""Logistic regression block ops: loss and gradient partials (dispatched to the block's backend by
:func:`gdask.ml.kernels._dispatch.kernels_for`), predictions, label counts and codes, Gram matrices.

Every op takes device blocks (NumPy on emulated devices, CuPy on CUDA, array-api-strict on strict
emulated devices) and small operands that the block task has already moved to the blocks' device.
Row terms are computed in the block's dtype (for float32 blocks they are as precise as the float32
raw predictions ``X @ w`` they come from), every sum is accumulated in float64, and partials come back
as host NumPy float64 data (moved explicitly with :func:`gdask.devices.to_numpy`).
"""

from __future__ import annotations

import numpy as np

from gdask.devices import array_module, array_namespace, astype, to_numpy
from gdask.ml.kernels import _dispatch
from gdask.ml.kernels._common import as_float, row_weights

__all__ = ["decision", "encode_labels", "gram", "label_counts", "label_counts_combine", "loss_grad",
           "loss_grad_combine", "sq_norms"]


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
    impl = _dispatch.kernels_for("logistic", X, classes=int(coef.shape[0]))
    return impl.loss_grad(X, y, coef, intercept, w, class_w)


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
    if _dispatch.block_kind(X) == "sparse":
        return _dispatch.kernels_for("logistic", X).decision(X, coef, intercept)
    if isinstance(X, np.ndarray):
        return np.ascontiguousarray(X @ np.asarray(coef).T + np.asarray(intercept))
    xp = array_namespace(X)
    c = as_float(coef, xp.result_type(X.dtype, coef.dtype) if hasattr(coef, "dtype") else X.dtype, X)
    out = X @ c.T + as_float(intercept, c.dtype, X)[None, :]
    return array_module(X).ascontiguousarray(out) if _dispatch.block_kind(X) == "cupy" else out


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
    return xp.astype(xp.searchsorted(as_float(classes, y.dtype, y), y), xp.int32)


def gram(X, w=None, class_w=None, y=None):
    """``[X, 1]^T diag(s) [X, 1]`` of one block in float64 (``s``: row weights), for the step size
    of gradient descent."""
    if _dispatch.block_kind(X) == "sparse":
        return _dispatch.kernels_for("logistic", X).gram(X, w, class_w, y)
    xp = np if isinstance(X, np.ndarray) else array_namespace(X)
    s = row_weights(y, w, class_w)
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
    if _dispatch.block_kind(X) == "sparse":
        return _dispatch.kernels_for("logistic", X).sq_norms(X, w, class_w, y)
    xp = np if isinstance(X, np.ndarray) else array_namespace(X)
    s = row_weights(y, w, class_w)
    rows = xp.sum(X * X, axis=1, dtype=xp.float64) + 1
    return float(xp.sum(rows) if s is None else xp.sum(rows * s))
