"""Reads of managed blocks, and the loads onto the device that may wait.

Every function here is called **without** the store's lock and takes it itself, around each step
(:meth:`Entries.locked`); waits for memory, waits for another reader's copy and host->device copies
run without it. After every step that ran without the lock the entry is checked again: it may have
been loaded, evicted or deleted meanwhile.

One load at a time owns an entry (:meth:`Entry.claim`, ``entry.inflight``): a second reader of
the same block, or the prefetch thread, waits for that load instead of starting another.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Hashable

from dask.utils import format_bytes

from gdask import config
from gdask.window_cache._entries import Entries, Entry, WindowCacheMemoryError
from gdask.window_cache._pins import Reader

__all__ = ["complete_load", "read"]

Key = Hashable

#: how long a demand load waits for device memory held by running tasks before the reader gets the
#: host copy (s): the reader runs on the worker's event loop, where a long wait would also keep
#: finished tasks from releasing their memory
WAIT_FOR_MEMORY = 0.5


def read(entries: Entries, prefetcher: Any, key: Key, reader: Reader | None) -> tuple[Any, str | None, int]:
    """The value of managed block ``key`` for ``reader``, what the read was (``"hit"``: on the
    device, ``"miss"``: copied for this read, by it or by a prefetch, None: the host copy) and the
    block's bytes.

    A block not on the device is copied there first (the reader waits: stall time), except for a
    transfer, which is sent from the host copy. ``KeyError`` when ``key`` is not managed.
    """
    with entries.locked():
        e = entries.entries[key]
        entries.stats.add("reads")
        if entries.policy.on_read(key):
            entries.stats.add("passes")
            entries.sample()
        if e.device is not None:
            value, kind = e.device, "hit"
            if e.prefetched:
                e.prefetched = False
                entries.stats.add("prefetch_hits")
                kind = "miss"
            else:
                entries.stats.add("hits")
            prefetcher.plan()
            return value, kind, e.nbytes
        if reader is not None and reader.kind == "task":
            entries.check_inputs(reader.task)
        if reader is not None and reader.kind == "transfer" and e.inflight is None:
            # to another worker: the host copy, without a copy to the device
            entries.stats.add("host_reads")
            value = entries.host_value(e)
            prefetcher.plan()
            return value, None, e.nbytes
    t0 = time.perf_counter()
    value = _wait_or_load(entries, key, e)
    with entries.locked():
        e.prefetched = False
        entries.stats.stall_time += time.perf_counter() - t0
        prefetcher.plan()
    return value, "miss", e.nbytes


def _wait_or_load(entries: Entries, key: Key, e: Entry) -> Any:
    """The device copy of a block not on the device: wait for the load that owns the entry, if any,
    else load it. Re-checked after every wait: the block may have been evicted again, and another
    reader's load may own the entry by then."""
    limit = float(config.get("timeouts.block-copy", 120))
    deadline = time.monotonic() + limit
    first = True
    while True:
        with entries.locked():
            if e.device is not None:
                if first:  # landed since read() looked (a prefetch's or another reader's copy)
                    entries.stats.add("prefetch_hits")
                return e.device
            if e.deleted:
                raise KeyError(key)
            ev = e.inflight
            owner = ev is None
            if owner:  # demand load: the reader waits for the copy
                if first:
                    entries.stats.add("misses")
                entries.check_fits(key, e.nbytes)
                ev = e.claim()
            elif first:  # a prefetch (or another reader) is copying it: wait for that copy
                entries.stats.add("prefetch_hits")
            first = False
        if owner:
            value = _demand_load(entries, key, e, ev)
            if value is not _EVICTED:
                return value
            continue  # evicted again before this reader took it (another reader needed the room)
        if not ev.wait(max(0.0, deadline - time.monotonic())):
            raise WindowCacheMemoryError(
                f"block {key!r} of {format_bytes(e.nbytes)}: its copy to the device did not finish within "
                f"{limit:g} s (gdask.timeouts.block-copy)")


def _demand_load(entries: Entries, key: Key, e: Entry, ev: threading.Event) -> Any:
    """Copy ``key`` to the device for a reader that owns its load (``ev``). When the device stays
    full of blocks that running tasks hold, the reader gets the host copy instead of an
    out-of-memory error (counted in ``host_reads``)."""
    try:
        allocated, host = _allocate(entries, key, e, ev)
    except BaseException:
        with entries.locked():
            e.release_claim(ev)
        raise
    if not allocated:  # no device memory came free in time
        return host
    del host
    complete_load(entries, key, e)
    with entries.locked():
        if e.device is not None:
            return e.device
        if e.deleted:  # deleted while it was copied
            raise KeyError(key)
        return _EVICTED  # landed, then evicted for another reader's load before this one took it


#: what :func:`_demand_load` returns when the block it landed was evicted before its reader took it
_EVICTED = object()


def _allocate(entries: Entries, key: Key, e: Entry, ev: threading.Event) -> tuple[bool, Any]:
    """Make room for ``e`` and allocate its device buffer (``e.pending``); returns ``(True, host
    value)`` when the copy may start, ``(False, host value)`` when no device memory came free within
    :data:`WAIT_FOR_MEMORY` (the claim is then released). Evicts whatever is needed: first blocks no running task holds
    (their memory is free at once), then once the others (their memory frees when their tasks end),
    and waits, without the lock, for that memory."""
    n = e.nbytes
    deadline = time.monotonic() + WAIT_FOR_MEMORY
    host = None
    evicted_busy = False
    while True:
        with entries.locked():
            if e.deleted:
                e.release_claim(ev)
                raise KeyError(key)
            if host is None:
                entries.make_room(n, before=None, protect={key}, job=e.job)
                host = entries.host_value(e)
            if entries.allocate(e, host, ev):
                return True, host
            if entries.evict_bytes(n, job=e.job, free_now=True):
                continue  # blocks no task holds: their memory is free at once
            if not evicted_busy:  # blocks that running tasks hold free their memory when those end
                evicted_busy = bool(entries.evict_bytes(n, job=e.job))
            if time.monotonic() > deadline:  # the device stays full of blocks in use: the host copy
                entries.stats.add("host_reads")
                e.release_claim(ev)
                return False, host
        time.sleep(0.005)


def complete_load(entries: Entries, key: Key, e: Entry) -> None:
    """The host->device copy of a load whose buffer was allocated (``e.pending``), without the lock;
    then the block lands on the device. Called once per load, by its owner (a reader or the prefetch
    thread)."""
    with entries.locked():
        pending = e.pending
    if pending is None:  # this load already landed (another owner completed it)
        return
    dev, host, _ = pending
    try:
        entries.tier.copy_to_device(dev, host)
    except BaseException:
        with entries.locked():
            entries.land(key, e, ok=False, pending=pending)
        raise
    del dev, host
    with entries.locked():
        entries.land(key, e, ok=True, pending=pending)
