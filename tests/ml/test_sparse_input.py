"""Sparse input for KMeans and LogisticRegression: CSR blocks, never densified; the same answers as
scikit-learn on the same sparse data and as gdask on the data densified."""

import numpy as np
import pytest

sp = pytest.importorskip("scipy.sparse")
pytest.importorskip("sklearn")

import dask  # noqa: E402
import sklearn.cluster as skc  # noqa: E402
import sklearn.linear_model as skl  # noqa: E402

import gdask  # noqa: E402
from gdask.devices import SparseBlockError, is_sparse  # noqa: E402
from gdask.ml import KMeans, LogisticRegression  # noqa: E402
from gdask.ml.kernels import backend_for  # noqa: E402

FORMATS = ("csr_matrix", "csr_array", "csc_matrix", "coo_array")


def _data(n=600, d=30, density=0.15, seed=0, dtype=np.float64):
    x = sp.random(n, d, density=density, format="csr", random_state=seed, dtype=np.float64)
    x.data = x.data * 4 - 1  # signed values
    return x.astype(dtype)


def _as(x, fmt):
    return getattr(sp, fmt)(x)


def _rtol(dtype):
    return 1e-6 if dtype == np.float64 else 1e-5


# -- the collection --------------------------------------------------------------------------------
def test_from_array_blocks_are_csr_and_compute_to_csr():
    x = _data(n=200)
    G = gdask.from_array(sp.coo_array(x), block_rows=64)
    assert G.nnz is not None and G.nnz == x.nnz and G.row_blocks == (64, 64, 64, 8)
    assert G.nbytes < x.shape[0] * x.shape[1] * 8
    blk = dask.compute(G.block(1))[0]
    assert isinstance(blk, sp.csr_array) and blk.shape == (64, 30)
    out = G.compute()
    assert is_sparse(out) and out.format == "csr" and abs(out - x).max() == 0
    np.testing.assert_allclose(G.var(axis=0).compute(), x.toarray().var(axis=0), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(G.mean(axis=0).compute(), x.toarray().mean(axis=0), rtol=1e-12, atol=1e-15)
    assert G.astype(np.float32).nnz == x.nnz and backend_for(blk) == "sparse"


def test_dask_arrays_of_sparse_chunks_are_refused_with_the_way_out():
    da = pytest.importorskip("dask.array")
    a = da.from_array(_data(n=100), chunks=(50, 30), asarray=False)
    with pytest.raises(TypeError, match="compute it to one SciPy sparse matrix"):
        KMeans(2).fit(a)


def test_strict_devices_refuse_sparse_blocks():
    with dask.config.set({"gdask.backend": "emulated-strict"}):
        with pytest.raises(SparseBlockError, match="sparse blocks need NumPy"):
            gdask.from_array(_data(n=20), block_rows=10).compute()


# -- K-means ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("weighted", [False, True])
def test_kmeans_matches_sklearn(dtype, fmt, weighted):
    x = _data(dtype=dtype)
    w = np.random.default_rng(1).uniform(0.2, 3, x.shape[0]) if weighted else None
    init = x[[0, 100, 200, 300, 400]].toarray()
    X = _as(x, fmt)
    ref = skc.KMeans(5, init=init, n_init=1, algorithm="lloyd").fit(X, sample_weight=w)
    km = KMeans(5, init=init, algorithm="lloyd").fit(X, sample_weight=w)
    assert km.n_iter_ == ref.n_iter_
    np.testing.assert_array_equal(km.labels_, ref.labels_)
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=_rtol(dtype), atol=1e-6)
    np.testing.assert_allclose(km.inertia_, ref.inertia_, rtol=_rtol(dtype))
    assert km.cluster_centers_.dtype == dtype and isinstance(km.labels_, np.ndarray)
    # predictions of sparse host input: NumPy
    pred, dist = km.predict(X), km.transform(X)
    assert isinstance(pred, np.ndarray) and isinstance(dist, np.ndarray)
    np.testing.assert_array_equal(pred, ref.predict(X))
    np.testing.assert_allclose(dist, ref.transform(X), rtol=_rtol(dtype), atol=1e-5)
    np.testing.assert_allclose(km.score(X, sample_weight=w), ref.score(X, sample_weight=w), rtol=_rtol(dtype))


