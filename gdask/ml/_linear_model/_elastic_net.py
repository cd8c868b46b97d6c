"""Lasso and the elastic net on the engine (scikit-learn API)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from gdask.ml._adapt import check_int, check_real
from gdask.ml._base import in_task_scope
from gdask.ml._gram import run_passes
from gdask.ml._linear_model._base import LinearModel
from gdask.ml._linear_model._cd import CD_LOCK as _CD_LOCK
from gdask.ml._linear_model._cd import cd_gram
from gdask.ml._linear_model._iterative import Fista
from gdask.ml._linear_model._problem import Data, Problem, prepare, problem

__all__ = ["ElasticNet", "Lasso"]

_MESSAGE = ("Objective did not converge. You might want to increase the number of iterations, check the scale of "
            "the features or consider increasing regularisation.")


class ElasticNet(LinearModel):
    """Linear regression with combined L1 and L2 penalties on device-resident blocks, scikit-learn API.

    Minimises scikit-learn's objective ``1/(2 n) ||y - Xw||^2_S + alpha l1_ratio ||w||_1 +
    alpha (1 - l1_ratio)/2 ||w||^2`` (sample weights ``S`` rescaled to sum to ``n``). Few features:
    one pass all-gathers the centered, weighted Gram matrix in float64 and coordinate descent runs
    on it with scikit-learn's updates, Gap Safe screening and duality-gap stopping rule (the same
    iterates, ``n_iter_`` and ``dual_gap_``). Many features: accelerated proximal gradient on the
    engine, one pass per iteration, stopped on the same duality gap. A ConvergenceWarning where
    scikit-learn warns.

    Parameters
    ----------
    alpha : float, default 1.0
    l1_ratio : float in [0, 1], default 0.5
    fit_intercept : bool, default True
    precompute : bool or "auto"
        Accepted: gdask always all-gathers its own Gram matrix when the features are few (an array is
        refused with ValueError).
    max_iter : int, default 1000
    copy_X : bool
        Accepted for compatibility.
    tol : float, default 1e-4
    warm_start : bool, default False
    positive : bool, default False
    random_state : int, RandomState or None
        Seeds ``selection="random"`` (numba's generator: other draws than scikit-learn's).
    selection : {"cyclic", "random"}
    verbose, callback, gpu, memory, job_name
        As the other gdask.ml estimators.

    Attributes
    ----------
    coef_, intercept_, n_iter_, dual_gap_, sparse_coef_, n_features_in_, feature_names_in_
    """

    _l1_default = 0.5

    _ravel_one_target = True

    def __init__(self, alpha: float = 1.0, *, l1_ratio: float = 0.5, fit_intercept: bool = True,
                 precompute: Any = False, max_iter: int = 1000, copy_X: bool = True, tol: float = 1e-4,
                 warm_start: bool = False, positive: bool = False, random_state: Any = None,
                 selection: str = "cyclic", verbose: Any = 0, callback: Any = None, gpu: float | None = None,
                 memory: Any = None, job_name: str | None = None) -> None:
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.precompute = precompute
        self.max_iter = max_iter
        self.copy_X = copy_X
        self.tol = tol
        self.warm_start = warm_start
        self.positive = positive
        self.random_state = random_state
        self.selection = selection
        self.verbose = verbose
        self.callback = callback
        self.gpu = gpu
        self.memory = memory
        self.job_name = job_name

    def _check_params(self) -> None:
        self._check_common()
        check_real(self, "alpha", 0.0)
        check_real(self, "l1_ratio", 0.0, 1.0)
        check_int(self, "max_iter", 1)
        check_real(self, "tol", 0.0)
        if self.selection not in ("cyclic", "random"):
            raise ValueError(f"The 'selection' parameter of {type(self).__name__} must be a str among "
                             f"{{'cyclic', 'random'}}. Got {self.selection!r} instead.")
        if not (isinstance(self.precompute, (bool, np.bool_)) or (isinstance(self.precompute, str)
                                                                   and self.precompute == "auto")):
            raise ValueError(f"precompute of type {type(self.precompute).__name__} is not supported: gdask computes "
                             "the Gram matrix from the blocks itself; use precompute=False, True or 'auto'")

    @property
    def sparse_coef_(self):
        """``coef_`` as a SciPy sparse CSR array."""
        from scipy import sparse

        return sparse.csr_array(np.atleast_2d(np.asarray(self.coef_)))

    @in_task_scope
    def fit(self, X: Any, y: Any, sample_weight: Any = None, check_input: bool = True) -> ElasticNet:
        """Fit on X, y (any supported input types; ``check_input`` accepted for compatibility)."""
        self._check_params()
        if self.alpha == 0:
            warnings.warn("With alpha=0, this algorithm does not converge well. You are advised to use the "
                          "LinearRegression estimator", stacklevel=2)
        data = prepare(self, X, y, sample_weight)
        prob = problem(self, data, self.fit_intercept)
        n = data.X.shape[0]
        scale = n / prob.sw  # the weights rescaled to sum to n_samples, as scikit-learn
        l1 = self.alpha * self.l1_ratio * n
        l2 = self.alpha * (1.0 - self.l1_ratio) * n
        W0 = self._start(data)
        coef, gaps, iters = np.empty((data.t, data.d)), np.empty(data.t), []
        for k in range(data.t):
            w, gap, tol, it, conv = self._solve(data, prob, k, W0[k], scale, l1, l2)
            if not conv:
                msg = _MESSAGE + f" Duality gap: {gap:.6e}, tolerance: {tol:.3e}"
                if l1 < np.finfo(np.float64).eps:
                    msg += ("\nLinear regression models with a zero l1 penalization strength are more efficiently "
                            "fitted using one of the solvers implemented in sklearn.linear_model.Ridge/RidgeCV "
                            "instead.")
                from sklearn.exceptions import ConvergenceWarning

                warnings.warn(msg, ConvergenceWarning, stacklevel=3)
            coef[k], gaps[k] = w, gap / n
            iters.append(int(it))
        if not np.isfinite(coef).all():
            raise ValueError("Coordinate descent iterations resulted in non-finite parameter values. The input data "
                             "may contain large values and need to be preprocessed.")
        self._set_coef(data, prob, coef)
        dtype = data.X.dtype
        self.n_iter_ = iters[0] if data.t == 1 else iters
        self.dual_gap_ = dtype.type(gaps[0]) if data.t == 1 else gaps.astype(dtype)
        return self

    def _start(self, data: Data) -> np.ndarray:
        if self.warm_start and hasattr(self, "coef_"):
            W0 = np.atleast_2d(np.asarray(self.coef_, dtype=np.float64))
            if W0.shape == (data.t, data.d):
                return W0.copy()
        return np.zeros((data.t, data.d))

    def _solve(self, data: Data, prob: Problem, k: int, w0: np.ndarray, scale: float, l1: float,
               l2: float) -> tuple:
        """``(w, gap, scaled tol, iterations, converged)`` of target ``k``."""
        if prob.Q is not None:
            seed = 0
            if self.selection == "random":
                from sklearn.utils import check_random_state

                seed = int(check_random_state(self.random_state).randint(0, 2 ** 31 - 1))
            with _CD_LOCK:  # numba compiles on the first call: one thread at a time
                    return cd_gram(w0.copy(), l1, l2, prob.Q * scale, prob.q[:, k] * scale, float(prob.yy[k] * scale),
                               int(self.max_iter), float(self.tol), bool(self.positive), self.selection == "random",
                               seed, True)
        algo = Fista(data.W is not None, prob.x_mean if self.fit_intercept else None, scale,
                     prob.q[:, k:k + 1] * scale, prob.yy[k:k + 1] * scale, l1, l2, self.tol, self.max_iter,
                     self.positive)
        res = run_passes(self, algo, data.arrays(), Fista.start(w0[:, None]), total=self.max_iter)
        st = res.state
        return (st["x"][:, 0], float(st["gap"][0]), float(self.tol * prob.yy[k] * scale), st["it"],
                bool(st["done"][0]))


class Lasso(ElasticNet):
    """Linear regression with an L1 penalty, ``1/(2 n) ||y - Xw||^2 + alpha ||w||_1``: the
    :class:`ElasticNet` with ``l1_ratio=1`` (same solvers and attributes)."""

    def __init__(self, alpha: float = 1.0, *, fit_intercept: bool = True, precompute: Any = False,
                 copy_X: bool = True, max_iter: int = 1000, tol: float = 1e-4, warm_start: bool = False,
                 positive: bool = False, random_state: Any = None, selection: str = "cyclic", verbose: Any = 0,
                 callback: Any = None, gpu: float | None = None, memory: Any = None,
                 job_name: str | None = None) -> None:
        super().__init__(alpha=alpha, l1_ratio=1.0, fit_intercept=fit_intercept, precompute=precompute,
                         max_iter=max_iter, copy_X=copy_X, tol=tol, warm_start=warm_start, positive=positive,
                         random_state=random_state, selection=selection, verbose=verbose, callback=callback, gpu=gpu,
                         memory=memory, job_name=job_name)
