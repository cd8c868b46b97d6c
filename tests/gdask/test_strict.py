"""The emulated-strict backend: array-api-strict blocks on a non-CPU device, with the byte budget,
out-of-memory rule and window cache of emulated devices; host <-> device moves only through the
device API."""

from __future__ import annotations

import gc

import dask
import numpy as np
import pytest
from dask.sizeof import sizeof

import gdask
from gdask import DeviceMemoryError
from gdask.devices import (
    BACKENDS,
    DeviceSpec,
    StrictDevice,
    asarray_like,
    current_device,
    discover,
    is_strict,
    make_device,
    make_specs,
    to_numpy,
)
from gdask.window_cache import State, WindowStore

xps = pytest.importorskip("array_api_strict")
NB = 1024 * 16 * 4  # a float32 (1024, 16) block


def device(budget=8 * NB, bandwidth=None):
    return StrictDevice(DeviceSpec(index=0, backend="emulated-strict", memory=budget, bandwidth=bandwidth))


def test_backend_is_chosen_by_name_and_config():
    assert "emulated-strict" in BACKENDS
    assert discover("emulated-strict").backend == "emulated-strict"
    specs = make_specs(3, backend="emulated-strict", device_memory="1MiB")
    assert [s.backend for s in specs] == ["emulated-strict"] * 3 and specs[0].memory == 2**20
    assert isinstance(make_device(specs[0]), StrictDevice)
    with dask.config.set({"gdask.backend": "emulated-strict"}):  # local computations follow the config
        assert current_device().backend == "emulated-strict"
        X = gdask.from_array(np.ones((4, 2)))
        assert type(X.compute(output_type="device")).__module__.startswith("array_api_strict")
        assert isinstance(X.compute(), np.ndarray)  # results follow the input: NumPy data gives NumPy
    assert current_device().backend != "emulated-strict"
    with pytest.raises(ValueError, match="backend must be one of"):
        DeviceSpec(index=0, backend="strict", memory=1)


def test_info_lists_the_backend(capsys):
    from gdask._cli import main

    assert main(["info", "--backend", "emulated-strict"]) == 0
    out = capsys.readouterr().out
    assert "gdask backend: emulated-strict" in out and "emulated-strict" in out.split("backends:")[1]


def test_moves_go_through_the_device_and_are_counted():
    dev = device()
    host = np.arange(64, dtype=np.float32).reshape(16, 4)
    blk = dev.asarray(host)
    assert is_strict(blk) and blk.device == dev.array_device != xps.Device("CPU_DEVICE")
    assert dev.pool.used == host.nbytes and dev.bytes_h2d == host.nbytes
    back = dev.to_host(blk)
    assert isinstance(back, np.ndarray) and dev.bytes_d2h == host.nbytes
    np.testing.assert_array_equal(back, host)
    back[0, 0] = -1  # a copy: the device array is unchanged
    np.testing.assert_array_equal(to_numpy(blk), host)
    # what CuPy refuses, strict device arrays refuse too
    with pytest.raises(TypeError):
        blk + host
    with pytest.raises((RuntimeError, TypeError, ValueError)):
        np.asarray(blk)
    with pytest.raises(ValueError):  # another device
        blk + xps.asarray(host)
    np.testing.assert_array_equal(to_numpy(blk + asarray_like(host, blk)), 2 * host)
    assert sizeof(blk) == host.nbytes
    del blk
    gc.collect()
    assert dev.pool.used == 0


def test_results_are_charged_per_array_and_released():
    dev = device(budget=4 * NB)
    blk = dev.asarray(np.ones((1024, 16), np.float32))
    out = dev.run(lambda b: b * 2, blk)
    assert dev.pool.used == 2 * NB and dev.pool.owns(out)
    view = dev.run(lambda b: b[:512, ...], blk)  # no .base chain: a view is charged as a copy
    assert dev.pool.used == 2 * NB + NB // 2
    del out, view
    gc.collect()
    assert dev.pool.used == NB


def test_out_of_memory_asks_the_reclaimers_then_names_the_sizes():
    dev = device(budget=2 * NB)
    held = [dev.asarray(np.ones((1024, 16), np.float32)) for _ in range(2)]
    with dask.config.set({"gdask.timeouts.memory": 0.05}):
        with pytest.raises(DeviceMemoryError, match="0 B were moved off the device and it still did not fit"):
            dev.asarray(np.ones((1024, 16), np.float32))

    def reclaim(nbytes, device):
        held.pop()
        gc.collect()
        return NB

    dev.add_reclaimer(reclaim)
    blk = dev.asarray(np.full((1024, 16), 3, np.float32))  # room made, retried
    assert float(to_numpy(blk)[0, 0]) == 3 and len(held) == 1
    with pytest.raises(DeviceMemoryError, match="larger than the whole device budget"):
        dev.asarray(np.ones((1024, 48), np.float32))


def test_window_store_spills_and_reloads_strict_blocks():
    dev = device(budget=8 * NB)
    s = WindowStore("window", device=dev, reserve=0)
    for i in range(16):
        s[("x", i)] = dev.asarray(np.full((1024, 16), i, np.float32))
    m = s.metrics()
    assert m["device_blocks"] == 7 and m["host_blocks"] == 9
    assert dev.pool.peak <= dev.pool.budget
    states = [s.state(("x", i)) for i in range(16)]
    assert states.count(State.DEVICE) == 7 and states.count(State.HOST) == 9
    for p in range(2):
        for i in range(16):
            v = s[("x", i)]
            assert is_strict(v) and v.device == dev.array_device  # reloaded onto the device
            assert float(to_numpy(v)[3, 2]) == i
            del v
    assert dev.pool.peak <= dev.pool.budget
    s.close()


def test_to_numpy_of_every_kind():
    host = np.arange(6.0).reshape(2, 3)
    dev = device()
    assert to_numpy(host) is host and to_numpy(2.5) == 2.5
    np.testing.assert_array_equal(gdask.to_numpy(dev.asarray(host)), host)
    z = xps.sum(dev.asarray(host))
    assert to_numpy(z) == 15.0