@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random"])
def test_kmeans_equals_the_densified_fit(init):
    x = _data(n=800, seed=3)
    w = np.random.default_rng(2).uniform(0.5, 2, x.shape[0])
    kw = dict(n_clusters=6, init=init, random_state=7, n_init=2, tol=1e-6)
    sparse = KMeans(**kw).fit(x, sample_weight=w)
    dense = KMeans(**kw, algorithm="lloyd").fit(x.toarray(), sample_weight=w)
    np.testing.assert_array_equal(sparse.labels_, dense.labels_)
    np.testing.assert_allclose(sparse.cluster_centers_, dense.cluster_centers_, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sparse.inertia_, dense.inertia_, rtol=1e-12)
    assert sparse.n_iter_ == dense.n_iter_


def test_kmeans_elkan_on_sparse_runs_lloyd_and_relocates_empty_clusters():
    x = _data(n=300, seed=5)
    init = np.vstack([x[:3].toarray(), np.full((2, 30), 50.0)])  # two centers far from every row: empty
    ref = skc.KMeans(5, init=init, n_init=1, algorithm="lloyd").fit(x)
    for algorithm in ("elkan", "auto", "lloyd"):
        km = KMeans(5, init=init, algorithm=algorithm).fit(x)
        np.testing.assert_array_equal(km.labels_, ref.labels_)
        np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=1e-6, atol=1e-9)
        assert np.unique(km.labels_).size == 5


# -- logistic regression ---------------------------------------------------------------------------
def _targets(x, classes, seed=0):
    rng = np.random.default_rng(seed)
    z = x @ rng.standard_normal((x.shape[1], classes)) + rng.normal(0, 0.3, (x.shape[0], classes))
    return z.argmax(1) if classes > 2 else (z[:, 0] > 0).astype(int)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("classes", [2, 3])
def test_logistic_matches_sklearn(dtype, fmt, classes):
    x = _data(dtype=dtype, seed=classes)
    y = _targets(x.astype(np.float64), classes)
    w = np.random.default_rng(4).uniform(0.5, 2, x.shape[0])
    X = _as(x, fmt)
    ref = skl.LogisticRegression(C=2.0, tol=1e-8, max_iter=500).fit(X, y, sample_weight=w)
    got = LogisticRegression(C=2.0, tol=1e-8, max_iter=500).fit(X, y, sample_weight=w)
    assert got.coef_.dtype == dtype
    outs = {m: getattr(got, m)(X) for m in ("predict_proba", "decision_function")}
    assert all(isinstance(out, np.ndarray) for out in outs.values())
    if dtype == np.float64:
        np.testing.assert_allclose(got.coef_, ref.coef_, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got.intercept_, ref.intercept_, rtol=1e-6, atol=1e-6)
        for m, out in outs.items():
            np.testing.assert_allclose(out, getattr(ref, m)(X), rtol=1e-6, atol=1e-6)
    else:
        # float32 fits stop where float32's rounding hides the loss's decrease, each at its own point
        # near the optimum: both are measured against the float64 fit, and gdask's may be no further
        # from it than twice scikit-learn's own float32 fit (the float32 row terms' cancellation
        # once put it 4x further)
        X64 = _as(x.astype(np.float64), fmt)
        best = skl.LogisticRegression(C=2.0, tol=1e-10, max_iter=1000).fit(X64, y, sample_weight=w)

        def far(a, b):
            return float(np.abs(np.asarray(a, np.float64) - b).max())

        pairs = [(got.coef_, ref.coef_, best.coef_), (got.intercept_, ref.intercept_, best.intercept_)]
        pairs += [(out, getattr(ref, m)(X), getattr(best, m)(X64)) for m, out in outs.items()]
        for ours, theirs, exact in pairs:
            assert far(ours, exact) <= max(2 * far(theirs, exact), 1e-4)
    np.testing.assert_array_equal(got.predict(X), ref.predict(X))
    assert got.score(X, y) == pytest.approx(ref.score(X, y))


