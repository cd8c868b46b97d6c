"""Logistic regression on CSR blocks (SciPy on emulated devices, ``cupyx.scipy.sparse`` on CUDA): the
raw predictions ``X @ w`` and the gradient ``X^T @ r`` are sparse matrix products, O(nnz) per block;
the row terms are the array API reference's (:mod:`gdask.ml.kernels._logistic_xp`), on the dense
``(rows,)`` / ``(rows, K)`` predictions."""

from __future__ import annotations

from typing import Any

import numpy as np

from gdask.devices import array_module, array_namespace, sparse_row_ids, sparse_row_sums, to_numpy, with_data
from gdask.ml.kernels._common import as_float, row_weights
from gdask.ml.kernels._logistic_xp import _binomial, _multinomial

__all__ = ["decision", "gram", "loss_grad", "sq_norms"]


def _dense(blk: Any, v: Any) -> Any:
    """A small operand in the block's dtype on its device, C-contiguous."""
    return array_module(blk.data).ascontiguousarray(as_float(v, blk.dtype, blk.data))


def _row_scaled(X: Any, s: Any) -> Any:
    """``diag(s) X`` for CSR ``X`` (the stored values times their row's ``s``; O(nnz))."""
    xp = array_module(X.data)
    return with_data(X, X.data * xp.asarray(s, dtype=X.dtype)[sparse_row_ids(X)])


def loss_grad(X, y, coef, intercept, w=None, class_w=None):
    """One block's partial of the weighted log-loss and its gradient (see
    :func:`gdask.ml.kernels.loss_grad`): ``z = X @ coef^T + b``, ``grad = X^T @ r``."""
    xp = array_namespace(X.data)
    s = row_weights(y, w, class_w)
    dt = X.dtype
    c = _dense(X, coef)
    b = as_float(intercept, dt, X.data)
    if c.shape[0] == 1:  # binomial
        z = X @ c[0, :] + b[0]
        total, r, gi = _binomial(z, y, s, xp)
        gc = (X.T @ xp.astype(r, dt))[None, :]
    else:
        z = X @ array_module(c).ascontiguousarray(c.T) + b[None, :]
        total, r, gi = _multinomial(z, y, s, xp)
        gc = (X.T @ array_module(r).ascontiguousarray(xp.astype(r, dt))).T
    return (float(total), to_numpy(xp.astype(gc, xp.float64)),
            np.atleast_1d(to_numpy(xp.astype(gi, xp.float64))))


def decision(X, coef, intercept):
    """``X @ coef.T + intercept`` of one CSR block, shape (n, K), dense on the block's device."""
    mod = array_module(X.data)
    dt = np.result_type(X.dtype, coef.dtype) if hasattr(coef, "dtype") else X.dtype
    c = mod.ascontiguousarray(as_float(coef, dt, X.data))
    out = X @ mod.ascontiguousarray(c.T) + as_float(intercept, dt, X.data)[None, :]
    return mod.ascontiguousarray(out)


def gram(X, w=None, class_w=None, y=None):
    """``[X, 1]^T diag(s) [X, 1]`` of one CSR block in float64 (the features' Gram matrix is dense:
    gd computes it below ``GRAM_MAX_FEATURES`` features only)."""
    s = row_weights(y, w, class_w)
    xp = array_module(X.data)
    X64 = with_data(X, X.data.astype(xp.float64))
    Xs = X64 if s is None else _row_scaled(X64, s)
    d = X.shape[1]
    out = np.empty((d + 1, d + 1))
    out[:d, :d] = to_numpy((X64.T @ Xs).toarray())
    col = to_numpy(Xs.T @ xp.ones(X.shape[0], dtype=xp.float64))
    out[:d, d] = col
    out[d, :d] = col
    out[d, d] = float(X.shape[0] if s is None else xp.asarray(s, dtype=xp.float64).sum())
    return out


def sq_norms(X, w=None, class_w=None, y=None):
    """Trace of :func:`gram`: ``sum_i s_i (||x_i||^2 + 1)``."""
    xp = array_module(X.data)
    s = row_weights(y, w, class_w)
    v = X.data.astype(xp.float64)
    rows = sparse_row_sums(X, v * v) + 1
    return float(rows.sum() if s is None else (rows * xp.asarray(s, dtype=xp.float64)).sum())
