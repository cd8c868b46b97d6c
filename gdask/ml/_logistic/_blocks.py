"""The functions logistic regression runs in block tasks: scores, probabilities and labels of a
block (NaN / inf refused, as scikit-learn refuses them), class counts and weight sums."""

from __future__ import annotations

from typing import Any

import numpy as np

from gdask.devices import array_namespace, asarray_like, to_numpy
from gdask.ml import kernels as _k
from gdask.ml._base import require_finite

__all__ = ["checked_decision", "decision_block", "predict_block", "proba_block", "probabilities", "weight_sum",
           "weighted_bincount"]


def probabilities(scores: Any) -> Any:
    """Class probabilities from decision scores ((n,) binary or (n, K)), in the scores' namespace."""
    xp = array_namespace(scores)
    if scores.ndim == 1:
        p1 = expit(scores, xp)
        return xp.stack([1 - p1, p1], axis=1)
    m = xp.max(scores, axis=1, keepdims=True)
    e = xp.exp(scores - m)
    return e / xp.sum(e, axis=1, keepdims=True)


def decision_block(X, coef, intercept):
    z = checked_decision(X, coef, intercept)
    return z[:, 0] if z.shape[1] == 1 else z


def proba_block(X, coef, intercept):
    return probabilities(decision_block(X, coef, intercept))


def predict_block(X, coef, intercept, classes):
    z = decision_block(X, coef, intercept)
    xp = array_namespace(z)
    idx = xp.astype(z > 0, xp.int64) if z.ndim == 1 else xp.argmax(z, axis=1)
    return xp.take(asarray_like(classes, z), idx)


def checked_decision(X, coef, intercept):
    """:func:`gdask.ml.kernels.decision` of one block; NaN or infinity in it raises, as for NumPy
    input (scikit-learn's check)."""
    require_finite(X)
    return _k.decision(X, coef, intercept)


def expit(z: Any, xp) -> Any:
    e = xp.exp(-xp.abs(z))
    q = 1 / (1 + e)
    return xp.where(z >= 0, q, e * q)


def weighted_bincount(y, k, w=None):
    """Weighted count of each class code ``0..k-1`` in a block, on the host."""
    if isinstance(y, np.ndarray):
        return np.bincount(y, weights=w, minlength=k).astype(np.float64)
    import array_api_extra as xpx

    xp = array_namespace(y)
    oh = xpx.one_hot(xp.astype(y, xp.int64), k, dtype=xp.float64, xp=xp)
    return to_numpy(xp.sum(oh if w is None else oh * xp.astype(w, xp.float64)[:, None], axis=0))


def weight_sum(y, w=None, class_w=None):
    s = _k.row_weights(y, w, class_w)
    if s is None:
        return float(y.shape[0])
    return float(s.sum() if isinstance(s, np.ndarray) else array_namespace(s).sum(s))
