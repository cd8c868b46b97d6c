"""CUDA memory as RMM sees it, and out-of-memory handling, against fake ``cupy`` and ``rmm`` modules
(this path cannot run without a GPU; its logic can): the worker's allocator is an RMM pool of its
share under a statistics adaptor, memory in use is what that adaptor counts (not the driver's
``total - free``, which includes the pool's reservation), and an allocation that does not fit asks
the reclaimers and is retried, as on emulated devices."""

from __future__ import annotations

import sys
import types

import dask
import numpy as np
import pytest

from gdask import DeviceMemoryError
from gdask._devices import _cuda
from gdask.devices import DeviceSpec
from gdask.window_cache._tiers import device_tier

GiB = 2**30


class FakeOOM(MemoryError):
    """cupy.cuda.memory.OutOfMemoryError (a MemoryError subclass, as in CuPy)."""


class Resource:
    def __init__(self, name, upstream=None, **kw):
        self.name, self.upstream, self.kw = name, upstream, kw


class StatisticsResourceAdaptor(Resource):
    def __init__(self, upstream):
        super().__init__("statistics", upstream)
        self.allocation_counts = types.SimpleNamespace(current_bytes=0, peak_bytes=0)


class FakeRMM:
    """The parts of rmm gdask uses, recording what was set up."""

    def __init__(self):
        self.resource = Resource("cuda")
        self.calls = []
        rmm = types.ModuleType("rmm")
        mr = types.ModuleType("rmm.mr")
        stats = types.ModuleType("rmm.statistics")
        allocators = types.ModuleType("rmm.allocators")
        cupy_alloc = types.ModuleType("rmm.allocators.cupy")

        def reinitialize(pool_allocator=False, initial_pool_size=None, maximum_pool_size=None, **kw):
            self.calls.append(("reinitialize", pool_allocator, initial_pool_size, maximum_pool_size))
            self.resource = Resource("pool", Resource("cuda"), initial=initial_pool_size, maximum=maximum_pool_size) \
                if pool_allocator else Resource("cuda")

        def enable_statistics():
            if not isinstance(self.resource, StatisticsResourceAdaptor):
                self.resource = StatisticsResourceAdaptor(self.resource)

        def get_statistics():
            r = self.resource
            return r.allocation_counts if isinstance(r, StatisticsResourceAdaptor) else None

        rmm.reinitialize = reinitialize
        mr.get_current_device_resource = lambda: self.resource
        mr.set_current_device_resource = lambda r: setattr(self, "resource", r)
        mr.LimitingResourceAdaptor = lambda up, allocation_limit: Resource("limit", up, limit=allocation_limit)
        mr.StatisticsResourceAdaptor = StatisticsResourceAdaptor
        stats.enable_statistics = enable_statistics
        stats.get_statistics = get_statistics
        cupy_alloc.rmm_cupy_allocator = lambda nbytes: None
        rmm.mr, rmm.statistics, rmm.allocators, allocators.cupy = mr, stats, allocators, cupy_alloc
        self.modules = {"rmm": rmm, "rmm.mr": mr, "rmm.statistics": stats, "rmm.allocators": allocators,
                        "rmm.allocators.cupy": cupy_alloc}


class _Ctx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass


class FakePool:
    """cupy.get_default_memory_pool(): used bytes and the limit set on it."""

    def __init__(self, owner):
        self.owner, self.limit = owner, None

    def used_bytes(self):
        return self.owner.pool_used

    def set_limit(self, size=None, fraction=None):
        self.limit = size

    def malloc(self, nbytes):
        return ("cupy pool", nbytes)


