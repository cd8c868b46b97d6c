"""A block sent from one worker's window store to another worker arrives there as a managed block."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest

from gdask._devices import DeviceSpec, EmulatedDevice
from gdask.window_cache import State, WindowStore
from gdask.window_cache._arrivals import SentBlock, arrived
from gdask.window_cache._pins import reading_for_transfer

BLOCK = (1024, 64)  # float32: 256 KiB
NB = 1024 * 64 * 4


def _device(blocks, backend="emulated"):
    if backend == "emulated-strict":
        pytest.importorskip("array_api_strict")
        from gdask._devices._strict import StrictDevice

        return StrictDevice(DeviceSpec(index=0, backend=backend, memory=blocks * NB))
    return EmulatedDevice(DeviceSpec(index=0, backend=backend, memory=blocks * NB))


def _send(store, key, who):
    """What distributed sends for ``key`` (``get_data`` through gdask's handler), as the receiver unpickles it."""
    with reading_for_transfer(who):
        value = store[key]
    return pickle.loads(pickle.dumps(value, protocol=5))


def _wait_state(store, key, state, timeout=10.0):
    deadline = time.monotonic() + timeout
    while store.state(key) is not state:
        assert time.monotonic() < deadline, f"{key} stayed {store.state(key)}, expected {state}"
        time.sleep(0.01)


@pytest.mark.parametrize("backend", ["emulated", "emulated-strict"])
def test_a_block_sent_to_a_worker_lands_on_its_device(backend):
    a_dev, b_dev = _device(8, backend), _device(8, backend)
    a, b = WindowStore("lru", device=a_dev, reserve=0), WindowStore("lru", device=b_dev, reserve=0)
    try:
        a["x"] = a_dev.asarray(np.full(BLOCK, 3, np.float32))
        got = _send(a, "x", who="tcp://b")
        assert type(got) is np.ndarray and got[0, 0] == 3  # plain host data on the wire
        b["x"] = got
        _wait_state(b, "x", State.DEVICE)  # managed, and copied to b's device (it fits)
        assert b.metrics()["device_blocks"] == 1 and b.metrics()["plain_keys"] == 0
        assert b.tier.owns(b["x"])  # a device array of b's pool
        assert float(b_dev.to_host(b["x"])[5, 5]) == 3.0
        assert a.state("x") is State.DEVICE  # the sender keeps its block
    finally:
        a.close()
        b.close()


def test_a_block_that_does_not_fit_waits_on_the_host_for_its_reader():
    a_dev, b_dev = _device(8), _device(2)
    a, b = WindowStore("lru", device=a_dev, reserve=0), WindowStore("lru", device=b_dev, reserve=0)
    try:
        b["busy"] = b_dev.asarray(np.zeros(BLOCK, np.float32))  # b's window has room for no second block
        b["busy2"] = b_dev.asarray(np.zeros(BLOCK, np.float32))
        a["x"] = a_dev.asarray(np.full(BLOCK, 4, np.float32))
        b["x"] = _send(a, "x", who="tcp://b")
        assert b.state("x") in (State.HOST, State.DEVICE) and b.metrics()["plain_keys"] == 0
        assert float(np.asarray(b["x"])[0, 0]) == 4.0  # read: loaded (evicting another block) or from the host
    finally:
        a.close()
        b.close()


def test_clients_and_plain_values_get_plain_data():
    dev = _device(8)
    a = WindowStore("lru", device=dev, reserve=0)
    try:
        a["x"] = dev.asarray(np.full(BLOCK, 5, np.float32))
        a["small"] = np.arange(3)  # a host value: never sent as a block
        with reading_for_transfer(None):  # a client gathers
            assert type(a["x"]) is np.ndarray
        with reading_for_transfer("tcp://b"):
            assert isinstance(a["x"], SentBlock) and type(a["small"]) is np.ndarray
        b = {}  # a receiver without a window store keeps the array as it came
        b["x"] = _send(a, "x", who="tcp://b")
        assert type(b["x"]) is np.ndarray and b["x"][0, 0] == 5
    finally:
        a.close()


def test_the_arrival_note_is_taken_once_and_holds_nothing():
    import gc
    import weakref

    got = pickle.loads(pickle.dumps(SentBlock(np.ones(4)), protocol=5))
    assert arrived(got) and not arrived(got)  # taken by the first store that sees it
    other = pickle.loads(pickle.dumps(SentBlock(np.ones(4)), protocol=5))
    ref = weakref.ref(other)
    del other
    gc.collect()
    assert ref() is None  # the note keeps no array alive
    assert not arrived(np.ones(4))
