"""Emulated devices: NumPy arrays in a byte-budgeted pool, threads as streams.

They exist so that every code path of gdask runs, and is tested, on machines without a GPU. A
device with ``speed=0.5`` finishes each piece of work twice as late; a ``bandwidth`` makes
host<->device copies take ``nbytes / bandwidth`` seconds, as PCIe transfers do.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from typing import Any, Callable

import numpy as np
from dask.utils import format_bytes

from gdask._devices._base import DeviceBase
from gdask._devices._buffers import BufferPool, copy_into, lease_nbytes
from gdask._devices._spec import DeviceSpec
from gdask._errors import DeviceMemoryError


def _root(arr: np.ndarray) -> Any:
    """What owns ``arr``'s memory: its first ancestor array, or the :class:`BufferPool` lease under it."""
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr.base if lease_nbytes(arr.base) is not None else arr


def _owned_nbytes(owner: Any) -> int:
    n = lease_nbytes(owner)
    return int(owner.nbytes) if n is None else n


class EmulatedPool:
    """A byte budget that arrays are charged against until they are garbage collected.

    As a device's memory pool (RMM's on a GPU), it keeps the memory of freed arrays for the next ones
    of the same size (:class:`~gdask._devices._buffers.BufferPool`, up to ``keep`` bytes of free
    buffers): blocks that come and go (the window cache's, a stream of batches) would otherwise each
    pay their page faults in a worker process.

    Parameters
    ----------
    budget : int
        Bytes the pool may hand out.
    name : str
        Used in error messages.
    keep : int, optional
        Bytes of freed buffers kept for reuse (default: an eighth of the budget, at most 256 MiB).
    """

    def __init__(self, budget: int, name: str = "emulated device", keep: int | None = None) -> None:
        if budget <= 0:
            raise ValueError(f"pool budget must be positive, got {budget}")
        self.budget = int(budget)
        self.name = name
        self._used = 0
        self._peak = 0
        self._lock = threading.Lock()
        self._owned: dict[int, int] = {}  # id(owner: root array or lease) -> nbytes
        self.buffers = BufferPool(max_bytes=min(self.budget // 8, 256 << 20) if keep is None else int(keep))

    @property
    def used(self) -> int:
        return self._used

    @property
    def peak(self) -> int:
        return self._peak

    @property
    def free(self) -> int:
        return self.budget - self._used

    def _charge(self, nbytes: int) -> None:
        with self._lock:
            if self._used + nbytes > self.budget:
                what = (
                    f"a single allocation of {format_bytes(nbytes)} is larger than the whole "
                    f"device budget of {format_bytes(self.budget)}"
                    if nbytes > self.budget
                    else f"requested {format_bytes(nbytes)} with {format_bytes(self._used)} of "
                    f"{format_bytes(self.budget)} in use"
                )
                raise DeviceMemoryError(
                    f"{self.name} out of memory: {what}. Use smaller blocks (block_rows=...), "
                    "more devices, or a larger device_memory."
                )
            self._used += nbytes
            self._peak = max(self._peak, self._used)

    def _release(self, key: int, nbytes: int) -> None:
        with self._lock:
            self._used -= nbytes
            self._owned.pop(key, None)

    def owns(self, x: Any) -> bool:
        """Whether ``x`` (or the array it is a view of) is charged to this pool."""
        return isinstance(x, np.ndarray) and id(_root(x)) in self._owned

    def adopt(self, arr: Any) -> Any:
        """Charge ``arr``'s memory to the pool until it is freed. Views of owned arrays are free."""
        if not isinstance(arr, np.ndarray):
            return arr
        root = _root(arr)
        key = id(root)
        if key in self._owned:
            return arr
        nbytes = _owned_nbytes(root)
        self._charge(nbytes)
        self._owned[key] = nbytes
        weakref.finalize(root, self._release, key, nbytes)
        return arr

    def empty(self, shape: tuple[int, ...], dtype: Any, order: str = "F") -> np.ndarray:
        """Allocate an uninitialised array from the pool."""
        dt = np.dtype(dtype)
        count = math.prod(shape)  # Python ints: np.prod costs ~10 us a call
        nbytes = count * dt.itemsize
        self._charge(nbytes)  # raise before touching host memory
        try:
            lease = self.buffers.take(nbytes) if nbytes >= self.buffers.min_bytes else None
            if lease is None:
                arr = owner = np.empty(shape, dtype=dt, order=order)
            else:  # a reused buffer: every view of the array refers to the lease, which owns the memory
                arr = np.frombuffer(lease, dtype=dt, count=count).reshape(shape, order=order)
                owner = lease
        except BaseException:
            with self._lock:
                self._used -= nbytes
            raise
        key = id(owner)
        with self._lock:
            self._owned[key] = nbytes
        weakref.finalize(owner, self._release, key, nbytes)
        return arr


class EmulatedDevice(DeviceBase):
    """One emulated device: a pool, a speed, a host<->device bandwidth."""

    backend = "emulated"

    def __init__(self, spec: DeviceSpec) -> None:
        super().__init__()
        self.spec = spec
        self.pool = EmulatedPool(spec.memory, name=f"emulated device {spec.index}")
        self.bytes_h2d = 0
        self.bytes_d2h = 0
        self.busy_time = 0.0
        self.tasks = 0
        self._stats_lock = threading.Lock()
        self._clock = None

    # -- arrays -------------------------------------------------------------------------------
    @property
    def xp(self):
        return np

    def _transfer(self, nbytes: int, direction: str, started: float | None = None) -> None:
        """Count a copy of ``nbytes`` and make it last ``nbytes / bandwidth`` in all, as over a link of
        that bandwidth: ``started`` (``time.perf_counter()`` before the caller's own memory copy)
        makes the sleep the rest of that time, so the copy's CPU work is not counted twice."""
        with self._stats_lock:
            if direction == "h2d":
                self.bytes_h2d += nbytes
            else:
                self.bytes_d2h += nbytes
        if self.spec.bandwidth:
            rest = nbytes / self.spec.bandwidth - (0.0 if started is None else time.perf_counter() - started)
            if rest > 0:
                time.sleep(rest)

    def asarray(self, x: Any, order: str = "F") -> np.ndarray:
        """Copy host data onto the device in the given layout ("F" = feature-major for 2-D)."""
        x = np.asarray(x)
        out = self.with_room(x.nbytes, lambda: self.pool.empty(x.shape, x.dtype, order=order),
                             "a host->device copy")
        started = time.perf_counter()
        copy_into(out, x)
        self._transfer(out.nbytes, "h2d", started)
        return out

    def hand_over(self, x: Any, order: str = "F") -> np.ndarray:
        """``x`` itself when it is a writable NumPy array in the layout ("F" = feature-major for 2-D): it
        is charged to the pool and counted (and timed) as a host->device copy, without the copy (nor
        the page faults of fresh memory: 4 blocks of 30 MB took a worker 100-190 ms to copy on a
        2-core machine). Anything else is copied (:meth:`asarray`)."""
        if not (isinstance(x, np.ndarray) and x.flags.writeable
                and (x.flags.f_contiguous if order == "F" else x.flags.c_contiguous)):
            return self.asarray(x, order=order)
        started = time.perf_counter()
        out = self._adopt_array(x, "a host->device hand-over")
        self._transfer(x.nbytes, "h2d", started)
        return out

    def to_host(self, x: Any) -> np.ndarray:
        x = np.asarray(x)
        self._transfer(x.nbytes, "d2h")
        return x

    def _adopt_array(self, arr: np.ndarray, what: str) -> np.ndarray:
        """``arr`` charged to the pool (all of its root's memory), making room first when it does not fit."""
        return self.with_room(_owned_nbytes(_root(arr)), lambda: self.pool.adopt(arr), what)

    def adopt(self, result: Any) -> Any:
        """Charge a task's array results to this device's pool."""
        if isinstance(result, np.ndarray):
            return self._adopt_array(result, "a task result")
        if isinstance(result, (tuple, list)):
            for r in result:
                self.adopt(r)
        return result

    # -- execution ----------------------------------------------------------------------------
    def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``func`` as device work: timed, slowed down by ``1 / speed``, results pooled."""
        return self.adopt(self.compute(func, *args, **kwargs))

    def compute(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """:meth:`run` for results that go to the host: not charged to the device's pool."""
        t0 = time.perf_counter()
        result = func(*args, **kwargs)
        elapsed = time.perf_counter() - t0
        if self.spec.speed != 1.0:
            extra = elapsed * (1.0 / self.spec.speed - 1.0)
            if extra > 0:
                time.sleep(extra)
                elapsed += extra
        self._count(elapsed)
        return result

    def _count(self, elapsed: float) -> None:
        with self._stats_lock:
            self.busy_time += elapsed
            self.tasks += 1

    def kernel(self, work: float, compute: float = 1.0, bandwidth: float = 1.0, job: Any = None) -> float:
        """Run an emulated kernel of ``work`` device-seconds with demand ``(compute, bandwidth)``,
        contending with the kernels that share this device (see
        :class:`gdask._devices._contention.SharedClock`); returns the seconds it took."""
        clock = self.clock
        elapsed = clock.kernel(work, compute, bandwidth, job=job)
        self._count(elapsed)
        return elapsed

    @property
    def clock(self):
        """The device's :class:`~gdask._devices._contention.SharedClock` (made on first use)."""
        if self._clock is None:
            from gdask._devices._contention import SharedClock

            with self._stats_lock:
                if self._clock is None:
                    self._clock = SharedClock(speed=self.spec.speed)
        return self._clock

    def job_usage(self, job: Any = None) -> dict[str, float]:
        """Per-job device usage of emulated kernels (NVML's per-process utilisation, emulated)."""
        return self.clock.usage(job)

    def synchronize(self) -> None:
        """Emulated work is synchronous."""

    def memory_used(self) -> int:
        """Bytes charged to the device's pool."""
        return int(self.pool.used)

    def info(self) -> dict[str, Any]:
        return {
            **self.spec.to_dict(),
            "memory_used": self.pool.used,
            "memory_peak": self.pool.peak,
            "bytes_h2d": self.bytes_h2d,
            "bytes_d2h": self.bytes_d2h,
            "busy_time": self.busy_time,
            "tasks": self.tasks,
        }
