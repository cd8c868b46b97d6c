"""Where a computation finds its device and its per-process state.

On a gdask worker both belong to the worker's device plugin (``worker.plugins["gdask-device"]``:
its ``device`` and ``state``), so several workers in one process (``processes=False``, in-process
test clusters) each keep their own. Code that runs outside any gdask worker (the client process,
local threads without a cluster) uses one :class:`LocalContext` for the process, made on first use.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable

from gdask import protocol

__all__ = ["LocalContext", "SpareBuffers", "StateSpaces", "context", "current_device", "worker_state"]


class SpareBuffers:
    """Host buffers that finished computations gave back, for the next one to reuse instead of
    faulting fresh memory in (a cache: at most ``max_bytes`` kept; beyond it a buffer given back is
    let go).

    Parameters
    ----------
    max_bytes : int
    """

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = int(max_bytes)
        self._free: list = []
        self._lock = threading.Lock()

    def take(self, size: int, dtype: Any) -> Any:
        """A spare 1-D NumPy buffer of ``dtype`` with ``size`` to ``2 * size`` items, or None."""
        with self._lock:
            for i, buf in enumerate(self._free):
                if buf.dtype == dtype and size <= buf.size <= 2 * size:
                    return self._free.pop(i)
        return None

    def give(self, buf: Any) -> bool:
        """Keep ``buf`` (its holder must not use it any more) for a later :meth:`take`; whether kept."""
        with self._lock:
            if self.nbytes() + buf.nbytes > self.max_bytes:
                return False
            self._free.append(buf)
            return True

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._free)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


class StateSpaces:
    """Named dicts of per-computation state kept by one process (e.g. the bounds of the K-means
    blocks a worker holds, under the fit's token).

    A space is a cache: code that finds it empty recomputes what it needs. The oldest spaces are
    dropped beyond ``max_spaces``, so an interrupted computation that never drops its own cannot
    fill the process. :attr:`spares` keeps the buffers of finished states for the next ones
    (:class:`SpareBuffers`).

    Parameters
    ----------
    max_spaces : int
        Spaces kept at most (oldest dropped first).
    """

    def __init__(self, max_spaces: int = 16) -> None:
        if max_spaces < 1:
            raise ValueError(f"max_spaces must be >= 1, got {max_spaces}")
        self.max_spaces = int(max_spaces)
        self._spaces: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()
        self.spares = SpareBuffers()  # buffers the computations' states leave behind, for the next ones

    def get(self, token: str, create: bool = True) -> dict | None:
        """The space of ``token`` (made empty on first use unless ``create`` is False)."""
        with self._lock:
            space = self._spaces.get(token)
            if space is None and create:
                space = self._spaces[token] = {}
                while len(self._spaces) > self.max_spaces:
                    self._spaces.popitem(last=False)
            return space

    def drop(self, token: str) -> bool:
        """Forget the space of ``token``; whether there was one."""
        with self._lock:
            return self._spaces.pop(token, None) is not None

    def tokens(self) -> list[str]:
        """The tokens of the spaces kept now, oldest first."""
        with self._lock:
            return list(self._spaces)

    def __contains__(self, token: object) -> bool:
        return token in self._spaces

    def __len__(self) -> int:
        return len(self._spaces)


class LocalContext:
    """The device and state of code running outside gdask workers in this process.

    Parameters
    ----------
    make_device : callable
        ``make_device() -> device``, called on first use of :attr:`device`.
    key : callable, optional
        ``key() -> value`` of the settings the device is made from (the configured backend): when
        it changes, the next use of :attr:`device` makes a new device (so that
        ``dask.config.set({"gdask.backend": ...})`` applies to local computations too). None: the
        first device is kept.
    """

    def __init__(self, make_device: Callable[[], Any], key: Callable[[], Any] | None = None) -> None:
        self._make_device = make_device
        self._key = key
        self._made_for: Any = None
        self._device: Any = None
        self._lock = threading.Lock()
        self.state = StateSpaces()

    @property
    def device(self) -> Any:
        key = None if self._key is None else self._key()
        if self._device is None or key != self._made_for:
            with self._lock:
                if self._device is None or key != self._made_for:
                    self._device = self._make_device()
                    self._made_for = key
        return self._device


def _local_device() -> Any:
    from gdask._devices import make_device, make_specs

    return make_device(make_specs(1)[0])


def _local_key() -> Any:
    from gdask import config

    return config.backend()


#: the context of code outside gdask workers (one per process; workers keep theirs on their plugin)
_LOCAL = LocalContext(_local_device, key=_local_key)


def _running_worker() -> Any:
    """The distributed Worker whose task is running in this thread, else None."""
    try:
        from distributed.worker import get_worker
    except ImportError:  # pragma: no cover - distributed is a dependency
        return None
    try:
        return get_worker()
    except ValueError:
        return None


def context(worker: Any = None) -> Any:
    """The gdask context (``.device``, ``.state``) of ``worker`` (default: the worker running the
    calling task); outside gdask workers, the process's :class:`LocalContext`."""
    worker = worker if worker is not None else _running_worker()
    if worker is not None:
        plugin = worker.plugins.get(protocol.PLUGIN_DEVICE)
        if plugin is not None and getattr(plugin, "device", None) is not None:
            return plugin
    return _LOCAL


def current_device() -> Any:
    """The device the calling code computes on: its worker's device on a gdask worker, else a
    local device chosen from config (CUDA device 0 where CUDA is usable, else emulated)."""
    return context().device


def worker_state(token: str, create: bool = True) -> dict | None:
    """The calling process's (worker's) state space of computation ``token``
    (see :class:`StateSpaces`)."""
    return context().state.get(token, create=create)
