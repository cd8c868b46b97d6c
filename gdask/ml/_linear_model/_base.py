"""What the linear models share: prediction over blocks, the R^2 score, fitted attributes."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin

from gdask.devices import astype, to_numpy
from gdask.ml._adapt import as_gdataset, host, output
from gdask.ml._base import in_task_scope
from gdask.ml._gram import _f64
from gdask.ml._linear_model._problem import Data, Problem

__all__ = ["LinearModel"]


def _predict_1d(X: Any, coef: Any, intercept: Any) -> Any:
    return astype(_f64(X) @ coef + intercept, X.dtype)


class LinearModel(RegressorMixin, BaseEstimator):
    """Prediction and scoring of a fitted ``coef_`` / ``intercept_`` (subclasses fit them)."""

    #: ``coef_`` of shape (n_features,) also for ``y`` of shape (n, 1), as scikit-learn's Ridge and ElasticNet
    _ravel_one_target = False

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        tags.target_tags.multi_output = True
        return tags

    def _check_common(self) -> None:
        if not isinstance(self.fit_intercept, (bool, np.bool_)):
            raise ValueError(f"The 'fit_intercept' parameter of {type(self).__name__} must be an instance of "
                             f"'bool'. Got {self.fit_intercept!r} instead.")
        cb = getattr(self, "callback", None)
        if cb is not None and not callable(cb):
            raise ValueError(f"callback must be callable or None, got {type(cb).__name__}")

    def _set_coef(self, data: Data, prob: Problem, coef: np.ndarray) -> None:
        """``coef_`` / ``intercept_`` from the ``(t, d)`` coefficients in scikit-learn's shapes and X's dtype."""
        dtype = data.X.dtype
        intercept = prob.y_mean - coef @ prob.x_mean if self.fit_intercept else np.zeros(coef.shape[0])
        to = "cupy" if data.kind == "cupy" else "numpy"
        if data.y_1d:
            self.coef_ = output(coef[0].astype(dtype), to)
            self.intercept_ = dtype.type(intercept[0]) if self.fit_intercept else 0.0
        elif data.t == 1 and self._ravel_one_target:  # y of shape (n, 1): scikit-learn's Ridge / ElasticNet shapes
            self.coef_ = output(coef[0].astype(dtype), to)
            self.intercept_ = output(intercept.astype(dtype), to) if self.fit_intercept else 0.0
        else:
            self.coef_ = output(coef.astype(dtype), to)
            self.intercept_ = output(intercept.astype(dtype), to) if self.fit_intercept else 0.0
        self.fit_mode_ = prob.mode

    @in_task_scope
    def predict(self, X: Any) -> Any:
        """``X @ coef_.T + intercept_``: NumPy for NumPy input (CuPy for CuPy), lazy and blocked like X
        for GDataSet and dask input."""
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "coef_")
        G, kind = as_gdataset(self, X, reset=False)
        coef = np.asarray(to_numpy(self.coef_), dtype=np.float64)
        intercept = np.asarray(to_numpy(self.intercept_), dtype=np.float64)
        if coef.ndim == 1:
            out = G.map_blocks(_predict_1d, coef, float(intercept.reshape(-1)[0]), dtype=G.dtype, ncols=None,
                               name=f"{type(self).__name__.lower()}-predict")
        else:
            out = G.map_blocks(_predict_2d, coef, np.broadcast_to(intercept, coef.shape[:1]).copy(), dtype=G.dtype,
                               ncols=coef.shape[0], name=f"{type(self).__name__.lower()}-predict")
        return output(out, kind)

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """The coefficient of determination R^2 of the predictions (any input type; computed)."""
        from sklearn.metrics import r2_score

        sw = None if sample_weight is None else host(sample_weight)
        if isinstance(sw, np.ndarray) and sw.ndim == 0 or isinstance(sample_weight, numbers.Number):
            sw = None
        return float(r2_score(host(y), host(self.predict(X)), sample_weight=sw))


def _predict_2d(X: Any, coef: Any, intercept: Any) -> Any:
    return astype(_f64(X) @ coef.T + intercept, X.dtype)
