"""The peers' own test suites run against gdask.ml (the table read by ``tests/peers/conftest.py``).

Each suite: the test module of an installed peer package (imported by its module name, never
copied), the estimator names swapped for gdask's while it imports (its subject only: estimators it
uses as references stay the peer's), and the tests that cannot pass, each marked xfail with its
reason. Tests whose code never reaches a swapped name (directly, through a module-level helper, or
as a parametrized value) test the peer itself and are deselected. Add a suite by adding a ``Suite``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rule:
    """Tests matching any of ``patterns`` (fnmatch on the test's name with its parameters) are
    expected to fail for ``reason``; ``strict``: an unexpected pass fails the run."""

    patterns: tuple[str, ...]
    reason: str
    strict: bool = True


@dataclass(frozen=True)
class Suite:
    """One peer test module: ``swap`` maps a module the tests import from to ``{name: gdask object path}``."""

    module: str
    swap: dict[str, dict[str, str]]
    xfail: tuple[Rule, ...] = ()
    #: tests left out to keep CI's cost down (fnmatch patterns), with why
    skip: tuple[Rule, ...] = ()
    requires: tuple[str, ...] = field(default=("sklearn",))


SPARSE = "sparse input: gdask.ml estimators take dense data (NumPy, CuPy, dask, GDataSet) and refuse sparse matrices"
ARRAY_API = ("scikit-learn's array-API dispatch (torch / array_api_strict inputs with array_api_dispatch=True); gdask "
             "takes NumPy, CuPy, dask and GDataSets and runs array-API code on its own devices")

SUITES: tuple[Suite, ...] = (
    Suite("sklearn.decomposition.tests.test_pca", {"sklearn.decomposition": {"PCA": "gdask.ml.PCA"}}),
    Suite("sklearn.decomposition.tests.test_truncated_svd",
          {"sklearn.decomposition": {"TruncatedSVD": "gdask.ml.TruncatedSVD"}}),
    Suite("sklearn.linear_model.tests.test_base",
          {"sklearn.linear_model": {"LinearRegression": "gdask.ml.LinearRegression"}}),
    Suite("sklearn.linear_model.tests.test_ridge", {"sklearn.linear_model": {"Ridge": "gdask.ml.Ridge"}}),
    Suite("sklearn.linear_model.tests.test_coordinate_descent",
          {"sklearn.linear_model": {"Lasso": "gdask.ml.Lasso", "ElasticNet": "gdask.ml.ElasticNet"}}),
    Suite("sklearn.mixture.tests.test_gaussian_mixture",
          {"sklearn.mixture": {"GaussianMixture": "gdask.ml.GaussianMixture"}}),
)
