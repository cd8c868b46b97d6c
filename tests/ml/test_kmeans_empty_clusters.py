"""Empty clusters as scikit-learn handles them (issue "Drop-in", item 3), on every kernel path:
coincident initial centers (all equal; duplicated rows) end at scikit-learn's inertia.

scikit-learn relocates the empty clusters of a pass to the rows farthest from their centers (one
row each, leaving its cluster), does nothing when every row sits on its center, and puts a cluster
still without weight at the heaviest one (``_relocate_empty_clusters_dense``, ``_average_centers``).
"""

from __future__ import annotations

import warnings

import dask
import numpy as np
import pytest
import sklearn.cluster as sk

import gdask
from gdask.ml import KMeans, kernels
from gdask.ml.kernels import _cuda_common, _dispatch


def _data(seed, n=1500, d=5, k=6, dtype=np.float32):
    rng = np.random.default_rng(seed)
    true = rng.uniform(-8, 8, (k, d))
    X = true[rng.integers(0, k, n)] + rng.standard_normal((n, d)) * rng.uniform(0.3, 1.5, (n, 1))
    return X.astype(dtype)


def _inits(X, k, rng):
    return {"all-equal": np.repeat(X[:1], k, axis=0),
            "duplicated-rows": X[np.repeat(rng.choice(len(X), (k + 1) // 2, replace=False), 2)[:k]]}


def _fit_both(X, init, algorithm, max_iter, w=None, block_rows=400):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn: "Number of distinct clusters found smaller than n_clusters"
        ref = sk.KMeans(len(init), init=init, n_init=1, max_iter=max_iter, tol=0, algorithm=algorithm)
        ref.fit(X, sample_weight=w)
    got = KMeans(len(init), init=init, max_iter=max_iter, tol=0, algorithm=algorithm)
    got.fit(gdask.from_array(X, block_rows=block_rows), sample_weight=w)
    return ref, got


@pytest.mark.parametrize("algorithm", ["lloyd", "elkan"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_coincident_centers_end_at_sklearns_inertia(algorithm, dtype, backend):
    for seed in (0, 1):
        X = _data(seed, dtype=dtype)
        for k in (5, 12) if seed == 0 else (9,):  # fewer / more empty clusters than a pass reports rows for
            for name, init in _inits(X, k, np.random.default_rng(seed)).items():
                for max_iter in (2, 60):
                    ref, got = _fit_both(X, init, algorithm, max_iter)
                    assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-4), (seed, k, name, max_iter)


def test_weighted_coincident_centers(backend):
    X = _data(7, n=900)
    w = np.random.default_rng(8).uniform(0.5, 2.0, len(X))
    for name, init in _inits(X, 9, np.random.default_rng(9)).items():
        ref, got = _fit_both(X, init, "lloyd", 40, w=w)
        assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-4), name


def test_fewer_distinct_rows_than_clusters(backend):
    """Fewer distinct rows than clusters: once every row sits on its center nothing is relocated
    (the centers left without rows take the heaviest cluster's place, scikit-learn's
    ``_average_centers``), and the fit ends at inertia 0 with every distinct row a center, as there."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((4, 3)).astype(np.float32)[rng.integers(0, 4, 200)]
    init = np.repeat(X[:1], 7, axis=0)
    ref, got = _fit_both(X, init, "lloyd", 10)
    assert ref.inertia_ == pytest.approx(0.0, abs=1e-6) and got.inertia_ == pytest.approx(0.0, abs=1e-6)
    for c in np.unique(X, axis=0):  # every distinct row became a center, as in scikit-learn
        assert np.abs(np.asarray(got.cluster_centers_) - c).max(1).min() < 1e-6
        assert np.abs(ref.cluster_centers_ - c).max(1).min() < 1e-6


def test_next_centers_follows_sklearn_step_by_step():
    """One pass's M-step against scikit-learn's, on the pass's own statistics."""
    sums = np.array([[10.0, 0.0], [0.0, 0.0], [4.0, 4.0], [0.0, 0.0]])
    counts = np.array([5.0, 0.0, 2.0, 0.0])
    centers = np.zeros((4, 2))
    far = (np.array([9.0, 16.0, 16.0]), np.array([0, 2, 0]), np.array([[5.0, 0.0], [3.0, 3.0], [6.0, 0.0]]),
           np.array([1.0, 1.0, 1.0]))
    new = kernels.next_centers(sums, counts, centers, far)
    # cluster 1 takes the farthest row (16, the first of the two), cluster 3 the next one
    np.testing.assert_allclose(new, [[4.0 / 4, 0.0], [3.0, 3.0], [1.0, 1.0], [6.0, 0.0]])
    assert kernels.next_centers(sums, counts, centers, tuple(a[:1] for a in far)) is None  # 2 empty, 1 row
    zero = (np.zeros(1), np.zeros(1, np.int64), np.ones((1, 2)), np.ones(1))  # every row on its center
    out = kernels.next_centers(sums, counts, centers, zero)
    np.testing.assert_allclose(out, [[2.0, 0.0], [2.0, 0.0], [2.0, 2.0], [2.0, 0.0]])  # heaviest: cluster 0


def test_coincident_centers_tie_to_the_lowest_index_on_every_path():
    """Equal centers get equal distances on every backend, so rows go to the first of them and the
    others are empty (a matrix product may round equal columns apart: the array API path spreads
    the distances of the distinct centers)."""
    array_api_strict = pytest.importorskip("array_api_strict")
    X = _data(3, n=700) + 40.0  # far from the origin: the expanded form's rounding is large
    C = np.repeat(X[5:6], 7, axis=0)
    C[4] = X[9]
    dev = array_api_strict.Device("device1")
    for blk, c in ((X, C), (array_api_strict.asarray(X, device=dev), array_api_strict.asarray(C, device=dev))):
        labels = kernels.host(kernels.assign(blk, c))[0]
        assert set(np.unique(labels)) <= {0, 4}
        counts = kernels.host(kernels.lloyd_partial(blk, c))["counts"]
        assert (counts[[1, 2, 3, 5, 6]] == 0).all()


@pytest.mark.cudasim
def test_coincident_centers_on_the_cuda_kernels(monkeypatch):
    """The numba.cuda path (in the simulator: NumPy blocks posing as CuPy blocks) relocates as
    scikit-learn does."""
    from numba.core import config

    if not config.ENABLE_CUDASIM:
        pytest.skip("needs NUMBA_ENABLE_CUDASIM=1 (the simulator runs the kernels on NumPy blocks)")
    monkeypatch.setattr(_cuda_common, "usable", lambda: True)
    monkeypatch.setattr(_dispatch, "block_kind", lambda x: "cupy" if isinstance(x, np.ndarray) else "other")
    X = _data(5, n=160, d=3)
    with dask.config.set(scheduler="sync"):  # the simulator runs one launch at a time
        for name, init in _inits(X, 5, np.random.default_rng(5)).items():
            ref, got = _fit_both(X, init, "lloyd", 8, block_rows=80)
            assert got.inertia_ == pytest.approx(ref.inertia_, rel=1e-4), name
