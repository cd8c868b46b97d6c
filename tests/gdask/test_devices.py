import gc

import dask
import numpy as np
import pytest

import gdask
from gdask._devices import DeviceSpec, EmulatedDevice, EmulatedPool, discover, make_specs


def test_pool_budget_and_release():
    pool = EmulatedPool(1000)
    a = pool.empty((100,), np.float64)
    assert pool.used == 800
    with pytest.raises(gdask.DeviceMemoryError, match="out of memory"):
        pool.empty((50,), np.float64)
    del a
    gc.collect()
    assert pool.used == 0
    b = pool.empty((100,), np.float64)
    view = b[10:]
    pool.adopt(view)  # a view of an owned array costs nothing more
    assert pool.used == 800


def test_single_allocation_larger_than_budget_names_sizes():
    pool = EmulatedPool(1024)
    with pytest.raises(gdask.DeviceMemoryError, match="larger than the whole device budget"):
        pool.empty((1000,), np.float64)
    assert pool.used == 0


def test_oom_is_a_memory_error():
    assert issubclass(gdask.DeviceMemoryError, MemoryError)


def test_emulated_speed_slows_work():
    import time

    dev = EmulatedDevice(DeviceSpec(0, "emulated", 10**6, speed=0.25))
    t = time.perf_counter()
    dev.run(time.sleep, 0.02)
    assert time.perf_counter() - t >= 0.07
    assert dev.tasks == 1


def test_emulated_layout_and_transfer_accounting():
    dev = EmulatedDevice(DeviceSpec(0, "emulated", 10**6, bandwidth=10**9))
    x = dev.asarray(np.ones((10, 3), np.float32))
    assert x.flags.f_contiguous and dev.bytes_h2d == 120 and dev.pool.used == 120


def test_discover_without_gpu_gives_reason():
    inv = discover("auto")
    if not inv.cuda_available:
        assert inv.backend == "emulated" and inv.cuda_reason
        with pytest.raises(gdask.NoDeviceError, match="cannot be used"):
            discover("cuda")


@pytest.mark.parametrize(
    "kwargs, match",
    [({"n_devices": 0}, "n_devices"), ({"device_memory": -1}, "device_memory"),
     ({"device_memory": "lots"}, "device_memory"), ({"n_devices": 2, "device_speeds": [1.0]}, "device_speeds"),
     ({"n_devices": 1, "device_speeds": [0]}, "speed"), ({"backend": "tpu"}, "backend")],
)
def test_bad_specs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_specs(**{"backend": "emulated", **kwargs})


def test_config_overrides():
    with dask.config.set({"gdask.emulated.n-devices": 3, "gdask.emulated.memory": "1GiB"}):
        specs = make_specs(backend="emulated")
    assert len(specs) == 3 and specs[0].memory == 2**30


def test_config_yaml_matches_schema():
    import os

    import yaml

    here = os.path.dirname(gdask.__file__)
    conf = yaml.safe_load(open(os.path.join(here, "gdask.yaml")))["gdask"]
    schema = yaml.safe_load(open(os.path.join(here, "gdask-schema.yaml")))["properties"]["gdask"]["properties"]

    def walk(c, s, path):
        assert set(c) == set(s), path
        for k, v in c.items():
            if isinstance(v, dict):
                walk(v, s[k]["properties"], path + [k])

    walk(conf, schema, [])


def test_info_reports_backend():
    from gdask._info import format_info, info

    d = info()
    assert d["backend"] in ("cuda", "emulated")
    assert "gdask backend" in format_info(d)


