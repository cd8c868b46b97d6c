"""KMeans's loop on the workers (gdask.ml.worker-loop) against the loop from the client."""

import logging

import dask
import numpy as np
import pytest

import gdask
from gdask.gdataset._collective import CollectiveError
from gdask.ml import KMeans, _kmeans


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    centers = rng.uniform(-6, 6, size=(5, 10))
    X = (centers[rng.integers(0, 5, 40_000)] + rng.standard_normal((40_000, 10))).astype(np.float32)
    return X, X[rng.choice(len(X), 5, replace=False)].copy()


def _both(X, init, *, sample_weight=None, **kw):
    G = gdask.from_array(X, block_rows=5_000).persist()
    out = []
    for on_workers in (True, False):
        with dask.config.set({"gdask.ml.worker-loop": on_workers}):
            out.append(KMeans(len(init), init=init, **kw).fit(G, sample_weight=sample_weight))
    return out


def _assert_same(a, b):
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert a.inertia_ == b.inertia_
    assert a.n_iter_ == b.n_iter_ == len(a.iteration_times_)


@pytest.mark.parametrize("kw", [dict(max_iter=12, tol=0), dict(max_iter=12, tol=0, algorithm="lloyd"),
                                dict(max_iter=300, tol=1e-4)], ids=["elkan", "lloyd", "converges"])
def test_same_fit_as_the_loop_from_the_client(client, data, kw, monkeypatch):
    calls = []
    monkeypatch.setattr(_kmeans, "run_on_workers", lambda *a, **k: calls.append(1) or run(*a, **k))
    a, b = _both(*data, **kw)
    assert calls == [1]  # the first fit ran on the workers, the second did not
    _assert_same(a, b)
    if kw["tol"]:
        assert a.n_iter_ < 300


def test_sample_weight_and_empty_clusters(client, data):
    X, init = data
    w = np.random.default_rng(1).uniform(0, 3, len(X))
    far = np.vstack([init[:3], np.full((2, X.shape[1]), 1e4, np.float32)])  # two centers get no rows
    a, b = _both(X, far, sample_weight=w, max_iter=8, tol=0)
    _assert_same(a, b)
    assert len(np.unique(a.labels_)) == 5


def test_many_empty_clusters_take_an_extra_pass_on_the_workers(client):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3000, 3)).astype(np.float32)
    x[::37] *= 20
    init = np.concatenate([x[:2], 1e3 + np.arange(36, dtype=np.float32).reshape(12, 3)])  # > N_FARTHEST empty
    a, b = _both(x, init, max_iter=3, tol=0)
    _assert_same(a, b)


def test_verbose_prints_every_iteration_once_in_order(client, data, capsys):
    G = gdask.from_array(data[0], block_rows=5_000).persist()
    KMeans(5, init=data[1], max_iter=6, tol=0, verbose=True).fit(G)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("iteration")]
    assert [ln.split(":")[0] for ln in lines] == [f"iteration {i}" for i in range(1, 7)]


def test_falls_back_to_the_loop_from_the_client(client, data, monkeypatch, caplog):
    def broken(*a, **k):
        raise CollectiveError("a worker left")

    G = gdask.from_array(data[0], block_rows=5_000).persist()
    ref = KMeans(5, init=data[1], max_iter=10, tol=0).fit(G)
    monkeypatch.setattr(_kmeans, "run_on_workers", broken)
    with caplog.at_level(logging.WARNING, logger="gdask.ml"):
        km = KMeans(5, init=data[1], max_iter=10, tol=0).fit(G)
    assert "a worker left" in caplog.text and "from the client" in caplog.text
    _assert_same(km, ref)


run = _kmeans.run_on_workers


def _die_at_call(n):
    """On this worker, exit the process at the ``n``-th group pass of a K-means loop on the workers."""
    import os

    orig = _kmeans._group_partial
    calls = [0]

    def dying(*a, **k):
        calls[0] += 1
        if calls[0] >= n:
            os._exit(1)
        return orig(*a, **k)

    _kmeans._group_partial = dying


def test_a_worker_dying_mid_fit_gives_the_same_fit(caplog):
    from distributed import Client

    X = np.random.default_rng(0).random((100_000, 8), dtype=np.float32)
    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="512MiB",
                               dashboard_address=":0") as cluster, Client(cluster) as c:
        G = gdask.from_array(X, block_rows=12_500).persist()
        ref = KMeans(8, init=X[:8], max_iter=20, tol=0).fit(G)
        victim = sorted(c.scheduler_info(n_workers=-1)["workers"])[1]
        c.run(_die_at_call, 5, workers=[victim])
        with caplog.at_level(logging.WARNING, logger="gdask.ml"):
            km = KMeans(8, init=X[:8], max_iter=20, tol=0).fit(G)
        assert "did not run to its end" in caplog.text  # the worker died inside the loop
        _assert_same(km, ref)  # its blocks were recomputed and the loop from the client took over


def test_the_passes_on_the_workers_teach_the_placement_plugin(client, data):
    G = gdask.from_array(data[0], block_rows=5_000).persist()
    groups = G.block_groups()

    def done():
        stats = client.sync(client.scheduler.gdask_placement_stats)["workers"]
        return sum(s["gpu_tasks_done"] for s in stats.values())

    before = done()
    km = KMeans(5, init=data[1], max_iter=6, tol=0).fit(G)
    # each group's pass of each iteration counts as the task it would have been from the client
    assert done() - before == km.n_iter_ * len(groups)


def test_on_a_plain_dask_cluster(data, monkeypatch):
    from distributed import Client, LocalCluster

    calls = []
    monkeypatch.setattr(_kmeans, "run_on_workers", lambda *a, **k: calls.append(1) or run(*a, **k))
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster):
        a, b = _both(*data, max_iter=8, tol=0)
    assert calls == [1]
    _assert_same(a, b)
