"""KMeans on the iteration engine: the loop on the workers against the loop from the client, the same
bits wherever the blocks are, and resuming from the last finished iteration after a failure."""

import logging

import dask
import numpy as np
import pytest

import gdask
from gdask import protocol
from gdask._compat import scheduler_workers
from gdask.gdataset.engine import _worker as engine_worker
from gdask.ml import KMeans, kernels


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


def _labels(km):
    lab = km.labels_
    return gdask.to_numpy(lab.compute() if hasattr(lab, "compute") else lab)


def _assert_same(a, b):
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(_labels(a), _labels(b))
    assert a.inertia_ == b.inertia_
    assert a.n_iter_ == b.n_iter_ == len(a.iteration_times_)


@pytest.mark.parametrize("kw", [dict(max_iter=12, tol=0), dict(max_iter=12, tol=0, algorithm="lloyd"),
                                dict(max_iter=300, tol=1e-4)], ids=["elkan", "lloyd", "converges"])
def test_same_fit_as_the_loop_from_the_client(bclient, data, kw):
    a, b = _both(*data, **kw)
    assert (a.fit_mode_, b.fit_mode_) == ("workers", "client")
    _assert_same(a, b)
    if kw["tol"]:
        assert a.n_iter_ < 300


def test_sample_weight_and_empty_clusters(bclient, data):
    X, init = data
    w = np.random.default_rng(1).uniform(0, 3, len(X))
    far = np.vstack([init[:3], np.full((2, X.shape[1]), 1e4, np.float32)])  # two centers get no rows
    a, b = _both(X, far, sample_weight=w, max_iter=8, tol=0)
    _assert_same(a, b)
    assert len(np.unique(_labels(a))) == 5


def test_many_empty_clusters_take_an_extra_pass_on_the_workers(bclient):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3000, 3)).astype(np.float32)
    x[::37] *= 20
    init = np.concatenate([x[:2], 1e3 + np.arange(36, dtype=np.float32).reshape(12, 3)])  # > N_FARTHEST empty
    a, b = _both(x, init, max_iter=3, tol=0)
    _assert_same(a, b)


def test_verbose_prints_every_iteration_once_in_order(client, data, capsys):
    G = gdask.from_array(data[0], block_rows=5_000).persist()
    records = []
    km = KMeans(5, init=data[1], max_iter=6, tol=0, verbose=2, callback=records.append).fit(G)
    assert km.fit_mode_ == "workers"
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("iteration")]
    assert [ln.split(":")[0] for ln in lines] == [f"iteration {i}" for i in range(1, 7)]
    assert [r["iteration"] for r in records] == list(range(1, 7))
    assert all(r["mode"] == "workers" and r["seconds"] > 0 for r in records)


def test_a_failing_loop_on_the_workers_resumes_from_the_client(client, data, caplog):
    G = gdask.from_array(data[0], block_rows=5_000).persist()
    ref = KMeans(5, init=data[1], max_iter=10, tol=0, algorithm="lloyd").fit(G)
    # the loop on the workers stops after 4 iterations (a rank raises): the fit resumes from the client there
    def stop_after_four(comm, algorithm, *args):
        class Stop(type(algorithm)):
            def run(self, st, ctx):
                real = ctx.checkpoint

                def checkpoint(s, **rec):
                    real(s, **rec)
                    if ctx.iteration >= 4:
                        raise RuntimeError("rank failed after iteration 4")
                ctx.checkpoint = checkpoint
                return super().run(st, ctx)
        algorithm.__class__ = Stop
        return _engine_driver(comm, algorithm, *args)

    _engine_driver = engine_worker.driver_on_worker
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine_worker, "driver_on_worker", stop_after_four)
        with caplog.at_level(logging.WARNING, logger="gdask.gdataset"):
            km = KMeans(5, init=data[1], max_iter=10, tol=0, algorithm="lloyd").fit(G)
    assert "did not run to its end" in caplog.text and "resuming from the client at iteration 4" in caplog.text
    assert km.fit_mode_ == "client"
    assert [r["mode"] for r in km.history_] == ["workers"] * 4 + ["client"] * 6
    _assert_same(km, ref)


