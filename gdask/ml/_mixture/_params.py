"""Gaussian mixture parameters on the host: the M-step from combined block statistics, Cholesky
factors of the precisions (scikit-learn's conventions), log-determinants, parameter counts, checks."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import linalg

__all__ = ["COV_TYPES", "ERROR", "check_inits", "log_det", "m_step", "n_parameters", "precisions",
           "precisions_cholesky", "precisions_cholesky_from_precisions"]

COV_TYPES = ("full", "tied", "diag", "spherical")

ERROR = ("Fitting the mixture model failed because some components have ill-defined empirical covariance (for "
         "instance caused by singleton or collapsed samples). Try to decrease the number of components, increase "
         "reg_covar, or scale the input data.")


def m_step(stats: dict, shift: np.ndarray, reg: float, cov_type: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(nk, means, covariances)`` from the sums of responsibilities ``nk``, of ``r x`` (``sx``) and
    of ``r (x - shift_k)^2`` products (``s2``): scikit-learn's estimates, ``nk + 10 eps`` and all."""
    nr = stats["nk"]
    nk = nr + 10 * np.finfo(np.float64).eps
    means = stats["sx"] / nk[:, None]
    delta = means - shift
    s2 = stats["s2"]
    d = means.shape[1]
    if cov_type in ("full", "tied"):
        scat = s2 - nr[:, None, None] * (delta[:, :, None] * delta[:, None, :])
        if cov_type == "full":
            cov = scat / nk[:, None, None]
            cov[:, np.arange(d), np.arange(d)] += reg
        else:
            cov = scat.sum(axis=0) / nk.sum()
            cov[np.arange(d), np.arange(d)] += reg
        return nk, means, cov
    diag = (s2 - nr[:, None] * delta * delta) / nk[:, None] + reg
    return nk, means, (diag if cov_type == "diag" else diag.mean(axis=1))


def precisions_cholesky(cov: np.ndarray, cov_type: str) -> np.ndarray:
    """The precisions' Cholesky factors ``U`` (``precision = U U^T``, ``U = chol(cov)^-T``) as
    scikit-learn stores them; ValueError for a covariance that is not positive definite."""
    if cov_type in ("full", "tied"):
        covs = cov if cov_type == "full" else cov[None]
        out = np.empty_like(covs)
        for k, c in enumerate(covs):
            try:
                L = linalg.cholesky(c, lower=True)
            except linalg.LinAlgError:
                raise ValueError(ERROR) from None
            out[k] = linalg.solve_triangular(L, np.eye(c.shape[0]), lower=True).T
        return out if cov_type == "full" else out[0]
    if np.any(cov <= 0.0):
        raise ValueError(ERROR)
    return 1.0 / np.sqrt(cov)


def _flip(a: np.ndarray) -> np.ndarray:
    return a[::-1, ::-1]


def precisions_cholesky_from_precisions(prec: np.ndarray, cov_type: str) -> np.ndarray:
    """The upper-triangular ``U`` with ``precision = U U^T`` (Cholesky of the reversed matrix)."""
    if cov_type == "full":
        return np.stack([_flip(linalg.cholesky(_flip(p), lower=True)) for p in prec])
    if cov_type == "tied":
        return _flip(linalg.cholesky(_flip(prec), lower=True))
    return np.sqrt(prec)


def precisions(prec_chol: np.ndarray, cov_type: str) -> np.ndarray:
    """The precision matrices (or vectors / scalars) from their Cholesky factors."""
    if cov_type == "full":
        return np.einsum("kij,klj->kil", prec_chol, prec_chol)
    if cov_type == "tied":
        return prec_chol @ prec_chol.T
    return prec_chol ** 2


def log_det(prec_chol: np.ndarray, cov_type: str, d: int) -> np.ndarray | float:
    """``log det`` of the Cholesky factors (half the precisions' log-determinants), per component."""
    if cov_type == "full":
        return np.log(np.diagonal(prec_chol, axis1=1, axis2=2)).sum(axis=1)
    if cov_type == "tied":
        return float(np.log(np.diag(prec_chol)).sum())
    if cov_type == "diag":
        return np.log(prec_chol).sum(axis=1)
    return d * np.log(prec_chol)


def constants(weights: np.ndarray, prec_chol: np.ndarray, cov_type: str, d: int) -> np.ndarray:
    """Per component: ``log w_k + log det U_k - d/2 log(2 pi)`` (what the blocks add to ``-mahal/2``)."""
    with np.errstate(divide="ignore"):
        lw = np.log(weights)
    return lw + log_det(prec_chol, cov_type, d) - 0.5 * d * math.log(2 * math.pi)


def n_parameters(K: int, d: int, cov_type: str) -> int:
    """Free parameters of the model (for BIC / AIC)."""
    cov = {"full": K * d * (d + 1) / 2.0, "diag": K * d, "tied": d * (d + 1) / 2.0, "spherical": K}[cov_type]
    return int(cov + K * d + K - 1)


def _check_shape(a: np.ndarray, shape: tuple, name: str) -> None:
    if a.shape != shape:
        raise ValueError(f"The parameter '{name}' should have the shape of {shape}, but got {a.shape}")


def _check_pd(P: np.ndarray, what: str) -> None:
    if not (np.allclose(P, P.T) and np.all(linalg.eigvalsh(P) > 0.0)):
        raise ValueError(f"'{what} precision' should be symmetric, positive-definite")


def check_inits(est: Any, K: int, d: int) -> tuple[Any, Any, Any]:
    """``weights_init``, ``means_init``, ``precisions_init`` validated as float64 arrays (or None)."""
    w = m = p = None
    if est.weights_init is not None:
        w = np.asarray(est.weights_init, dtype=np.float64)
        _check_shape(w, (K,), "weights")
        if np.any(w < 0.0) or np.any(w > 1.0):
            raise ValueError(f"The parameter 'weights' should be in the range [0, 1], but got max value "
                             f"{w.max():.5f}, min value {w.min():.5f}")
        if not np.allclose(np.abs(1.0 - w.sum()), 0.0):
            raise ValueError(f"The parameter 'weights' should be normalized, but got sum(weights) = {w.sum():.5f}")
    if est.means_init is not None:
        m = np.asarray(est.means_init, dtype=np.float64)
        _check_shape(m, (K, d), "means")
    if est.precisions_init is not None:
        p = np.asarray(est.precisions_init, dtype=np.float64)
        t = est.covariance_type
        shape = {"full": (K, d, d), "tied": (d, d), "diag": (K, d), "spherical": (K,)}[t]
        _check_shape(p, shape, f"{t} precision")
        if t in ("diag", "spherical") and np.any(p <= 0):
            raise ValueError(f"'{t} precision' should be positive")
        for P in (p if t == "full" else [p] if t == "tied" else []):
            _check_pd(P, t)
    return w, m, p
