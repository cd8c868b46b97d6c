"""Strict emulated devices (backend ``"emulated-strict"``): emulated devices whose blocks are
``array_api_strict`` arrays on a non-CPU device.

Everything an :class:`~gdask._devices._emulated.EmulatedDevice` models (the byte budget and its
out-of-memory error, speed, host<->device bandwidth, contention) is the same. What changes is the
arrays: like CuPy arrays, strict arrays refuse to mix with NumPy arrays (``TypeError``), to be
converted to NumPy implicitly (``np.asarray`` raises) and to meet arrays of another device, and they
offer only the array API standard (no ``.sum()`` method, no ``numpy.add.at``). So code that works on
this backend does not silently mix host and device data, and moves data between them through the
device API (:meth:`StrictDevice.asarray`, :meth:`StrictDevice.to_host`) as the CUDA backend must:
this is how a machine without a GPU checks the logic of the CUDA path.

Strict arrays have no ``.base`` chain: the pool charges every array object it adopts by its own
size, and releases it when that object is garbage collected (a weak reference's finalizer), so
views are charged as copies.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from typing import Any

import numpy as np

from gdask._devices._arrays import numpy_dtype, to_numpy
from gdask._devices._buffers import copy_into
from gdask._devices._emulated import EmulatedDevice, EmulatedPool
from gdask._devices._spec import DeviceSpec

__all__ = ["STRICT_DEVICE", "StrictDevice", "StrictPool", "is_strict", "register_dask"]

#: the array_api_strict device name of every strict emulated device (not the CPU device). All
#: workers use the same one: a block unpickled on another worker lands on that worker's device, as
#: a CuPy array does on the receiving worker's GPU
STRICT_DEVICE = "device1"

_registered = threading.Lock()
_done: list[bool] = []


def _xps():
    import array_api_strict

    return array_api_strict


def is_strict(x: Any) -> bool:
    """Whether ``x`` is an ``array_api_strict`` array."""
    return type(x).__module__.split(".")[0] == "array_api_strict"


def strict_nbytes(x: Any) -> int:
    """Bytes of a strict array's elements."""
    return int(math.prod(x.shape)) * numpy_dtype(x.dtype).itemsize


def register_dask() -> None:
    """Teach dask's ``sizeof`` the size of strict arrays (the worker's memory accounting and the window
    cache size blocks with it). Idempotent."""
    with _registered:
        if _done:
            return
        from dask.sizeof import sizeof

        sizeof.register(type(_xps().empty(0)))(strict_nbytes)
        _done.append(True)


class StrictPool(EmulatedPool):
    """An :class:`EmulatedPool` for ``array_api_strict`` arrays, charged per array object."""

    def __init__(self, budget: int, name: str = "emulated-strict device") -> None:
        super().__init__(budget, name)
        xps = _xps()
        self.xp = xps
        self.device = xps.Device(STRICT_DEVICE)

    def owns(self, x: Any) -> bool:
        """Whether ``x`` is a strict array charged to this pool."""
        return is_strict(x) and id(x) in self._owned

    def _register(self, arr: Any, nbytes: int) -> Any:
        key = id(arr)
        with self._lock:
            self._owned[key] = nbytes
        weakref.finalize(arr, self._release, key, nbytes)
        return arr

    def adopt(self, arr: Any) -> Any:
        """Charge a strict array to the pool until it is freed (NumPy arrays: as the emulated pool)."""
        if isinstance(arr, np.ndarray):
            return super().adopt(arr)
        if not is_strict(arr) or id(arr) in self._owned:
            return arr
        nbytes = strict_nbytes(arr)
        self._charge(nbytes)
        return self._register(arr, nbytes)

    def empty(self, shape: tuple[int, ...], dtype: Any, order: str = "F") -> Any:
        """An uninitialised (zeroed) strict array on the device, charged to the pool. Strict arrays
        have no layout in the standard; underneath, their NumPy data takes ``order`` as the emulated
        device's does, so both backends round reductions alike (the same bits)."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize  # as the emulated pool counts it
        self._charge(nbytes)  # raise before allocating
        try:
            arr = self.xp.asarray(np.zeros(tuple(shape), dtype=dt, order=order), device=self.device)
        except BaseException:
            with self._lock:
                self._used -= nbytes
            raise
        return self._register(arr, nbytes)

    def copy_of(self, host: np.ndarray, order: str = "K") -> Any:
        """A strict device array with the values of host array ``host``, charged to the pool (its
        NumPy data in ``order``, as :meth:`empty`)."""
        nbytes = int(host.nbytes)
        self._charge(nbytes)
        try:
            data = np.empty_like(host, order=order)
            copy_into(data, host)  # rows into feature-major memory in tiles; any other copy as it is
            arr = self.xp.asarray(data, device=self.device)
        except BaseException:
            with self._lock:
                self._used -= nbytes
            raise
        return self._register(arr, nbytes)


class StrictDevice(EmulatedDevice):
    """An emulated device whose arrays are ``array_api_strict`` arrays on a non-CPU device.

    Same budget, speed, bandwidth and out-of-memory behaviour as :class:`EmulatedDevice`; host data
    reaches the device only through :meth:`asarray` and leaves it only through :meth:`to_host`.
    """

    backend = "emulated-strict"

    def __init__(self, spec: DeviceSpec) -> None:
        super().__init__(spec)
        self.pool = StrictPool(spec.memory, name=f"emulated-strict device {spec.index}")
        self._xps = self.pool.xp
        #: the ``array_api_strict.Device`` every array of this device is on
        self.array_device = self.pool.device
        register_dask()

    @property
    def xp(self):
        return self._xps

    def asarray(self, x: Any, order: str = "F") -> Any:
        """Copy host data (a NumPy array, or anything ``numpy.asarray`` takes) onto the device; a strict
        array of this device is copied on the device. ``order`` is the layout of the NumPy data
        underneath, as on the emulated device ("F" = feature-major for 2-D): the same rounding."""
        if is_strict(x):
            x = to_numpy(x)  # another strict device (or the CPU device): through the host, explicitly
        host = np.asarray(x)
        started = time.perf_counter()
        out = self.with_room(host.nbytes, lambda: self.pool.copy_of(host, order), "a host->device copy")
        self._transfer(host.nbytes, "h2d", started)
        return out

    def hand_over(self, x: Any, order: str = "F") -> Any:
        """A strict device copies host data in every case (:meth:`asarray`)."""
        return self.asarray(x, order=order)

    def to_host(self, x: Any) -> Any:
        """A NumPy copy of a device array (sleeps ``nbytes / bandwidth``); host data is returned as is."""
        if not is_strict(x):
            return x
        started = time.perf_counter()
        out = to_numpy(x)
        self._transfer(int(out.nbytes), "d2h", started)
        return out

    def adopt(self, result: Any) -> Any:
        """Charge a task's strict array results to this device's pool (host results are not)."""
        if is_strict(result):
            return self.with_room(strict_nbytes(result), lambda: self.pool.adopt(result), "a task result")
        if isinstance(result, (tuple, list)):
            for r in result:
                self.adopt(r)
        return result
