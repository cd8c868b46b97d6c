"""GTracker: reuse of block results across graphs, block updates, eviction, worker loss."""

from __future__ import annotations

from collections import Counter

import dask
import dask.array as da
import numpy as np
import pytest

import gdask
from gdask._compat import scheduler_workers
from gdask.devices import array_namespace
from gdask.gdataset import ExecutionLog, GTracker, IterationChannel, incremental
from gdask.gdataset._cachepolicy import ReusePolicy


# plain Dask runs of these loops differ from each other in the last bits (BLAS / reduction order on
# workers), so "identical" is checked to 1e-12 relative
def _same(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


STATIC = {"from-array", "mean-partial", "std-partial", "mean", "std", "mean-result", "std-result", "truediv",
          "expand"}


def expand(b):
    """A block function written against the array API (NumPy or device blocks of any backend)."""
    if isinstance(b, np.ndarray):
        return np.concatenate([b, b * b], axis=1)
    return array_namespace(b).concat([b, b * b], axis=1)


def _data(n=1200, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, d)), rng.random(n)


def _step(X, y, w):
    Z = ((X - X.mean(axis=0)) / X.std(axis=0)).map_blocks(expand)
    g = gdask.to_numpy((Z.T @ ((Z @ w) - y)).compute()) / len(X)
    return w - 0.1 * g


def _loop(X, y, n_iter):
    w = np.zeros(2 * X.shape[1])
    for _ in range(n_iter):
        w = _step(X, y, w)
    return w


def test_policy_idle_and_lru():
    p = ReusePolicy(max_bytes=100, max_idle=2)
    p.add("a", ("k", 0), now=0)
    p.set_nbytes("a", 60)
    p.add("b", ("k", 1), now=0)
    p.set_nbytes("b", 60)
    assert p.evictions(now=0) == ["a"]  # over budget: least recently used goes
    p.hit("b", now=1)
    assert p.evictions(now=2) == []
    assert p.evictions(now=3) == ["b"]  # idle for max_idle computations
    with pytest.raises(ValueError, match="max_idle"):
        ReusePolicy(10, max_idle=0)


def test_static_part_executes_nothing_after_first_iteration(bclient):
    client = bclient
    Xh, yh = _data()
    X, y = gdask.from_array(Xh, block_rows=300), gdask.from_array(yh, block_rows=300)
    expected = _loop(X, y, 3)
    with incremental(client) as tracker:
        got = _loop(X, y, 3)
    _same(got, expected)
    h = tracker.history
    assert len(h) == 3
    assert STATIC & set(h[0]["executed_by_prefix"])
    for rec in h[1:]:
        assert not STATIC & set(rec["executed_by_prefix"]), rec["executed_by_prefix"]
        assert rec["reused"] > 0 and rec["bytes_reused"] > 0
        assert rec["executed"] < h[0]["executed"]
        assert rec["executed"] <= rec["submitted"] - rec["reused"] - rec["pruned"]
    assert len(tracker) == 0  # closed: cache released


def test_a_client_that_is_not_the_current_one(_emulated_client):
    """incremental(client) with a client nobody made current: its computations run on that client."""
    Xh, yh = _data(seed=2)
    X, y = gdask.from_array(Xh, block_rows=300), gdask.from_array(yh, block_rows=300)
    expected = _loop(X, y, 2)  # no Client: local
    with incremental(_emulated_client) as tracker:
        got = _loop(X, y, 2)
    _same(got, expected)
    assert len(tracker.history) == 2 and tracker.history[1]["reused"] > 0


