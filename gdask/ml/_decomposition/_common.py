"""Block functions and checks shared by PCA and TruncatedSVD."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gdask.devices import array_namespace, astype
from gdask.ml._adapt import as_gdataset, output
from gdask.ml._gram import _f64

__all__ = ["apply_rows", "infer_dimension", "project_block", "reconstruct_block"]


def project_block(X: Any, components: Any, mean: Any = None, scale: Any = None) -> Any:
    """``((X - mean) @ components.T) / scale`` of one block, in float64, returned in X's dtype."""
    Z = _f64(X)
    if mean is not None:
        Z = Z - mean
    out = Z @ components.T
    if scale is not None:
        out = out / scale
    return astype(out, X.dtype)


def reconstruct_block(X: Any, components: Any, mean: Any = None) -> Any:
    """``X @ components + mean`` of one block (the inverse transform), in X's dtype."""
    out = _f64(X) @ components
    if mean is not None:
        out = out + mean
    return astype(out, X.dtype)


def loglik_block(X: Any, mean: Any, precision: Any, const: float) -> Any:
    """The probabilistic PCA log-likelihood of every row of one block (float64)."""
    R = _f64(X) - mean
    xp = array_namespace(R)
    return -0.5 * xp.sum(R * (R @ precision), axis=1) - const


def apply_rows(est: Any, X: Any, func: Any, *args: Any, ncols: int | None, dtype: Any = None,
               name: str = "rows") -> Any:
    """``func(block, *args)`` over the rows of any input ``X``, returned as the input's type (lazy
    for GDataSet and dask input); ``X`` must have ``est.n_features_in_`` columns."""
    G, kind = as_gdataset(est, X, reset=False)
    out = G.map_blocks(func, *args, dtype=dtype or G.dtype, ncols=ncols, name=name)
    return output(out, kind)


def _assess(spectrum: np.ndarray, rank: int, n_samples: int) -> float:
    """Minka's (2000) Laplace approximation of the log evidence of a probabilistic PCA of ``rank``
    components for the eigenvalue ``spectrum`` (descending) of ``n_samples`` rows."""
    d = len(spectrum)
    if not 1 <= rank < d:
        raise ValueError("the rank must be in [1, n_features - 1]")
    lam = spectrum[:rank]
    log_pu = -rank * math.log(2.0) + sum(math.lgamma((d - i) / 2.0) - (d - i) / 2.0 * math.log(math.pi)
                                         for i in range(rank))
    log_pl = -n_samples / 2.0 * float(np.sum(np.log(lam)))
    v = max(float(np.sum(spectrum[rank:])) / (d - rank), 1e-15)
    log_pv = -n_samples * (d - rank) / 2.0 * math.log(v)
    m = d * rank - rank * (rank + 1.0) / 2.0
    log_pp = (m + rank) / 2.0 * math.log(2.0 * math.pi)
    # the Hessian's determinant over pairs i < j (the inverses with the noise variance beyond rank)
    inv = np.concatenate([1.0 / lam, np.full(d - rank, 1.0 / v)])
    log_paz = 0.0
    for i in range(rank):
        diff_inv = inv[i + 1:] - inv[i]
        diff = lam[i] - spectrum[i + 1:]
        with np.errstate(divide="ignore", invalid="ignore"):
            log_paz += float(np.sum(np.log(diff_inv * diff))) + math.log(n_samples) * (d - i - 1)
    return log_pu + log_pl + log_pv + log_pp - log_paz / 2.0 - rank * math.log(n_samples) / 2.0


def infer_dimension(spectrum: np.ndarray, n_samples: int) -> int:
    """The number of components of largest evidence (Minka's MLE, ``n_components="mle"``)."""
    best, arg = -np.inf, 1
    for rank in range(1, len(spectrum)):
        if spectrum[rank - 1] < 1e-15:  # a zero eigenvalue: no evidence for this rank (as scikit-learn)
            break
        ll = _assess(spectrum, rank, n_samples)
        if ll > best:
            best, arg = ll, rank
    return arg
