"""The stream executor: K-limited concurrency, live K changes, feedback, secede, a real worker."""

import threading
import time

import dask
import pytest

from gdask._devices import DeviceSpec
from gdask.scheduling import DeviceSetup, StreamController, StreamThreadPoolExecutor, stream_settings

TIMEOUT = 10


def wait_for(cond, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.002)


class Gate:
    """Tasks that block until released, counting how many run at once."""

    def __init__(self):
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def task(self, i):
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            assert self.release.wait(TIMEOUT)
            return i
        finally:
            with self.lock:
                self.now -= 1


@pytest.fixture
def executor():
    ex = StreamThreadPoolExecutor(4, 2)
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


def test_concurrency_is_limited_to_k(executor):
    g = Gate()
    futs = [executor.submit(g.task, i) for i in range(6)]
    wait_for(lambda: g.now == 2)
    time.sleep(0.05)  # give a third task every chance to start (it must not)
    assert (g.now, executor.running, executor.queued) == (2, 2, 4)
    g.release.set()
    assert [f.result(TIMEOUT) for f in futs] == list(range(6))
    assert g.peak == 2 and executor.running == 0 and executor.completed == 6


def test_k_grows_and_shrinks_while_tasks_wait(executor):
    g = Gate()
    executor.set_streams(1)
    futs = [executor.submit(g.task, i) for i in range(8)]
    wait_for(lambda: g.now == 1)
    executor.set_streams(3)  # queued tasks start at once
    wait_for(lambda: g.now == 3)
    assert executor.queued == 5
    executor.set_streams(1)  # running tasks finish; no new one starts until below K
    g.release.set()
    assert [f.result(TIMEOUT) for f in futs] == list(range(8))
    g2 = Gate()
    g2.release.set()
    futs = [executor.submit(g2.task, i) for i in range(10)]
    assert [f.result(TIMEOUT) for f in futs] == list(range(10))
    assert g2.peak == 1
    with pytest.raises(ValueError, match=r"streams must be an integer in \[1, 4\]"):
        executor.set_streams(5)


def test_no_task_lost_under_random_k_changes():
    import random

    rng = random.Random(0)
    ex = StreamThreadPoolExecutor(6, 3, round_tasks=5)
    futs = [ex.submit(lambda i: (time.sleep(0.001 * (i % 3)), i)[1], i) for i in range(300)]
    changes = 0
    while not all(f.done() for f in futs):  # K changes all along the run
        ex.set_streams(rng.randint(1, 6))
        changes += 1
        time.sleep(0.002)
    assert changes > 10
    assert [f.result(TIMEOUT) for f in futs] == list(range(300))
    assert ex.completed == 300 and ex.running == 0 and ex.queued == 0 and ex._max_running <= 6
    rounds = ex.rounds
    ex.set_streams(2)  # a fresh round: 10 tasks are exactly two rounds, measured with a fixed K
    assert [f.result(TIMEOUT) for f in [ex.submit(abs, -i) for i in range(10)]] == list(range(10))
    wait_for(lambda: ex.rounds == rounds + 2)
    assert ex.trace[-1][0] == 2 and ex.throughput > 0 and not ex.adaptive
    ex.shutdown()


def test_exceptions_propagate_and_the_executor_keeps_working(executor):
    def boom():
        raise ZeroDivisionError("kernel failed")

    f = executor.submit(boom)
    with pytest.raises(ZeroDivisionError, match="kernel failed"):
        f.result(TIMEOUT)
    assert executor.submit(lambda: 42).result(TIMEOUT) == 42
    deadline = time.monotonic() + TIMEOUT  # a future resolves just before its slot's counters update
    while not (executor.completed == 2 and executor.running == 0) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert executor.failed == 1 and executor.completed == 2 and executor.running == 0


def test_shutdown_runs_queued_tasks_then_stops_threads():
    ex = StreamThreadPoolExecutor(3, 2, thread_name_prefix="test-shutdown")
    futs = [ex.submit(time.sleep, 0.01) for _ in range(7)]
    ex.shutdown(wait=True)
    assert all(f.done() and f.exception() is None for f in futs)
    assert not [t for t in threading.enumerate() if t.name.startswith("test-shutdown")]
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(print)


def test_shutdown_can_cancel_queued_tasks():
    g = Gate()
    ex = StreamThreadPoolExecutor(2, 1)
    futs = [ex.submit(g.task, i) for i in range(4)]
    wait_for(lambda: g.now == 1)
    threading.Timer(0.05, g.release.set).start()
    ex.shutdown(wait=True, cancel_futures=True)
    assert futs[0].result() == 0 and all(f.cancelled() for f in futs[1:])
    assert ex.completed == 1


