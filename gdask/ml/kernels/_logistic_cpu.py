"""Logistic loss and gradient on NumPy blocks: NumPy's SIMD ``exp`` / ``log`` and matrix products,
the rest fused in one numba pass per block. Row terms in the block's dtype, every sum float64."""

from __future__ import annotations

import numpy as np
from numba import njit

from gdask.ml.kernels._common import row_weights

__all__ = ["loss_grad"]

_FM = {"reassoc", "contract", "arcp"}  # no 'nnan'/'ninf': NaN and inf must still show in the sums


def loss_grad(X, y, coef, intercept, w=None, class_w=None):
    """One block's partial of the weighted log-loss and its gradient (see
    :func:`gdask.ml.kernels.loss_grad`)."""
    s = row_weights(y, w, class_w)
    dt = X.dtype
    c = np.asarray(coef).astype(dt, copy=False)
    b = np.asarray(intercept).astype(dt, copy=False)
    if c.shape[0] == 1:  # binomial
        z = X @ c[0] + b[0]
        total, r, gi = _binomial(z, y, s)
        gc = (X.T @ r.astype(dt, copy=False))[None, :]
    else:  # multinomial, classes along rows: (K, n) keeps every NumPy pass contiguous
        z = c @ X.T
        z += b[:, None]
        total, r, gi = _multinomial(z, y, s)
        gc = r @ X
    return (float(total), gc.astype(np.float64), np.atleast_1d(gi).astype(np.float64))


def _binomial(z, y, s):
    q = np.abs(z)
    np.negative(q, out=q)
    e = np.exp(q, out=q)                    # exp(-|z|) in (0, 1]
    q = 1 + e
    np.reciprocal(q, out=q)                 # sigmoid(|z|)
    logq = np.log(q)
    r = np.empty_like(z)
    total, gi = _binomial_rows(z, q, logq, y, s, r)
    return total, r, gi


@njit(nogil=True, cache=True, fastmath=_FM)
def _binomial_rows(z, q, logq, y, s, r):  # pragma: no cover - compiled
    """Loss ``log(1 + e^z) - y z`` and residual ``s (sigmoid(z) - y)`` per row (``s=None``: ones)."""
    loss = 0.0
    gsum = 0.0
    for i in range(z.shape[0]):
        zi = z[i]
        yi = y[i]
        p = q[i] if zi >= 0 else 1 - q[i]
        li = max(zi, 0.0) - logq[i] - yi * zi
        wi = 1.0 if s is None else s[i]
        ri = wi * (p - yi)
        loss += wi * li
        gsum += ri
        r[i] = ri
    return loss, gsum


def _multinomial(z, y, s):
    """``z`` is (K, n): raw predictions of each class along a row. Returns the loss, the residuals
    ``s (softmax - onehot)`` as (K, n) in z's dtype and their row sums."""
    z -= z.max(axis=0)                      # z - max over the classes
    ez = np.exp(z)
    tot = ez.sum(axis=0)
    logtot = np.log(tot)
    ez /= tot                               # softmax
    total = _multinomial_cols(z, ez, logtot, y, s)
    if s is not None:
        ez *= s.astype(ez.dtype)
    return total, ez, ez.sum(axis=1, dtype=np.float64)


@njit(nogil=True, cache=True, fastmath=_FM)
def _multinomial_cols(zs, p, logtot, y, s):  # pragma: no cover - compiled
    """Sum of s_i (log(sum exp(zs[:, i])) - zs[y_i, i]); subtracts the one-hot from ``p`` in place."""
    loss = 0.0
    for i in range(zs.shape[1]):
        yi = y[i]
        wi = 1.0 if s is None else s[i]
        loss += wi * (logtot[i] - zs[yi, i])
        p[yi, i] -= 1
    return loss
