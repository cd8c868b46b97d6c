"""gdask.ml.GaussianMixture: scikit-learn's checks, agreement with scikit-learn on standardised wine
over two devices (both backends), every initialisation, inference and lazy outputs."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from sklearn import mixture as skm
from sklearn.datasets import load_wine
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import gdask
from gdask.ml import GaussianMixture
from gdask.ml._adapt import collect

COV_TYPES = ("full", "tied", "diag", "spherical")
ATTRS = ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_")


def assert_close(actual, expected, rtol=1e-4):
    expected = np.asarray(expected, dtype=np.float64)
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=rtol,
                               atol=rtol * 1e-4 * max(float(np.abs(expected).max(initial=0.0)), 1e-300))


@pytest.fixture(scope="module")
def wine():
    X = StandardScaler().fit_transform(load_wine().data)
    return X, X[[0, 60, 130]]


@parametrize_with_checks([GaussianMixture(n_components=2, random_state=0)])
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


@pytest.mark.parametrize("cov", COV_TYPES)
def test_wine_on_two_devices_agrees_with_sklearn(bclient, wine, cov):
    X, M = wine
    G = gdask.from_array(X, block_rows=50).persist()
    ours = GaussianMixture(3, covariance_type=cov, means_init=M, random_state=0).fit(G)
    ref = skm.GaussianMixture(3, covariance_type=cov, means_init=M, random_state=0).fit(X)
    assert ours.fit_mode_ == "workers"
    for a in ATTRS:
        assert_close(getattr(ours, a), getattr(ref, a))
    assert (ours.n_iter_, ours.converged_) == (ref.n_iter_, ref.converged_)
    assert ours.lower_bound_ == pytest.approx(ref.lower_bound_, rel=1e-8)
    proba = ours.predict_proba(G)
    assert isinstance(proba, gdask.GDataSet) and proba.row_blocks == G.row_blocks
    assert_close(collect(proba), ref.predict_proba(X))
    np.testing.assert_array_equal(collect(ours.predict(G)), ref.predict(X))
    assert ours.score(G) == pytest.approx(ref.score(X), rel=1e-8)


@pytest.mark.parametrize("init_params", ["kmeans", "k-means++", "random", "random_from_data"])
@pytest.mark.parametrize("cov", ["full", "tied"])
def test_initialisations_as_sklearn(wine, init_params, cov):
    X, _ = wine
    ours = GaussianMixture(3, covariance_type=cov, init_params=init_params, random_state=1).fit(
        gdask.from_array(X, block_rows=64))
    ref = skm.GaussianMixture(3, covariance_type=cov, init_params=init_params, random_state=1).fit(X)
    for a in ATTRS:
        assert_close(getattr(ours, a), getattr(ref, a))
    assert ours.n_iter_ == ref.n_iter_


def test_inference_scores_and_criteria(wine):
    X, M = wine
    ours = GaussianMixture(3, covariance_type="diag", means_init=M, n_init=2, random_state=0).fit(X)
    ref = skm.GaussianMixture(3, covariance_type="diag", means_init=M, n_init=2, random_state=0).fit(X)
    assert_close(ours.score_samples(X), ref.score_samples(X))
    assert ours.bic(X) == pytest.approx(ref.bic(X), rel=1e-8)
    assert ours.aic(X) == pytest.approx(ref.aic(X), rel=1e-8)
    np.testing.assert_array_equal(ours.fit_predict(X), ref.fit_predict(X))
    Xs, ys = ours.sample(50)
    Xr, yr = ref.sample(50)
    assert_close(Xs, Xr)
    np.testing.assert_array_equal(ys, yr)


def test_given_parameters_warm_start_and_warnings(wine):
    X, M = wine
    first = skm.GaussianMixture(2, random_state=0).fit(X)
    inits = dict(weights_init=first.weights_, means_init=first.means_, precisions_init=first.precisions_)
    ours = GaussianMixture(2, random_state=0, **inits).fit(X)
    ref = skm.GaussianMixture(2, random_state=0, **inits).fit(X)
    assert_close(ours.means_, ref.means_)
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        warm = GaussianMixture(3, means_init=M, max_iter=1, warm_start=True, random_state=0).fit(X)
    lb = warm.lower_bound_
    with pytest.warns(ConvergenceWarning):
        warm.fit(X)
    assert warm.lower_bound_ >= lb


def test_lazy_input_and_progress(wine):
    X, M = wine
    records = []
    gm = GaussianMixture(3, means_init=M, random_state=0, callback=records.append).fit(
        da.from_array(X, chunks=60))
    assert len(records) == gm.n_iter_ + 1  # the initial passes, then one record per EM iteration
    assert all("lower_bound" in r for r in records[1:])
    out = gm.predict_proba(da.from_array(X, chunks=60))
    assert isinstance(out, da.Array) and out.chunks[0] == (60, 60, 58)
    assert isinstance(gm.predict(X), np.ndarray)


def test_errors_name_the_problem(wine):
    X, _ = wine
    with pytest.raises(ValueError, match="n_samples >= n_components"):
        GaussianMixture(5).fit(X[:3])
    with pytest.raises(ValueError, match="should be normalized"):
        GaussianMixture(2, weights_init=[0.2, 0.2]).fit(X)
    with pytest.raises(ValueError, match="covariance_type"):
        GaussianMixture(2, covariance_type="banded").fit(X)