def test_feedback_rounds_drive_k_to_the_best_count():
    """Deterministic device model on a fake clock: every task advances the clock by the time one
    task costs at the current stream count, so a round's measured throughput is the model's."""

    def model(k):  # tasks/s: rises to 3 streams, then contention
        return 100.0 * min(k, 3) - 8.0 * max(0, k - 3)

    clock = [0.0]
    lock = threading.Lock()
    ex = StreamThreadPoolExecutor(6, 1, adaptive=True, round_tasks=12, clock=lambda: clock[0])

    def task():
        with lock:
            clock[0] += 1.0 / model(ex.streams)

    ks = []
    for r in range(14):  # one round at a time
        futs = [ex.submit(task) for _ in range(12)]
        for f in futs:
            f.result(TIMEOUT)
        wait_for(lambda: ex.rounds == r + 1)  # the round is booked and K applied
        ks.append(ex.streams)
    ex.shutdown()
    assert ex.rounds == 14 and len(ex.trace) == 14
    assert [k for k, _ in list(ex.trace)[:4]] == [1, 2, 3, 4]  # the climb
    for k, thr in ex.trace:
        assert thr == pytest.approx(model(k), rel=1e-9)
    assert ex.controller.home == 3 and all(1 <= k <= 6 for k in ks)
    assert ex.metrics() == {
        "streams": ex.streams, "max_streams": 6, "adaptive": True, "throughput": ex.throughput,
        "rounds": 14, "running": 0, "queued": 0, "completed": 168,
    }


def test_idle_time_is_not_counted_against_k():
    clock = [0.0]
    ex = StreamThreadPoolExecutor(2, 1, round_tasks=4, clock=lambda: clock[0])

    def task():
        clock[0] += 0.25

    for i in range(4):
        ex.submit(task).result(TIMEOUT)
        wait_for(lambda: ex.completed == i + 1)  # the executor has booked it
        clock[0] += 100.0  # idle between tasks
    ex.shutdown()
    assert list(ex.trace) == [(1, pytest.approx(4.0))]


def test_adapt_validates_its_controller():
    ex = StreamThreadPoolExecutor(4)
    with pytest.raises(ValueError, match="max_streams"):
        ex.adapt(StreamController(3))
    c = ex.adapt(StreamController(4, start=2))
    assert ex.adaptive and ex.streams == 2 and ex.controller is c
    ex.set_streams(1)
    assert not ex.adaptive
    ex.shutdown()
    with pytest.raises(ValueError, match="max_streams"):
        StreamThreadPoolExecutor(0)


def test_secede_frees_the_slot_and_rejoin_takes_one_back():
    from distributed.threadpoolexecutor import rejoin, secede

    ex = StreamThreadPoolExecutor(2, 1)
    other_ran = threading.Event()

    def long_task():
        secede()  # K=1: the slot must go to the next task while this one waits
        assert other_ran.wait(TIMEOUT)
        rejoin()
        return "long"

    f1 = ex.submit(long_task)
    f2 = ex.submit(lambda: other_ran.set() or "short")
    assert f2.result(TIMEOUT) == "short" and f1.result(TIMEOUT) == "long"
    assert ex.submit(lambda: 1).result(TIMEOUT) == 1
    wait_for(lambda: ex.running == 0)
    ex.shutdown()


def test_stream_settings_resolution():
    emu = DeviceSpec(index=0, backend="emulated", memory=2**20, streams=2)
    gpu = DeviceSpec(index=0, backend="cuda", memory=2**20, streams=1)
    s = stream_settings(emu, max_streams=8)  # "auto": emulated devices keep a fixed count
    assert (s.executor, s.streams, s.max_streams, s.adaptive, s.nthreads) == (True, 2, 2, False, 2)
    s = stream_settings(gpu, max_streams=8)
    assert (s.adaptive, s.max_streams, s.nthreads) == (True, 8, 8)
    assert stream_settings(emu, adaptive_streams=True, max_streams=1).max_streams == 2
    assert stream_settings(gpu, stream_executor=False).nthreads == 1
    with dask.config.set({"gdask.device.adaptive-streams": "true", "gdask.device.max-streams": 3}):
        assert stream_settings(emu).nthreads == 3
    for bad in ({"max_streams": 0}, {"adaptive_streams": "sometimes"}, {"stream_executor": 2}):
        with pytest.raises(ValueError):
            stream_settings(emu, **bad)
    setup = DeviceSetup({0: emu, 1: gpu}, max_streams=6)
    assert setup.worker_threads() == 6


def _report():
    from distributed import get_worker

    w = get_worker()  # the worker context reaches tasks run on the stream executor
    return {"executor": type(w.executor).__name__, "same_as_gpu": w.executors["gpu"] is w.executor,
            "thread": threading.current_thread().name, "streams": w.executor.streams,
            "max_streams": w.executor.max_streams, "adaptive": w.executor.adaptive}


def _fail(x):
    raise KeyError(f"no block {x}")


