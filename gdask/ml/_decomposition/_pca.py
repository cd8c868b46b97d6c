"""Principal component analysis over GDataSet blocks (scikit-learn API)."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin

from gdask.devices import to_numpy
from gdask.ml._adapt import as_gdataset, check_int, check_real, host, output
from gdask.ml._base import in_task_scope
from gdask.ml._decomposition import _solvers
from gdask.ml._decomposition._common import (
    apply_rows,
    infer_dimension,
    loglik_block,
    project_block,
    reconstruct_block,
)
from gdask.ml._gram import Moments, run_passes

__all__ = ["PCA"]

_SOLVERS = ("auto", "full", "covariance_eigh", "arpack", "randomized")


class PCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Principal component analysis on device-resident blocks, scikit-learn API.

    Centers the data and projects it on the right singular vectors of the centered data. The
    solvers run on gdask's iteration engine (one task per worker, per-block partials combined in
    block order: the same bits wherever the blocks sit):

    * exact (``svd_solver`` "full", "covariance_eigh" and "arpack", which solve the same problem):
      one pass computes the centered Gram matrix in float64 (Chan's parallel update: no
      cancellation), whose eigendecomposition gives every component. "arpack" keeps
      scikit-learn's limit ``n_components < min(n_samples, n_features)``.
    * "randomized": scikit-learn's randomized SVD (same draws from ``random_state``, same
      subspace) with each power iteration one pass over the blocks; the Gram matrix is never formed,
      so this is the solver for many features.
    * "auto": scikit-learn's rule picks "covariance_eigh"/"full" (exact) or "randomized".

    Accepts NumPy / CuPy arrays, pandas and dask DataFrames, dask arrays and GDataSets; results
    come back in the input's type (lazy, blocked like X, for GDataSet and dask input).

    Parameters
    ----------
    n_components : int, float, "mle" or None
        As scikit-learn: a count, a fraction of variance to keep (exact solvers), Minka's MLE, or
        ``min(n_samples, n_features)`` (minus one for "arpack").
    copy : bool
        Accepted for compatibility: gdask never modifies X.
    whiten : bool
    svd_solver : {"auto", "full", "covariance_eigh", "arpack", "randomized"}
    tol : float
        Accepted for compatibility ("arpack" is solved exactly).
    iterated_power : int or "auto"
        Power iterations of "randomized" (scikit-learn's "auto": 7 or 4).
    n_oversamples : int
    power_iteration_normalizer : {"auto", "QR", "LU", "none"}
        Accepted; gdask orthonormalises every power iteration (the subspace, hence the result, is
        the one each normaliser gives, with no loss of precision).
    random_state : int, RandomState or None
    verbose, callback
        Progress of the passes (see :class:`gdask.gdataset.Progress`).
    gpu, memory, job_name
        The fit's share of the devices (see :func:`gdask.gdataset.device_share`).

    Attributes
    ----------
    components_, explained_variance_, explained_variance_ratio_, singular_values_, mean_,
    n_components_, n_samples_, noise_variance_, n_features_in_, feature_names_in_
        As scikit-learn (``components_`` with its sign convention). NumPy (CuPy for CuPy input).
    fit_mode_ : str
        Where the engine ran the passes.
    """

    def __init__(self, n_components: Any = None, *, copy: bool = True, whiten: bool = False,
                 svd_solver: str = "auto", tol: float = 0.0, iterated_power: Any = "auto", n_oversamples: int = 10,
                 power_iteration_normalizer: str = "auto", random_state: Any = None, verbose: Any = 0,
                 callback: Any = None, gpu: float | None = None, memory: Any = None,
                 job_name: str | None = None) -> None:
        self.n_components = n_components
        self.copy = copy
        self.whiten = whiten
        self.svd_solver = svd_solver
        self.tol = tol
        self.iterated_power = iterated_power
        self.n_oversamples = n_oversamples
        self.power_iteration_normalizer = power_iteration_normalizer
        self.random_state = random_state
        self.verbose = verbose
        self.callback = callback
        self.gpu = gpu
        self.memory = memory
        self.job_name = job_name

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    @property
    def _n_features_out(self) -> int:
        return self.components_.shape[0]

    def _check_params(self) -> None:
        nc = self.n_components
        if not (nc is None or nc == "mle" or (isinstance(nc, numbers.Real) and not isinstance(nc, bool))):
            raise ValueError(f"The 'n_components' parameter of PCA must be an int, a float in (0, 1), 'mle' or "
                             f"None. Got {nc!r} instead.")
        if isinstance(nc, numbers.Real) and not isinstance(nc, numbers.Integral) and not 0 < nc < 1:
            if not float(nc).is_integer() or nc < 0:
                raise ValueError(f"n_components={nc!r} must be an int >= 0 or a float in (0, 1)")
        if self.svd_solver not in _SOLVERS:
            raise ValueError(f"The 'svd_solver' parameter of PCA must be one of {_SOLVERS}. Got "
                             f"{self.svd_solver!r} instead.")
        check_int(self, "iterated_power", 0, extra=("auto",))
        check_int(self, "n_oversamples", 1)
        check_real(self, "tol", 0.0)
        if self.power_iteration_normalizer not in ("auto", "QR", "LU", "none"):
            raise ValueError("The 'power_iteration_normalizer' parameter of PCA must be one of 'auto', 'QR', "
                             f"'LU' or 'none'. Got {self.power_iteration_normalizer!r} instead.")
        if self.callback is not None and not callable(self.callback):
            raise ValueError(f"callback must be callable or None, got {type(self.callback).__name__}")

    def _solver(self, n: int, d: int, k: Any) -> str:
        """scikit-learn's choice for "auto"; "full" / "covariance_eigh" are both the exact solver here."""
        s = self.svd_solver
        if s != "auto":
            return s
        if d <= 1_000 and n >= 10 * d:
            return "covariance_eigh"
        if max(n, d) <= 500 or k == "mle":
            return "full"
        return "randomized" if isinstance(k, numbers.Integral) and 1 <= k < 0.8 * min(n, d) else "full"

    # -- fit ---------------------------------------------------------------------------------------
    @in_task_scope
    def fit(self, X: Any, y: Any = None) -> PCA:
        """Fit the model on X (any supported input; see the class docstring)."""
        self._check_params()
        G, kind = as_gdataset(self, X, reset=True, ensure_min_samples=1)
        self._fit(G, kind)
        return self

    def _fit(self, G: Any, kind: str) -> None:
        n, d = G.shape
        k = self.n_components
        if k is not None and k != "mle" and float(k).is_integer():
            k = int(k)
        solver = self._solver(n, d, min(n, d) if k is None else k)
        if k is None:
            k = min(n, d) - (solver == "arpack")
        self._fit_svd_solver = solver
        if solver in ("arpack", "randomized"):
            if isinstance(k, str):
                raise ValueError(f"n_components={k!r} cannot be a string with svd_solver='{solver}'")
            if not isinstance(k, numbers.Integral):
                raise ValueError(f"n_components={k!r} must be an integer with svd_solver='{solver}'")
            if not 1 <= k <= min(n, d):
                raise ValueError(f"n_components={k!r} must be between 1 and min(n_samples, n_features)="
                                 f"{min(n, d)} with svd_solver='{solver}'")
            if solver == "arpack" and k == min(n, d):
                raise ValueError(f"n_components={k!r} must be strictly less than min(n_samples, n_features)="
                                 f"{min(n, d)} with svd_solver='{solver}'")
        elif k == "mle":
            if n < d:
                raise ValueError("n_components='mle' is only supported if n_samples >= n_features")
        elif not 0 <= k <= min(n, d):
            raise ValueError(f"n_components={k} must be between 0 and min(n_samples, n_features)={min(n, d)} "
                             f"with svd_solver={solver!r}")
        if solver == "randomized":
            self._fit_randomized(G, k)
        else:
            self._fit_exact(G, k, solver)
        self.n_samples_ = n
        self._set_output_types(G.dtype, kind)

    def _fit_exact(self, G: Any, k: Any, solver: str) -> None:
        n, d = G.shape
        res = run_passes(self, Moments(), {"X": G}, {}, total=1)
        n_, mean, m2 = res.state["moments"]
        lam, Vt = _solvers.eig_from_moments(n_, mean, m2, center=True)
        r = min(n, d)
        ev = lam[:r] / max(n - 1, 1)
        total = ev.sum()
        ratio = ev / total if total > 0 else np.zeros_like(ev)
        if k == "mle":
            k = infer_dimension(ev, n)
        elif 0 < k < 1:
            k = int(np.searchsorted(np.cumsum(ratio), k, side="right") + 1)
            k = min(k, r)
        noise = float(ev[k:].mean()) if k < r else 0.0
        if solver == "arpack" and k < r:  # scikit-learn's arpack/randomized formula (the same in exact arithmetic)
            noise = float((total - ev[:k].sum()) / (r - k))
        self.mean_ = mean
        self.components_ = Vt[:k]
        self.explained_variance_ = ev[:k]
        self.explained_variance_ratio_ = ratio[:k]
        self.singular_values_ = np.sqrt(lam[:k])
        self.n_components_ = int(k)
        self.noise_variance_ = noise
        self.fit_mode_ = res.mode

    def _fit_randomized(self, G: Any, k: int) -> None:
        n, d = G.shape
        n_iter = self.iterated_power
        if n_iter == "auto":
            n_iter = 7 if k < 0.1 * min(n, d) else 4
        from sklearn.utils import check_random_state

        K = _solvers.random_basis(check_random_state(self.random_state), d, k + self.n_oversamples, G.dtype)
        K, _ = np.linalg.qr(K)  # the same subspace, better conditioned
        res = run_passes(self, _solvers.RandomizedSVD(n_iter, center=True), {"X": G}, {"K": K, "it": 0},
                         total=n_iter + 2)
        S, Vt, _ = _solvers.randomized_result(res.state, k)
        col = res.state["col"]
        ev = S ** 2 / max(n - 1, 1)
        total = float(col[2].sum()) / max(n - 1, 1)
        self.mean_ = col[1]
        self.components_ = Vt
        self.explained_variance_ = ev
        self.explained_variance_ratio_ = ev / total if total > 0 else np.zeros_like(ev)
        self.singular_values_ = S
        self.n_components_ = int(k)
        r = min(n, d)
        self.noise_variance_ = float((total - ev.sum()) / (r - k)) if k < r else 0.0
        self.fit_mode_ = res.mode

    def _set_output_types(self, dtype: Any, kind: str) -> None:
        for a in ("mean_", "components_", "explained_variance_", "explained_variance_ratio_", "singular_values_"):
            setattr(self, a, output(np.asarray(getattr(self, a)).astype(dtype), "cupy" if kind == "cupy" else "numpy"))
        self.noise_variance_ = np.asarray(self.noise_variance_, dtype=dtype)[()]

    # -- transform ---------------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "components_")

    def _host(self, name: str) -> np.ndarray:
        return np.asarray(to_numpy(getattr(self, name)), dtype=np.float64)

    @in_task_scope
    def transform(self, X: Any) -> Any:
        """Project X on the components: ``(X - mean_) @ components_.T`` (divided by
        ``sqrt(explained_variance_)`` when whitening)."""
        self._check_fitted()
        scale = None
        if self.whiten:
            scale = np.maximum(np.sqrt(self._host("explained_variance_")), np.finfo(self.components_.dtype).eps)
        return apply_rows(self, X, project_block, self._host("components_"), self._host("mean_"), scale,
                          ncols=self.n_components_, name="pca-transform")

    def fit_transform(self, X: Any, y: Any = None) -> Any:
        """Fit, then transform the same X."""
        return self.fit(X).transform(X)

    @in_task_scope
    def inverse_transform(self, X: Any) -> Any:
        """Data in the original space: ``X @ components_ + mean_`` (whitening undone)."""
        self._check_fitted()
        C = self._host("components_")
        if self.whiten:
            C = np.sqrt(self._host("explained_variance_"))[:, None] * C
        G, kind = _as_scores(X, C.shape[0])
        return output(G.map_blocks(reconstruct_block, C, self._host("mean_"), dtype=G.dtype, ncols=C.shape[1],
                                   name="pca-inverse-transform"), kind)

    # -- probabilistic PCA -------------------------------------------------------------------------
    def get_covariance(self) -> np.ndarray:
        """The model's covariance ``components_.T diag(explained_variance_ - noise) components_ + noise I``
        (scikit-learn's formula, whitening included)."""
        self._check_fitted()
        C, ev, noise = self._host("components_"), self._host("explained_variance_"), float(self.noise_variance_)
        if self.whiten:
            C = C * np.sqrt(ev[:, None])
        diff = np.where(ev > noise, ev - noise, 0.0)
        cov = (C.T * diff) @ C
        cov[np.diag_indices_from(cov)] += noise
        return cov.astype(self.components_.dtype)

    def get_precision(self) -> np.ndarray:
        """The inverse of :meth:`get_covariance`."""
        self._check_fitted()
        d = self.components_.shape[1]
        if self.n_components_ == 0:
            return np.eye(d) / float(self.noise_variance_)
        return np.linalg.inv(self.get_covariance().astype(np.float64)).astype(self.components_.dtype)

    @in_task_scope
    def score_samples(self, X: Any) -> Any:
        """The log-likelihood of every row under the probabilistic PCA model (lazy for lazy input)."""
        self._check_fitted()
        P = self.get_precision().astype(np.float64)
        d = P.shape[0]
        sign, logdet = np.linalg.slogdet(P)
        const = 0.5 * (d * math.log(2.0 * math.pi) - (logdet if sign > 0 else -np.inf))
        return apply_rows(self, X, loglik_block, self._host("mean_"), P, const, ncols=None, dtype=np.float64,
                          name="pca-score-samples")

    def score(self, X: Any, y: Any = None) -> float:
        """The average log-likelihood of the rows of X."""
        return float(np.mean(host(self.score_samples(X))))


def _as_scores(X: Any, k: int) -> tuple[Any, str]:
    """Scores ``(n_samples, k)`` of any input type (an inverse transform's input) as a GDataSet and its kind."""
    from gdask.gdataset import from_array
    from gdask.ml._base import is_host_input

    if is_host_input(X):
        from sklearn.utils.validation import check_array

        Xh = check_array(X, dtype=[np.float64, np.float32])
        if Xh.shape[1] != k:
            raise ValueError(f"X has {Xh.shape[1]} features (components), expected {k}")
        return from_array(Xh), "numpy"
    return as_gdataset(_Scores(k), X, reset=False)


class _Scores:
    """Stands in for the estimator when its transformed data is the input (``k`` columns)."""

    def __init__(self, k: int) -> None:
        self.n_features_in_ = k
