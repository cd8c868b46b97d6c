"""gdask.ml's linear models: scikit-learn's checks, agreement with scikit-learn on its diabetes data
over two devices (both backends), the iterative solvers for many features, inputs and outputs."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest
from sklearn import linear_model as skl
from sklearn.datasets import load_diabetes
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.estimator_checks import parametrize_with_checks

import gdask
import gdask.ml as gm
from gdask.ml import ElasticNet, Lasso, LinearRegression, Ridge
from gdask.ml._linear_model import _problem


def assert_close(actual, expected, rtol=1e-4):
    expected = np.asarray(expected, dtype=np.float64)
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=rtol,
                               atol=rtol * 1e-4 * max(float(np.abs(expected).max(initial=0.0)), 1e-300))


@pytest.fixture(scope="module")
def diabetes():
    return load_diabetes(return_X_y=True)


# scikit-learn expects the same of its own Ridge: its n_iter_ is None for the direct solvers
@parametrize_with_checks([LinearRegression(), Ridge(), Lasso(), ElasticNet(), Ridge(solver="sparse_cg")],
                         expected_failed_checks=lambda est: (
                             {"check_non_transformer_estimators_n_iter": "n_iter_ is None for the direct solvers, "
                              "as scikit-learn's Ridge (xfailed by scikit-learn the same way)"}
                             if isinstance(est, Ridge) else {}))
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


MODELS = [("LinearRegression", {}), ("Ridge", {"alpha": 0.5}), ("Lasso", {"alpha": 0.01}),
          ("ElasticNet", {"alpha": 0.01, "l1_ratio": 0.7}), ("Lasso", {"alpha": 0.1, "positive": True})]


@pytest.mark.parametrize("name, params", MODELS)
def test_diabetes_on_two_devices_agrees_with_sklearn(bclient, diabetes, name, params):
    X, y = diabetes
    G = gdask.from_array(X, block_rows=128).persist()
    Y = gdask.from_array(y, block_rows=128).persist()
    w = np.random.default_rng(0).uniform(0.5, 2.0, len(y))
    for sw in (None, w):
        ours = getattr(gm, name)(**params).fit(G, Y, sample_weight=sw)
        ref = getattr(skl, name)(**params).fit(X, y, sample_weight=sw)
        assert ours.fit_mode_ == "workers"
        assert_close(ours.coef_, ref.coef_)
        assert ours.intercept_ == pytest.approx(ref.intercept_, rel=1e-4)
        for a in ("n_iter_", "rank_"):
            assert getattr(ours, a, None) == getattr(ref, a, None)
        if hasattr(ref, "dual_gap_"):
            assert ours.dual_gap_ == pytest.approx(ref.dual_gap_, rel=1e-4)
        pred = ours.predict(G)
        assert isinstance(pred, gdask.GDataSet) and pred.row_blocks == G.row_blocks
        assert_close(gdask.ml._adapt.collect(pred), ref.predict(X))
        assert ours.score(G, Y) == pytest.approx(ref.score(X, y), rel=1e-6)


def test_multi_target_and_no_intercept(diabetes):
    X, y = diabetes
    Y2 = np.c_[y, 2 * y + 100, -y]
    for name, params in MODELS[:4]:
        for fit_intercept in (True, False):
            ours = getattr(gm, name)(fit_intercept=fit_intercept, **params).fit(X, Y2)
            ref = getattr(skl, name)(fit_intercept=fit_intercept, **params).fit(X, Y2)
            assert ours.coef_.shape == ref.coef_.shape == (3, 10)
            assert_close(ours.coef_, ref.coef_)
            assert_close(ours.intercept_, ref.intercept_)
            assert_close(ours.predict(X), ref.predict(X))


@pytest.mark.parametrize("name, params", MODELS + [("Ridge", {"alpha": 0.5, "positive": True})])
def test_iterative_solvers_for_many_features(monkeypatch, name, params):
    """The solvers that never form the Gram matrix (CG, accelerated proximal gradient) reach scikit-learn's
    solution (forced here by lowering the feature limit of the Gram solvers; well-conditioned data, so that
    the first-order solver needs tens of passes, not thousands)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 12)) + 3.0
    y = X @ rng.standard_normal(12) * 10 + rng.standard_normal(400)
    monkeypatch.setattr(_problem, "GRAM_MAX_FEATURES", 4)
    tight = {"tol": 1e-10} if name == "LinearRegression" else {"tol": 1e-10, "max_iter": 5000}
    ours = getattr(gm, name)(**params, **tight).fit(gdask.from_array(X, block_rows=100), y)
    ref = getattr(skl, name)(**params, **({} if name == "LinearRegression" else {"tol": 1e-12, "max_iter": 100_000}))
    ref.fit(X, y)
    assert_close(ours.coef_, ref.coef_)
    assert ours.intercept_ == pytest.approx(ref.intercept_, rel=1e-4)


def test_lazy_inputs_and_output_types(diabetes):
    X, y = diabetes
    Xd, yd = da.from_array(X, chunks=(100, 10)), da.from_array(y, chunks=100)
    ref = skl.Ridge().fit(X, y)
    ours = Ridge().fit(Xd, yd)
    assert_close(ours.coef_, ref.coef_)
    p = ours.predict(Xd)
    assert isinstance(p, da.Array) and p.chunks[0] == Xd.chunks[0]
    assert_close(p.compute(), ref.predict(X))
    assert isinstance(ours.predict(X), np.ndarray)
    assert Ridge().fit(X.astype(np.float32), y).predict(X.astype(np.float32)).dtype == np.float32


def test_convergence_warning_where_sklearn_warns(diabetes):
    X, y = diabetes
    with pytest.warns(ConvergenceWarning, match="Objective did not converge"):
        Lasso(alpha=1e-4, max_iter=3).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        Lasso(alpha=0.01).fit(X, y)
    with pytest.warns(UserWarning, match="alpha=0"):
        Lasso(alpha=0, max_iter=5).fit(X, y)


def test_warm_start_and_callback(diabetes):
    X, y = diabetes
    records = []
    first = ElasticNet(alpha=0.001, warm_start=True, callback=records.append).fit(X, y)
    assert len(records) == 1 and "seconds" in records[0]  # the Gram pass
    again = first.fit(X, y)
    assert again.n_iter_ <= 2


def test_errors_name_the_problem(diabetes):
    X, y = diabetes
    with pytest.raises(ValueError, match="does not support positive"):
        Ridge(solver="svd", positive=True).fit(X, y)
    with pytest.raises(ValueError, match="l1_ratio"):
        ElasticNet(l1_ratio=1.5).fit(X, y)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        Lasso().fit(gdask.from_array(X), y[:-1])
    with pytest.raises(ValueError, match="penalties"):
        Ridge(alpha=[1.0, 2.0]).fit(X, y)
