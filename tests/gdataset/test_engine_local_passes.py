"""A client-mode loop without a Client: passes over blocks in memory run on a thread pool without a
graph (:class:`~gdask.gdataset.engine._client.LocalPasses`), with the graph's results, errors and
bounded wait; anything that needs a graph (blocks still to compute, another scheduler) builds one."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import pytest

import gdask
from gdask.gdataset import BlockIndex, IterativeAlgorithm, run_loop
from gdask.gdataset.engine import _client
from gdask.ml import KMeans

pytestmark = pytest.mark.timeout(120)


def _block_stats(b, index, scale, big, offset=0.0):
    return {"index": index, "sum": float(b.sum()) * scale + float(big.sum()) + offset,
            "thread": threading.current_thread().name}


class _Passes(IterativeAlgorithm):
    """Two passes: one with a block index, a scalar, an operand past the embedding size and a keyword,
    one over a subset of the blocks."""

    name = "local-passes"
    modes = ("client",)

    def __init__(self, big):
        self.big = big

    def run(self, state, ctx):
        first = ctx.map(_block_stats, ctx.data["X"], BlockIndex(), 2.0, self.big, offset=1.5)
        some = ctx.map(_block_stats, ctx.data["X"], BlockIndex(), 1.0, self.big, blocks=[3, 1])
        ctx.checkpoint(state)
        return {"first": first, "some": some}


@pytest.fixture
def graphs(monkeypatch):
    """Counts the graphs the client context builds."""
    built = []
    graph = _client.ClientContext._graph

    def counting(self, *args, **kwargs):
        built.append(args[0])
        return graph(self, *args, **kwargs)

    monkeypatch.setattr(_client.ClientContext, "_graph", counting)
    return built


def _run(X):
    big = np.arange(20_000, dtype=np.float64)  # 160 kB: a graph would hold it as its own node
    return run_loop(_Passes(big), {"X": X}, {}, client=None).state


def test_passes_over_persisted_blocks_build_no_graph_and_match_the_graphs(graphs):
    X = gdask.from_array(np.random.default_rng(0).random((40, 3)), block_rows=10).persist()
    here = _run(X)
    assert graphs == []
    with dask.config.set(scheduler="synchronous"):  # another scheduler: the graph as before
        ref = _run(X)
    assert len(graphs) == 2
    strip = [{k: v for k, v in r.items() if k != "thread"} for r in here["first"] + here["some"]]
    assert strip == [{k: v for k, v in r.items() if k != "thread"} for r in ref["first"] + ref["some"]]
    assert [r["index"] for r in here["some"]] == [1, 3]  # in block order
    assert {r["thread"].split("_")[0] for r in here["first"]} == {"gdask-pass"}
    assert {r["thread"] for r in ref["first"]} == {threading.current_thread().name}


_MADE = []


def _made(b):
    _MADE.append(b.shape[0])
    return b * 2.0


def test_a_loop_without_a_client_makes_the_blocks_once(graphs, monkeypatch):
    """Blocks still to compute are made once for the loop (persisted here), not by every pass; without
    room for them in memory, every pass's graph makes them again."""
    X = gdask.from_array(np.random.default_rng(1).random((40, 3)), block_rows=10).map_blocks(_made)
    _MADE.clear()
    kept = _run(X)
    assert len(_MADE) == 4 and graphs == []
    monkeypatch.setattr(_client, "_room_here", lambda datasets: False)
    _MADE.clear()
    again = _run(X)
    assert len(_MADE) == 6 and len(graphs) == 2  # each pass made its blocks: four, then two
    assert [r["sum"] for r in kept["first"]] == [r["sum"] for r in again["first"]]


def test_room_here_counts_every_dataset(monkeypatch):
    import psutil

    X = gdask.from_array(np.ones((1000, 10)), block_rows=100)  # 80 kB
    free = type("Free", (), {"available": 4 * X.nbytes})
    monkeypatch.setattr(psutil, "virtual_memory", lambda: free)
    assert _client._room_here({"X": X, "W": None})
    assert not _client._room_here({"X": X, "Y": X, "W": None})  # 160 kB of 320 kB free: not under half


def test_a_configured_pool_runs_the_passes(graphs):
    X = gdask.from_array(np.ones((40, 3)), block_rows=10).persist()
    with ThreadPoolExecutor(1, thread_name_prefix="users-pool") as pool, dask.config.set(pool=pool):
        out = _run(X)
    assert graphs == []
    assert {r["thread"].split("_")[0] for r in out["first"]} == {"users-pool"}


def _fails(b, bad):
    if bad in np.asarray(b):
        raise ValueError(f"block with {bad}")
    return 0


class _Failing(IterativeAlgorithm):
    name = "failing"
    modes = ("client",)

    def run(self, state, ctx):
        ctx.map(_fails, ctx.data["X"], 25.0)
        return state


def test_a_tasks_error_reaches_the_caller():
    X = gdask.from_array(np.arange(40.0).reshape(40, 1), block_rows=10).persist()
    with pytest.raises(ValueError, match="block with 25.0"):
        run_loop(_Failing(), {"X": X}, {}, client=None)