def _die_in_iteration(n):
    """On this worker, exit the process at its first block pass of K-means (Lloyd or bounds) in
    iteration ``n``: iterations are counted by the centers each pass gets (new ones every iteration),
    so the kill falls in that iteration however many blocks the worker holds."""
    import os

    seen = []
    for mod, name in ((kernels, "lloyd_partial"), (kernels, "bounds_partial")):
        orig = getattr(mod, name)

        def dying(blk, centers, *a, _orig=orig, **k):
            key = np.asarray(centers).tobytes()
            if not seen or seen[-1] != key:
                seen.append(key)
            if len(seen) >= n:
                os._exit(1)
            return _orig(blk, centers, *a, **k)

        setattr(mod, name, dying)


@pytest.mark.parametrize("die_in", [2, 8], ids=["lloyd-phase", "bounds-phase"])
def test_a_worker_dying_mid_fit_gives_the_same_bits(caplog, die_in):
    from distributed import Client

    X = np.random.default_rng(0).random((100_000, 8), dtype=np.float32)
    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="512MiB",
                               dashboard_address=":0") as cluster, Client(cluster) as c:
        G = gdask.from_array(X, block_rows=12_500).persist()
        ref = KMeans(8, init=X[:8], max_iter=20, tol=0).fit(G)
        victim = sorted(scheduler_workers(c))[0]
        c.run(_die_in_iteration, die_in, workers=[victim])
        with caplog.at_level(logging.WARNING, logger="gdask.gdataset"):
            km = KMeans(8, init=X[:8], max_iter=20, tol=0).fit(G)
        assert "did not run to its end" in caplog.text  # the worker died inside the loop
        # not from the start: the checkpoints of the iterations before the kill were kept
        assert "resuming from the client at iteration 0" not in caplog.text
        # its blocks were recomputed from lineage, lost bounds rebuilt from the fit's history: same bits
        _assert_same(km, ref)
        # every iteration's record came back: rank 0 sends them in batches, the survivors keep recent ones
        assert [r["iteration"] for r in km.history_] == list(range(1, 21))
        assert all("center_shift" in r for r in km.history_), km.history_


def test_the_passes_on_the_workers_teach_the_placement_plugin(client, data):
    from distributed import futures_of, wait

    G = gdask.from_array(data[0], block_rows=5_000).persist()
    wait(futures_of(G))  # the blocks' own tasks are counted before

    def done():
        stats = client.sync(client.scheduler.gdask_placement_stats)["workers"]
        return sum(s["gpu_tasks_done"] for s in stats.values())

    before = done()
    km = KMeans(5, init=data[1], max_iter=6, tol=0).fit(G)
    assert km.fit_mode_ == "workers"
    # each block's pass of each iteration counts as a task would from the client
    assert done() - before == km.n_iter_ * G.nblocks
    # they came as an event of the loop's last step, which the scheduler keeps no copy of
    assert client.run_on_scheduler(_kept_events, protocol.EVENT_OBSERVE) == 0


def _kept_events(topic, dask_scheduler=None):
    kept = dask_scheduler._broker._topics.get(topic)
    return 0 if kept is None else len(kept.events)


def test_on_a_plain_dask_cluster(data):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster):
        a, b = _both(*data, max_iter=8, tol=0)
        assert (a.fit_mode_, b.fit_mode_) == ("workers", "client")
        _assert_same(a, b)  # lazy labels_ read the cluster's blocks


def test_loop_state_pickles_its_history_whole():
    """A rank pickles its checkpoint every iteration: the bounds history goes as one array and comes
    back as the same list of centers."""
    import pickle

    from gdask.ml._kmeans._loop import LoopState

    rng = np.random.default_rng(0)
    st = LoopState(rng.random((3, 2)).astype(np.float32), True, 1e-4, np.dtype(np.float32), 10)
    st.history = [rng.random((3, 2)) for _ in range(5)]
    st.times = [0.1, 0.2]
    back = pickle.loads(pickle.dumps(st.copy(), protocol=5))
    assert len(back.history) == 5
    for a, b in zip(back.history, st.history):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(back.centers, st.centers)
    assert (back.times, back.n, back.dtype, back.bounds) == (st.times, st.n, st.dtype, st.bounds)
    back.history.append(np.zeros((3, 2)))  # a list again: the loop appends to it
    assert pickle.loads(pickle.dumps(LoopState(st.centers, False, 0.0, st.dtype, 10))).history == []
