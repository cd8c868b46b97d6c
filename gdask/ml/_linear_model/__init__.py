"""Linear models on the iteration engine (scikit-learn API): LinearRegression, Ridge, Lasso, ElasticNet."""

from __future__ import annotations

from gdask.ml._lazy import exports

__all__ = ["ElasticNet", "Lasso", "LinearRegression", "Ridge"]

# names resolved on first use: a worker that imports a block module does not import the estimator (gdask.ml._lazy)
__getattr__, __dir__ = exports(__name__, {
    "ElasticNet": "._elastic_net",
    "Lasso": "._elastic_net",
    "LinearRegression": "._least_squares",
    "Ridge": "._least_squares",
})