class FakeCupy:
    """The parts of cupy a CudaDevice uses; ``fail`` lists the errors the next allocations raise.
    ``host_transposes`` counts the copies CuPy would transpose on the host (``array(x, order="F")``
    of a C-order NumPy array: NumPy reorders it before the transfer)."""

    def __init__(self, total=80 * GiB, free=16 * GiB):
        self.fail: list[BaseException] = []
        self.allocator = None
        self.pool_used = 0
        self.host_transposes = 0
        self.pool = FakePool(self)
        cp = types.ModuleType("cupy")
        cp.ndarray = np.ndarray

        def allocating():
            if self.fail:
                raise self.fail.pop(0)

        def array(x, order="C", copy=True):
            allocating()
            flag = {"C": "c_contiguous", "F": "f_contiguous"}[order]
            if isinstance(x, np.ndarray) and x.ndim > 1 and not getattr(x.flags, flag):
                self.host_transposes += 1
            return np.array(x, order=order, copy=True)

        def asarray(x):
            allocating()
            if isinstance(x, np.ndarray) and not (x.flags.c_contiguous or x.flags.f_contiguous):
                self.host_transposes += 1
            return np.array(x, copy=True)

        def empty(shape, dtype=float, order="C"):
            allocating()
            return np.empty(shape, dtype=dtype, order=order)

        cp.array, cp.asarray, cp.empty = array, asarray, empty
        cp.asnumpy = lambda x, stream=None, order="C": np.array(x, order=order)  # CuPy's default: C order
        cp.get_default_memory_pool = lambda: self.pool
        cp.cuda = types.SimpleNamespace(
            Device=lambda i=0: _Ctx(), Stream=lambda non_blocking=False: _Ctx(),
            set_allocator=lambda f: setattr(self, "allocator", f),
            memory=types.SimpleNamespace(OutOfMemoryError=FakeOOM),
            runtime=types.SimpleNamespace(memGetInfo=lambda: (free, total)))
        self.module = cp


@pytest.fixture
def fakes(monkeypatch):
    rmm, cupy = FakeRMM(), FakeCupy()
    for name, mod in {**rmm.modules, "cupy": cupy.module}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return rmm, cupy


def _spec(index=0, memory=40 * GiB):
    return DeviceSpec(index=index, backend="cuda", memory=memory, physical=0, name="fake GPU")


