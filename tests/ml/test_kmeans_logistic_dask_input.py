"""Dask input end to end for KMeans and LogisticRegression: fits, lazy outputs blocked like X
(dask arrays for dask arrays and dask DataFrames), the same values as NumPy input, which gives NumPy."""

from __future__ import annotations

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

import gdask.ml as gm


def _data():
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(c, 0.5, size=(300, 4)) for c in (-3.0, 0.0, 3.0)])
    y = (X[:, 0] + 0.3 * X[:, 1] > 0).astype(np.int64)
    return X, y


def _as(kind, X):
    if kind == "array":
        return da.from_array(X, chunks=(250, 4))
    return dd.from_pandas(pd.DataFrame(X, columns=list("abcd")), npartitions=3)


def _rows(kind, dX):
    return dX.chunks[0] if kind == "array" else tuple(int(n) for n in dX.map_partitions(len).compute())


@pytest.mark.parametrize("kind", ["array", "dataframe"])
@pytest.mark.parametrize("use_client", [False, True])
def test_kmeans_dask_input_lazy_same_values(kind, use_client, request):
    if use_client:
        request.getfixturevalue("client")
    X, _ = _data()
    dX = _as(kind, X)
    ref = gm.KMeans(3, init="k-means++", random_state=0, algorithm="lloyd").fit(X)
    km = gm.KMeans(3, init="k-means++", random_state=0, algorithm="lloyd").fit(dX)
    assert isinstance(ref.labels_, np.ndarray) and isinstance(ref.predict(X), np.ndarray)
    assert isinstance(ref.transform(X), np.ndarray)
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=1e-10)
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)
    for got, want in ((km.labels_, ref.labels_), (km.predict(dX), ref.predict(X)),
                      (km.transform(dX), ref.transform(X))):
        assert isinstance(got, da.Array)
        assert got.chunks[0] == _rows(kind, dX)
        out = got.compute()
        assert isinstance(out, np.ndarray) and out.dtype == want.dtype
        np.testing.assert_allclose(out, want, rtol=1e-10)


@pytest.mark.parametrize("kind", ["array", "dataframe"])
def test_logistic_dask_input_lazy_same_values(kind):
    X, y = _data()
    dX = _as(kind, X)
    dy = da.from_array(y, chunks=250) if kind == "array" else dd.from_pandas(pd.Series(y), npartitions=3)
    ref = gm.LogisticRegression().fit(X, y)
    lr = gm.LogisticRegression().fit(dX, dy)
    np.testing.assert_allclose(lr.coef_, ref.coef_, rtol=1e-6, atol=1e-8)
    for m in ("predict", "predict_proba", "decision_function"):
        want = getattr(ref, m)(X)
        got = getattr(lr, m)(dX)
        assert isinstance(want, np.ndarray)
        assert isinstance(got, da.Array) and got.chunks[0] == _rows(kind, dX)
        out = got.compute()
        assert isinstance(out, np.ndarray)
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-8)


def test_kmeans_transform_dtype_as_sklearn_and_empty_chunks():
    """transform's dtype is scikit-learn's (float32 only when X and the centers are); dask chunks
    without rows are left out of the lazy outputs' blocking (as dask-ml does)."""
    from sklearn.cluster import KMeans as SK

    X = da.random.default_rng(0).uniform(size=(100, 2), chunks=(50, 2))
    X32 = X.astype("f4")
    for fit_on, apply_to in ((X, X), (X32, X32), (X, X32), (X32, X)):
        a = gm.KMeans(3, random_state=0).fit(fit_on)
        b = SK(3, random_state=0, n_init=1).fit(fit_on.compute())
        assert a.cluster_centers_.dtype == b.cluster_centers_.dtype
        assert a.transform(apply_to).dtype == b.transform(apply_to.compute()).dtype
        assert a.transform(apply_to).compute().dtype == b.transform(apply_to.compute()).dtype
    Xe = da.random.default_rng(1).random((100, 4), chunks=((0, 5, 95), (4,)))
    out = gm.KMeans(2, random_state=0).fit_transform(Xe)
    assert out.chunks == ((5, 95), (2,))