def test_update_blocks_recomputes_only_changed(bclient):
    client = bclient
    Xh, yh = _data(seed=1)
    X = gdask.from_array(Xh, block_rows=300)
    new = np.full((300, 3), 0.5)  # block 3 of 4
    X2 = X.update_blocks({3: new})
    assert X2.block_versions == (0, 0, 0, 1) and X2.name != X.name
    Xh2 = Xh.copy()
    Xh2[900:1200] = new
    w = np.linspace(0, 1, 6)

    def pipeline(X):
        return float(gdask.to_numpy((X.map_blocks(expand) @ w).sum().compute()))

    with incremental(client) as tracker:
        a = pipeline(X)
        b = pipeline(X2)
    assert a == pytest.approx((expand(Xh) @ w).sum())
    assert b == pytest.approx((expand(Xh2) @ w).sum())
    assert tracker.history[1]["executed_by_prefix"]["expand"] == 1
    assert tracker.history[1]["executed_by_prefix"]["matmul"] == 1
    np.testing.assert_array_equal(gdask.to_numpy(X2.compute()), Xh2)
    # a persisted dataset: unchanged blocks point at the held blocks
    X2p = X.persist().update_blocks({3: new})
    np.testing.assert_array_equal(gdask.to_numpy(X2p.compute()), Xh2)
    with incremental(client) as tracker:
        assert pipeline(X2p) == pytest.approx(b)


def test_update_blocks_of_a_persisted_dataset_runs_only_what_reads_them(bclient):
    """A new version of a persisted dataset reads its unchanged blocks through aliases of the held
    blocks: the work on those blocks matches the work done on the persisted dataset itself (same
    fingerprints), so only the changed block's tasks run. persist() inside the tracker works too, and
    a version made from it gives the right values."""
    Xh, _ = _data(seed=3)
    X = gdask.from_array(Xh, block_rows=300).persist()  # 4 blocks
    new = np.full((300, 3), 0.25)
    w = np.linspace(0, 1, 6)

    def pipeline(X):
        return float(gdask.to_numpy((X.map_blocks(expand) @ w).sum().compute()))

    Xh2 = Xh.copy()
    Xh2[300:600] = new
    with incremental(bclient) as tracker:
        a = pipeline(X)
        X2 = X.update_blocks({1: new})
        b = pipeline(X2)
        kept = X2.persist()
        X3 = kept.update_blocks({2: new})
        c = pipeline(X3)
    assert a == pytest.approx((expand(Xh) @ w).sum()) and b == pytest.approx((expand(Xh2) @ w).sum())
    second = tracker.history[1]
    assert second["executed_by_prefix"]["expand"] == 1 and second["executed_by_prefix"]["matmul"] == 1
    assert second["reused"] >= 3  # the three unchanged blocks' results (their expand tasks pruned behind them)
    Xh3 = Xh2.copy()
    Xh3[600:900] = new
    assert c == pytest.approx((expand(Xh3) @ w).sum())
    np.testing.assert_array_equal(gdask.to_numpy(X3.compute()), Xh3)


def test_update_blocks_errors():
    X = gdask.from_array(np.zeros((8, 2)), block_rows=4)
    with pytest.raises(IndexError, match="out of range"):
        X.update_blocks({2: np.zeros((4, 2))})
    with pytest.raises(ValueError, match="shape"):
        X.update_blocks({0: np.zeros((3, 2))})
    assert X.update_blocks({}) is X


def test_fusion_does_not_destroy_reuse_dask_array(client):
    xh = np.random.default_rng(2).random((1200, 4))
    x = da.from_array(xh, chunks=(200, 4))
    static = da.exp((x - x.mean(axis=0)) / x.std(axis=0))

    def it(w):
        return (static @ w).sum()

    plain = [it(np.full(4, float(i))).compute() for i in range(3)]
    with incremental(client) as tracker:
        got = [it(np.full(4, float(i))).compute() for i in range(3)]
    np.testing.assert_allclose(got, plain, rtol=1e-12)
    later = set(tracker.history[2]["executed_by_prefix"])
    assert not later & {"exp", "truediv", "sub", "mean_chunk", "mean_agg-aggregate", "var", "sqrt"}, later
    assert tracker.history[2]["executed"] < tracker.history[0]["executed"]


def test_eviction_keeps_results_identical(client):
    Xh, yh = _data(seed=3)
    X, y = gdask.from_array(Xh, block_rows=300), gdask.from_array(yh, block_rows=300)
    expected = _loop(X, y, 3)
    with incremental(client) as unbounded:
        _loop(X, y, 3)
    with incremental(client, max_bytes=20_000) as tracker:
        got = _loop(X, y, 3)
        assert tracker.cached_bytes <= 20_000
    _same(got, expected)
    # evicted results are submitted again (whether the scheduler still held some of them, through
    # a reference not yet garbage collected, is up to timing: "executed" is not checked)
    assert tracker.history[2]["reused"] < unbounded.history[2]["reused"]
    assert tracker.history[2]["to_run"] > unbounded.history[2]["to_run"]


