"""What every device backend shares: making room in device memory when an allocation fails.

A device keeps a list of *reclaimers*, callables ``reclaim(nbytes, device) -> bytes freed`` (the
window cache of the worker's data store registers one: it moves cached blocks to the host). Any
allocation that does not fit, on any backend, asks them for room and is retried once
(:meth:`DeviceBase.with_room`); if it still does not fit, the error names the sizes.
"""

from __future__ import annotations

import gc
import threading
import time
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

    def room_for(self, requested: int | None) -> int:
        """Bytes to ask the reclaimers for when an allocation of ``requested`` bytes did not fit.

        The request, plus as much again (at most a 32nd of the device) as a margin: a task that
        failed on one allocation usually makes more of its kind (outputs, temporaries of the same
        shape), and a pool needs some slack to find one contiguous block. An error that does not
        say its size asks for an eighth of the device.
        """
        if not requested or requested <= 0:
            return max(1, self.budget // 8)
        return max(1, min(self.budget, int(requested) + min(int(requested), self.budget // 32)))

    def with_room(self, nbytes: int | None, alloc: Callable[[], T], what: str = "an allocation") -> T:
        """``alloc()``; when it raises :class:`~gdask.DeviceMemoryError`, ask the reclaimers for
        ``nbytes`` and retry; while they can free nothing, wait for memory that running tasks hold
        (at most config ``gdask.timeouts.memory`` seconds) and retry. The final error says what
        was asked, what is in use and where the memory is (the reclaimers' reports).

        ``nbytes=None``: the size is not known in advance (a task's device work); each failure asks
        for :meth:`room_for` the allocation that failed (the error's ``requested`` bytes).

        No exception is kept across the retries (only its message and size): an exception held in a
        local makes a cycle with this frame, which would keep ``alloc``'s arrays charged until the
        garbage collector runs."""
        try:
            return alloc()
        except DeviceMemoryError as e:
            asked = nbytes if nbytes is not None else getattr(e, "requested", None)
            if asked is not None and asked > self.budget:
                raise DeviceMemoryError(f"{e} ({what}; larger than the whole device)") from None
            need = nbytes if nbytes is not None else self.room_for(asked)
            last = str(e)
        from gdask import config

        limit = float(config.get("timeouts.memory", 5))
        deadline = time.monotonic() + limit
        freed = 0
        pause = 0.002
        collected = False
        while True:
            got = self.reclaim(need)
            freed += got
            try:
                return alloc()
            except DeviceMemoryError as e:
                last = str(e)
                if nbytes is None:
                    need = self.room_for(getattr(e, "requested", None))
            if got > 0:
                continue
            if not collected:  # arrays kept only by reference cycles (e.g. tracebacks) hold memory too
                collected = True
                gc.collect()
                continue
            if time.monotonic() >= deadline:  # nothing more to move off: running tasks hold the memory
                break
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        reports = [r() for r in (getattr(getattr(f, "__self__", None), "memory_report", None)
                                 for f in self.reclaimers()) if r is not None]
        raise DeviceMemoryError(
            f"{last} ({what} needing {format_bytes(need)}; {format_bytes(freed)} were moved off the device and it "
            f"still did not fit after {limit:g} s (gdask.timeouts.memory)" + "".join(f"; {r}" for r in reports) + ")"
        )

    def hand_over(self, x: Any, order: str = "F") -> Any:
        """Host data that nothing else holds or writes (a block just read from its file) onto the device,
        as :meth:`asarray` copies it; a device whose memory is the host's keeps it without a copy."""
        return self.asarray(x, order=order)  # type: ignore[attr-defined]

    # -- memory -----------------------------------------------------------------------------------
    @property
    def budget(self) -> int:
        """Bytes of device memory this (logical) device may use."""
        return int(self.spec.memory)  # type: ignore[attr-defined]
