"""Data larger than the devices' memory (issue #17, item 3): persisted data 2x and 4x the memory of
the devices, GDataSet op chains and the estimators run to the right result (before:
``((X - X.mean(0)) / X.std(0)).sum(0)`` raised DeviceMemoryError on data 2x device memory)."""

from __future__ import annotations

import numpy as np
import pytest
from distributed import futures_of, wait

import gdask
import gdask.ml

pytestmark = pytest.mark.timeout(180)

BLOCK_ROWS = 32768  # 2 MiB blocks of 8 float64 columns


@pytest.fixture(scope="module")
def small():
    """Two devices of 16 MiB: 32 MiB of device memory."""
    from distributed import Client

    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="16MiB",
                               dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


@pytest.mark.parametrize("factor", [2, 4])
def test_op_chains_on_data_larger_than_the_devices(small, factor):
    X = np.random.default_rng(factor).random((factor * 32 * 2**20 // 64, 8))
    G = gdask.from_array(X, block_rows=BLOCK_ROWS).persist()
    wait(futures_of(G))
    np.testing.assert_allclose(G.sum(axis=0).compute(), X.sum(axis=0), rtol=1e-12)
    Z = (X - X.mean(axis=0)) / X.std(axis=0)
    np.testing.assert_allclose(((G - G.mean(axis=0)) / G.std(axis=0)).sum(axis=0).compute(), Z.sum(axis=0),
                               atol=1e-6)
    np.testing.assert_allclose((((G * 2.0) + 1.0) ** 2).max(axis=0).compute(), ((X * 2 + 1) ** 2).max(axis=0))
    np.testing.assert_allclose(G.T @ ((G @ np.ones(8)) - 1.0), X.T @ ((X @ np.ones(8)) - 1.0), rtol=1e-10)
    # a chain persisted as a whole (its blocks are results charged to the devices)
    P = ((G - 0.5) * 3.0).persist()
    wait(futures_of(P))
    np.testing.assert_allclose(P.mean(axis=0).compute(), ((X - 0.5) * 3).mean(axis=0), rtol=1e-10)
    stats = small.run(lambda dask_worker: dask_worker.data.metrics())
    assert sum(s["evictions"] for s in stats.values()) > 0  # the data did go through the window
    for s in stats.values():
        assert s["window_bytes"] <= 16 * 2**20


def test_estimators_on_data_twice_the_devices(small):
    rng = np.random.default_rng(0)
    X = rng.random((2 * 32 * 2**20 // 64, 8))
    y = (X[:, 0] + X[:, 1] + 0.1 * rng.standard_normal(len(X)) > 1).astype(int)
    G = gdask.from_array(X, block_rows=BLOCK_ROWS)
    km = gdask.ml.KMeans(5, init=X[:5], max_iter=5, tol=0, algorithm="lloyd").fit(G)
    assert km.fit_mode_ == "stream"
    ref = gdask.ml.KMeans(5, init=X[:5], max_iter=5, tol=0, algorithm="lloyd").fit(X)  # host data, local fit
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=1e-10)
    lr = gdask.ml.LogisticRegression(max_iter=20).fit(G, gdask.from_array(y, block_rows=BLOCK_ROWS))
    assert lr.fit_mode_ == "stream"
    ref = gdask.ml.LogisticRegression(max_iter=20).fit(X, y)
    np.testing.assert_allclose(lr.coef_, ref.coef_, rtol=1e-8)
