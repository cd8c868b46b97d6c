"""The placement SchedulerPlugin on real clusters: in-process (gen_cluster) and LocalGPUCluster."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import dask
import numpy as np
import pytest
from distributed.utils_test import gen_cluster, inc, slowinc

import gdask
from gdask._compat import scheduler_workers
from gdask.scheduling import GPUPlacement, is_gpu_task


def _pinned(s, keys):
    return {k: (set(s.tasks[k].worker_restrictions or ()), s.tasks[k].loose_restrictions) for k in keys}


def _train(plugin, kind, seconds_by_worker, n=3):
    for _ in range(n):  # the first measurement per (kind, device) is a warm-up and is ignored
        for addr, sec in seconds_by_worker.items():
            plugin.model.observe(kind, 0, addr, sec)


@gen_cluster(client=True, nthreads=[("", 1)] * 2)
async def test_plain_tasks_left_to_dask_and_marked_tasks_pinned(c, s, a, b):
    plugin = GPUPlacement()
    await c.register_plugin(plugin)
    plugin = s.plugins[GPUPlacement.name]
    plain = c.map(inc, range(10))
    await c.gather(plain)
    assert all(not s.tasks[f.key].worker_restrictions for f in plain)
    with dask.annotate(gdask_gpu=True):
        gpu = c.map(inc, range(100, 110))
    assert await c.gather(gpu) == list(range(101, 111))
    assert is_gpu_task(s.tasks[gpu[0].key]) and not is_gpu_task(s.tasks[plain[0].key])
    pins = _pinned(s, [f.key for f in gpu])
    assert all(len(w) == 1 for w, _ in pins.values())
    assert {next(iter(w)) for w, _ in pins.values()} == {a.address, b.address}  # spread, not all on one
    stats = plugin.placement_stats()
    assert sum(v["placed"] for v in stats.values()) == 10
    assert plugin.placer.outstanding() == 0


@gen_cluster(client=True, nthreads=[("", 1)] * 2)
async def test_work_stealing_does_not_undo_confident_placement(c, s, a, b):
    await c.register_plugin(GPUPlacement())
    plugin = s.plugins[GPUPlacement.name]
    # b is measured 50x slower: every task belongs on a, although b sits idle
    _train(plugin, "slowinc", {a.address: 0.05, b.address: 2.5})
    assert s.extensions["stealing"] is not None
    with dask.annotate(gdask_gpu=True):
        futs = c.map(slowinc, range(16), delay=0.05)
    assert await c.gather(futs) == list(range(1, 17))
    where = {ws.address for f in futs for ws in s.tasks[f.key].who_has}
    assert where == {a.address}
    assert all(not loose for _, loose in _pinned(s, [f.key for f in futs]).values())


@gen_cluster(client=True, nthreads=[("", 1)] * 3)
async def test_pinned_tasks_are_replaced_when_their_worker_dies(c, s, a, b, w3):
    await c.register_plugin(GPUPlacement())
    plugin = s.plugins[GPUPlacement.name]
    _train(plugin, "slowinc", {a.address: 0.05, b.address: 0.05, w3.address: 0.05})
    with dask.annotate(gdask_gpu=True):
        futs = c.map(slowinc, range(30), delay=0.05)
        total = c.submit(sum, futs)
    while not any(f.done() for f in futs):
        await asyncio.sleep(0.01)
    victim = a.address
    assert any(plugin._pinned.get(f.key) == victim for f in futs)
    await a.close()
    # without re-placement the tasks pinned to the dead worker would wait in no-worker forever
    assert await asyncio.wait_for(total, 30) == sum(range(1, 31))
    assert plugin.replaced > 0
    assert all(victim not in (s.tasks[f.key].worker_restrictions or ()) for f in futs)


# in-process clusters first: the module-scoped LocalGPUCluster below holds a client of its own
@gen_cluster(client=True, nthreads=[("", 1)], scheduler_kwargs={"preload": ["gdask.scheduling"]})
async def test_scheduler_preload_installs_placement(c, s, a):
    assert isinstance(s.plugins.get(GPUPlacement.name), GPUPlacement)
    assert "gdask_device_table" in s.handlers
    stats = await c.scheduler.gdask_placement_stats()
    assert a.address in stats["workers"]
    assert "gdask-jobs" in s.plugins and "gdask_job_open" in s.handlers


@gen_cluster(client=True, nthreads=[("", 1)], scheduler_kwargs={"preload": ["gdask.scheduling"]})
async def test_the_placement_plugin_installs_the_gather_filter(c, s, a):
    plugin = s.plugins[GPUPlacement.name]
    log = logging.getLogger("distributed.scheduler")
    assert plugin.gather_log in log.filters and plugin.gather_log.scheduler is s  # its own, for its scheduler
    assert plugin.gather_log.settle == 10  # config gdask.timeouts.gather-settle
    await plugin.close()
    assert plugin.gather_log not in log.filters


@gen_cluster(client=True, nthreads=[("", 1)] * 2, scheduler_kwargs={"preload": ["gdask.scheduling"]})
async def test_a_gather_from_a_worker_that_died_is_an_error_only_if_the_worker_stays(c, s, a, b):
    """The scheduler's own gather fails on a worker that does not answer (its process died; the
    scheduler has not heard yet): no ERROR once the worker is known gone, the ERROR if it stays."""
    from distributed.utils_test import captured_logger

    s.plugins[GPUPlacement.name].gather_log.settle = 0.2
    futs = [c.submit(np.full, 10, i, key=f"held-by-b-{i}", workers=[b.address]) for i in range(2)]
    await c.gather(futs)

    async def dead(comm, **kwargs):  # what a dead worker's peer sees: the connection goes away
        comm.abort()

    b.handlers["get_data"] = dead
    with captured_logger("distributed.scheduler", level=logging.INFO) as log:
        assert (await s.gather(keys=["held-by-b-0"]))["status"] == "error"
        await asyncio.sleep(0.5)  # past the wait: b is still there
    assert "Couldn't gather keys: {'held-by-b-0': 'memory'}" in log.getvalue()
    with captured_logger("distributed.scheduler", level=logging.INFO) as log:
        assert (await s.gather(keys=["held-by-b-1"]))["status"] == "error"
        await s.remove_worker(b.address, stimulus_id="test-b-died", close=False)
        await asyncio.sleep(0.5)
    assert "Couldn't gather" not in log.getvalue()
    assert not s.plugins[GPUPlacement.name].gather_log._held


@gen_cluster(client=True, nthreads=[("", 1)] * 2)
async def test_rebalance_switches_a_blocks_copies_in_one_step(c, s, a, b):
    """The scheduler never shows a moved block on two workers (a client building the next
    iteration's groups meanwhile would split them by an arbitrary holder); the old worker frees it;
    a block that a queued task is about to read keeps its old copy."""
    await c.register_plugin(GPUPlacement())
    plugin = s.plugins[GPUPlacement.name]
    futs = [c.submit(np.full, 1000, i, key=("blk", i), workers=[a.address]) for i in range(3)]
    await c.gather(futs)
    keys = [f.key for f in futs]
    plugin.plan_moves = lambda: [(k, [a.address], b.address) for k in keys[:2]]
    holders, stop = [], False

    async def watch():  # what the scheduler says at every step of the event loop
        while not stop:
            holders.append(max(len(s.tasks[k].who_has) for k in keys))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    await plugin._rebalance()
    stop = True
    await watcher
    assert max(holders) == 1
    assert {k: {ws.address for ws in s.tasks[k].who_has} for k in keys} == {
        keys[0]: {b.address}, keys[1]: {b.address}, keys[2]: {a.address}}
    assert plugin.moves == 2
    while keys[0] in a.data or keys[1] in a.data:  # freed on the old worker
        await asyncio.sleep(0.01)
    assert keys[2] in a.data
    assert [int(x[0]) for x in await c.gather(futs)] == [0, 1, 2]

    # a task waits on block 2 (its worker is busy): the move copies it but keeps the old copy
    hold = c.submit(slowinc, 0, delay=0.5, workers=[a.address], key="busy")
    waiter = c.submit(lambda x, _: int(x[0]), futs[2], hold, workers=[a.address], key="reader")
    while not s.tasks[keys[2]].waiters:
        await asyncio.sleep(0.01)
    plugin.plan_moves = lambda: [(keys[2], [a.address], b.address)]
    await plugin._rebalance()
    assert {ws.address for ws in s.tasks[keys[2]].who_has} == {a.address, b.address}
    assert await waiter == 2 and plugin.moves == 2


@gen_cluster(client=True, nthreads=[("", 1)] * 2)
async def test_a_check_while_a_rebalance_runs_plans_again_when_it_ends(c, s, a, b):
    """An iteration that ends while a rebalance still moves blocks (whose moves skip the blocks that
    iteration's tasks were about to read) is not lost: the rebalance plans again when it ends; with
    no check meanwhile it plans once."""
    await c.register_plugin(GPUPlacement())
    plugin = s.plugins[GPUPlacement.name]
    plugin.interval = 0.0
    plugin._families["blk"].add(("blk", 0))
    plans, release = [], asyncio.Event()

    def plan():
        plans.append(len(plans))
        return [(("blk", 0), [a.address], b.address)]

    async def held_move(dst, blocks, stimulus_id):
        await release.wait()
        return {}

    plugin.plan_moves, plugin._move_to = plan, held_move
    plugin._check_balance()
    while not plans:
        await asyncio.sleep(0.01)
    plugin._check_balance()  # an iteration ends meanwhile
    assert plugin.rebalancing and plans == [0]
    release.set()
    await plugin._rebalancing
    assert plans == [0, 1] and not plugin.rebalancing
    plugin._check_balance()
    await plugin._rebalancing
    assert plans == [0, 1, 2]


@gen_cluster(client=True, nthreads=[("", 1)] * 2)
async def test_a_rebalance_overtaken_by_a_lost_worker_is_no_error(c, s, a, b, caplog):
    """A move whose worker left (or whose scheduler closes) meanwhile fails quietly: the blocks are
    where they were, nothing to report; a move that fails with every worker there is an ERROR."""
    await c.register_plugin(GPUPlacement())
    plugin = s.plugins[GPUPlacement.name]

    async def fail(*args):
        raise OSError("ConnectionPool is closed")

    plugin._move_to = fail
    plugin.plan_moves = lambda: [(("blk", 0), [a.address], b.address)]
    with caplog.at_level(logging.DEBUG, logger="gdask"):
        await plugin._rebalance()
    assert [r.levelno for r in caplog.records if "rebalancing" in r.getMessage()] == [logging.ERROR]
    caplog.clear()
    plugin.plan_moves = lambda: [(("blk", 0), [a.address], "tcp://127.0.0.1:1")]  # a worker that left
    with caplog.at_level(logging.DEBUG, logger="gdask"):
        await plugin._rebalance()
    assert [r.levelno for r in caplog.records if "rebalancing" in r.getMessage()] == [logging.DEBUG]
    caplog.clear()

    def bad_plan():
        raise ValueError("no plan")

    plugin.plan_moves = bad_plan  # a failure before any move: an ERROR, with every worker there
    with caplog.at_level(logging.DEBUG, logger="gdask"):
        await plugin._rebalance()
    assert [r.levelno for r in caplog.records if "rebalancing" in r.getMessage()] == [logging.ERROR]


def test_worker_preload_gives_a_device_and_reports_it():
    from distributed import Scheduler, Worker

    from gdask.scheduling import JobMonitor

    async def main():
        async with Scheduler(dashboard_address=":0", preload=["gdask.scheduling"]) as s, \
                Worker(s.address, preload=["gdask.scheduling"], name=0) as w:
            from gdask.devices import context
            from gdask.window_cache import WindowStore

            assert context(w).device is w.plugins["gdask-device"].device is not None
            assert isinstance(w.plugins.get(JobMonitor.name), JobMonitor)
            assert isinstance(w.data, WindowStore) and w.data.tier is not None  # the window store, on the device
            await w.heartbeat()
            assert s.workers[w.address].metrics.get("gdask_device", {}).get("memory", 0) > 0

    asyncio.run(main())


def _sleepy(b, cost, it):
    time.sleep(b.shape[0] * cost)
    return b.sum(axis=0)


def _add(parts):
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def _counts(X, client):
    from gdask.gdataset import block_workers

    where, _ = block_workers(X, client, wait_ready=True)
    names = {a: w["name"] for a, w in scheduler_workers(client).items()}
    out: dict = {}
    for addr in where.values():
        out[names[addr]] = out.get(names[addr], 0) + 1
    return out


async def _die():
    os._exit(1)


def _restricted(keys, dask_scheduler=None):
    return [bool(dask_scheduler.tasks[k].worker_restrictions) for k in keys]


@pytest.fixture(scope="module")
def hetero():
    from distributed import Client

    # moving a sub-millisecond block task pays only when its measured durations say so, and those
    # are noise: a fetch latency of 1 s makes such moves never pay, so where derived blocks land
    # is decided by where their data is, deterministically
    with dask.config.set({"gdask.scheduling.latency": 1.0}):
        cluster = gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="256MiB",
                                        device_speeds=[1.0, 0.25], dashboard_address=":0")
    with cluster, Client(cluster) as c:
        yield c


def test_blocks_mapped_in_proportion_to_speed_and_results_match(hetero):
    data = np.random.default_rng(1).random((20_000, 3))
    X = gdask.from_array(data, block_rows=1_000).persist()
    assert _counts(X, hetero) == {0: 16, 1: 4}
    np.testing.assert_allclose(np.asarray(X.sum(axis=0).compute()), data.sum(axis=0))
    np.testing.assert_allclose((X * 2 + 1).compute(), data * 2 + 1)
    Y = (X * 2).persist()
    # derived blocks stay with their inputs
    assert _counts(Y, hetero) == {0: 16, 1: 4}
    # plain Dask work on the same cluster: untouched
    futs = hetero.map(inc, range(20))
    assert hetero.gather(futs) == list(range(1, 21))
    restr = hetero.run_on_scheduler(_restricted, [f.key for f in futs])
    assert not any(restr)


def test_worker_killed_mid_iteration_same_result(hetero):
    data = np.random.default_rng(2).random((8_000, 2))
    X = gdask.from_array(data, block_rows=1_000).persist()
    _counts(X, hetero)
    expected = data.sum(axis=0)
    fut = hetero.compute(X.reduce_blocks(_sleepy, _add, 2e-5, 0))
    time.sleep(0.1)
    victim = [a for a, w in scheduler_workers(hetero).items() if w["name"] == 0][0]
    hetero.run(_die, workers=[victim], wait=False)  # the nanny starts a fresh worker
    np.testing.assert_allclose(fut.result(timeout=90), expected)
    hetero.wait_for_workers(2, timeout=60)
    # the next iteration runs normally on the cluster that lost and regained a device
    np.testing.assert_allclose(X.reduce_blocks(_sleepy, _add, 1e-6, 1).compute(timeout=60), expected)


def _wait_rebalanced(client, timeout=30.0):
    """Wait until no rebalance is under way (one starts as an iteration's last task ends)."""
    deadline = time.monotonic() + timeout
    while client.sync(client.scheduler.gdask_placement_stats)["rebalancing"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"a rebalance of the blocks still ran after {timeout} s")
        time.sleep(0.01)


def test_blocks_rebalanced_when_measured_speeds_differ():
    from distributed import Client

    with dask.config.set({"gdask.scheduling.use-configured-speeds": False, "gdask.scheduling.interval": 0.0}):
        cluster = gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="256MiB",
                                        device_speeds=[1.0, 0.25], dashboard_address=":0")
    with cluster, Client(cluster) as c:
        data = np.ones((10_000, 2))
        X = gdask.from_array(data, block_rows=1_000).persist()
        assert _counts(X, c) == {0: 5, 1: 5}  # nothing measured yet: equal split
        for it in range(6):
            assert X.reduce_blocks(_sleepy, _add, 2e-5, it).compute()[0] == 10_000
            _wait_rebalanced(c)  # moves run between iterations
        counts = _counts(X, c)
        stats = c.sync(c.scheduler.gdask_placement_stats)
    assert stats["moves"] > 0
    assert counts[0] >= 7, counts  # 8:2 is proportional to 1 : 0.25
    speeds = {w["speed_measured"] for w in stats["workers"].values()}
    assert min(speeds) < 0.5



def _holders(keys, dask_scheduler=None):
    return [sorted(ws.address for ws in dask_scheduler.tasks[k].who_has) for k in keys]


@pytest.mark.parametrize("shared", [True, False])
def test_a_fresh_clusters_first_pass_runs_where_the_new_blocks_are(shared):
    """Nothing measured yet (a script's first fit on a cluster it just started): the blocks' sizes come
    from the data their tasks carry (in the graph, or a file in shared memory), so the first pass over
    blocks still being made runs where they are made, not on an idle device that would fetch them."""
    from distributed import Client

    data = np.random.default_rng(3).random((100_000, 24))  # 4 blocks of 4.8 MB: over the shared-memory minimum
    with dask.config.set({"gdask.gdataset.same-host-transfer": shared, "gdask.scheduling.rebalance": False}):
        cluster = gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="256MiB",
                                        dashboard_address=":0")
        with cluster, Client(cluster) as c:
            X = gdask.from_array(data, block_rows=25_000).persist()
            np.testing.assert_allclose(np.asarray(X.sum(axis=0).compute()), data.sum(axis=0))
            holders = c.run_on_scheduler(_holders, list(X.__dask_keys__()))
    assert all(len(h) == 1 for h in holders), holders  # no block was copied to another device
    assert len({h[0] for h in holders}) == 2  # and they are shared out


def _skew_measured_speeds(fast, dask_scheduler=None):
    """Feed the placement model durations that make worker ``fast`` look 3x faster than the other."""
    plugin = dask_scheduler.plugins["gdask-placement"]
    for _ in range(20):
        for addr in plugin.placer.devices:
            plugin.model.observe("skew", 1e6, addr, 0.02 if addr == fast else 0.06)
    return {a: plugin.model.speed(a) for a in plugin.placer.devices}


@pytest.mark.parametrize("configured", [True, False])
def test_emulated_devices_share_blocks_by_their_configured_speeds(configured):
    """Equal emulated devices measure each other's load (they share the cores): a new dataset's blocks
    go by their configured speeds, not by measurements that say one is 3x faster; without
    configured speeds, by the measurements."""
    from distributed import Client

    with dask.config.set({"gdask.scheduling.use-configured-speeds": configured,
                          "gdask.scheduling.rebalance": False}):
        cluster = gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="256MiB",
                                        dashboard_address=":0")
    with cluster, Client(cluster) as c:
        fast = sorted(scheduler_workers(c))[0]
        speeds = c.run_on_scheduler(_skew_measured_speeds, fast)
        assert speeds[fast] > 2.5 * min(speeds.values())
        X = gdask.from_array(np.ones((8_000, 2)), block_rows=1_000).persist()
        counts = _counts(X, c)
    if configured:
        assert sorted(counts.values()) == [4, 4], counts
    else:
        assert sorted(counts.values()) == [2, 6], counts


