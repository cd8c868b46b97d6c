"""Linear models on the iteration engine (scikit-learn API): LinearRegression, Ridge, Lasso, ElasticNet."""

from __future__ import annotations

from gdask.ml._linear_model._elastic_net import ElasticNet, Lasso
from gdask.ml._linear_model._least_squares import LinearRegression, Ridge

__all__ = ["ElasticNet", "Lasso", "LinearRegression", "Ridge"]
