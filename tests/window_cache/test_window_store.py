"""WindowStore on an emulated device, without a cluster."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from gdask._devices import DeviceSpec, EmulatedDevice
from gdask.window_cache import State, WindowCacheMemoryError, WindowStore, make_room

BLOCK = (1024, 64)  # float32: 256 KiB
NB = 1024 * 64 * 4


def device(blocks=8, bandwidth=None):
    return EmulatedDevice(DeviceSpec(index=0, backend="emulated", memory=blocks * NB, bandwidth=bandwidth))


def fill(store, dev, n):
    for i in range(n):
        store[("x", i)] = dev.asarray(np.full(BLOCK, i, np.float32))


def read_passes(store, n, passes, order=None, work=0.0):
    for p in range(passes):
        keys = order(p) if order else range(n)
        for i in keys:
            v = store[("x", i)]
            assert v[0, 0] == i and v.flags.f_contiguous
            if work:
                time.sleep(work)
            del v


def test_plain_values_and_managed_blocks():
    dev = device()
    s = WindowStore(device=dev, reserve=0)
    s["small"] = {"a": 1}
    s["host"] = np.ones(10)
    s[("x", 0)] = dev.asarray(np.ones(BLOCK, np.float32))
    assert s.state(("x", 0)) is State.DEVICE
    assert s.state("small") is None and s.state("host") is None
    assert len(s) == 3 and set(s) == {"small", "host", ("x", 0)}
    assert s["small"] == {"a": 1}
    del s["small"], s[("x", 0)]
    assert "small" not in s and ("x", 0) not in s and len(s) == 1
    assert dev.pool.used == 0


def test_without_a_device_everything_is_plain():
    s = WindowStore()
    s["k"] = np.ones(100)
    assert s.tier is None and s.state("k") is None and s.metrics()["plain_keys"] == 1


def test_data_larger_than_device_spills_and_never_overflows():
    dev = device(blocks=8)
    s = WindowStore("window", device=dev, reserve=0)
    fill(s, dev, 16)
    m = s.metrics()
    assert m["device_blocks"] == 7 and m["host_blocks"] == 9  # one block's room stays free
    assert dev.pool.peak <= dev.pool.budget
    assert m["bytes_d2h"] == 9 * NB
    read_passes(s, 16, 3)
    assert dev.pool.peak <= dev.pool.budget


def test_window_hit_rate_near_capacity_lru_near_zero():
    n, passes = 16, 6
    res = {}
    for pol in ("window", "lru"):
        dev = device(blocks=9)
        s = WindowStore(pol, device=dev, reserve=0, prefetch=2)
        fill(s, dev, n)
        s.reset_stats()
        read_passes(s, n, passes)
        res[pol] = s.metrics()
        s.close()
    w, lru = res["window"], res["lru"]
    assert w["reads"] == n * passes
    assert w["hit_rate"] >= 0.35  # capacity 8 of 16 blocks, minus the prefetch slots
    assert w["hits"] + w["misses"] + w["prefetch_hits"] == w["reads"]
    assert w["bytes_h2d"] <= 0.7 * n * passes * NB
    assert lru["hit_rate"] < 0.1
    assert lru["bytes_h2d"] >= 0.9 * n * passes * NB
    assert lru["prefetches"] == 0


def test_alternating_scans_with_hints():
    n = 16
    dev = device(blocks=9)
    s = WindowStore("window", device=dev, reserve=0, prefetch=2)
    fill(s, dev, n)
    s.reset_stats()
    for p in range(6):
        order = list(range(n)) if p % 2 == 0 else list(range(n))[::-1]
        s.hint([("x", i) for i in order])
        read_passes(s, n, 1, order=lambda _: order)
    m = s.metrics()
    assert m["hit_rate"] >= 0.4
    assert m["misses"] <= 2  # every other copy was a prefetch


def test_prefetch_overlaps_compute():
    """With copies as long as the compute, prefetching hides them: little stall time."""
    n = 12
    dev = device(blocks=7, bandwidth=int(NB / 0.004))  # 4 ms per block copy
    s = WindowStore("window", device=dev, reserve=0, prefetch=2)
    fill(s, dev, n)
    read_passes(s, n, 1)  # learn the order
    s.reset_stats()
    read_passes(s, n, 3, work=0.006)
    m = s.metrics()
    assert m["prefetch_hits"] > 0
    copies = m["misses"] + m["prefetch_hits"]
    assert m["stall_time"] < 0.5 * copies * 0.004, m  # well under the serial copy time

    lru = WindowStore("lru", device=device(blocks=7, bandwidth=int(NB / 0.004)), reserve=0)
    fill(lru, lru.tier.device, n)
    lru.reset_stats()
    read_passes(lru, n, 3, work=0.006)
    assert lru.metrics()["stall_time"] > 2 * m["stall_time"]
    s.close()


def test_exclusive_tiers_copy_back_on_every_eviction():
    n = 12
    dev = device(blocks=7)
    s = WindowStore("lru", device=dev, reserve=0, host_copy=False)
    fill(s, dev, n)
    s.reset_stats()
    read_passes(s, n, 2)
    m = s.metrics()
    assert m["bytes_d2h"] >= 0.8 * m["bytes_h2d"] > 0  # dask-cuda-style: every miss evicts a copy back
    assert m["host_bytes"] == m["host_blocks"] * NB


def test_block_that_can_never_fit_names_sizes():
    dev = device(blocks=4)
    s = WindowStore(device=dev, reserve=0.5)
    big = dev.asarray(np.zeros((1024, 64 * 3), np.float32))  # 768 KiB
    s["big"] = big
    del big
    assert s.state("big") is State.HOST
    with pytest.raises(WindowCacheMemoryError, match=r"768.00 kiB can never fit.*1.00 MiB.*512.00 kiB"):
        s["big"]


def test_full_device_serves_host_copies_instead_of_oom():
    """A reader holding every block at once (a transfer to another worker, a task with many
    inputs) fills the device: further reads get host copies, no out-of-memory error."""
    n = 10
    dev = device(blocks=5)
    s = WindowStore("window", device=dev, reserve=0)
    fill(s, dev, n)
    s.task_started("many-inputs", [("x", i) for i in range(n)])  # a task that holds every block
    held = [s[("x", i)] for i in range(n)]
    assert [int(v[0, 0]) for v in held] == list(range(n))
    assert s.metrics()["host_reads"] > 0
    assert dev.pool.peak <= dev.pool.budget


def test_window_follows_free_memory():
    dev = device(blocks=10)
    s = WindowStore("window", device=dev, reserve=0, window_interval=0)
    fill(s, dev, 8)
    cap0 = s.capacity()
    from gdask import DeviceMemoryError

    with pytest.raises(DeviceMemoryError):
        dev.pool.empty((4 * 1024, 64), np.float32)
    assert make_room(4 * NB, dev) >= 2 * NB  # what an allocation outside the store does on failure
    other = dev.pool.empty((4 * 1024, 64), np.float32)  # someone else takes 4 blocks
    assert s.capacity() == cap0 - 4 * NB
    read_passes(s, 8, 1)
    assert s.metrics()["device_blocks"] <= 5  # the window shrank to make room
    del other
    assert s.capacity() == cap0
    read_passes(s, 8, 2)
    assert s.metrics()["device_blocks"] >= 8 - 1  # ... and grew back
    caps = [c for _, c, _, _ in s.stats()["window"]]
    assert min(caps) <= cap0 - 4 * NB and caps[-1] == cap0  # the capacity over time: down, back up


def test_disk_tier(tmp_path):
    dev = device(blocks=4)
    s = WindowStore("window", device=dev, reserve=0, disk=str(tmp_path), host_memory_limit=2 * NB)
    fill(s, dev, 10)
    m = s.metrics()
    assert m["disk_blocks"] > 0 and m["host_bytes"] <= 2 * NB
    read_passes(s, 10, 2)
    assert s.metrics()["bytes_from_disk"] > 0
    s.close()


def test_hooks_make_room_and_delete_everything():
    events = {"hit": 0, "miss": 0, "evict": 0}

    def hook(name):
        def f(key, nbytes):
            assert nbytes == NB
            events[name] += 1
        return f

    dev = device(blocks=6)
    s = WindowStore("lru", device=dev, reserve=0, on_hit=hook("hit"), on_miss=hook("miss"),
                    on_evict=hook("evict"))
    fill(s, dev, 8)
    read_passes(s, 8, 1)
    assert events["miss"] > 0 and events["evict"] > 0 and sum(events.values()) >= 8
    before = s.metrics()["device_blocks"]
    assert make_room(2 * NB, dev) >= 2 * NB
    assert s.metrics()["device_blocks"] == before - 2
    for k in list(s):
        del s[k]
    assert len(s) == 0 and dev.pool.used == 0


def test_concurrent_readers():
    n = 12
    dev = device(blocks=7, bandwidth=int(NB / 0.001))
    s = WindowStore("window", device=dev, reserve=0)
    fill(s, dev, n)
    errors = []

    def reader(offset):
        try:
            for p in range(3):
                for i in range(n):
                    v = s[("x", (i + offset) % n)]
                    assert v[0, 0] == (i + offset) % n
                    del v
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=reader, args=(o,)) for o in (0, 6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert dev.pool.peak <= dev.pool.budget
    assert s.metrics()["reads"] == 2 * 3 * n
    s.close()


def test_bad_arguments():
    with pytest.raises(ValueError, match="policy"):
        WindowStore("mru")
    with pytest.raises(ValueError, match="reserve"):
        WindowStore(reserve=-1)


def test_prefetch_thread_ends_with_its_store():
    import gc

    dev = device(blocks=5)
    s = WindowStore("window", device=dev, reserve=0)
    fill(s, dev, 8)
    read_passes(s, 8, 2)
    assert s.metrics()["device_bytes"] == sum(s.device_bytes(k) for k in s) > 0
    t = s._prefetcher.thread
    assert t is not None and t.is_alive()
    del s
    gc.collect()
    t.join(3)
    assert not t.is_alive()


def test_binds_the_worker_device_when_attached_and_reads_config():
    import dask

    with dask.config.set({"gdask.window-cache.policy": "lru", "gdask.window-cache.reserve": "512KiB"}):
        s = WindowStore()
    s["early"] = np.ones(10)  # before the worker's device plugin attached the device: plain
    dev = device()
    s.attach_device(dev)  # what the device plugin does at setup
    assert dev.reclaimers() == [s._reclaim]  # the device may ask it for room
    s["b"] = dev.asarray(np.ones(BLOCK, np.float32))
    assert s.state("b") is State.DEVICE and s.state("early") is None
    assert s.metrics()["policy"] == "LRU"
    assert s.size_policy.reserve_bytes(dev.pool.budget) == 512 * 1024
