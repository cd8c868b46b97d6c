"""The CUDA backend: CuPy arrays, an RMM pool per worker, CUDA streams.

Memory is counted as RMM sees it: every worker's allocator is its own RMM pool (sized to the worker's
share of the GPU: logical devices on one GPU each have a pool of their share) under a statistics
resource adaptor, and the memory in use is the bytes allocated from that pool
(:meth:`CudaDevice.memory_used`), not the driver's ``total - free``, which counts the pool's whole
up-front reservation as used. The window cache, placement and ``device_table`` read it.

An allocation that does not fit (CuPy's ``OutOfMemoryError`` or RMM's ``MemoryError``) is raised as
:class:`~gdask.DeviceMemoryError` (:meth:`CudaDevice.translate_oom`) and goes through the same
make-room-and-retry rule as on emulated devices (:meth:`DeviceBase.with_room`: the window cache
moves blocks to the host).

CuPy and RMM are imported only when a CUDA device is actually used, never at ``import gdask``. None of
this runs without a GPU: the logic is tested with fake ``cupy`` / ``rmm`` modules.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from gdask._devices._base import DeviceBase
from gdask._devices._spec import DeviceSpec
from gdask._errors import DeviceMemoryError


def _oom_types() -> tuple[type[BaseException], ...]:
    """Errors of an allocation that did not fit: CuPy's ``OutOfMemoryError`` (a ``MemoryError``) and
    RMM's ``rmm::out_of_memory``, which Cython raises as ``MemoryError``. Other RMM errors are not
    out-of-memory errors and pass through."""
    import cupy

    return (cupy.cuda.memory.OutOfMemoryError, MemoryError)


def setup_rmm_pool(pool_size: int | None, device_memory: int) -> str:
    """Route CuPy's allocations on the current device through RMM, within ``device_memory`` bytes,
    with allocation statistics.

    ``pool_size`` bytes are reserved up front in a pool that may grow to ``device_memory`` (the
    worker's share of the GPU); ``None``: no pool, allocations capped at ``device_memory`` by a
    limiting adaptor. Either way a statistics adaptor sits on top, so :meth:`CudaDevice.memory_used`
    counts the bytes allocated, not the reservation. Returns a short description of what was set
    up. Without RMM installed CuPy keeps its own memory pool (still a pool, just not RMM's), and the
    description says so.
    """
    import cupy

    try:
        import rmm
        import rmm.mr
        import rmm.statistics
        from rmm.allocators.cupy import rmm_cupy_allocator
    except ImportError:
        return "cupy memory pool (rmm not installed)"
    limit = int(device_memory) // 256 * 256
    if pool_size is None:
        rmm.reinitialize(pool_allocator=False)
        rmm.mr.set_current_device_resource(rmm.mr.LimitingResourceAdaptor(rmm.mr.get_current_device_resource(),
                                                                          allocation_limit=limit))
        what = f"rmm (no pool, at most {limit} bytes)"
    else:
        pool_size = min(int(pool_size), int(device_memory)) // 256 * 256
        rmm.reinitialize(pool_allocator=True, initial_pool_size=pool_size, maximum_pool_size=limit)
        what = f"rmm pool of {pool_size} bytes (up to {limit})"
    rmm.statistics.enable_statistics()  # a StatisticsResourceAdaptor over the pool: bytes in use
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    return what + ", statistics"


def rmm_bytes_in_use() -> int | None:
    """Bytes allocated from this process's RMM resource (its statistics adaptor), or ``None`` when RMM
    is not installed or keeps no statistics."""
    try:
        import rmm.statistics
    except ImportError:
        return None
    stats = rmm.statistics.get_statistics()
    return None if stats is None else int(stats.current_bytes)


class CudaDevice(DeviceBase):
    """One CUDA device (or a logical slice of one) owned by this process."""

    backend = "cuda"

    def __init__(self, spec: DeviceSpec) -> None:
        import cupy

        super().__init__()
        self.spec = spec
        self._cupy = cupy
        self.device = cupy.cuda.Device(0)  # CUDA_VISIBLE_DEVICES maps the worker's GPU to 0
        self._local = threading.local()
        self.bytes_h2d = 0
        self.bytes_d2h = 0
        self.busy_time = 0.0
        self.tasks = 0
        self._stats_lock = threading.Lock()
        self.allocator = "cupy default pool"

    @property
    def xp(self):
        return self._cupy

    def stream(self):
        """The CUDA stream of the calling thread (one non-blocking stream per executor thread)."""
        s = getattr(self._local, "stream", None)
        if s is None:
            with self.device:
                s = self._cupy.cuda.Stream(non_blocking=True)
            self._local.stream = s
        return s

    def translate_oom(self, func: Callable[[], Any]) -> Any:
        """``func()`` with CuPy's and RMM's out-of-memory errors raised as DeviceMemoryError."""
        try:
            return func()
        except DeviceMemoryError:
            raise
        except _oom_types() as e:
            raise DeviceMemoryError(f"CUDA device {self.spec.index} out of memory: {e}") from e

    def asarray(self, x: Any, order: str = "F") -> Any:
        cp = self._cupy

        def copy():
            with self.device, self.stream():
                out = cp.array(x, order=order, copy=True)
                self.stream().synchronize()
            return out

        out = self.with_room(int(getattr(x, "nbytes", 0)), lambda: self.translate_oom(copy), "a host->device copy")
        with self._stats_lock:
            self.bytes_h2d += out.nbytes
        return out

    def to_host(self, x: Any) -> Any:
        cp = self._cupy
        if isinstance(x, cp.ndarray):
            with self._stats_lock:
                self.bytes_d2h += x.nbytes
            return cp.asnumpy(x, stream=self.stream())
        return x

    def adopt(self, result: Any) -> Any:
        return result  # RMM / CuPy already account for every allocation

    def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()

        def call():
            with self.device, self.stream():
                result = func(*args, **kwargs)
                self.stream().synchronize()
            return result

        # the size a kernel needs is unknown: make room for an eighth of the device and retry once
        result = self.with_room(self.budget // 8, lambda: self.translate_oom(call), "a task's device work")
        with self._stats_lock:
            self.busy_time += time.perf_counter() - t0
            self.tasks += 1
        return result

    def compute(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """:meth:`run` (CUDA memory is accounted by RMM / CuPy either way)."""
        return self.run(func, *args, **kwargs)

    def synchronize(self) -> None:
        self.device.synchronize()

    def memory_used(self) -> int:
        """Bytes of device memory this worker has allocated: RMM's statistics of the worker's own pool
        (what the pool reserved up front but did not hand out is free); without RMM statistics,
        CuPy's memory pool; the driver's ``total - free`` (capped at the budget) only as a last resort,
        when gdask did not set up the allocator."""
        used = rmm_bytes_in_use()
        if used is not None:
            return used
        if "rmm" not in str(self.allocator):
            return int(self._cupy.get_default_memory_pool().used_bytes())
        with self.device:
            free, total = self._cupy.cuda.runtime.memGetInfo()
        return int(min(self.budget, max(0, total - free)))

    def info(self) -> dict[str, Any]:
        from gdask._devices import _nvml

        used = self.memory_used()
        return {
            **self.spec.to_dict(),
            "memory_used": used,
            "memory_free": max(0, self.budget - used),
            "allocator": self.allocator,
            "bytes_h2d": self.bytes_h2d,
            "bytes_d2h": self.bytes_d2h,
            "busy_time": self.busy_time,
            "tasks": self.tasks,
            **{k: v for k, v in _nvml.utilization(self.spec.physical).items() if k != "memory_used"},
        }