def test_usable_without_with(client):
    before = dask.config.get("scheduler", None)
    X = gdask.from_array(np.arange(12.0).reshape(6, 2), block_rows=3)
    tracker = gdask.incremental(client)
    assert isinstance(tracker, GTracker)
    assert (X * 2).sum().compute() == 132.0
    assert (X * 2).sum().compute() == 132.0
    second = tracker.history[1]
    # the same graph again: its (small) final result is cached, nothing below it is even submitted
    assert second["reused"] == 1 and second["pruned"] >= 7 and second["executed"] == 0
    tracker.close()
    assert dask.config.get("scheduler", None) == before
    assert len(tracker.history) == 2


def test_execution_log_counts_plain_dask(client):
    log = ExecutionLog(client)
    log.pop()
    x = da.ones((100,), chunks=10)
    client.compute(x.sum(), optimize_graph=False).result()
    assert len(log.pop()) >= 10


def test_channel_sends_only_changed_parts(client):
    parts = [np.zeros(1000), np.ones(1000), np.full(1000, 2.0)]
    with IterationChannel(client) as ch:
        f1 = ch.publish_blocks("s", parts)
        nw = len(scheduler_workers(client))
        assert ch.history[-1]["bytes_sent"] == 3 * 8000 * nw
        f2 = ch.publish_blocks("s", [parts[0], parts[1] + 1, parts[2]])
        assert ch.history[-1]["parts_sent"] == 1 and ch.history[-1]["bytes_sent"] == 8000 * nw
        assert f2[0].key == f1[0].key and f2[1].key != f1[1].key
        np.testing.assert_array_equal(f2[1].result(), parts[1] + 1)


def _sq_dist_sum(b, c):
    return float(((b[:, None, :] - c[None]) ** 2).sum())


def _add(parts):
    return sum(parts)


def test_channel_refs_in_gdataset_ops_are_reused(client):
    """How an estimator (e.g. K-means) uses the channel: tasks carry the state's token, not the state."""
    Xh = np.random.default_rng(5).random((400, 2))
    X = gdask.from_array(Xh, block_rows=100)
    c1, c2 = np.zeros((3, 2)), np.ones((3, 2))
    with incremental(client) as tracker, IterationChannel(client) as ch:
        got = []
        for c in (c1, c1, c2):
            ref = ch.publish("centers", c)
            got.append(X.reduce_blocks(_sq_dist_sum, _add, ref).compute())
    expected = [((Xh[:, None, :] - c[None]) ** 2).sum() for c in (c1, c1, c2)]
    np.testing.assert_allclose(got, expected)
    assert [h["parts_sent"] for h in ch.history] == [1, 0, 1]
    h = tracker.history
    assert h[1]["executed"] == 0 and h[2]["executed_by_prefix"]["sq_dist_sum-partial"] == 4


def test_worker_loss_recomputes_from_lineage(client):
    """Last test of the module: kills one worker of the shared cluster (its nanny restarts it)."""
    import os

    Xh, yh = _data(seed=4)
    X, y = gdask.from_array(Xh, block_rows=300), gdask.from_array(yh, block_rows=300)
    expected = _loop(X, y, 3)
    with incremental(client) as tracker:
        w = _step(X, y, np.zeros(6))
        held = client.who_has(list(tracker._futures.values()))
        only = Counter(v[0] for v in held.values() if len(v) == 1)  # results held by one worker only
        victim = only.most_common(1)[0][0] if only else sorted(scheduler_workers(client))[0]
        client.run(os._exit, 1, workers=[victim], on_error="ignore")
        for _ in range(2):
            w = _step(X, y, w)
    _same(w, expected)
    if only:  # cached results that were only on the dead worker were rebuilt from their lineage
        assert sum(h["recomputed"] for h in tracker.history[1:]) > 0
