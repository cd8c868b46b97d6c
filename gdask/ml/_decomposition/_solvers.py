"""The SVD solvers of PCA and TruncatedSVD on the engine.

* exact: one pass gives the all-gathered Gram matrix of the (centered) data in float64
  (:mod:`gdask.ml._gram`); its eigendecomposition gives the singular values and right singular
  vectors of X, every one of them (the problem scikit-learn's "full", "covariance_eigh" and
  "arpack" solve).
* randomized: Halko, Martinsson & Tropp's randomized range finder as scikit-learn runs it
  (``randomized_svd``: ``Q = orth(M (M^T M)^q Omega)``, ``B = Q^T M``, SVD of ``B``), with the
  power iterations on the engine: the tall ``n x l`` basis is never formed; each power iteration is
  one pass ``K -> M^T (M K)`` on ``d x l`` matrices, orthonormalised on the host (which leaves
  the subspace, hence the result, as scikit-learn's normalisers do), and a last pass gives
  ``Y = M^T M K`` and ``s = 1^T M K``, from which ``B = Lambda^-1/2 E^T Y^T`` (``K^T Y = E Lambda E^T``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gdask.devices import array_namespace
from gdask.gdataset import IterativeAlgorithm, LoopContext
from gdask.ml._gram import _f64, gram_apply_block, sum_in_order

__all__ = ["RandomizedSVD", "col_moments_block", "combine_col_moments", "eig_from_moments", "flip_rows",
           "random_basis"]


def flip_rows(Vt: np.ndarray) -> np.ndarray:
    """scikit-learn's sign convention (``svd_flip(u_based_decision=False)``): the largest absolute
    entry of every row of ``Vt`` is positive."""
    if Vt.size == 0:
        return Vt
    idx = np.argmax(np.abs(Vt), axis=1)
    signs = np.sign(Vt[np.arange(Vt.shape[0]), idx])
    signs[signs == 0] = 1
    return Vt * signs[:, None]


def eig_from_moments(n: float, mean: np.ndarray, m2: np.ndarray, center: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(sigma^2 descending, Vt)`` of X (centered when ``center``) from its moments: the eigenvalues
    (clipped at 0) and eigenvectors of its Gram matrix in float64."""
    G = m2 if center else m2 + n * np.outer(mean, mean)
    lam, vec = np.linalg.eigh((G + G.T) / 2)
    lam = np.clip(lam[::-1], 0.0, None)
    return lam, flip_rows(np.ascontiguousarray(vec[:, ::-1].T))


def col_moments_block(X: Any) -> tuple[float, Any, Any]:
    """``(rows, column means, column sums of squared deviations)`` of one block, in float64."""
    Z = _f64(X)
    if Z.shape[0] == 0:
        return 0.0, None, None
    xp = array_namespace(Z)
    n = float(Z.shape[0])
    mean = xp.sum(Z, axis=0) / n
    C = Z - mean
    return n, mean, xp.sum(C * C, axis=0)


def combine_col_moments(parts: list) -> tuple[float, np.ndarray, np.ndarray]:
    """Chan's combination of :func:`col_moments_block` partials, in block order."""
    n, mean, m2 = 0.0, None, None
    for nb, mb, m2b in parts:
        if nb == 0:
            continue
        if mean is None:
            n, mean, m2 = nb, np.array(mb, dtype=np.float64), np.array(m2b, dtype=np.float64)
            continue
        tot = n + nb
        delta = mb - mean
        mean = mean + delta * (nb / tot)
        m2 = m2 + m2b + delta * delta * (n * nb / tot)
        n = tot
    return n, mean, m2


def random_basis(random_state: np.random.RandomState, d: int, n_random: int, dtype: Any) -> np.ndarray:
    """The starting ``Omega`` of scikit-learn's range finder: the same draws from the same state."""
    Q = random_state.normal(size=(d, n_random))
    if np.dtype(dtype).kind == "f":
        Q = Q.astype(dtype, copy=False)
    return Q.astype(np.float64)


def _row_sums_block(X: Any, mu: Any, K: Any) -> tuple[Any, Any]:
    """``(M^T (M K), 1^T M K)`` of one block, ``M = X - mu``."""
    Z = _f64(X)
    if mu is not None:
        Z = Z - mu
    P = Z @ K
    return Z.T @ P, array_namespace(P).sum(P, axis=0)


class RandomizedSVD(IterativeAlgorithm):
    """The randomized SVD's passes: column moments, ``n_iter`` power iterations, the last pass.
    State: ``{"K": basis (d x l), "it": power iterations done, "col": column moments}``; the result
    under ``"Y"``, ``"s"``."""

    name = "randomized-svd"

    def __init__(self, n_iter: int, center: bool) -> None:
        self.n_iter = int(n_iter)
        self.center = bool(center)

    def run(self, state: dict, ctx: LoopContext) -> dict:
        X = ctx.data["X"]
        if "col" not in state:
            t0 = time.perf_counter()
            col = combine_col_moments(ctx.map(col_moments_block, X, name="svd-column-moments"))
            state = {**state, "col": col}
            ctx.checkpoint(state, line=f"column moments: {time.perf_counter() - t0:.3f} s")
        mu = state["col"][1] if self.center else None
        while state["it"] < self.n_iter:
            t0 = time.perf_counter()
            Y = sum_in_order(ctx.map(gram_apply_block, X, mu, state["K"], name="svd-power-iteration"))
            K, _ = np.linalg.qr(Y)
            state = {**state, "K": K, "it": state["it"] + 1}
            ctx.checkpoint(state, line=f"power iteration {state['it']}: {time.perf_counter() - t0:.3f} s")
        if "Y" not in state:
            t0 = time.perf_counter()
            parts = ctx.map(_row_sums_block, X, mu, state["K"], name="svd-range")
            state = {**state, "Y": sum_in_order([p[0] for p in parts]), "s": sum_in_order([p[1] for p in parts])}
            ctx.checkpoint(state, line=f"range pass: {time.perf_counter() - t0:.3f} s")
        return state


def randomized_result(state: dict, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(singular values, Vt, variance of the transformed columns (ddof=0))`` of the top ``k``
    from a finished :class:`RandomizedSVD` state."""
    K, Y, s = state["K"], state["Y"], state["s"]
    n = state["col"][0]
    A = K.T @ Y
    lam, E = np.linalg.eigh((A + A.T) / 2)
    keep = lam > max(lam.max(initial=0.0), 0.0) * A.shape[0] * np.finfo(np.float64).eps
    lam, E = lam[keep], E[:, keep]
    B = (E / np.sqrt(lam)).T @ Y.T
    Ut, S, Vt = np.linalg.svd(B, full_matrices=False)
    Vt = Vt[:k]
    signs = np.sign(Vt[np.arange(Vt.shape[0]), np.argmax(np.abs(Vt), axis=1)])
    signs[signs == 0] = 1
    # the transformed column j is M K c_j with c_j = E Lambda^-1/2 Ut_j S_j
    C = (E / np.sqrt(lam)) @ (Ut[:, :k] * S[:k])
    var = np.einsum("ij,ik,kj->j", C, A, C) / n - ((s @ C) / n) ** 2
    return S[:k], Vt * signs[:, None], np.clip(var, 0.0, None)