def _held(b, release, started):
    started.set()
    release.wait(timeout=60)
    return 0


class _Held(IterativeAlgorithm):
    name = "held"
    modes = ("client",)

    def __init__(self, release, started):
        self.release, self.started = release, started

    def run(self, state, ctx):
        ctx.map(_held, ctx.data["X"], self.release, self.started, name="held-pass")
        return state


def test_a_pass_that_does_not_finish_in_time_raises():
    """The wait ends at gdask.timeouts.pass while the tasks are still held (released after the error)."""
    release, started = threading.Event(), threading.Event()
    X = gdask.from_array(np.ones((8, 2)), block_rows=4).persist()
    try:
        with dask.config.set({"gdask.timeouts.pass": 0.5}):
            with pytest.raises(TimeoutError, match=r"pass 0 \(held-pass\) of a client loop did not finish within "
                                                   r"0.5 s \(gdask.timeouts.pass\)"):
                run_loop(_Held(release, started), {"X": X}, {}, client=None)
        assert started.is_set() and not release.is_set()
    finally:
        release.set()


def test_close_shuts_down_only_its_own_pool():
    passes = _client.LocalPasses()
    own = passes.executor()
    passes.close()
    with pytest.raises(RuntimeError):  # shut down
        own.submit(int)
    with ThreadPoolExecutor(1) as pool, dask.config.set(pool=pool):
        passes = _client.LocalPasses()
        assert passes.executor() is pool
        passes.close()
        assert pool.submit(int, 3).result(timeout=10) == 3


def test_kmeans_without_a_client_gives_the_graphs_bits():
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(20_000, 10, centers=5, random_state=0)  # from 8 features: bounds steps
    X = np.vstack([X, np.random.default_rng(0).uniform(-10, 10, (20_000, 10))]).astype(np.float32)
    fast = KMeans(5, random_state=0, n_init=1).fit(X)
    with dask.config.set(scheduler="synchronous"):
        slow = KMeans(5, random_state=0, n_init=1).fit(X)
    assert fast.n_iter_ == slow.n_iter_ > 3
    assert any("changed" in r for r in fast.history_)  # it stepped on the bounds
    np.testing.assert_array_equal(fast.cluster_centers_, slow.cluster_centers_)
    np.testing.assert_array_equal(fast.labels_, slow.labels_)
    assert fast.inertia_ == slow.inertia_


def _blas_threads() -> set[int]:
    from threadpoolctl import threadpool_info

    return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}


def _blas_in_task(b):
    return _blas_threads()


class _BlasPasses(IterativeAlgorithm):
    """Two passes that report the BLAS threads their tasks see, and what the driver sees between them."""

    name = "blas-passes"
    modes = ("client",)

    def run(self, state, ctx):
        first = ctx.map(_blas_in_task, ctx.data["X"])
        between = _blas_threads()
        second = ctx.map(_blas_in_task, ctx.data["X"])
        if state == "fail":
            ctx.map(_fails, ctx.data["X"], 1.0)
        return {"tasks": first + second, "between": between}


def test_tasks_side_by_side_call_blas_on_one_thread_until_the_loop_ends():
    """N tasks each calling an N-threaded BLAS would put N^2 threads on N cores: while a loop's passes
    run tasks side by side without a Client, BLAS runs one thread a call; the loop's end (or its error)
    gives the libraries back their setting. A pass of one task keeps it."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not _blas_threads():
        pytest.skip("no BLAS library loaded")
    many = gdask.from_array(np.ones((40, 3)), block_rows=10).persist()
    one = gdask.from_array(np.ones((10, 3)), block_rows=10).persist()
    with threadpoolctl.threadpool_limits(2, user_api="blas"), dask.config.set(num_workers=2):
        out = run_loop(_BlasPasses(), {"X": many}, None, client=None).state
        assert out["tasks"] == [{1}] * 8 and out["between"] == {1}
        assert _blas_threads() == {2}
        with pytest.raises(ValueError, match="block with 1.0"):
            run_loop(_BlasPasses(), {"X": many}, "fail", client=None)
        assert _blas_threads() == {2}
        alone = run_loop(_BlasPasses(), {"X": one}, None, client=None).state
        assert alone["tasks"] == [{2}] * 2 and alone["between"] == {2}


def test_one_blas_thread_is_held_until_its_last_holder_releases_it():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not _blas_threads():
        pytest.skip("no BLAS library loaded")
    from gdask.gdataset.engine._blas import OneBlasThread

    limit = OneBlasThread()
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        limit.hold()
        other = threading.Thread(target=limit.hold)  # a second fit's loop, in another thread
        other.start()
        other.join(timeout=30)
        assert _blas_threads() == {1} and limit.active
        limit.release()
        assert _blas_threads() == {1}  # the other holder still runs
        limit.release()
        assert _blas_threads() == {2} and not limit.active
        with pytest.raises(RuntimeError, match="without a hold"):
            limit.release()
        with limit:
            assert _blas_threads() == {1}
        assert _blas_threads() == {2}