def test_emulated_pool_reuses_freed_memory_and_views_keep_it():
    """A freed block's memory goes to the next block of its size (as a device pool does: fresh memory
    costs its page faults in a worker); a view of a freed array keeps the memory and its values."""
    import gc

    from gdask._devices import EmulatedPool

    pool = EmulatedPool(64 << 20)
    a = pool.empty((50_000, 4), np.float32, order="F")
    assert a.flags.f_contiguous and a.flags.writeable and pool.owns(a)
    a[...] = 7.0
    view = a[100:200].T
    assert pool.owns(view)
    del a
    gc.collect()
    assert pool.used == 800_000  # the view holds the memory
    b = pool.empty((50_000, 4), np.float32)
    b[...] = 1.0
    assert float(view.min()) == 7.0 and pool.buffers.allocated == 2  # not handed out while the view lives
    del view, b
    gc.collect()
    assert pool.used == 0 and pool.buffers.free_bytes() == 1_600_000
    for _ in range(3):
        c = pool.empty((50_000, 4), np.float32)
        pool.adopt(c[5:])  # a view of a pool array is not charged again
        assert pool.used == 800_000
        del c
        gc.collect()
    assert pool.buffers.allocated == 2  # reused
    small = pool.empty((10, 4), np.float32)  # under the pool's smallest reused size: a plain array
    assert small.base is None and pool.used == 160


@pytest.mark.parametrize("backend", ["emulated", "emulated-strict"])
def test_rows_to_device_layout_in_tiles_keep_every_value(backend, monkeypatch):
    """A host array reaches the device in feature-major layout through tiles of rows: every value in
    its place for any tile size (one row, a tile cut mid-array, wider than the array), for row-major,
    strided and already feature-major data, every dtype."""
    from gdask._devices import _buffers
    from gdask._devices._arrays import to_numpy
    from gdask._devices._strict import StrictDevice

    cls = StrictDevice if backend == "emulated-strict" else EmulatedDevice
    dev = cls(DeviceSpec(0, backend, 64 << 20))
    rng = np.random.default_rng(3)
    cases = [rng.random((1001, 7)), rng.random((1001, 7)).astype(np.float32), rng.integers(-9, 9, (257, 3)),
             rng.random((600, 9))[::3, 1:8], np.asfortranarray(rng.random((50, 5))), rng.random((40, 1)),
             rng.random(33)]
    for tile in (1, 96, 4096, 1 << 30):
        monkeypatch.setattr(_buffers, "TILE_BYTES", tile)
        for x in cases:
            got = to_numpy(dev.asarray(x))
            assert got.dtype == x.dtype and got.shape == x.shape
            assert got.flags.f_contiguous
            np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("backend", ["emulated", "emulated-strict"])
def test_host_data_handed_over_is_kept_without_a_copy_where_device_memory_is_the_hosts(backend):
    """An emulated device keeps a writable array already in its layout as it is (charged to the pool
    until it is freed, counted as a host->device copy); anything else, and every array on a strict
    device, is copied as ``asarray`` copies it."""
    from gdask._devices._arrays import to_numpy
    from gdask._devices._strict import StrictDevice

    strict = backend == "emulated-strict"
    dev = (StrictDevice if strict else EmulatedDevice)(DeviceSpec(0, backend, 64 << 20))
    rng = np.random.default_rng(4)
    x = np.asfortranarray(rng.random((300, 4)))
    got = dev.hand_over(x[:, 1:3])  # a feature-major view: its base is what is charged
    np.testing.assert_array_equal(to_numpy(got), x[:, 1:3])
    assert np.shares_memory(to_numpy(got), x) is not strict
    assert dev.pool.used == (2 * 300 * 8 if strict else x.nbytes) and dev.bytes_h2d == 2 * 300 * 8
    del got, x  # (the whole of x was charged: freed with it)
    gc.collect()
    assert dev.pool.used == 0
    frozen = np.asfortranarray(rng.random((50, 3)))
    frozen.flags.writeable = False
    rows, labels = rng.random((50, 3)), np.arange(7)
    for other, order in [(rows, "F"), (frozen, "F"), (np.asfortranarray(rows), "C"), (labels[::2], "C")]:
        got = dev.hand_over(other, order=order)
        assert not np.shares_memory(to_numpy(got), other)
        np.testing.assert_array_equal(to_numpy(got), other)
    kept = dev.hand_over(labels, order="C")
    assert np.shares_memory(to_numpy(kept), labels) is not strict
    with pytest.raises(gdask.DeviceMemoryError, match="hand-over|host->device"):
        dev.hand_over(np.asfortranarray(np.zeros((9000, 1000))))
