"""Ordinary least squares and ridge regression on the engine (scikit-learn API)."""

from __future__ import annotations

import numbers
import warnings
from typing import Any

import numpy as np

from gdask.ml._adapt import check_int, check_real
from gdask.ml._base import in_task_scope
from gdask.ml._gram import run_passes
from gdask.ml._linear_model._base import LinearModel
from gdask.ml._linear_model._cd import CD_LOCK, cd_gram
from gdask.ml._linear_model._iterative import ConjugateGradient, Fista
from gdask.ml._linear_model._problem import Data, Problem, prepare, problem

__all__ = ["LinearRegression", "Ridge"]

_RIDGE_SOLVERS = ("auto", "svd", "cholesky", "lsqr", "sparse_cg", "sag", "saga", "lbfgs")
#: iterations of the engine's solvers when ``max_iter`` is None
_DEFAULT_MAX_ITER = 1000


def _eig(Q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lam, E = np.linalg.eigh((Q + Q.T) / 2)
    return lam[::-1], E[:, ::-1]


def _cutoff(lam: np.ndarray, n: int, d: int) -> float:
    """Eigenvalues of the Gram matrix below this are taken as 0 (its singular values below
    ``s_max * sqrt(eps * max(n, d))``: the Gram matrix squares X's condition number)."""
    return float(max(lam.max(initial=0.0), 0.0) * np.finfo(np.float64).eps * max(n, d))


def _min_norm(lam: np.ndarray, E: np.ndarray, q: np.ndarray, cut: float) -> np.ndarray:
    """The minimum-norm solution of ``Q w = q`` (``Q = E diag(lam) E^T``), shape (t, d)."""
    keep = lam > cut
    return ((E[:, keep] / lam[keep]) @ (E[:, keep].T @ q)).T


def _nnls(lam: np.ndarray, E: np.ndarray, q: np.ndarray, cut: float) -> np.ndarray:
    """Non-negative least squares from the Gram matrix: ``min ||A w - b||`` with ``A^T A = Q``,
    ``A^T b = q`` (``A = diag(sqrt(lam)) E^T``); shape (t, d)."""
    from scipy.optimize import nnls

    keep = lam > cut
    A = np.sqrt(lam[keep])[:, None] * E[:, keep].T
    B = (E[:, keep].T @ q) / np.sqrt(lam[keep])[:, None]
    return np.stack([nnls(A, B[:, k], maxiter=50 * A.shape[1] + 50)[0] for k in range(q.shape[1])])


class LinearRegression(LinearModel):
    """Ordinary least squares on device-resident blocks, scikit-learn API.

    Few features: one pass all-gathers the centered, weighted Gram matrix in float64 and the
    minimum-norm solution is computed from its eigendecomposition (``singular_values_`` and
    ``rank_`` of the centered, weighted X; singular values below ``s_max * sqrt(eps * max(n, d))``
    count as zero). Many features (more than ``gdask.ml._linear_model._problem.GRAM_MAX_FEATURES``):
    conjugate gradients on the normal equations, one pass per iteration, to ``tol`` (then
    ``rank_`` and ``singular_values_`` are not set, as scikit-learn for sparse X).

    Parameters
    ----------
    fit_intercept : bool, default True
    copy_X : bool
        Accepted for compatibility: gdask never modifies X.
    tol : float, default 1e-6
        Relative residual of the iterative solver (many features).
    n_jobs : int or None
        Accepted for compatibility.
    positive : bool, default False
        Non-negative least squares (from the Gram matrix: scipy's NNLS on its square root).
    verbose, callback, gpu, memory, job_name
        Progress and device share of the fit, as the other gdask.ml estimators.
    """

    def __init__(self, *, fit_intercept: bool = True, copy_X: bool = True, tol: float = 1e-6, n_jobs: Any = None,
                 positive: bool = False, verbose: Any = 0, callback: Any = None, gpu: float | None = None,
                 memory: Any = None, job_name: str | None = None) -> None:
        self.fit_intercept = fit_intercept
        self.copy_X = copy_X
        self.tol = tol
        self.n_jobs = n_jobs
        self.positive = positive
        self.verbose = verbose
        self.callback = callback
        self.gpu = gpu
        self.memory = memory
        self.job_name = job_name

    @in_task_scope
    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> LinearRegression:
        """Fit on X, y (any supported input types; ``sample_weight`` non-negative)."""
        self._check_common()
        check_real(self, "tol", 0.0)
        data = prepare(self, X, y, sample_weight, non_negative=True)
        prob = problem(self, data, self.fit_intercept, gram=None if not self.positive else True)
        n, d = data.X.shape
        if prob.Q is None:
            b = prob.q
            res = run_passes(self, ConjugateGradient(data.W is not None, prob.x_mean if self.fit_intercept else None,
                                                     np.zeros(b.shape[1]), b, self.tol, _DEFAULT_MAX_ITER),
                             data.arrays(), ConjugateGradient.start(b), total=_DEFAULT_MAX_ITER)
            coef = res.state["w"].T
        else:
            lam, E = _eig(prob.Q)
            cut = _cutoff(lam, n, d)
            coef = _nnls(lam, E, prob.q, cut) if self.positive else _min_norm(lam, E, prob.q, cut)
            self.rank_ = int((lam > cut).sum())
            self.singular_values_ = np.sqrt(np.clip(lam, 0.0, None))[:min(n, d)].astype(data.X.dtype)
        self._set_coef(data, prob, coef)
        return self


class Ridge(LinearModel):
    """Linear least squares with an L2 penalty, ``||y - Xw||^2_S + alpha ||w||^2``, on device-resident
    blocks, scikit-learn API.

    ``solver`` maps scikit-learn's names onto the problem gdask solves them by (all solve the same
    problem): "auto", "svd" and "cholesky" solve exactly from the all-gathered Gram matrix in
    float64 (one pass) while the features are few, else by conjugate gradients on the engine (one
    pass per iteration); "sparse_cg", "lsqr", "sag" and "saga" always take the conjugate gradients
    (``tol`` / ``max_iter``); "lbfgs" (with ``positive=True``, as scikit-learn requires) is solved
    by projected coordinate descent on the Gram matrix. ``solver_`` tells which ran.

    Parameters
    ----------
    alpha : float or array of shape (n_targets,), default 1.0
    fit_intercept : bool, default True
    copy_X : bool
        Accepted for compatibility.
    max_iter : int or None
        Iterations of the iterative solvers (default 1000).
    tol : float, default 1e-4
    solver : str, default "auto"
    positive : bool, default False
    random_state : any
        Accepted for compatibility (no solver here is random).
    verbose, callback, gpu, memory, job_name
        As the other gdask.ml estimators.
    """

    _ravel_one_target = True

    def __init__(self, alpha: Any = 1.0, *, fit_intercept: bool = True, copy_X: bool = True, max_iter: Any = None,
                 tol: float = 1e-4, solver: str = "auto", positive: bool = False, random_state: Any = None,
                 verbose: Any = 0, callback: Any = None, gpu: float | None = None, memory: Any = None,
                 job_name: str | None = None) -> None:
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.copy_X = copy_X
        self.max_iter = max_iter
        self.tol = tol
        self.solver = solver
        self.positive = positive
        self.random_state = random_state
        self.verbose = verbose
        self.callback = callback
        self.gpu = gpu
        self.memory = memory
        self.job_name = job_name

    def _check_params(self) -> None:
        self._check_common()
        if self.solver not in _RIDGE_SOLVERS:
            raise ValueError(f"The 'solver' parameter of Ridge must be a str among {_RIDGE_SOLVERS}. Got "
                             f"{self.solver!r} instead.")
        if self.positive and self.solver not in ("auto", "lbfgs"):
            raise ValueError(f"solver='{self.solver}' does not support positive fitting. Please set the solver to "
                             "'auto' or 'lbfgs', or set `positive=False`")
        if self.solver == "lbfgs" and not self.positive:
            raise ValueError("'lbfgs' solver can be used only when positive=True. Please use another solver.")
        check_int(self, "max_iter", 1, none=True)
        check_real(self, "tol", 0.0)
        a = np.asarray(self.alpha)
        if isinstance(self.alpha, numbers.Real) or a.ndim == 0:
            check_real(self, "alpha", 0.0)
        elif not (np.isfinite(a).all() and (a >= 0).all()):
            raise ValueError(f"alpha must be non-negative, got {self.alpha!r}")

    @in_task_scope
    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> Ridge:
        """Fit on X, y (any supported input types)."""
        self._check_params()
        data = prepare(self, X, y, sample_weight)
        alpha = np.asarray(self.alpha, dtype=np.float64).ravel()
        if alpha.size not in (1, data.t):
            raise ValueError(f"Number of targets and number of penalties do not correspond: {alpha.size} != "
                             f"{data.t}")
        alpha = np.broadcast_to(alpha, (data.t,)).copy()
        iterative = self.solver in ("sparse_cg", "lsqr", "sag", "saga")
        prob = problem(self, data, self.fit_intercept, gram=False if iterative else None)
        self.n_iter_ = None
        if self.positive:
            coef, ran = self._positive(data, prob, alpha), "lbfgs"
        elif prob.Q is None:
            coef, ran = self._cg(data, prob, alpha), "sparse_cg"
        else:
            coef, ran = self._direct(data, prob, alpha), "cholesky"
        # scikit-learn's names: the solver asked for (solved as the docstring says), "auto" resolved;
        # n_iter_ only for the solvers scikit-learn reports it for
        self.solver_ = ran if self.solver == "auto" else self.solver
        if self.solver_ not in ("lsqr", "sag", "saga", "lbfgs"):
            self.n_iter_ = None
        self._set_coef(data, prob, coef)
        return self

    def _direct(self, data: Data, prob: Problem, alpha: np.ndarray) -> np.ndarray:
        lam, E = _eig(prob.Q)
        proj = E.T @ prob.q  # (d, t)
        out = np.empty((data.t, data.d))
        for k in range(data.t):
            if alpha[k] > 0:
                out[k] = E @ (proj[:, k] / (np.clip(lam, 0.0, None) + alpha[k]))
            else:  # no penalty: the minimum-norm least-squares solution
                out[k] = _min_norm(lam, E, prob.q[:, k:k + 1], _cutoff(lam, *data.X.shape))[0]
        return out

    def _cg(self, data: Data, prob: Problem, alpha: np.ndarray) -> np.ndarray:
        max_iter = self.max_iter or _DEFAULT_MAX_ITER
        algo = ConjugateGradient(data.W is not None, prob.x_mean if self.fit_intercept else None, alpha, prob.q,
                                 self.tol, max_iter)
        res = run_passes(self, algo, data.arrays(), ConjugateGradient.start(prob.q), total=max_iter)
        self.n_iter_ = np.asarray(res.state["n_iter"], dtype=np.int32)
        return res.state["w"].T

    def _positive(self, data: Data, prob: Problem, alpha: np.ndarray) -> np.ndarray:
        max_iter = self.max_iter or 15000
        out = np.empty((data.t, data.d))
        iters = []
        for k in range(data.t):
            if prob.Q is not None:
                with CD_LOCK:
                    w, gap, tol, it, conv = cd_gram(np.zeros(data.d), 0.0, float(alpha[k]), prob.Q, prob.q[:, k].copy(),
                                                    float(prob.yy[k]), max_iter, float(self.tol), True, False, 0, False)
            else:
                algo = Fista(data.W is not None, prob.x_mean if self.fit_intercept else None, 1.0,
                             prob.q[:, k:k + 1], prob.yy[k:k + 1], 0.0, float(alpha[k]), self.tol, max_iter, True)
                res = run_passes(self, algo, data.arrays(), Fista.start(np.zeros((data.d, 1))), total=max_iter)
                w, it, conv = res.state["x"][:, 0], res.state["it"], bool(res.state["done"].all())
            if not conv:
                from sklearn.exceptions import ConvergenceWarning

                warnings.warn(f"Ridge with positive=True did not converge in {max_iter} iterations; increase "
                              "max_iter or tol", ConvergenceWarning, stacklevel=3)
            out[k] = w
            iters.append(it)
        self.n_iter_ = np.asarray(iters, dtype=np.int32)
        return out
