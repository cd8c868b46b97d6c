import numpy as np
import pandas as pd
import pytest

import gdask
from gdask.ml import KMeans, kernels

sk = pytest.importorskip("sklearn.cluster")


@pytest.fixture(scope="module")
def blobs():
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(20_000, 8, centers=6, random_state=0)
    return X.astype(np.float32)


def test_equals_sklearn_lloyd_from_same_init(blobs, backend):
    init = blobs[:6].copy()
    ours = KMeans(6, init=init, max_iter=30, tol=0).fit(gdask.from_array(blobs, block_rows=3000))
    ref = sk.KMeans(6, init=init, n_init=1, max_iter=30, tol=0, algorithm="lloyd").fit(blobs)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=1e-4, atol=1e-4)
    assert isinstance(ours.labels_, gdask.GDataSet)  # GDataSet input: lazy labels, blocked like X
    assert (gdask.to_numpy(ours.labels_.compute()) == ref.labels_).mean() > 0.999
    assert ours.n_iter_ == ref.n_iter_
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-4)


@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random"])
def test_inits_find_good_clusterings(blobs, init, backend):
    km = KMeans(6, init=init, random_state=0).fit(blobs)
    ref = sk.KMeans(6, n_init=3, random_state=0).fit(blobs)
    if init == "random":  # one random start can end in a local minimum; it must still converge
        assert km.n_iter_ < km.max_iter and np.isfinite(km.inertia_)
    else:
        assert km.inertia_ <= ref.inertia_ * 1.05
    np.testing.assert_array_equal(km.predict(blobs), km.labels_)
    assert km.transform(blobs[:5]).shape == (5, 6)
    assert km.score(blobs) == pytest.approx(-km.inertia_, rel=1e-6)


def test_deterministic_with_random_state(blobs):
    a = KMeans(6, random_state=3).fit(blobs).cluster_centers_
    b = KMeans(6, random_state=3).fit(blobs).cluster_centers_
    np.testing.assert_array_equal(a, b)


def test_with_client_same_answer(blobs, bclient):
    init = blobs[:6].copy()
    a = KMeans(6, init=init, max_iter=20, tol=0).fit(blobs)
    np.testing.assert_allclose(a.cluster_centers_, KMeans(6, init=init, max_iter=20, tol=0).fit(
        gdask.from_array(blobs, block_rows=5000)).cluster_centers_, rtol=1e-5)


def test_dataframe_and_float64_inputs(blobs):
    df = pd.DataFrame(blobs.astype(np.float64))
    km = KMeans(6, random_state=0).fit(df)
    assert km.cluster_centers_.shape == (6, 8)


@pytest.mark.parametrize(
    "X, kw, exc, match",
    # host input is validated by scikit-learn, with scikit-learn's messages (drop-in)
    [(np.array([[1.0, np.nan], [0, 1]]), {"n_clusters": 1}, ValueError, "NaN"),
     (np.array([[1.0, np.inf], [0, 1]]), {"n_clusters": 1}, ValueError, "infinity"),
     (np.ones(5), {"n_clusters": 1}, ValueError, "Reshape your data"),
     (np.ones((0, 3)), {"n_clusters": 1}, ValueError, "0 sample"),
     (np.ones((3, 2)), {"n_clusters": 5}, ValueError, "n_clusters"),
     (np.array([["a", "b"]]), {"n_clusters": 1}, ValueError, "could not convert"),
     (np.array([[1 + 1j, 2]]), {"n_clusters": 1}, ValueError, "[Cc]omplex"),
     (np.ones((4, 2)), {"n_clusters": 2, "init": np.ones((3, 2))}, ValueError, "initial centers"),
     (np.ones((4, 2)), {"n_clusters": 2, "init": "bogus"}, ValueError, "init must be")],
)
def test_bad_input(X, kw, exc, match):
    with pytest.raises(exc, match=match):
        KMeans(**kw).fit(X)


