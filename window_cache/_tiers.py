"""Device adapters of the window cache: what is a device array, how much memory is free, and the
copies between the device tier and the host tier (and the optional disk tier).

Emulated devices: the device tier is NumPy arrays charged to the device's ``EmulatedPool``; the
host tier is plain NumPy not charged to it; copies go through ``device.asarray`` /
``device.to_host`` (which sleep ``nbytes / bandwidth`` and count bytes when a bandwidth is set).

Strict emulated devices (``emulated-strict``): the device tier is ``array_api_strict`` arrays on the
device, charged to its pool per array object; copies go through the device's pool and
``device.to_host`` (a NumPy copy), never through NumPy on a device array.

CUDA: CuPy arrays in the worker's (RMM) pool; the host tier is pinned memory; copies run on the
stream of the thread that does them (the prefetch thread has its own: a copy stream). Memory in use
is what the device reports (RMM's statistics of its own pool, see ``CudaDevice.memory_used``), not
the driver's count, which includes the pool's reservation. CuPy is imported only when a CUDA device
is bound. This path cannot be tested without a GPU.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import uuid
from typing import Any

import numpy as np

__all__ = ["DiskTier", "device_tier"]


def _root(arr: np.ndarray) -> np.ndarray:
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


def _order(x: Any) -> str:
    return "F" if getattr(x, "ndim", 0) >= 2 and x.flags.f_contiguous and not x.flags.c_contiguous else "C"


def _time_major(x: Any) -> bool:
    """A 3-D sequence block stored time-major: a ``(rows, T, f)`` view of ``(T, rows, f)`` C-order memory
    (GDataSet's layout for sequences), which a copy must keep."""
    return getattr(x, "ndim", 0) == 3 and not x.flags.c_contiguous and x.transpose(1, 0, 2).flags.c_contiguous


def _empty_like(empty: Any, host: Any) -> Any:
    """``empty(shape, dtype, order)`` for a buffer with ``host``'s shape and layout."""
    if _time_major(host):
        return empty(host.transpose(1, 0, 2).shape, host.dtype, "C").transpose(1, 0, 2)
    return empty(host.shape, host.dtype, _order(host))


class EmulatedTier:
    """The device tier of an ``EmulatedDevice``."""

    backend = "emulated"

    def __init__(self, device: Any) -> None:
        self.device = device
        self.pool = device.pool

    @property
    def budget(self) -> int:
        return int(self.pool.budget)

    @property
    def used(self) -> int:
        return int(self.pool.used)

    def owns(self, x: Any) -> bool:
        """Whether ``x`` is a device array (charged to this device's pool)."""
        return isinstance(x, np.ndarray) and bool(self.pool.owns(x))

    def alloc(self, host: np.ndarray) -> np.ndarray:
        """A device buffer for ``host`` (same shape, dtype, layout), charged to the pool now;
        raises ``DeviceMemoryError`` when the pool has no room."""
        return _empty_like(lambda shape, dtype, order: self.pool.empty(shape, dtype, order=order), host)

    def copy_to_device(self, dev: np.ndarray, host: np.ndarray) -> None:
        """Fill ``dev`` from ``host``: the host->device copy (nbytes / bandwidth in all)."""
        started = time.perf_counter()
        dev[...] = host
        transfer = getattr(self.device, "_transfer", None)
        if transfer is not None:
            transfer(dev.nbytes, "h2d", started)
        else:  # pragma: no cover - an emulated device without the transfer model
            self.device.bytes_h2d += dev.nbytes

    def to_host(self, dev: np.ndarray) -> np.ndarray:
        """A host copy of ``dev`` not charged to the pool (sleeps nbytes / bandwidth)."""
        out = self.device.to_host(dev)
        if isinstance(out, np.ndarray) and _root(out) is _root(dev):
            out = np.copy(out, order="K")  # the emulated "copy" returns the same memory
        return out


class StrictTier(EmulatedTier):
    """The device tier of a ``StrictDevice``: strict arrays on the device, charged to its pool."""

    backend = "emulated-strict"

    def owns(self, x: Any) -> bool:
        """Whether ``x`` is a strict array of this device's pool."""
        return bool(self.pool.owns(x))

    def alloc(self, host: np.ndarray) -> Any:
        """A device buffer for ``host`` (same shape and dtype), charged to the pool now; raises
        ``DeviceMemoryError`` when the pool has no room."""
        return self.pool.empty(host.shape, host.dtype)

    def copy_to_device(self, dev: Any, host: np.ndarray) -> None:
        """Fill ``dev`` from ``host``: the host->device copy (nbytes / bandwidth in all)."""
        xp = self.pool.xp
        started = time.perf_counter()
        dev[...] = xp.asarray(np.asarray(host), device=self.pool.device)
        self.device._transfer(int(host.nbytes), "h2d", started)

    def to_host(self, dev: Any) -> np.ndarray:
        """A NumPy copy of ``dev`` not charged to the pool (sleeps nbytes / bandwidth)."""
        return self.device.to_host(dev)


class CudaTier:
    """The device tier of a ``CudaDevice``: CuPy arrays, pinned host buffers (untested here)."""

    backend = "cuda"

    def __init__(self, device: Any) -> None:
        import cupy

        self.device = device
        self._cp = cupy
        self._lock = threading.Lock()

    @property
    def budget(self) -> int:
        return int(self.device.spec.memory)

    @property
    def used(self) -> int:
        """Device memory in use by this worker, as its device counts it: the bytes allocated from its
        RMM pool (RMM's statistics), not the pool's reservation (see ``CudaDevice.memory_used``)."""
        return int(self.device.memory_used())

    def owns(self, x: Any) -> bool:
        return isinstance(x, self._cp.ndarray)

    def alloc(self, host: Any) -> Any:
        """A device buffer for ``host``; CuPy's / RMM's out-of-memory errors raise DeviceMemoryError."""
        def empty():
            with self.device.device:
                return _empty_like(lambda shape, dtype, order: self._cp.empty(shape, dtype=dtype, order=order), host)

        return self.device.translate_oom(empty)

    def copy_to_device(self, dev: Any, host: Any) -> None:
        """Host (pinned) -> device copy on this thread's stream: the prefetch thread has its own
        stream, so copies overlap the compute streams."""
        stream = self.device.stream()
        with self.device.device:
            if _time_major(dev):  # CuPy sets contiguous arrays only: copy the (T, rows, f) views
                dev.transpose(1, 0, 2).set(host.transpose(1, 0, 2), stream=stream)
            else:
                dev.set(host, stream=stream)
            stream.synchronize()
        with self.device._stats_lock:
            self.device.bytes_h2d += dev.nbytes

    def to_host(self, dev: Any) -> Any:
        """Copy into pinned host memory on this thread's stream (pageable if pinning fails)."""
        import cupyx

        if _time_major(dev):  # copy the contiguous (T, rows, f) view; the host copy keeps the layout
            return self.to_host(dev.transpose(1, 0, 2)).transpose(1, 0, 2)
        try:
            out = cupyx.empty_pinned(dev.shape, dtype=dev.dtype, order=_order(dev))
        except Exception:  # noqa: BLE001 - pinned memory exhausted: pageable copy
            return self.device.to_host(dev)
        stream = self.device.stream()
        with self.device.device:
            dev.get(out=out, stream=stream)
            stream.synchronize()
        with self.device._stats_lock:
            self.device.bytes_d2h += dev.nbytes
        return out


def device_tier(device: Any):
    """The tier adapter for a gdask device (``None`` for ``None``)."""
    if device is None:
        return None
    backend = getattr(device, "backend", None)
    if backend == "cuda":
        return CudaTier(device)
    if backend == "emulated-strict":
        return StrictTier(device)
    return EmulatedTier(device)


class DiskTier:
    """Host blocks written to files in ``directory`` (pickle protocol 5, one file per block)."""

    def __init__(self, directory: str) -> None:
        self.directory = os.path.join(directory, f"gdask-window-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.makedirs(self.directory, exist_ok=True)
        self.bytes_written = 0
        self.bytes_read = 0

    def write(self, value: Any) -> str:
        path = os.path.join(self.directory, uuid.uuid4().hex)
        with open(path, "wb") as f:
            pickle.dump(value, f, protocol=5)
        self.bytes_written += int(getattr(value, "nbytes", 0))
        return path

    def read(self, path: str) -> Any:
        with open(path, "rb") as f:
            value = pickle.load(f)
        self.bytes_read += int(getattr(value, "nbytes", 0))
        return value

    def delete(self, path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
