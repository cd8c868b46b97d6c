"""What every device backend shares: making room in device memory when an allocation fails.

A device keeps a list of *reclaimers*, callables ``reclaim(nbytes, device) -> bytes freed`` (the
window cache of the worker's data store registers one: it moves cached blocks to the host). Any
allocation that does not fit, on any backend, asks them for room and is retried once
(:meth:`DeviceBase.with_room`); if it still does not fit, the error names the sizes.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, TypeVar

from dask.utils import format_bytes

from gdask._errors import DeviceMemoryError

__all__ = ["DeviceBase"]

T = TypeVar("T")


class DeviceBase:
    """Reclaimers and the allocate-or-make-room-and-retry rule, shared by all backends."""

    def __init__(self) -> None:
        self._reclaimers: list[Any] = []  # weak references: a reclaimer does not keep its owner alive
        self._reclaim_lock = threading.Lock()

    # -- reclaimers ----------------------------------------------------------------------------------
    @staticmethod
    def _ref(func: Callable) -> Any:
        return weakref.WeakMethod(func) if hasattr(func, "__self__") else weakref.ref(func)

    def add_reclaimer(self, func: Callable[[int, Any], int]) -> None:
        """Let ``func(nbytes, device)`` free device memory when an allocation does not fit. Held
        weakly: a window store that is dropped stops being asked."""
        with self._reclaim_lock:
            if func not in self.reclaimers():
                self._reclaimers = [*self._reclaimers, self._ref(func)]

    def remove_reclaimer(self, func: Callable[[int, Any], int]) -> None:
        with self._reclaim_lock:
            self._reclaimers = [r for r in self._reclaimers if r() is not None and r() != func]

    def reclaimers(self) -> list[Callable[[int, Any], int]]:
        """The reclaimers still alive, in the order they were added."""
        return [f for f in (r() for r in self._reclaimers) if f is not None]

    def reclaim(self, nbytes: int) -> int:
        """Ask the reclaimers to free ``nbytes`` of this device; the bytes they freed."""
        freed = 0
        for func in self.reclaimers():
            if freed >= nbytes:
                break
            freed += int(func(nbytes - freed, self) or 0)
        return freed

    def with_room(self, nbytes: int, alloc: Callable[[], T], what: str = "an allocation") -> T:
        """``alloc()``; when it raises :class:`~gdask.DeviceMemoryError`, ask the reclaimers for
        ``nbytes`` and retry once. The final error says what was asked, what is in use and what the
        reclaimers could free."""
        try:
            return alloc()
        except DeviceMemoryError as first:
            freed = self.reclaim(nbytes) if nbytes <= self.budget else 0
            if freed <= 0:
                raise DeviceMemoryError(f"{first} ({what}; nothing could be moved off the device)") from first
        try:
            return alloc()
        except DeviceMemoryError as second:
            raise DeviceMemoryError(
                f"{second} ({what} of {format_bytes(nbytes)}; {format_bytes(freed)} were moved off the device "
                "and it still does not fit)"
            ) from second

    # -- memory -----------------------------------------------------------------------------------
    @property
    def budget(self) -> int:
        """Bytes of device memory this (logical) device may use."""
        return int(self.spec.memory)  # type: ignore[attr-defined]