def _gather_record(states):
    return logging.LogRecord("distributed.scheduler", logging.ERROR, __file__, 1, "Couldn't gather keys: %s",
                             (states,), None)


def test_a_gather_racing_a_recomputation_is_not_an_error():
    from gdask.scheduling._scheduler import GatherDuringRecompute

    f = GatherDuringRecompute()
    log = logging.getLogger("distributed.scheduler")
    old = log.level
    try:
        log.setLevel(logging.INFO)
        # the worker holding the key left and the scheduler computes it again: the client asks again
        for states in ({"x-1": "waiting"}, {"x-1": "processing", "x-2": "no-worker"}, {"x-1": "queued"}):
            rec = _gather_record(states)
            assert f.filter(rec) is False and rec.levelno == logging.DEBUG
        log.setLevel(logging.DEBUG)  # asked for: shown, as DEBUG
        rec = _gather_record({"x-1": "waiting"})
        assert f.filter(rec) is True and rec.levelname == "DEBUG"
        log.setLevel(logging.INFO)
        # anything else stays an error: a key in memory whose worker did not answer, lost for good, ...
        for states in ({"x-1": "memory"}, {"x-1": "waiting", "x-2": "forgotten"}, {"x-1": "erred"}, {}):
            rec = _gather_record(states)
            assert f.filter(rec) is True and rec.levelno == logging.ERROR
        other = logging.LogRecord("distributed.scheduler", logging.ERROR, __file__, 1, "something else %s",
                                  ({"x": "waiting"},), None)
        assert f.filter(other) is True and other.levelno == logging.ERROR
    finally:
        log.setLevel(old)




