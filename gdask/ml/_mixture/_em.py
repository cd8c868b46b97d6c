"""EM for Gaussian mixtures on the engine.

Each EM iteration is one pass over the blocks: every block computes its rows' log-densities and
responsibilities (the E-step, array-API code on the blocks' device) and the sufficient statistics of
the M-step in float64: ``sum r``, ``sum r x`` and the scatter ``sum r (x - c_k)(x - c_k)^T`` (or its
diagonal) about the current means ``c`` (so the update ``S - n (mu - c)(mu - c)^T`` loses no
precision), plus the sum of the rows' log-likelihoods (the lower bound). The partials are added in
block order and the M-step runs on the host, exactly as scikit-learn sequences them.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gdask.devices import array_namespace
from gdask.gdataset import IterativeAlgorithm, LoopContext
from gdask.ml._gram import _f64, sum_in_order
from gdask.ml._mixture import _params

__all__ = ["EMLoop", "log_resp_block", "log_prob_block"]


def half_mahalanobis(Z: Any, means: Any, prec_chol: Any, cov_type: str) -> Any:
    """``-1/2`` the squared Mahalanobis distance of every row to every component, (n, K)."""
    xp = array_namespace(Z)
    K = means.shape[0]
    cols = []
    for k in range(K):
        D = Z - means[k, :]
        if cov_type == "full":
            Y = D @ prec_chol[k, ...]
            cols.append(xp.sum(Y * Y, axis=1))
        elif cov_type == "tied":
            Y = D @ prec_chol
            cols.append(xp.sum(Y * Y, axis=1))
        elif cov_type == "diag":
            cols.append(xp.sum(D * D * (prec_chol[k, :] * prec_chol[k, :]), axis=1))
        else:
            cols.append(xp.sum(D * D, axis=1) * (prec_chol[k] * prec_chol[k]))
    return -0.5 * xp.stack(cols, axis=1)


def log_prob_block(X: Any, means: Any, prec_chol: Any, const: Any, cov_type: str) -> Any:
    """``log w_k + log N(x | k)`` of every row of one block, (n, K) float64."""
    return half_mahalanobis(_f64(X), means, prec_chol, cov_type) + const


def _logsumexp(L: Any) -> Any:
    xp = array_namespace(L)
    m = xp.max(L, axis=1)
    m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))
    return m + xp.log(xp.sum(xp.exp(L - m[:, None]), axis=1))


def score_block(X: Any, means: Any, prec_chol: Any, const: Any, cov_type: str) -> Any:
    """The log-likelihood of every row of one block under the mixture."""
    return _logsumexp(log_prob_block(X, means, prec_chol, const, cov_type))


def log_resp_block(X: Any, means: Any, prec_chol: Any, const: Any, cov_type: str) -> Any:
    """The log-responsibilities of every row of one block, (n, K)."""
    L = log_prob_block(X, means, prec_chol, const, cov_type)
    return L - _logsumexp(L)[:, None]


def proba_block(X: Any, means: Any, prec_chol: Any, const: Any, cov_type: str, dtype: Any = None) -> Any:
    xp = array_namespace(X)
    P = xp.exp(log_resp_block(X, means, prec_chol, const, cov_type))
    return P if dtype is None else xp.astype(P, dtype)


def predict_block(X: Any, means: Any, prec_chol: Any, const: Any, cov_type: str) -> Any:
    return array_namespace(X).argmax(log_prob_block(X, means, prec_chol, const, cov_type), axis=1)


def _statistics(Z: Any, R: Any, shift: Any, cov_type: str) -> dict:
    """``nk``, ``sx`` and the scatter about ``shift`` of responsibilities ``R`` (n, K)."""
    xp = array_namespace(Z)
    K = R.shape[1]
    s2 = []
    for k in range(K):
        D = Z - shift[k, :]
        r = R[:, k]
        s2.append((D * r[:, None]).T @ D if cov_type in ("full", "tied") else xp.sum(D * D * r[:, None], axis=0))
    return {"nk": xp.sum(R, axis=0), "sx": R.T @ Z, "s2": xp.stack(s2, axis=0)}


def em_block(X: Any, means: Any, prec_chol: Any, const: Any, shift: Any, cov_type: str) -> dict:
    """One block's E-step and M-step statistics (and the sum of its rows' log-likelihoods)."""
    Z = _f64(X)
    xp = array_namespace(Z)
    L = log_prob_block(Z, means, prec_chol, const, cov_type)
    lse = _logsumexp(L)
    out = _statistics(Z, xp.exp(L - lse[:, None]), shift, cov_type)
    out["ll"] = xp.sum(lse)
    return out


def init_block(X: Any, R: Any, ks: Any, shift: Any, center: Any, cov_type: str, second: bool) -> dict:
    """The statistics of given responsibilities: ``R`` (n, K) dense, or labels (n,) (-1: none). The
    first pass also counts the rows and sums them; the second gives the scatters about ``shift`` and,
    for a tied covariance, the scatter of all rows about ``center`` (scikit-learn's tied estimate
    uses every row whatever its responsibilities)."""
    Z = _f64(X)
    xp = array_namespace(Z)
    if R.ndim == 1:
        R = xp.astype(R[:, None] == ks[None, :], xp.float64)
    else:
        R = _f64(R)
    if not second:
        return {"nk": xp.sum(R, axis=0), "sx": R.T @ Z, "n": float(Z.shape[0]), "s": xp.sum(Z, axis=0)}
    out = _statistics(Z, R, shift, cov_type)
    if center is not None:
        D = Z - center
        out["T"] = D.T @ D
    return out


def _combine(parts: list) -> dict:
    return {k: sum_in_order([p[k] for p in parts]) for k in parts[0]}


class EMLoop(IterativeAlgorithm):
    """EM from initial responsibilities (``ctx.data["R"]``) or parameters (state ``"params"``).

    State: ``params`` (weights, means, covariances or None, prec_chol), ``lb`` (lower bound),
    ``lbs``, ``n_iter``, ``converged``."""

    name = "gaussian-mixture"

    def __init__(self, K: int, cov_type: str, reg: float, tol: float, max_iter: int, n: int,
                 inits: tuple) -> None:
        self.K, self.cov_type, self.reg = K, cov_type, float(reg)
        self.tol, self.max_iter, self.n = float(tol), int(max_iter), int(n)
        self.inits = inits  # weights_init, means_init, precisions_init (validated) or None

    def _initial(self, ctx: LoopContext) -> dict:
        """scikit-learn's ``_initialize`` from the responsibilities ``R`` (two passes)."""
        X, R, ks = ctx.data["X"], ctx.data["R"], np.arange(self.K)
        first = _combine(ctx.map(init_block, X, R, ks, None, None, self.cov_type, False, name="gmm-init-means"))
        shift = first["sx"] / (first["nk"] + 10 * np.finfo(np.float64).eps)[:, None]
        center = first["s"] / first["n"] if self.cov_type == "tied" else None
        stats = _combine(ctx.map(init_block, X, R, ks, shift, center, self.cov_type, True,
                                 name="gmm-init-covariances"))
        nk, means, cov = _params.m_step(stats, shift, self.reg, self.cov_type)
        if center is not None:  # scikit-learn's (X^T X - sum_k nk mu_k mu_k^T) / sum nk, about the mean
            m = center
            cov = (stats["T"] + first["n"] * np.outer(m, m) - (nk[:, None] * means).T @ means) / nk.sum()
            cov[np.diag_indices_from(cov)] += self.reg
        w0, m0, p0 = self.inits
        weights = nk / self.n if w0 is None else w0
        means = means if m0 is None else m0
        if p0 is None:
            return {"weights": weights, "means": means, "covariances": cov,
                    "prec_chol": _params.precisions_cholesky(cov, self.cov_type)}
        return {"weights": weights, "means": means, "covariances": None,
                "prec_chol": _params.precisions_cholesky_from_precisions(p0, self.cov_type)}

    def run(self, state: dict, ctx: LoopContext) -> dict:
        st = dict(state)
        if st.get("params") is None:
            st["params"] = self._initial(ctx)
            ctx.checkpoint(st, line="initial parameters")
        X = ctx.data["X"]
        while st["n_iter"] < self.max_iter and not st["converged"]:
            t0 = time.perf_counter()
            p = st["params"]
            d = p["means"].shape[1]
            const = _params.constants(p["weights"], p["prec_chol"], self.cov_type, d)
            parts = ctx.map(em_block, X, p["means"], p["prec_chol"], const, p["means"], self.cov_type,
                            name="gmm-em")
            stats = _combine(parts)
            lb = float(stats["ll"]) / self.n
            nk, means, cov = _params.m_step(stats, p["means"], self.reg, self.cov_type)
            params = {"weights": nk / nk.sum(), "means": means, "covariances": cov,
                      "prec_chol": _params.precisions_cholesky(cov, self.cov_type)}
            change = lb - st["lb"]
            st = {**st, "params": params, "lb": lb, "lbs": [*st["lbs"], lb], "n_iter": st["n_iter"] + 1,
                  "converged": abs(change) < self.tol}
            ctx.checkpoint(st, lower_bound=lb, change=change,
                           line=f"iteration {st['n_iter']}: lower bound {lb:.10g}, change {change:.3g}, "
                                f"{time.perf_counter() - t0:.3f} s")
        return st
