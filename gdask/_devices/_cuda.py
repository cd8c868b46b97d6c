"""The CUDA backend: CuPy arrays, an RMM pool per worker, CUDA streams.

CuPy and RMM are imported only when a CUDA device is actually used, never at ``import gdask``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from gdask._devices._base import DeviceBase
from gdask._devices._spec import DeviceSpec
from gdask._errors import DeviceMemoryError


def _oom_types() -> tuple[type[BaseException], ...]:
    import cupy

    types: list[type[BaseException]] = [cupy.cuda.memory.OutOfMemoryError]
    try:
        import rmm

        types.append(getattr(rmm, "RMMError", MemoryError))
    except ImportError:
        pass
    types.append(MemoryError)
    return tuple(types)


def setup_rmm_pool(pool_size: int | None, device_memory: int) -> str:
    """Route CuPy's allocations through an RMM pool of ``pool_size`` bytes on the current device.

    Returns a short description of what was set up. Without RMM installed CuPy keeps its own
    memory pool (still a pool, just not RMM's), and the description says so.
    """
    import cupy

    try:
        import rmm
        from rmm.allocators.cupy import rmm_cupy_allocator
    except ImportError:
        return "cupy memory pool (rmm not installed)"
    if pool_size is None:
        rmm.reinitialize(pool_allocator=False)
        cupy.cuda.set_allocator(rmm_cupy_allocator)
        return "rmm (no pool)"
    pool_size = min(pool_size, device_memory) // 256 * 256
    rmm.reinitialize(pool_allocator=True, initial_pool_size=pool_size, maximum_pool_size=device_memory // 256 * 256)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    return f"rmm pool of {pool_size} bytes"


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

    def info(self) -> dict[str, Any]:
        from gdask._devices import _nvml

        free, total = self._cupy.cuda.runtime.memGetInfo()
        return {
            **self.spec.to_dict(),
            "memory_used": int(total - free),
            "allocator": self.allocator,
            "bytes_h2d": self.bytes_h2d,
            "bytes_d2h": self.bytes_d2h,
            "busy_time": self.busy_time,
            "tasks": self.tasks,
            **{k: v for k, v in _nvml.utilization(self.spec.physical).items() if k != "memory_used"},
        }
