"""Logistic loss and gradient on NumPy blocks.

* Binomial: one numba pass over the block (:func:`_binomial_pass`), a tile of rows at a time: the raw
  predictions of the tile (vectorised over rows, feature by feature), each row's ``exp(-|z|)``,
  sigmoid and residual, then the tile's gradient while its rows are still in cache. The block is
  read once (it was read twice, by ``X @ c`` and ``X.T @ r``, with five NumPy passes between).
* Multinomial: NumPy's SIMD ``exp`` / ``log`` and matrix products, the rest in one numba pass.

Raw predictions, ``exp`` and residuals in the block's dtype, every sum float64.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from gdask.ml.kernels._common import row_weights

__all__ = ["loss_grad"]

_FM = {"reassoc", "contract", "arcp"}  # no 'nnan'/'ninf': NaN and inf must still show in the sums

#: rows per tile of the binomial pass, times the itemsize (2048 float32 rows, 1024 float64): each
#: feature's part of a tile is a long forward read (the hardware prefetches it), four features are
#: read at once, and the tile's rows (256 KiB at 32 features) stay in L2 for the gradient
_TILE_BYTES = 8192
#: rows per product of factors ``1 + exp(-|z|)`` in (1, 2]: below 2^512, which float64 holds (one
#: log per 512 rows instead of one per row)
_PROD = 512


def loss_grad(X, y, coef, intercept, w=None, class_w=None):
    """One block's partial of the weighted log-loss and its gradient (see
    :func:`gdask.ml.kernels.loss_grad`)."""
    s = row_weights(y, w, class_w)
    dt = X.dtype
    c = np.asarray(coef).astype(dt, copy=False)
    b = np.asarray(intercept).astype(dt, copy=False)
    if c.shape[0] == 1:  # binomial
        gc = np.zeros((1, X.shape[1]), np.float64)
        total, gi = _binomial_pass(X.T, y, s, c[0], b[0], gc[0])
    else:  # multinomial, classes along rows: (K, n) keeps every NumPy pass contiguous
        z = c @ X.T
        z += b[:, None]
        total, r, gi = _multinomial(z, y, s)
        gc = r @ X
    return (float(total), gc.astype(np.float64), np.atleast_1d(gi).astype(np.float64))


@njit(nogil=True, cache=True, fastmath=_FM, error_model="numpy")  # no ZeroDivisionError branch: 1 / (1 + e) vectorises
def _binomial_pass(xt, y, s, c, b, gc):  # pragma: no cover - compiled
    """Weighted binomial log-loss ``log(1 + e^z) - y z`` and residuals ``s (sigmoid(z) - y)`` of the
    block's rows (``s=None``: ones), ``z = x . c + b``; adds the gradient ``sum_i r_i x_i`` to ``gc``
    (float64) and returns (loss, sum of the residuals). ``xt`` is the feature-major block (d, n).

    Per tile: ``z`` and ``exp(-|z|)`` in the block's dtype, the row terms in float64 (one SIMD loop),
    the residuals back in the block's dtype for the gradient's products, summed per tile and feature
    in that dtype, then in float64. Unweighted, ``log(1 + e)`` (``e = exp(-|z|)``) is summed as the log
    of the product of ``1 + e`` over :data:`_PROD` rows (float64, within ~512 eps of the exact
    product): one log per 512 rows, not one per row."""
    d, n = xt.shape
    tile = _TILE_BYTES // xt.itemsize
    z = np.empty(tile, xt.dtype)
    e = np.empty(tile, xt.dtype)
    r = np.empty(tile, xt.dtype)
    rr = np.empty(tile, np.float64)  # the residuals, t the loss terms, f the factors 1 + e (float64)
    t = np.empty(tile, np.float64)
    f = np.empty(tile, np.float64)
    zero = z.dtype.type(0)
    loss = 0.0
    gsum = 0.0
    for i0 in range(0, n, tile):
        m = min(tile, n - i0)
        for i in range(m):
            z[i] = b
        j = 0
        while j + 4 <= d:  # raw predictions, vectorised over the tile's rows, 4 features (4 streams) a pass
            c0, c1, c2, c3 = c[j], c[j + 1], c[j + 2], c[j + 3]
            x0 = xt[j, i0:i0 + m]
            x1 = xt[j + 1, i0:i0 + m]
            x2 = xt[j + 2, i0:i0 + m]
            x3 = xt[j + 3, i0:i0 + m]
            for i in range(m):
                z[i] += c0 * x0[i] + c1 * x1[i] + c2 * x2[i] + c3 * x3[i]
            j += 4
        while j < d:
            cj = c[j]
            xr = xt[j, i0:i0 + m]
            for i in range(m):
                z[i] += cj * xr[i]
            j += 1
        for i in range(m):  # exp(-|z|) in (0, 1]: a libm call per row
            e[i] = math.exp(-abs(z[i]))
        for i in range(m):  # the row terms, vectorised over the rows; no sum here (see below)
            zi = np.float64(z[i])
            ei = np.float64(e[i])
            yi = np.float64(y[i0 + i])
            q = 1.0 / (1.0 + ei)            # sigmoid(|z|)
            p = q if zi >= 0 else 1.0 - q
            lin = max(zi, 0.0) - yi * zi
            if s is None:
                ri = p - yi
                f[i] = 1.0 + ei
            else:
                wi = s[i0 + i]
                ri = wi * (p - yi)
                lin *= wi
            t[i] = lin
            rr[i] = ri
            r[i] = ri
        # the sums in loops that only read: a loop that also stores is vectorised only when LLVM's
        # run-time check finds its arrays apart, and the order of its sums (the bits) would then
        # depend on where the heap put them
        for i in range(m):
            loss += t[i]
            gsum += rr[i]
        if s is None:
            for k0 in range(0, m, _PROD):
                prod = 1.0
                for i in range(k0, min(k0 + _PROD, m)):
                    prod *= f[i]
                loss += math.log(prod)
        if s is not None:  # weighted: log(1 + e) per row
            for i in range(m):
                loss += s[i0 + i] * math.log1p(np.float64(e[i]))
        j = 0
        while j + 4 <= d:  # the tile's gradient, its rows still in cache
            x0 = xt[j, i0:i0 + m]
            x1 = xt[j + 1, i0:i0 + m]
            x2 = xt[j + 2, i0:i0 + m]
            x3 = xt[j + 3, i0:i0 + m]
            a0 = zero
            a1 = zero
            a2 = zero
            a3 = zero
            for i in range(m):
                ri = r[i]
                a0 += x0[i] * ri
                a1 += x1[i] * ri
                a2 += x2[i] * ri
                a3 += x3[i] * ri
            gc[j] += a0
            gc[j + 1] += a1
            gc[j + 2] += a2
            gc[j + 3] += a3
            j += 4
        while j < d:
            xr = xt[j, i0:i0 + m]
            acc = zero
            for i in range(m):
                acc += xr[i] * r[i]
            gc[j] += acc
            j += 1
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
