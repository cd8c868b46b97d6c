"""What must hold for the CUDA code path to be checkable without a GPU (issue #16), on
``LocalGPUCluster(n_devices=2, backend="emulated-strict")``: with a persisted GDataSet, ``KMeans()``
with default arguments, ``predict``, ``LogisticRegression().fit``, ``pagerank`` and
``((X - X.mean(0)) / X.std(0)).sum(0)`` run and agree with the ``emulated`` backend. Strict blocks
refuse NumPy operands and implicit conversion, so these runs also show that no NumPy array reaches a
device computation unconverted."""

from __future__ import annotations

import numpy as np
import pytest

import gdask
from gdask import to_numpy
from gdask.ml import KMeans, LogisticRegression, pagerank, powerlaw_graph

pytest.importorskip("array_api_strict")


def _data():
    from sklearn.datasets import make_blobs

    x, lab = make_blobs(6000, 8, centers=5, random_state=0)
    return x.astype(np.float32), (lab % 2).astype(np.int64)


def _run(backend: str) -> dict:
    from distributed import Client

    x, y = _data()
    out: dict = {}
    with gdask.LocalGPUCluster(n_devices=2, backend=backend, device_memory="256MiB",
                               dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as c, c.as_current():
        X = gdask.from_array(x, block_rows=1000).persist()
        out["block_type"] = type(X.block(0).compute()).__module__.split(".")[0]
        km = KMeans(5, random_state=0).fit(X)  # default arguments: init="k-means||", algorithm="auto" (elkan)
        out["km"] = (to_numpy(km.cluster_centers_), km.inertia_, km.n_iter_, km.fit_mode_)
        out["labels"] = to_numpy(km.labels_.compute())
        out["predict"] = to_numpy(km.predict(X).compute())
        out["predict_host"] = km.predict(x)
        lr = LogisticRegression().fit(X, y)
        out["lr"] = (lr.coef_, lr.intercept_, lr.n_iter_, lr.fit_mode_)
        out["lr_proba"] = gdask.to_numpy(lr.predict_proba(X).compute())  # lazy for a GDataSet
        out["pagerank"] = pagerank(powerlaw_graph(1500, seed=1), tol=1e-9, nblocks=3)
        expr = ((X - X.mean(0)) / X.std(0)).sum(0).compute()
        out["device_type"] = type(X.compute(output_type="device")).__module__.split(".")[0]
        out["expr_type"] = type(expr).__module__.split(".")[0]
        out["expr"] = to_numpy(expr)
        with gdask.job(c, gpu=0.5, memory="64MiB", name=f"strict-check-{backend}"):  # a device share
            Xj = gdask.from_array(x, block_rows=1500)
            out["job_km"] = to_numpy(KMeans(5, init=x[:5], max_iter=10, tol=0).fit(Xj).cluster_centers_)
    return out


@pytest.fixture(scope="module")
def runs():
    return {b: _run(b) for b in ("emulated", "emulated-strict")}


def test_blocks_are_the_devices_arrays(runs):
    assert runs["emulated"]["block_type"] == "numpy"
    assert runs["emulated-strict"]["block_type"] == "array_api_strict"
    assert runs["emulated-strict"]["device_type"] == "array_api_strict"  # the device's arrays, when asked for
    assert runs["emulated-strict"]["expr_type"] == "numpy"  # results follow the input: NumPy in, NumPy out


def test_kmeans_with_default_arguments_and_predict_agree(runs):
    a, b = runs["emulated"], runs["emulated-strict"]
    (ca, ia, na, ma), (cb, ib, nb, mb) = a["km"], b["km"]
    assert ma == mb == "workers"
    np.testing.assert_allclose(cb, ca, rtol=1e-4, atol=1e-4)
    assert ib == pytest.approx(ia, rel=1e-5) and na == nb
    np.testing.assert_array_equal(b["labels"], a["labels"])
    np.testing.assert_array_equal(b["predict"], a["predict"])
    np.testing.assert_array_equal(b["predict_host"], a["predict_host"])
    np.testing.assert_array_equal(b["predict"], b["labels"])
    np.testing.assert_allclose(b["job_km"], a["job_km"], rtol=1e-4, atol=1e-4)


def test_logistic_regression_agrees(runs):
    a, b = runs["emulated"]["lr"], runs["emulated-strict"]["lr"]
    np.testing.assert_allclose(b[0], a[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b[1], a[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(runs["emulated-strict"]["lr_proba"], runs["emulated"]["lr_proba"], atol=1e-5)


def test_pagerank_agrees(runs):
    np.testing.assert_allclose(runs["emulated-strict"]["pagerank"], runs["emulated"]["pagerank"], rtol=1e-12)


def test_standardised_column_sums_agree(runs):
    np.testing.assert_allclose(runs["emulated-strict"]["expr"], runs["emulated"]["expr"], rtol=1e-5, atol=1e-3)


def test_kmeans_streams_strict_blocks_through_the_window():
    """Data larger than the strict devices: the fit streams its blocks through the window cache (the
    strict device tier spills to the host and copies back through the device), with the answer of
    the local fit."""
    from distributed import Client

    rng = np.random.default_rng(5)
    x = (rng.uniform(-5, 5, (4, 8))[rng.integers(0, 4, 64_000)] + rng.standard_normal((64_000, 8))).astype(np.float32)
    init = x[:4].copy()
    with gdask.LocalGPUCluster(n_devices=2, backend="emulated-strict", device_memory="1MiB",
                               dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as c, c.as_current():
        km = KMeans(4, init=init, max_iter=6, tol=0, algorithm="lloyd").fit(gdask.from_array(x, block_rows=2000))
        assert km.fit_mode_ == "stream"
        labels = to_numpy(km.labels_.compute())  # lazy for GDataSet input: computed while the cluster is up
        moved = c.run(lambda dask_worker: dask_worker.data.metrics()["bytes_d2h"])
    assert sum(moved.values()) > 0  # blocks left the devices
    local = KMeans(4, init=init, max_iter=6, tol=0, algorithm="lloyd").fit(gdask.from_array(x, block_rows=2000))
    np.testing.assert_allclose(km.cluster_centers_, local.cluster_centers_, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(labels, to_numpy(local.labels_.compute()))
