"""Truncated SVD (latent semantic analysis) over GDataSet blocks (scikit-learn API)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin

from gdask.devices import to_numpy
from gdask.ml._adapt import as_gdataset, check_int, check_real, output
from gdask.ml._base import in_task_scope
from gdask.ml._decomposition import _solvers
from gdask.ml._decomposition._common import apply_rows, project_block, reconstruct_block
from gdask.ml._decomposition._pca import _as_scores
from gdask.ml._gram import Moments, run_passes

__all__ = ["TruncatedSVD"]


class TruncatedSVD(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Dimensionality reduction by truncated SVD (no centering), on device-resident blocks,
    scikit-learn API.

    ``algorithm="randomized"`` (default) is scikit-learn's randomized SVD (the same draws from
    ``random_state`` and the same subspace), each power iteration one pass over the blocks on
    gdask's engine; ``"arpack"`` is solved exactly: one pass gives the Gram matrix in float64, whose
    eigendecomposition gives the leading singular triplets (what ARPACK converges to). Inputs and
    outputs as :class:`gdask.ml.PCA`.

    Parameters
    ----------
    n_components : int, default 2
    algorithm : {"randomized", "arpack"}
    n_iter : int, default 5
    n_oversamples : int, default 10
    power_iteration_normalizer : {"auto", "QR", "LU", "none"}
        Accepted; gdask orthonormalises every power iteration (same subspace).
    random_state : int, RandomState or None
    tol : float
        Accepted for compatibility ("arpack" is solved exactly).
    verbose, callback, gpu, memory, job_name
        As :class:`gdask.ml.PCA`.

    Attributes
    ----------
    components_, explained_variance_, explained_variance_ratio_, singular_values_, n_features_in_
        As scikit-learn (``components_`` with its sign convention).
    """

    def __init__(self, n_components: int = 2, *, algorithm: str = "randomized", n_iter: int = 5,
                 n_oversamples: int = 10, power_iteration_normalizer: str = "auto", random_state: Any = None,
                 tol: float = 0.0, verbose: Any = 0, callback: Any = None, gpu: float | None = None,
                 memory: Any = None, job_name: str | None = None) -> None:
        self.n_components = n_components
        self.algorithm = algorithm
        self.n_iter = n_iter
        self.n_oversamples = n_oversamples
        self.power_iteration_normalizer = power_iteration_normalizer
        self.random_state = random_state
        self.tol = tol
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
        check_int(self, "n_components", 1)
        check_int(self, "n_iter", 0)
        check_int(self, "n_oversamples", 1)
        check_real(self, "tol", 0.0)
        if self.algorithm not in ("randomized", "arpack"):
            raise ValueError("The 'algorithm' parameter of TruncatedSVD must be a str among {'arpack', "
                             f"'randomized'}}. Got {self.algorithm!r} instead.")
        if self.power_iteration_normalizer not in ("auto", "QR", "LU", "none"):
            raise ValueError("The 'power_iteration_normalizer' parameter of TruncatedSVD must be one of 'auto', "
                             f"'QR', 'LU' or 'none'. Got {self.power_iteration_normalizer!r} instead.")
        if self.callback is not None and not callable(self.callback):
            raise ValueError(f"callback must be callable or None, got {type(self.callback).__name__}")

    @in_task_scope
    def fit(self, X: Any, y: Any = None) -> TruncatedSVD:
        """Fit the model on X (any supported input)."""
        self._check_params()
        G, kind = as_gdataset(self, X, reset=True)
        n, d = G.shape
        k = int(self.n_components)
        if self.algorithm == "arpack":
            if k >= min(n, d):
                raise ValueError(f"n_components must be < min(n_samples, n_features) with algorithm='arpack' "
                                 f"(n_samples={n}, n_features={d}), got {k}")
            S, Vt, var, full_var, mode = self._exact(G, k)
        else:
            if k > d:
                raise ValueError(f"n_components({k}) must be <= n_features({d}).")
            S, Vt, var, full_var, mode = self._randomized(G, k)
        to = "cupy" if kind == "cupy" else "numpy"
        self.components_ = output(Vt.astype(G.dtype), to)
        self.explained_variance_ = output(var.astype(G.dtype), to)
        self.explained_variance_ratio_ = output((var / full_var if full_var > 0 else var * 0).astype(G.dtype), to)
        self.singular_values_ = output(S.astype(G.dtype), to)
        self.fit_mode_ = mode
        return self

    def _exact(self, G: Any, k: int) -> tuple:
        res = run_passes(self, Moments(), {"X": G}, {}, total=1)
        n, mean, m2 = res.state["moments"]
        lam, Vt = _solvers.eig_from_moments(n, mean, m2, center=False)
        Vt = Vt[:k]
        # variance of the transformed columns X v_j: v_j^T (M2 / n) v_j
        var = np.einsum("ij,jk,ik->i", Vt, m2, Vt) / n
        return np.sqrt(lam[:k]), Vt, var, float(np.trace(m2)) / n, res.mode

    def _randomized(self, G: Any, k: int) -> tuple:
        n, d = G.shape
        from sklearn.utils import check_random_state

        K = _solvers.random_basis(check_random_state(self.random_state), d, k + self.n_oversamples, G.dtype)
        K, _ = np.linalg.qr(K)
        res = run_passes(self, _solvers.RandomizedSVD(self.n_iter, center=False), {"X": G}, {"K": K, "it": 0},
                         total=self.n_iter + 2)
        S, Vt, var = _solvers.randomized_result(res.state, k)
        col = res.state["col"]
        return S, Vt, var, float(col[2].sum()) / col[0], res.mode

    def fit_transform(self, X: Any, y: Any = None) -> Any:
        """Fit, then transform the same X."""
        return self.fit(X).transform(X)

    @in_task_scope
    def transform(self, X: Any) -> Any:
        """``X @ components_.T`` (lazy for lazy input)."""
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "components_")
        C = np.asarray(to_numpy(self.components_), dtype=np.float64)
        return apply_rows(self, X, project_block, C, None, None, ncols=C.shape[0], name="tsvd-transform")

    @in_task_scope
    def inverse_transform(self, X: Any) -> Any:
        """``X @ components_``: back to the original space (lazy for lazy input)."""
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "components_")
        C = np.asarray(to_numpy(self.components_), dtype=np.float64)
        G, kind = _as_scores(X, C.shape[0])
        return output(G.map_blocks(reconstruct_block, C, None, dtype=G.dtype, ncols=C.shape[1],
                                   name="tsvd-inverse-transform"), kind)