@pytest.mark.parametrize("kw", [{}, {"tol": 0}, {"tol": 0, "init": np.zeros((2, 2))}, {"init": "random"}])
def test_nan_in_gdataset_detected(kw):
    x = np.ones((100, 2))
    x[50, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        KMeans(2, **kw).fit(gdask.from_array(x, block_rows=30))


def test_not_fitted():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        KMeans(2).predict(np.ones((3, 2)))


def test_empty_cluster_is_relocated_to_farthest_point(backend):
    x = np.array([[0.0, 0], [0.1, 0], [0, 0.1], [10, 10]], np.float32)
    init = np.array([[0.0, 0], [100, 100]], np.float32)  # the second center gets no points
    km = KMeans(2, init=init, max_iter=1, tol=0).fit(gdask.from_array(x, block_rows=2))
    np.testing.assert_allclose(km.cluster_centers_[1], [10, 10])
    ref = sk.KMeans(2, init=init, n_init=1, max_iter=1, tol=0, algorithm="lloyd").fit(x)
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=1e-5)


@pytest.mark.parametrize("n_empty", [3, kernels.N_FARTHEST + 2])  # from the Lloyd pass / an extra pass
def test_many_empty_clusters_take_the_farthest_points(n_empty, backend):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((600, 3)).astype(np.float32)
    x[::37] *= 20  # a few clearly farthest points
    init = np.concatenate([x[:2], 1e3 + np.arange(3 * n_empty, dtype=np.float32).reshape(n_empty, 3)])
    km = KMeans(len(init), init=init, max_iter=1, tol=0).fit(gdask.from_array(x, block_rows=70))
    ref = sk.KMeans(len(init), init=init, n_init=1, max_iter=1, tol=0, algorithm="lloyd").fit(x)
    # the same points become centers (scikit-learn's order among them is unspecified)
    key = lambda c: np.lexsort(np.asarray(c, np.float64).T[::-1])  # noqa: E731
    np.testing.assert_allclose(np.asarray(km.cluster_centers_)[key(km.cluster_centers_)],
                               ref.cluster_centers_[key(ref.cluster_centers_)], rtol=1e-5, atol=1e-6)


def test_sklearn_compat_messages_and_warnings():
    """scikit-learn's init-shape messages, _n_init, the elkan single-cluster warning, feature names out,
    the distinct-clusters ConvergenceWarning, a RandomState for callable inits, sparse input as dense."""
    import re
    import warnings

    import scipy.sparse as sp
    from sklearn.exceptions import ConvergenceWarning

    from gdask.ml import KMeans as K

    X = np.random.default_rng(0).normal(size=(50, 3))
    with pytest.raises(ValueError, match=re.escape("does not match the number of clusters 4")):
        K(4, init=X[:2]).fit(X)
    with pytest.raises(ValueError, match="does not match the number of features of the data 3"):
        K(2, init=X[:2, :2]).fit(X)
    km = K(3, init="random", n_init="auto").fit(X)
    assert km._n_init == 10 and km.fit(X)._n_init == 10  # refits too
    with pytest.warns(RuntimeWarning, match="doesn't make sense for a single cluster"):
        K(1, algorithm="elkan").fit(X)
    assert list(K(2).fit(X).get_feature_names_out()) == ["kmeans0", "kmeans1"]
    seen = []
    K(2, init=lambda X, k, rs: (seen.append(rs), X[:k])[1]).fit(X)
    assert all(isinstance(r, np.random.RandomState) for r in seen) and len(seen) == 10
    dup = np.array([[0.0, 0], [0, 1], [1, 0], [1, 0]])
    with pytest.warns(ConvergenceWarning, match=re.escape("Number of distinct clusters (3) found smaller")):
        K(4, init=dup, n_init=1).fit(dup)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        dense = K(3, init=X[:3]).fit(X)
    sparse = K(3, init=X[:3]).fit(sp.csr_matrix(X))
    np.testing.assert_allclose(sparse.cluster_centers_, dense.cluster_centers_)
    np.testing.assert_array_equal(sparse.predict(sp.csr_array(X)), dense.labels_)


@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random"])
def test_unit_weights_fit_as_no_weights(init):
    X = np.random.default_rng(3).normal(size=(120, 3))
    a = KMeans(3, init=init, random_state=5, n_init=1).fit(X)
    b = KMeans(3, init=init, random_state=5, n_init=1).fit(X, sample_weight=np.ones(len(X)))
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_)