class _Holder:
    def __init__(self, address):
        self.address = address


class _Task:
    def __init__(self, state, *holders):
        self.state, self.who_has = state, {_Holder(a) for a in holders}


class _Scheduler:
    def __init__(self, tasks, workers):
        self.tasks, self.workers = tasks, dict.fromkeys(workers)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelname, record.getMessage()))


def _log_gathers(f, settle_for, *states_list, level=logging.INFO):
    """Log "Couldn't gather keys" records through filter ``f`` on an event loop (as the scheduler
    does), run ``settle_for(f)`` inside the loop, then: what reached the logger's handlers."""
    import asyncio

    log = logging.getLogger("distributed.scheduler")
    handler, old = _Records(), log.level
    log.addHandler(handler)
    log.addFilter(f)
    log.setLevel(level)

    async def main():
        for states in states_list:
            log.error("Couldn't gather keys: %s", states)
        await settle_for(f)

    loop = asyncio.new_event_loop()  # not asyncio.run: it would leave the thread without an event loop
    try:
        loop.run_until_complete(main())
        return handler.records
    finally:
        loop.close()
        log.removeFilter(f)
        log.removeHandler(handler)
        log.setLevel(old)


def test_a_gather_of_keys_whose_worker_died_is_not_an_error_once_it_is_known_gone():
    import asyncio

    from gdask.scheduling._scheduler import GatherDuringRecompute

    tasks = {"x-1": _Task("memory", "tcp://a"), "x-2": _Task("memory", "tcp://b"), "x-3": _Task("waiting")}

    async def a_leaves(f):  # the scheduler hears of the dead worker after the failed gather
        await asyncio.sleep(0.05)
        f.worker_left("tcp://a")
        await asyncio.sleep(0.01)

    f = GatherDuringRecompute(_Scheduler(tasks, ["tcp://a", "tcp://b"]), settle=30)
    assert _log_gathers(f, a_leaves, {"x-1": "memory", "x-3": "waiting"}) == []  # demoted at once, not 30 s on
    assert not f._held
    f = GatherDuringRecompute(_Scheduler(tasks, ["tcp://a", "tcp://b"]), settle=30)
    shown = _log_gathers(f, a_leaves, {"x-1": "memory"}, level=logging.DEBUG)
    assert [lv for lv, _ in shown] == ["DEBUG"]  # asked for: shown, as DEBUG

    async def settle(f):
        await asyncio.sleep(0.3)

    # the holder is still there when the wait ends: the ERROR it was, once
    f = GatherDuringRecompute(_Scheduler(tasks, ["tcp://a", "tcp://b"]), settle=0.1)
    shown = _log_gathers(f, settle, {"x-2": "memory"})
    assert shown == [("ERROR", "Couldn't gather keys: {'x-2': 'memory'}")]
    # gone from the scheduler's workers by then (no remove_worker seen): DEBUG
    f = GatherDuringRecompute(_Scheduler(tasks, ["tcp://b"]), settle=0.1)
    assert _log_gathers(f, settle, {"x-1": "memory"}) == []
    # one of two holders left: still an error
    tasks2 = {"y": _Task("memory", "tcp://a", "tcp://b")}
    f = GatherDuringRecompute(_Scheduler(tasks2, ["tcp://a", "tcp://b"]), settle=0.1)

    async def a_leaves_then_wait(f):
        f.worker_left("tcp://a")
        await asyncio.sleep(0.3)

    assert [lv for lv, _ in _log_gathers(f, a_leaves_then_wait, {"y": "memory"})] == ["ERROR"]
    # not this scheduler's keys, a lost key, no scheduler: ERROR at once, nothing held
    for f, states in ((GatherDuringRecompute(_Scheduler({}, []), settle=30), {"z": "memory"}),
                      (GatherDuringRecompute(_Scheduler(tasks, ["tcp://a"]), settle=30), {"x-1": "memory",
                                                                                         "x-9": "forgotten"}),
                      (GatherDuringRecompute(None, settle=30), {"x-1": "memory"})):
        assert [lv for lv, _ in _log_gathers(f, settle, states)] == ["ERROR"]
        assert not f._held

    # the scheduler closes while a record is held: it is settled then, not dropped
    async def close_now(f):
        f.close()

    f = GatherDuringRecompute(_Scheduler(tasks, ["tcp://a", "tcp://b"]), settle=30)
    assert [lv for lv, _ in _log_gathers(f, close_now, {"x-2": "memory"})] == ["ERROR"]
    assert not f._held