@pytest.mark.parametrize("params", [{}, {"class_weight": "balanced"}, {"solver": "gd", "max_iter": 300},
                                    {"l1_ratio": 1.0, "solver": "saga", "C": 5.0, "max_iter": 300}],
                         ids=["lbfgs", "balanced", "gd", "l1"])
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # both fits stop alike
def test_logistic_equals_the_densified_fit(params):
    x = _data(n=500, seed=6)
    y = _targets(x, 3, seed=1)
    w = np.random.default_rng(5).uniform(0.5, 2, x.shape[0])
    sparse = LogisticRegression(**params).fit(x, y, sample_weight=w)
    dense = LogisticRegression(**params).fit(x.toarray(), y, sample_weight=w)
    np.testing.assert_allclose(sparse.coef_, dense.coef_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sparse.intercept_, dense.intercept_, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(sparse.n_iter_, dense.n_iter_)


def test_lazy_predictions_of_a_sparse_gdataset():
    x = _data(n=300, seed=8)
    y = _targets(x, 2)
    G = gdask.from_array(x, block_rows=100)
    clf = LogisticRegression().fit(G, y)
    np.testing.assert_allclose(clf.predict_proba(G).compute(), clf.predict_proba(x), rtol=1e-12)
    km = KMeans(3, init=x[:3].toarray()).fit(G)
    np.testing.assert_array_equal(km.labels_.compute(), km.predict(x))
    np.testing.assert_allclose(km.transform(G).compute(), km.transform(x), rtol=1e-12)


# -- memory: never dense ---------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # 3 iterations: enough to show
def test_large_sparse_input_is_never_densified():
    """200_000 x 50_000 at density 1e-4 (1M stored values, 12 MB): 80 GB dense. The fits' peak of traced
    host allocations (NumPy's included) stays far below even one densified block."""
    import tracemalloc

    n, d = 200_000, 50_000
    rng = np.random.default_rng(0)
    nnz = n * d // 10_000
    x = sp.csr_matrix((rng.standard_normal(nnz), (rng.integers(0, n, nnz), rng.integers(0, d, nnz))), shape=(n, d))
    y = (rng.random(n) < 0.5).astype(int)
    tracemalloc.start()
    try:
        km = KMeans(4, init="k-means||", random_state=0, max_iter=3).fit(x)
        clf = LogisticRegression(max_iter=3).fit(x, y)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert km.cluster_centers_.shape == (4, d) and clf.coef_.shape == (1, d)
    assert peak < 1 << 30, f"peak {peak / 2**20:.0f} MiB"


# -- with a Client ---------------------------------------------------------------------------------
def test_on_a_cluster_the_loop_runs_on_the_workers(client):
    x = _data(n=1200, seed=9)
    y = _targets(x, 3, seed=2)
    init = x[:4].toarray()
    local_km = KMeans(4, init=init).fit(x)
    local_lr = LogisticRegression().fit(x, y)
    km = KMeans(4, init=init).fit(x)
    lr = LogisticRegression().fit(x, y)
    assert km.fit_mode_ == "workers" and lr.fit_mode_ == "workers"
    np.testing.assert_array_equal(km.labels_, local_km.labels_)
    np.testing.assert_array_equal(km.cluster_centers_, local_km.cluster_centers_)
    np.testing.assert_array_equal(lr.coef_, local_lr.coef_)
    np.testing.assert_array_equal(lr.predict(x), local_lr.predict(x))


# -- CUDA: cupyx.scipy.sparse blocks (skipped without a GPU; not run where this was written) -----------
def _gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy or no usable driver/GPU
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU with CuPy")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cupyx_blocks_give_the_scipy_blocks_results(dtype):
    import cupy
    from cupyx.scipy import sparse as cusparse

    from gdask.devices import to_numpy
    from gdask.ml.kernels import _kmeans_sparse, _logistic_sparse, host

    x = _data(n=400, dtype=dtype)
    g = cusparse.csr_matrix(x)
    assert backend_for(g) == "sparse"
    c = x[:5].toarray()
    w = np.random.default_rng(0).uniform(0.5, 2, x.shape[0])
    cpu = _kmeans_sparse.lloyd_partial(x, c, w)
    gpu = host(_kmeans_sparse.lloyd_partial(g, cupy.asarray(c), cupy.asarray(w)))
    for key in ("sums", "counts", "far_d", "far_rows"):
        np.testing.assert_allclose(gpu[key], cpu[key], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(to_numpy(_kmeans_sparse.assign(g, cupy.asarray(c))[0]),
                                  _kmeans_sparse.assign(x, c)[0])
    y = (np.arange(x.shape[0]) % 3).astype(np.int32)
    coef, b = np.random.default_rng(1).normal(size=(3, x.shape[1])), np.zeros(3)
    f, gc, gi = _logistic_sparse.loss_grad(x, y, coef, b)
    fg, gcg, gig = _logistic_sparse.loss_grad(g, cupy.asarray(y), cupy.asarray(coef), cupy.asarray(b))
    np.testing.assert_allclose([fg, *gcg.ravel(), *gig], [f, *gc.ravel(), *gi], rtol=1e-4, atol=1e-5)