def test_device_worker_runs_tasks_on_the_stream_executor():
    from distributed import Client, worker_client

    import gdask

    def fan_out(n):
        with worker_client() as c:  # secedes from, then rejoins, the stream executor
            return sum(c.gather(c.map(lambda i: i * i, range(n))))

    cfg = {"gdask.device.adaptive-streams": True, "gdask.device.max-streams": 2,
           "gdask.device.stream-round-tasks": 8}
    with dask.config.set(cfg), gdask.LocalGPUCluster(
        n_devices=1, backend="emulated", streams=2, device_memory="64MiB", dashboard_address=":0"
    ) as cluster, Client(cluster) as client:
        info = client.submit(_report, pure=False).result(TIMEOUT)
        assert info["executor"] == "StreamThreadPoolExecutor" and info["same_as_gpu"]
        assert "gdask-stream" in info["thread"]
        assert (info["max_streams"], info["adaptive"]) == (2, True)
        assert sum(client.gather(client.map(lambda i: i + 1, range(40)))) == sum(range(1, 41))
        with pytest.raises(KeyError, match="no block 7"):
            client.submit(_fail, 7).result(TIMEOUT)
        assert client.submit(fan_out, 10).result(TIMEOUT) == sum(i * i for i in range(10))
        m = client.run(lambda dask_worker: dask_worker.metrics["gdask_streams"](dask_worker))
        (m,) = m.values()
        assert m["rounds"] >= 4 and 1 <= m["streams"] <= 2 and m["max_streams"] == 2
        (dev,) = client.run(gdask.scheduling.device_info).values()
        assert dev["streams"] == m["streams"] and dev["adaptive_streams"] is True

        def scheduler_metrics(dask_scheduler):
            return [ws.metrics.get("gdask_streams") for ws in dask_scheduler.workers.values()]

        wait_for(lambda: (client.run_on_scheduler(scheduler_metrics)[0] or {}).get("rounds", 0) >= 4)


class FakeCudaDevice:
    """Stands in for CudaDevice (no GPU here): one stream per thread, calls recorded."""

    backend = "cuda"

    def __init__(self):
        self.local = threading.local()
        self.events = []
        self.lock = threading.Lock()
        outer = self

        class Ctx:
            def __init__(self, name):
                self.name = name

            def __enter__(self):
                with outer.lock:
                    outer.events.append(("enter", self.name, threading.get_ident()))

            def __exit__(self, *exc):
                with outer.lock:
                    outer.events.append(("exit", self.name, threading.get_ident()))

            def synchronize(self):
                with outer.lock:
                    outer.events.append(("sync", self.name, threading.get_ident()))

        self.device = Ctx("device")
        self.make = Ctx

    def stream(self):
        if not hasattr(self.local, "stream"):
            self.local.stream = self.make(f"stream-{threading.get_ident()}")
        return self.local.stream


def test_cuda_slots_run_each_task_on_their_own_stream_and_synchronize_it():
    from gdask.scheduling._executor import device_stream_context

    assert device_stream_context(object()) is None  # emulated: the thread is the stream
    dev = FakeCudaDevice()
    ex = StreamThreadPoolExecutor(2, 2, slot_context=device_stream_context(dev))
    g = Gate()

    def task(i):
        current = [e for e in dev.events if e[2] == threading.get_ident()]
        assert current[-2:] == [("enter", "device", threading.get_ident()),
                                ("enter", f"stream-{threading.get_ident()}", threading.get_ident())]
        return g.task(i)

    futs = [ex.submit(task, i) for i in range(4)]
    wait_for(lambda: g.now == 2)
    g.release.set()
    assert [f.result(TIMEOUT) for f in futs] == list(range(4))
    ex.shutdown()
    streams = {name for kind, name, _ in dev.events if name.startswith("stream")}
    assert len(streams) == 2  # two slots, two streams, both used
    syncs = [e for e in dev.events if e[0] == "sync"]
    assert len(syncs) == 4 and all(name == f"stream-{tid}" for _, name, tid in syncs)


def test_install_replaces_the_default_executor_and_caps_at_nthreads(caplog):
    from types import SimpleNamespace

    from distributed.threadpoolexecutor import ThreadPoolExecutor

    from gdask.devices import EmulatedDevice
    from gdask.scheduling import StreamSettings, install_stream_executor

    old = ThreadPoolExecutor(2)
    worker = SimpleNamespace(name="w0", state=SimpleNamespace(nthreads=3), metrics={},
                             executors={"default": old})
    dev = EmulatedDevice(DeviceSpec(index=0, backend="emulated", memory=2**20))
    settings = StreamSettings(executor=True, streams=1, max_streams=8, adaptive=True)
    with caplog.at_level("WARNING", logger="gdask"):
        ex = install_stream_executor(worker, dev, settings)
    assert "nthreads=3 < max_streams=8" in caplog.text
    assert worker.executors["default"] is ex and worker.executors["gpu"] is ex and old._shutdown
    assert (ex.max_streams, ex.streams, ex.adaptive) == (3, 1, True)
    assert worker.metrics == {}  # metrics are the device plugin's, registered once at its setup
    ex.shutdown()
