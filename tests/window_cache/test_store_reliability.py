"""WindowStore under memory pressure and concurrency (issue #17, items 3 and 4), without a cluster:
one load per block however many readers wait, room made from blocks no task holds, transfers
served from the host, a clear error for a task whose inputs cannot all fit, job isolation, and
allocations that wait (bounded) for memory that running tasks hold. Running tasks and transfers are
told to the store as gdask's worker hooks tell it (pins, reader marks: ``gdask.window_cache._pins``)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import dask
import numpy as np
import pytest

from gdask import DeviceMemoryError
from gdask._devices import DeviceSpec, EmulatedDevice
from gdask.window_cache import State, WindowCacheMemoryError, WindowStore
from gdask.window_cache._pins import reading_for_transfer, reading_inputs_of

BLOCK = (1024, 64)  # float32: 256 KiB
NB = 1024 * 64 * 4


def device(blocks=8):
    return EmulatedDevice(DeviceSpec(index=0, backend="emulated", memory=blocks * NB))


def fill(store, dev, n, job=None):
    for i in range(n):
        store[("x", i)] = dev.asarray(np.full(BLOCK, i, np.float32))


def on_host(store, n):
    return [("x", i) for i in range(n) if store.state(("x", i)) is State.HOST]


def test_a_block_is_loaded_once_while_its_first_reader_waits_for_memory(monkeypatch):
    # the race behind "'NoneType' object has no attribute 'set'": a demand load released the lock while
    # it waited for memory, and a second load of the same block started meanwhile
    dev = device(blocks=4)
    s = WindowStore("lru", device=dev, reserve=0)
    fill(s, dev, 6)
    key = on_host(s, 6)[0]
    on_device = [("x", i) for i in range(6) if s.state(("x", i)) is State.DEVICE]
    s.task_started("running", on_device)  # blocks a running task holds: evicting them frees nothing now
    held = [s[k] for k in on_device]
    real_alloc, real_sleep = s.tier.alloc, time.sleep
    fails = [2]
    second: list = []

    def alloc(host):
        if fails[0]:
            fails[0] -= 1
            raise DeviceMemoryError("held by running tasks")
        return real_alloc(host)

    def sleep(t):  # the first reader waits for memory, without the lock: a second reader comes now
        if not second:
            th = threading.Thread(target=lambda: second.append(s[key]), daemon=True)
            second.append(th)
            th.start()
            real_sleep(0.1)
        real_sleep(t)

    monkeypatch.setattr(s.tier, "alloc", alloc)
    monkeypatch.setattr(time, "sleep", sleep)
    h2d = s.counters["bytes_h2d"]
    first = s[key]
    monkeypatch.undo()
    second[0].join(5)
    assert len(second) == 2 and second[1] is first  # the second reader waited for the first load
    assert first[0, 0] == key[1] and s.counters["bytes_h2d"] - h2d == NB  # one copy
    del held, first
    s.close()


def test_concurrent_readers_under_pressure_never_race():
    dev = device(blocks=3)
    s = WindowStore("window", device=dev, reserve=0)
    n = 10
    fill(s, dev, n)
    errors = []

    def reader(offset):
        try:
            for _ in range(4):
                for i in range(n):
                    v = s[("x", (i + offset) % n)]
                    assert v[0, 0] == (i + offset) % n
                    del v
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=reader, args=(o,)) for o in (0, 3, 5, 5)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    assert dev.pool.peak <= dev.pool.budget
    s.close()


def test_room_for_an_allocation_comes_from_blocks_no_task_reads():
    dev = device(blocks=4)
    s = WindowStore("lru", device=dev, reserve=0)
    fill(s, dev, 4)
    s.task_started("running", [("x", 0)])
    busy = s[("x", 0)]  # a running task reads the least recently used block
    s[("x", 1)], s[("x", 2)]  # noqa: B018 - read: x0 is now the least recently used of the device's blocks
    evictions = s.counters["evictions"]
    # the window keeps one block free: two blocks' worth need one block moved off
    out = dev.with_room(2 * NB, lambda: dev.pool.empty((2048, 64), np.float32), "a test allocation")
    assert out.nbytes == 2 * NB
    assert s.state(("x", 0)) is State.DEVICE  # evicting it would have freed nothing
    assert s.counters["evictions"] > evictions
    del busy, out
    s.close()


def test_an_allocation_waits_for_memory_a_running_task_releases():
    dev = device(blocks=2)
    s = WindowStore("lru", device=dev, reserve=0)
    task = [dev.asarray(np.ones(BLOCK, np.float32)), dev.asarray(np.ones(BLOCK, np.float32))]  # not in the store
    threading.Timer(0.2, task.clear).start()  # the task ends
    out = dev.with_room(NB, lambda: dev.pool.empty(BLOCK, np.float32))
    assert out.nbytes == NB
    del out
    s.close()


def test_an_allocation_that_never_fits_names_the_sizes():
    dev = device(blocks=2)
    s = WindowStore("lru", device=dev, reserve=0)
    s[("x", 0)] = dev.asarray(np.ones(BLOCK, np.float32))
    s.task_started("running", [("x", 0)])
    busy = s[("x", 0)]
    other = dev.asarray(np.ones(BLOCK, np.float32))  # neither can be moved off
    with dask.config.set({"gdask.timeouts.memory": 0.2}):
        with pytest.raises(DeviceMemoryError, match=r"a test allocation needing 256.00 kiB.*after 0.2 s.*window cache "
                                                    r"holds 256.00 kiB in 1 blocks \(256.00 kiB of them read"):
            dev.with_room(NB, lambda: dev.pool.empty(BLOCK, np.float32), "a test allocation")
    del busy, other
    s.close()


def get_data(store, keys):  # as gdask's transfer handler reads: a transfer to another worker
    with reading_for_transfer():
        return {k: store[k] for k in keys}


def execute(store, ts):  # as gdask's task wrapper reads a task's inputs: pinned, then read
    store.task_started(ts.key, [d.key for d in ts.dependencies])
    try:
        with reading_inputs_of(ts.key):
            return {d.key: store[d.key] for d in ts.dependencies}
    finally:
        store.task_finished(ts.key)


def test_transfers_are_served_from_the_host_copy():
    dev = device(blocks=4)
    s = WindowStore("lru", device=dev, reserve=0)
    fill(s, dev, 6)
    key = on_host(s, 6)[0]
    got = get_data(s, [key])[key]
    assert got[0, 0] == key[1] and s.state(key) is State.HOST and s.counters["host_reads"] == 1
    s.close()


def test_a_task_whose_inputs_cannot_all_fit_gets_the_sizes():
    dev = device(blocks=4)
    s = WindowStore("lru", device=dev, reserve=0)
    fill(s, dev, 6)
    ts = SimpleNamespace(key="sum-of-everything", dependencies=[SimpleNamespace(key=("x", i)) for i in range(6)])
    with pytest.raises(WindowCacheMemoryError, match=r"task 'sum-of-everything' reads 6 device blocks of "
                                                     r"1.50 MiB in all .* more than the device's 1.00 MiB"):
        execute(s, ts)
    ts = SimpleNamespace(key="two", dependencies=[SimpleNamespace(key=("x", i)) for i in (0, 5)])
    assert set(execute(s, ts)) == {("x", 0), ("x", 5)}
    s.close()


def test_a_job_over_its_request_spills_only_its_own_blocks():
    dev = device(blocks=8)
    s = WindowStore("lru", device=dev, reserve=0)
    s.job_of = lambda key: key[0]
    s.set_job_limit("B", 4 * NB)
    s.set_job_limit("A", 2 * NB)
    for i in range(4):
        s[("B", i)] = dev.asarray(np.full(BLOCK, i, np.float32))
    for i in range(8):  # A asks for 2 blocks and stores 8: on a device with room for 4 more
        s[("A", i)] = dev.asarray(np.full(BLOCK, i, np.float32))
    assert s.job_usage("B") == 4 * NB and all(s.state(("B", i)) is State.DEVICE for i in range(4))
    assert s.job_usage("A") <= 2 * NB and s.job_spilled["A"] >= 6 * NB and "B" not in s.job_spilled
    # A's reads bring its blocks back within its request, never at B's expense
    for i in range(8):
        assert s[("A", i)][0, 0] == i
    assert s.job_usage("B") == 4 * NB and s.job_usage("A") <= 2 * NB
    # another job's (or no job's) allocation pressure does not evict B while B is within its request
    assert dev.reclaim(8 * NB) <= 4 * NB
    assert s.job_usage("B") == 4 * NB
    s.close()


def test_misaligned_arrays_are_stored_aligned():
    # data received from another worker is deserialized at any offset of the message: NumPy computes on
    # misaligned float64 without BLAS, so a block's results depended on where it had been computed
    x = np.asfortranarray(np.random.default_rng(0).random((4096, 8)))
    buf = np.empty(x.nbytes + 16, np.uint8)
    start = 3 + (-buf.ctypes.data) % 8  # 3 bytes past an 8-byte boundary
    y = buf[start:start + x.nbytes].view(x.dtype).reshape(x.shape[::-1]).T
    y[...] = x
    assert not y.flags.aligned and y.flags.f_contiguous
    s = WindowStore("lru", device=device(), reserve=0)
    s["received"] = y
    got = s["received"]
    assert got.flags.aligned and got.flags.f_contiguous
    np.testing.assert_array_equal(got, x)
    w = np.ones(8)
    assert (got @ w).tobytes() == (x @ w).tobytes()
    s.close()
