"""The prefetch thread of a window store: copies the blocks of the next predicted reads to the device
while the current ones compute.

:meth:`Prefetcher.plan` (called with the store's lock held, after reads and hints) asks the policy
which blocks come next, starts their loads (room and buffer, :meth:`Entries.begin_prefetch`) and
queues them; the thread does the copies one at a time (one copy engine), without the lock
(:func:`~gdask.window_cache._loads.complete_load`).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Hashable

from gdask.window_cache._entries import Entries, Entry
from gdask.window_cache._loads import complete_load

__all__ = ["Prefetcher"]

Key = Hashable


class Prefetcher:
    """The prefetch queue and thread of one store (the thread starts with the first prefetch).

    Parameters
    ----------
    entries : Entries
        The store's blocks; the queue is guarded by their lock.
    """

    def __init__(self, entries: Entries) -> None:
        self.entries = entries
        self.queue: deque[tuple[Key, Entry]] = deque()
        self.cond = threading.Condition(entries.lock)
        self.thread: threading.Thread | None = None
        self.closed = False

    def plan(self) -> None:
        """Start the loads of the next predicted reads that fit without evicting a block needed
        sooner, and queue their copies. Requires the store's lock held (never releases it)."""
        en = self.entries
        if not en.policy.prefetches or en.tier is None or self.closed:
            return
        if len(en.resident) == len(en.entries):  # everything is on the device
            return
        targets = en.policy.prefetch(
            lambda k: k in en.entries and (en.entries[k].device is not None or en.entries[k].inflight is not None))
        started = False
        for key, _ in targets:
            e = en.entries.get(key)
            if e is None:
                continue
            if not en.begin_prefetch(key, e):
                en.stats.add("prefetch_dropped")
                break  # later targets are needed even later: no room for them either
            e.prefetched = True
            en.stats.add("prefetches")
            self.queue.append((key, e))
            started = True
        if started:
            self._wake()
        en.sample()

    def load(self, key: Key, e: Entry) -> bool:
        """Queue the copy of block ``key`` (on the host) to the device when it fits in the window's
        room now, without evicting anything (a block that arrived from another worker); False when it
        does not fit (it stays on the host until a reader loads it). Requires the store's lock held."""
        en = self.entries
        if self.closed or en.tier is None or e.inflight is not None or e.device is not None or e.nbytes > en.room():
            return False
        ev = e.claim()
        if not en.allocate(e, en.host_value(e), ev):
            e.release_claim(ev)
            return False
        self.queue.append((key, e))
        self._wake()
        return True

    def _wake(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=_prefetch_loop, args=(weakref.ref(self),),
                                           name="gdask-window-prefetch", daemon=True)
            self.thread.start()
        self.cond.notify()

    def close(self) -> None:
        """Stop the thread (copies in progress finish). Takes the store's lock."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()


def _prefetch_loop(ref: weakref.ref) -> None:
    """The prefetch thread: copies queued blocks to the device, one at a time. Holds its prefetcher
    weakly, so it ends when the store is closed or garbage collected."""
    while True:
        prefetcher = ref()
        if prefetcher is None:
            return
        with prefetcher.cond:
            if not prefetcher.queue and not prefetcher.closed:
                prefetcher.cond.wait(timeout=1.0)
            if prefetcher.closed:
                return
            item = prefetcher.queue.popleft() if prefetcher.queue else None
        if item is not None:
            key, e = item
            try:
                complete_load(prefetcher.entries, key, e)
            except Exception:  # noqa: BLE001 - a failed prefetch leaves the block on the host;
                # the reader loads it on demand and sees any real error there
                with prefetcher.entries.locked():
                    prefetcher.entries.stats.add("prefetch_dropped")
            del key, e, item
        del prefetcher
