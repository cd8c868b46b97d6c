"""The CUDA backend: CuPy arrays, an RMM pool per worker, CUDA streams.

Memory is counted as RMM sees it: every worker's allocator is its own RMM pool (sized to the worker's
share of the GPU: logical devices on one GPU each have a pool of their share) under a statistics
resource adaptor, and the memory in use is the bytes allocated from that pool
(:meth:`CudaDevice.memory_used`), not the driver's ``total - free``, which counts the pool's whole
up-front reservation as used. The window cache, placement and ``device_table`` read it.

Without RMM the allocator is CuPy's own memory pool, capped at the worker's share
(``set_limit``), and the memory in use is the bytes that pool handed out. Which allocator a device
has is a flag (:attr:`Allocator.kind`), not read from its description.

An allocation that does not fit (CuPy's ``OutOfMemoryError`` or RMM's ``MemoryError``) is raised as
:class:`~gdask.DeviceMemoryError` (:meth:`CudaDevice.translate_oom`) carrying the size that was asked
for, and goes through the same make-room-and-retry rule as on emulated devices
(:meth:`DeviceBase.with_room`: the window cache moves blocks to the host) for what the allocation
needs, not a fixed share of the device.

CuPy and RMM are imported only when a CUDA device is actually used, never at ``import gdask``. None of
this runs without a GPU: the logic is tested with fake ``cupy`` / ``rmm`` modules.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Callable

import numpy as np

from gdask._devices._base import DeviceBase
from gdask._devices._spec import DeviceSpec
from gdask._errors import DeviceMemoryError

#: host->device copies of C-order arrays into F-order blocks go in row slabs of about this size: the
#: transpose runs on the device (the host copy stays a plain contiguous read), with one slab extra
_SLAB_BYTES = 64 * 2**20

#: allocator kinds (:attr:`Allocator.kind`)
RMM, CUPY, EXTERNAL = "rmm", "cupy", "external"


class Allocator(str):
    """The description of a CUDA device's allocator (what ``gdask`` logs) with its kind as a flag.

    ``kind`` is ``"rmm"`` (an RMM resource with a statistics adaptor set up by gdask: memory in use
    is what it counts), ``"cupy"`` (CuPy's default memory pool: memory in use is its used bytes) or
    ``"external"`` (set up by someone else: RMM's statistics if any, else the driver).
    """

    kind: str

    def __new__(cls, text: str, kind: str) -> Allocator:
        if kind not in (RMM, CUPY, EXTERNAL):
            raise ValueError(f"allocator kind must be one of {(RMM, CUPY, EXTERNAL)}, got {kind!r}")
        obj = super().__new__(cls, text)
        obj.kind = kind
        return obj


def _oom_types() -> tuple[type[BaseException], ...]:
    """Errors of an allocation that did not fit: CuPy's ``OutOfMemoryError`` (a ``MemoryError``) and
    RMM's ``rmm::out_of_memory``, which Cython raises as ``MemoryError``. Other RMM errors are not
    out-of-memory errors and pass through."""
    import cupy

    return (cupy.cuda.memory.OutOfMemoryError, MemoryError)


def requested_bytes(error: BaseException) -> int | None:
    """The size of the allocation that raised ``error`` (None where it does not say): CuPy's
    ``OutOfMemoryError`` keeps it (and writes it in its message); an RMM allocation made through
    gdask's allocator carries it as ``gdask_nbytes``."""
    for attr in ("gdask_nbytes", "_size"):
        value = getattr(error, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    m = re.search(r"allocating ([\d,]+) bytes", str(error))
    return int(m.group(1).replace(",", "")) if m else None


def _sized(allocate: Callable[[int], Any]) -> Callable[[int], Any]:
    """``allocate`` whose out-of-memory errors say how many bytes were asked for (RMM's do not)."""

    def allocate_sized(nbytes: int) -> Any:
        try:
            return allocate(nbytes)
        except MemoryError as e:
            e.gdask_nbytes = int(nbytes)
            raise

    return allocate_sized


def setup_rmm_pool(pool_size: int | None, device_memory: int) -> Allocator:
    """Route CuPy's allocations on the current device through RMM, within ``device_memory`` bytes,
    with allocation statistics.

    ``pool_size`` bytes are reserved up front in a pool that may grow to ``device_memory`` (the
    worker's share of the GPU); ``None``: no pool, allocations capped at ``device_memory`` by a
    limiting adaptor. Either way a statistics adaptor sits on top, so :meth:`CudaDevice.memory_used`
    counts the bytes allocated, not the reservation. Without RMM installed CuPy keeps its own
    memory pool, capped at ``device_memory`` (``set_limit``; nothing is reserved up front).

    Returns
    -------
    Allocator
        A short description of what was set up, whose ``kind`` says which allocator it is.
    """
    import cupy

    limit = int(device_memory) // 256 * 256
    try:
        import rmm
        import rmm.mr
        import rmm.statistics
        from rmm.allocators.cupy import rmm_cupy_allocator
    except ImportError:
        pool = cupy.get_default_memory_pool()
        pool.set_limit(size=limit)
        cupy.cuda.set_allocator(pool.malloc)
        return Allocator(f"cupy memory pool of at most {limit} bytes (rmm not installed)", CUPY)
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
    cupy.cuda.set_allocator(_sized(rmm_cupy_allocator))
    return Allocator(what + ", statistics", RMM)


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
        self.allocator = Allocator("cupy default pool", CUPY)

    @property
    def allocator(self) -> str:
        """The description of this device's allocator (:func:`setup_rmm_pool`'s result)."""
        return self._allocator

    @allocator.setter
    def allocator(self, value: str) -> None:
        self._allocator = value
        #: ``"rmm"``, ``"cupy"`` or ``"external"`` (a description without a kind: set up elsewhere)
        self.allocator_kind = getattr(value, "kind", EXTERNAL)

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
            error = DeviceMemoryError(f"CUDA device {self.spec.index} out of memory: {e}")
            error.requested = requested_bytes(e)
            raise error from e

    def _copy_in(self, x: Any, order: str) -> Any:
        """``x`` copied to this device in ``order``. A host array laid out otherwise (C order wanted
        in F order, a transposed view) is not reordered on the host (CuPy's ``array(x, order=...)``
        does that, single-threaded): the array it is a view of goes over in contiguous slabs, each
        written into the block on the device in the order wanted."""
        cp = self._cupy
        wanted = {"C": "c_contiguous", "F": "f_contiguous"}.get(order)
        if not isinstance(x, np.ndarray) or x.ndim < 2 or x.size == 0 or wanted is None or getattr(x.flags, wanted):
            return cp.array(x, order=order, copy=True)
        perm = tuple(int(a) for a in np.argsort([-s for s in x.strides], kind="stable"))  # outermost axis first
        base = x.transpose(perm)
        if not base.flags.c_contiguous:  # not a reordering of one contiguous array (e.g. a strided slice)
            return cp.array(x, order=order, copy=True)
        out = cp.empty(x.shape, dtype=x.dtype, order=order)
        view = out.transpose(perm)  # the device block, indexed as ``base``
        rows = max(1, _SLAB_BYTES // max(1, base[0].nbytes))
        for start in range(0, base.shape[0], rows):
            view[start:start + rows] = cp.asarray(base[start:start + rows])  # reordered on the device
        return out

    def asarray(self, x: Any, order: str = "F") -> Any:
        def copy():
            with self.device, self.stream():
                out = self._copy_in(x, order)
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
            # order "A": an F-order block comes back F-order, without a block-sized transpose on the device
            return cp.asnumpy(x, stream=self.stream(), order="A")
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

        # what a task needs is known when it fails: room for the allocation that failed (with a margin)
        result = self.with_room(None, lambda: self.translate_oom(call), "a task's device work")
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
        """Bytes of device memory this worker has allocated, by the allocator's kind
        (:attr:`allocator_kind`): RMM's statistics of the worker's own pool (what the pool reserved
        up front but did not hand out is free); CuPy's memory pool's used bytes (its cached free
        blocks and other processes are not this worker's use); for an allocator set up elsewhere,
        RMM's statistics if it keeps them, else the driver's ``total - free`` (capped at the budget)."""
        if self.allocator_kind == CUPY:
            return int(self._cupy.get_default_memory_pool().used_bytes())
        used = rmm_bytes_in_use()
        if used is not None:
            return used
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
            **{k: v for k, v in _nvml.utilization(self.spec.physical, self.spec.uuid).items() if k != "memory_used"},
        }
