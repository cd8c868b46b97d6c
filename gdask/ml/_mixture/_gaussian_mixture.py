"""Gaussian mixture models over GDataSet blocks, fitted by EM on the engine (scikit-learn API)."""

from __future__ import annotations

import numbers
import warnings
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, DensityMixin

from gdask.gdataset import GDataSet, from_array
from gdask.ml._adapt import as_gdataset, check_int, check_real, collect, host, output
from gdask.ml._base import in_task_scope
from gdask.ml._gram import run_passes
from gdask.ml._mixture import _em, _params

__all__ = ["GaussianMixture"]

_INITS = ("kmeans", "k-means++", "random", "random_from_data")
#: k-means++ seeding (init_params "kmeans" and "k-means++") runs on at most this many rows on the host
INIT_SAMPLE = 200_000


class GaussianMixture(DensityMixin, BaseEstimator):
    """Gaussian mixture model on device-resident blocks, fitted by EM on gdask's engine,
    scikit-learn API.

    Each EM iteration is one pass over the blocks (E-step and the M-step's sufficient statistics
    per block, in float64, added in block order; the M-step on the host), run as one task per worker
    with all-gathered partials when a Client holds the data, with checkpoints and progress. The
    iterates are scikit-learn's: the same initialisation from the same ``random_state``, the same
    updates (``nk + 10 eps``, ``reg_covar``), lower bound and stopping rule.

    ``init_params``: "kmeans" runs gdask's own :class:`gdask.ml.KMeans` (Lloyd) on the blocks from
    scikit-learn's k-means++ seeding (``sklearn.cluster.kmeans_plusplus`` with the mixture's random
    state, on the rows gathered to the host, or on a uniform sample of ``INIT_SAMPLE`` rows for
    larger data); "k-means++" and "random_from_data" pick rows as scikit-learn does; "random" draws
    the responsibilities on the host (n x K numbers) as scikit-learn does.

    Parameters
    ----------
    n_components : int, default 1
    covariance_type : {"full", "tied", "diag", "spherical"}
    tol : float, default 1e-3
    reg_covar : float, default 1e-6
    max_iter : int, default 100
    n_init : int, default 1
    init_params : {"kmeans", "k-means++", "random", "random_from_data"}
    weights_init, means_init, precisions_init : array-like, optional
    random_state : int, RandomState or None
    warm_start : bool, default False
    verbose : int
        Progress of the EM iterations (see :class:`gdask.gdataset.Progress`).
    verbose_interval : int
        Accepted for compatibility.
    callback : callable, optional
        ``callback(record)`` after every iteration (``lower_bound``, ``change``, ...).
    gpu, memory, job_name
        The fit's share of the devices.

    Attributes
    ----------
    weights_, means_, covariances_, precisions_, precisions_cholesky_, converged_, n_iter_,
    lower_bound_, lower_bounds_, n_features_in_, feature_names_in_
        As scikit-learn (NumPy).
    """

    def __init__(self, n_components: int = 1, *, covariance_type: str = "full", tol: float = 1e-3,
                 reg_covar: float = 1e-6, max_iter: int = 100, n_init: int = 1, init_params: str = "kmeans",
                 weights_init: Any = None, means_init: Any = None, precisions_init: Any = None,
                 random_state: Any = None, warm_start: bool = False, verbose: int = 0, verbose_interval: int = 10,
                 callback: Any = None, gpu: float | None = None, memory: Any = None,
                 job_name: str | None = None) -> None:
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval
        self.callback = callback
        self.gpu = gpu
        self.memory = memory
        self.job_name = job_name

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        return tags

    def _check_params(self) -> None:
        check_int(self, "n_components", 1)
        check_real(self, "tol", 0.0)
        check_real(self, "reg_covar", 0.0)
        check_int(self, "max_iter", 0)
        check_int(self, "n_init", 1)
        check_int(self, "verbose_interval", 1)
        if self.covariance_type not in _params.COV_TYPES:
            raise ValueError(f"The 'covariance_type' parameter of GaussianMixture must be a str among "
                             f"{_params.COV_TYPES}. Got {self.covariance_type!r} instead.")
        if self.init_params not in _INITS:
            raise ValueError(f"The 'init_params' parameter of GaussianMixture must be a str among {_INITS}. "
                             f"Got {self.init_params!r} instead.")
        if self.callback is not None and not callable(self.callback):
            raise ValueError(f"callback must be callable or None, got {type(self.callback).__name__}")

    # -- fit ---------------------------------------------------------------------------------------
    @in_task_scope
    def fit(self, X: Any, y: Any = None) -> GaussianMixture:
        """Estimate the parameters by EM (``n_init`` runs, the best lower bound kept)."""
        self._check_params()
        G, kind = as_gdataset(self, X, reset=not (self.warm_start and hasattr(self, "converged_")),
                              ensure_min_samples=2)
        self._fit(G)
        return self

    def _fit(self, G: GDataSet) -> None:
        from sklearn.utils import check_random_state

        n, d = G.shape
        K = int(self.n_components)
        if n < K:
            raise ValueError(f"Expected n_samples >= n_components but got n_components = {K}, n_samples = {n}")
        inits = _params.check_inits(self, K, d)
        do_init = not (self.warm_start and hasattr(self, "converged_"))
        rs = check_random_state(self.random_state)
        best, best_lb = None, -np.inf
        for _ in range(self.n_init if do_init else 1):
            state = self._start(G, rs, inits, do_init)
            st = self._run(G, state, inits)
            if st["lb"] > best_lb or best is None:
                best, best_lb = st, st["lb"]
        self.converged_ = bool(best["converged"])
        if not self.converged_ and self.max_iter > 0:
            from sklearn.exceptions import ConvergenceWarning

            warnings.warn("Best performing initialization did not converge. Try different init parameters, or "
                          "increase max_iter, tol, or check for degenerate data.", ConvergenceWarning, stacklevel=3)
        self._set_params(best["params"], G.dtype)
        self.n_iter_ = int(best["n_iter"])
        self.lower_bound_ = float(best["lb"])
        self.lower_bounds_ = list(best["lbs"])

    def _start(self, G: GDataSet, rs: Any, inits: tuple, do_init: bool) -> dict:
        """The engine state of one EM run: initial responsibilities ``R`` to start from, or parameters."""
        base = {"lb": -np.inf, "lbs": [], "n_iter": 0, "converged": False, "params": None, "R": None}
        if not do_init:
            return {**base, "lb": self.lower_bound_, "params": self._get_params()}
        if all(v is not None for v in inits):
            return base  # everything given: no responsibilities needed (scikit-learn's shortcut)
        return {**base, "R": self._responsibilities(G, rs)}

    def _run(self, G: GDataSet, state: dict, inits: tuple) -> dict:
        R = state.pop("R")
        if state["params"] is None and R is None:  # all three inits given
            w, m, p = inits
            state["params"] = {"weights": w, "means": m, "covariances": None,
                               "prec_chol": _params.precisions_cholesky_from_precisions(p, self.covariance_type)}
        algo = _em.EMLoop(self.n_components, self.covariance_type, self.reg_covar, self.tol, self.max_iter,
                          G.shape[0], inits)
        res = run_passes(self, algo, {"X": G, "R": R}, state, total=self.max_iter + 1)
        self.fit_mode_ = res.mode
        return res.state

    def _responsibilities(self, G: GDataSet, rs: Any) -> GDataSet:
        """Initial responsibilities blocked like ``G`` (labels, -1 for none, or dense), as scikit-learn's
        ``init_params`` with the same random state."""
        n, K = G.shape[0], int(self.n_components)
        how = self.init_params
        if how == "random":
            resp = rs.uniform(size=(n, K))
            return from_array(resp / resp.sum(axis=1)[:, None], block_rows=G.row_blocks)
        if how == "random_from_data":
            idx = rs.choice(n, size=K, replace=False)
        else:
            idx, centers = self._kmeans_plusplus(G, rs)
        if how == "kmeans":
            from gdask.ml import KMeans

            km = KMeans(n_clusters=K, init=centers, n_init=1, max_iter=300, tol=1e-4, algorithm="lloyd",
                        random_state=0).fit(G)
            return km.labels_
        labels = np.full(n, -1, dtype=np.int64)
        labels[idx] = np.arange(K)
        return from_array(labels, block_rows=G.row_blocks)

    def _kmeans_plusplus(self, G: GDataSet, rs: Any) -> tuple[np.ndarray, np.ndarray]:
        """scikit-learn's k-means++ seeding on the (centered) rows: ``(row indices, centers)``."""
        from sklearn.cluster import kmeans_plusplus

        n = G.shape[0]
        if n <= INIT_SAMPLE:
            rows, Xh = np.arange(n), collect(G).astype(np.float64)
        else:
            rows = np.sort(rs.choice(n, size=INIT_SAMPLE, replace=False))
            Xh = collect(G[rows]).astype(np.float64)
        mean = Xh.mean(axis=0)
        centers, idx = kmeans_plusplus(Xh - mean, int(self.n_components), random_state=rs)
        return rows[idx], centers + mean

    # -- parameters --------------------------------------------------------------------------------
    def _get_params(self) -> dict:
        return {"weights": np.asarray(self.weights_, dtype=np.float64),
                "means": np.asarray(self.means_, dtype=np.float64),
                "covariances": None if getattr(self, "covariances_", None) is None else
                np.asarray(self.covariances_, dtype=np.float64),
                "prec_chol": np.asarray(self.precisions_cholesky_, dtype=np.float64)}

    def _set_params(self, p: dict, dtype: Any) -> None:
        dtype = np.float64 if dtype == np.float64 else np.dtype(dtype)
        self.weights_ = p["weights"].astype(dtype)
        self.means_ = p["means"].astype(dtype)
        if p["covariances"] is not None:
            self.covariances_ = p["covariances"].astype(dtype)
        self.precisions_cholesky_ = p["prec_chol"].astype(dtype)
        self.precisions_ = _params.precisions(p["prec_chol"], self.covariance_type).astype(dtype)

    def _model(self) -> tuple:
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "precisions_cholesky_")
        p = self._get_params()
        const = _params.constants(p["weights"], p["prec_chol"], self.covariance_type, p["means"].shape[1])
        return p["means"], p["prec_chol"], const, self.covariance_type

    # -- inference ---------------------------------------------------------------------------------
    def _rows(self, X: Any, func: Any, ncols: Any, dtype: Any, name: str, *extra: Any) -> Any:
        G, kind = as_gdataset(self, X, reset=False)
        out = G.map_blocks(func, *self._model(), *extra, dtype=dtype, ncols=ncols, name=name)
        return output(out, kind)

    @in_task_scope
    def score_samples(self, X: Any) -> Any:
        """The log-likelihood of every row (lazy for lazy input)."""
        return self._rows(X, _em.score_block, None, np.float64, "gmm-score-samples")

    def score(self, X: Any, y: Any = None) -> float:
        """The average log-likelihood of the rows of X."""
        return float(np.mean(host(self.score_samples(X))))

    @in_task_scope
    def predict(self, X: Any) -> Any:
        """The most probable component of every row (lazy for lazy input)."""
        return self._rows(X, _em.predict_block, None, np.int64, "gmm-predict")

    @in_task_scope
    def predict_proba(self, X: Any) -> Any:
        """The components' posterior probabilities for every row, (n_samples, n_components)."""
        return self._rows(X, _em.proba_block, int(self.n_components), np.float64, "gmm-predict-proba")

    def fit_predict(self, X: Any, y: Any = None) -> Any:
        """Fit, then the labels of X (consistent with ``fit(X).predict(X)``)."""
        return self.fit(X).predict(X)

    def bic(self, X: Any) -> float:
        """Bayesian information criterion of the model on X (lower is better)."""
        n = _n_rows(X)
        return -2 * self.score(X) * n + self._n_parameters() * np.log(n)

    def aic(self, X: Any) -> float:
        """Akaike information criterion of the model on X (lower is better)."""
        return -2 * self.score(X) * _n_rows(X) + 2 * self._n_parameters()

    def _n_parameters(self) -> int:
        return _params.n_parameters(int(self.n_components), self.means_.shape[1], self.covariance_type)

    def sample(self, n_samples: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``(X, y)``: ``n_samples`` rows drawn from the model and their components (host, as
        scikit-learn draws them from ``random_state``)."""
        from sklearn.utils import check_random_state
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "means_")
        if not isinstance(n_samples, numbers.Integral) or n_samples < 1:
            raise ValueError(f"Invalid value for 'n_samples': {n_samples} . The sampling requires at least one "
                             "sample.")
        rng = check_random_state(self.random_state)
        counts = rng.multinomial(n_samples, self.weights_)
        t = self.covariance_type
        cov = self.covariances_
        if t == "full":
            X = np.vstack([rng.multivariate_normal(m, c, int(s)) for m, c, s in zip(self.means_, cov, counts)])
        elif t == "tied":
            X = np.vstack([rng.multivariate_normal(m, cov, int(s)) for m, s in zip(self.means_, counts)])
        else:
            X = np.vstack([m + rng.standard_normal(size=(s, self.means_.shape[1])) * np.sqrt(c)
                           for m, c, s in zip(self.means_, cov, counts)])
        y = np.concatenate([np.full(s, j, dtype=int) for j, s in enumerate(counts)])
        return X, y


def _n_rows(X: Any) -> int:
    return int(X.shape[0])
