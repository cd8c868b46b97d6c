"""Logistic loss and gradient written against the array API standard: the reference of the NumPy
and CUDA kernels, and what blocks of other namespaces run."""

from __future__ import annotations

import numpy as np

from gdask.devices import array_namespace, to_numpy
from gdask.ml.kernels._common import as_float, row_weights

__all__ = ["loss_grad"]


def loss_grad(X, y, coef, intercept, w=None, class_w=None):
    """One block's partial of the weighted log-loss and its gradient (see
    :func:`gdask.ml.kernels.loss_grad`)."""
    xp = array_namespace(X)
    s = row_weights(y, w, class_w)
    dt = X.dtype
    c = as_float(coef, dt, X)
    b = as_float(intercept, dt, X)
    if c.shape[0] == 1:  # binomial
        z = X @ c[0, :] + b[0]
        total, r, gi = _binomial(z, y, s, xp)
        gc = (X.T @ xp.astype(r, dt))[None, :]
    else:
        z = X @ c.T + b[None, :]
        total, r, gi = _multinomial(z, y, s, xp)
        gc = (X.T @ xp.astype(r, dt)).T
    return (float(total), to_numpy(xp.astype(gc, xp.float64)),
            np.atleast_1d(to_numpy(xp.astype(gi, xp.float64))))


def _row_terms_f64(z, s, xp):
    """The raw predictions and row weights in float64: the row terms are computed in it whatever the
    block's dtype (as scikit-learn's loss module does), so a float32 fit's loss and residuals carry
    float32's rounding of ``z`` only, not its cancellation in ``log(1 + exp(z)) - y z`` or
    ``logsumexp(z) - z_y`` (which stopped float32 fits early, with coefficients 4x further from the
    optimum than scikit-learn's). ``O(rows x classes)``: small next to the products with the block."""
    return xp.astype(z, xp.float64), (None if s is None else xp.astype(s, xp.float64))


def _binomial(z, y, s, xp):
    """loss = log(1 + exp(z)) - y z; residual sigmoid(z) - y (times the row weights), all in float64."""
    z, s = _row_terms_f64(z, s, xp)
    yf = xp.astype(y, z.dtype)
    e = xp.exp(-xp.abs(z))                  # in (0, 1]: never overflows
    q = 1 / (1 + e)                         # sigmoid(|z|)
    loss = xp.where(z > 0, z, 0.0) - xp.log(q) - yf * z
    r = xp.where(z >= 0, q, 1 - q) - yf     # sigmoid(z) - y
    if s is None:
        return xp.sum(loss, dtype=xp.float64), r, xp.sum(r, dtype=xp.float64)
    r = r * s
    return xp.sum(loss * s), r, xp.sum(r)


def _multinomial(z, y, s, xp):
    """loss = logsumexp(z) - z[y]; residual softmax(z) - onehot(y) (times the row weights), all in float64."""
    import array_api_extra as xpx

    z, s = _row_terms_f64(z, s, xp)
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
