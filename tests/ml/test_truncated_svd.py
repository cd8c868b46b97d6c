"""gdask.ml.TruncatedSVD: scikit-learn's checks, agreement with scikit-learn on digits over two
devices (both backends), lazy inputs."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from sklearn import decomposition as skd
from sklearn.datasets import load_digits
from sklearn.utils.estimator_checks import parametrize_with_checks

import gdask
from gdask.ml import TruncatedSVD
from gdask.ml._adapt import collect


def assert_close(actual, expected, rtol=1e-4):
    expected = np.asarray(expected, dtype=np.float64)
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=rtol,
                               atol=rtol * 1e-4 * max(float(np.abs(expected).max(initial=0.0)), 1e-300))


@pytest.fixture(scope="module")
def digits():
    return load_digits().data


@parametrize_with_checks([TruncatedSVD(n_components=1, random_state=0),
                          TruncatedSVD(n_components=1, algorithm="arpack")])
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


@pytest.mark.parametrize("algorithm, k", [("randomized", 2), ("randomized", 10), ("arpack", 10)])
def test_digits_on_two_devices_agrees_with_sklearn(bclient, digits, algorithm, k):
    G = gdask.from_array(digits, block_rows=256).persist()
    ours = TruncatedSVD(k, algorithm=algorithm, random_state=0).fit(G)
    ref = skd.TruncatedSVD(k, algorithm=algorithm, random_state=0).fit(digits)
    assert ours.fit_mode_ == "workers"
    for a in ("components_", "singular_values_", "explained_variance_", "explained_variance_ratio_"):
        assert_close(getattr(ours, a), getattr(ref, a))
    T = ours.transform(G)
    assert isinstance(T, gdask.GDataSet)
    assert_close(collect(T), ref.transform(digits))
    assert_close(collect(ours.inverse_transform(T)), ref.inverse_transform(ref.transform(digits)))


def test_lazy_and_host_outputs(digits):
    X = da.from_array(digits, chunks=(600, 64))
    svd = TruncatedSVD(3, random_state=0).fit(X)
    T = svd.fit_transform(X)
    assert isinstance(T, da.Array) and T.chunks[0] == X.chunks[0]
    np.testing.assert_allclose(T.compute(), svd.transform(digits), rtol=1e-10, atol=1e-8)
    assert isinstance(svd.transform(digits), np.ndarray)
    f32 = TruncatedSVD(3, random_state=0).fit(digits.astype(np.float32))
    assert f32.components_.dtype == np.float32 and f32.transform(digits.astype(np.float32)).dtype == np.float32


def test_progress_records_every_pass(digits):
    records = []
    TruncatedSVD(2, n_iter=4, random_state=0, callback=records.append).fit(digits)
    assert len(records) == 1 + 4 + 1


def test_refuses_more_components_than_features(digits):
    with pytest.raises(ValueError, match="n_features"):
        TruncatedSVD(65).fit(digits)
    with pytest.raises(ValueError, match="arpack"):
        TruncatedSVD(64, algorithm="arpack").fit(digits)