def test_pool_of_the_share_under_statistics(fakes):
    rmm, cupy = fakes
    what = _cuda.setup_rmm_pool(int(0.8 * 40 * GiB), 40 * GiB)
    assert rmm.calls == [("reinitialize", True, int(0.8 * 40 * GiB) // 256 * 256, 40 * GiB)]
    top = rmm.resource
    assert isinstance(top, StatisticsResourceAdaptor) and top.upstream.name == "pool"
    assert top.upstream.kw["maximum"] == 40 * GiB  # the worker's share, not the GPU
    assert cupy.allocator is not None and "statistics" in what


def test_without_a_pool_the_share_is_a_limit(fakes):
    rmm, _ = fakes
    _cuda.setup_rmm_pool(None, 20 * GiB)
    top = rmm.resource
    assert isinstance(top, StatisticsResourceAdaptor)
    assert top.upstream.name == "limit" and top.upstream.kw["limit"] == 20 * GiB


def test_memory_in_use_is_what_the_pool_handed_out(fakes):
    """The driver says 64 of 80 GiB are used (the pools' reservations of two logical devices); the
    device, its window tier and its metrics see the bytes allocated from its own pool."""
    rmm, cupy = fakes
    specs = [_spec(0), _spec(1)]  # two logical devices sharing GPU 0, 40 GiB each
    dev = _cuda.CudaDevice(specs[0])
    dev.allocator = _cuda.setup_rmm_pool(int(0.8 * specs[0].memory), specs[0].memory)
    rmm.resource.allocation_counts.current_bytes = 3 * GiB
    assert dev.memory_used() == 3 * GiB
    info = dev.info()
    assert info["memory_used"] == 3 * GiB and info["memory_free"] == 37 * GiB and info["memory"] == 40 * GiB
    assert device_tier(dev).used == 3 * GiB  # the window cache sizes itself from it
    from gdask.window_cache import WindowStore

    store = WindowStore(device=dev, reserve=0)
    assert store.capacity() >= 30 * GiB  # not the driver's 16 GiB free (minus the reservation)


def test_without_rmm_statistics_cupy_pool_or_driver(fakes, monkeypatch):
    _, cupy = fakes
    dev = _cuda.CudaDevice(_spec())
    monkeypatch.setattr(_cuda, "rmm_bytes_in_use", lambda: None)
    cupy.pool_used = 5 * GiB
    assert dev.memory_used() == 5 * GiB  # CuPy's own pool
    dev.allocator = "rmm pool of ..."  # RMM without statistics (not set up by gdask): the driver, capped
    assert dev.memory_used() == 40 * GiB


@pytest.mark.parametrize("error", [FakeOOM("cupy: out of memory allocating 1 GiB"),
                                   MemoryError("std::bad_alloc: out_of_memory: RMM failure")])
def test_out_of_memory_asks_the_reclaimers_and_retries(fakes, error):
    _, cupy = fakes
    dev = _cuda.CudaDevice(_spec())
    asked = []

    def reclaim(nbytes, device):  # held weakly by the device: kept alive here
        asked.append(nbytes)
        return nbytes

    dev.add_reclaimer(reclaim)
    cupy.fail = [error]
    host = np.ones((1000, 8), np.float32)
    out = dev.asarray(host)
    np.testing.assert_array_equal(out, host)
    assert asked == [host.nbytes]
    # a task's device work too: room for an eighth of the device, then the task again
    calls = []

    def work():
        calls.append(1)
        if len(calls) == 1:
            raise type(error)(str(error))
        return 7

    assert dev.run(work) == 7 and len(calls) == 2
    assert asked[-1] == dev.budget // 8  # an error that does not say its size: an eighth of the device


def test_a_task_out_of_memory_reclaims_what_the_allocation_needs(fakes):
    """Not an eighth of the device (18 GB on an H200) whatever failed: the failed request's size
    plus a margin of as much again (at most a 32nd of the device), from CuPy's error or from RMM's
    through gdask's allocator; a second failure asks for its own size."""
    rmm, cupy = fakes
    dev = _cuda.CudaDevice(_spec(memory=140 * GiB))
    dev.allocator = _cuda.setup_rmm_pool(None, dev.budget)
    asked = []

    def reclaim(nbytes, device):
        asked.append(nbytes)
        return nbytes

    dev.add_reclaimer(reclaim)
    oom = cupy.module.cuda.memory.OutOfMemoryError
    failures = [oom("Out of memory allocating 1,073,741,824 bytes (allocated so far: 0 bytes)."),
                oom("Out of memory allocating 2,147,483,648 bytes (allocated so far: 0 bytes).")]

    def work():
        if failures:
            raise failures.pop(0)
        return "done"

    assert dev.run(work) == "done"
    assert asked == [2 * GiB, 4 * GiB]  # 1 GiB + 1 GiB of margin, then 2 GiB + 2 GiB: not 17.5 GiB
    # RMM's MemoryError does not say its size: gdask's allocator (CuPy's, over RMM) adds it
    attempts = []

    def rmm_allocate(nbytes):
        attempts.append(nbytes)
        if len(attempts) == 1:
            raise MemoryError("std::bad_alloc: out_of_memory: RMM failure at: limiting_resource_adaptor.hpp")
        return ("rmm", nbytes)

    rmm.modules["rmm.allocators.cupy"].rmm_cupy_allocator = rmm_allocate
    dev.allocator = _cuda.setup_rmm_pool(None, dev.budget)
    asked.clear()
    assert dev.run(lambda: cupy.allocator(6 * GiB)) == ("rmm", 6 * GiB)
    assert asked == [6 * GiB + dev.budget // 32]  # the margin is at most a 32nd of the device
    # a request larger than the device is not retried
    failures.append(oom("Out of memory allocating 161,061,273,600 bytes (allocated so far: 0 bytes)."))
    with pytest.raises(DeviceMemoryError, match="larger than the whole device"):
        dev.run(work)


def test_out_of_memory_that_persists_names_the_sizes(fakes):
    _, cupy = fakes
    dev = _cuda.CudaDevice(_spec())
    nothing, everything = (lambda nbytes, device: 0), (lambda nbytes, device: nbytes)
    dev.add_reclaimer(nothing)
    cupy.fail = [FakeOOM("out of memory")] * 1000
    with dask.config.set({"gdask.timeouts.memory": 0.05}):
        with pytest.raises(DeviceMemoryError, match="CUDA device 0 out of memory.*0 B were moved off the device and "
                                                    "it still did not fit after 0.05 s"):
            dev.asarray(np.ones(10))
    dev.add_reclaimer(everything)
    cupy.fail = [FakeOOM("out of memory"), FakeOOM("out of memory")]
    assert dev.asarray(np.ones(10)) is not None  # the reclaimers made room: retried until it fit


def test_without_rmm_cupy_pool_is_capped_and_counted(fakes, monkeypatch):
    """Without RMM the allocator is CuPy's pool, capped at the worker's share, and memory in use is
    what that pool handed out: not the driver's total - free (other processes, CuPy's cache), which
    made the window cache evict everything."""
    _, cupy = fakes
    for name in ("rmm", "rmm.mr", "rmm.statistics", "rmm.allocators", "rmm.allocators.cupy"):
        monkeypatch.setitem(sys.modules, name, None)  # rmm not installed
    dev = _cuda.CudaDevice(_spec(memory=40 * GiB))
    dev.allocator = _cuda.setup_rmm_pool(int(0.8 * dev.budget), dev.budget)
    assert dev.allocator_kind == "cupy" and "rmm not installed" in dev.allocator
    assert cupy.pool.limit == 40 * GiB and cupy.allocator == cupy.pool.malloc
    cupy.pool_used = 5 * GiB  # the driver says 64 of 80 GiB are used
    assert dev.memory_used() == 5 * GiB
    assert dev.info()["memory_free"] == 35 * GiB


def test_c_order_host_data_is_transposed_on_the_device(fakes, monkeypatch):
    """An F-order block from C-order NumPy: contiguous slabs go over and are reordered on the device;
    CuPy's array(x, order="F") would transpose the whole array on the host, single-threaded."""
    _, cupy = fakes
    dev = _cuda.CudaDevice(_spec())
    host = np.arange(6000 * 7, dtype=np.float64).reshape(6000, 7)
    monkeypatch.setattr(_cuda, "_SLAB_BYTES", 7 * 8 * 1000)  # 1000 rows a slab: 6 slabs
    out = dev.asarray(host)
    assert cupy.host_transposes == 0
    assert out.flags.f_contiguous and np.array_equal(out, host) and dev.bytes_h2d == host.nbytes
    for ready in (np.asfortranarray(host), host[:, 0], host):
        np.testing.assert_array_equal(dev.asarray(ready, order="C" if ready is host else "F"), ready)
    assert cupy.host_transposes == 0
    # a time-major view of C-order sequences (n, t, f) -> (t, n, f), wanted C-contiguous (3-D blocks)
    seqs = np.arange(2500 * 3 * 4, dtype=np.float32).reshape(2500, 3, 4)
    out = dev.asarray(seqs.transpose(1, 0, 2), order="C")
    assert cupy.host_transposes == 0 and out.flags.c_contiguous and np.array_equal(out, seqs.transpose(1, 0, 2))
    strided = host[::2]  # not a reordering of one contiguous array: CuPy's own copy
    np.testing.assert_array_equal(dev.asarray(strided), strided)


def test_f_order_blocks_come_back_in_f_order(fakes):
    _, cupy = fakes
    dev = _cuda.CudaDevice(_spec())
    block = np.asfortranarray(np.arange(12.0).reshape(4, 3))
    back = dev.to_host(block)
    assert back.flags.f_contiguous and np.array_equal(back, block)  # no transpose on the device


def test_other_errors_are_not_out_of_memory(fakes):
    _, cupy = fakes
    dev = _cuda.CudaDevice(_spec())
    cupy.fail = [RuntimeError("cudaErrorIllegalAddress")]
    with pytest.raises(RuntimeError, match="IllegalAddress"):
        dev.asarray(np.ones(10))
