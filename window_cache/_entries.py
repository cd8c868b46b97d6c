"""The managed blocks of a window store and their moves between tiers (device, host, disk).

:class:`Entries` holds every managed block (an :class:`Entry`: its device array, host copy, disk file,
the load in flight) and does the moves that need no waiting: evictions to the host (and on to disk),
room for a new block, per-job quota enforcement, the allocation that starts a load, and the landing
of a finished copy.

Lock rules
----------
``Entries.lock`` guards every field of :class:`Entries` and of its entries, the quota, the pins and
the store's counters. Every method of :class:`Entries` **requires the lock held by its caller and
never releases it**: no waits and no host->device copies happen inside (device->host copies of
evictions do: an eviction is atomic with its bookkeeping). Waiting for memory or for another
reader's copy, and the copies to the device, are done by :mod:`gdask.window_cache._loads` and the
prefetch thread, which take the lock around each step and re-check the entry after every step. The
lock is not re-entrant: code that holds it calls no function that takes it.

Take the lock with :meth:`Entries.locked`: it also calls the eviction hooks gathered meanwhile, once
the lock is released.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Hashable

import numpy as np
from dask.utils import format_bytes

from gdask import DeviceMemoryError
from gdask.window_cache._pins import Pins
from gdask.window_cache._quota import JobQuota
from gdask.window_cache._stats import StoreStats
from gdask.window_cache._tiers import DiskTier

__all__ = ["Entries", "Entry", "State", "WindowCacheMemoryError", "aligned"]

Key = Hashable


class WindowCacheMemoryError(DeviceMemoryError):
    """A block cannot be brought onto the device: it is larger than the window's budget, or the
    memory it needs stays held by others."""


class State(str, Enum):
    """Where a managed block is. A block on the device may also keep a host copy."""

    DEVICE = "device"
    HOST = "host"
    DISK = "disk"
    IN_FLIGHT = "in-flight"


@dataclass
class Entry:
    """One managed block."""

    nbytes: int
    device: Any = None
    host: Any = None
    disk: str | None = None
    pending: Any = None  # (device buffer being filled, its host source, the load's event) while copied
    inflight: threading.Event | None = None  # set while one load (demand or prefetch) owns the entry
    prefetched: bool = False  # brought by a prefetch and not read since
    deleted: bool = False
    job: str | None = None  # the gdask.job the block belongs to (its memory request is enforced here)

    @property
    def state(self) -> State:
        if self.device is not None:
            return State.DEVICE
        if self.inflight is not None:
            return State.IN_FLIGHT
        if self.host is not None:
            return State.HOST
        return State.DISK

    def claim(self) -> threading.Event:
        """Make the caller the owner of this block's load (no other load starts until it ends);
        requires the store's lock held."""
        ev = threading.Event()
        self.inflight = ev
        return ev

    def release_claim(self, ev: threading.Event) -> None:
        """The owner of this block's load gives up (nothing was copied); readers waiting for it go
        on. Requires the store's lock held."""
        if self.inflight is ev:
            self.inflight = None
        ev.set()


def aligned(value: Any) -> Any:
    """An array as its own aligned copy when its data is not aligned to its item size (data received
    from another worker is deserialized at any offset of the message's buffer). NumPy computes on
    misaligned arrays without BLAS, summing in another order: the same block would give other bits
    depending on where it was computed (placement must not change results)."""
    if isinstance(value, np.ndarray) and not value.flags.aligned:
        return np.copy(value, order="K")
    return value


class _Locked:
    """The context manager of :meth:`Entries.locked`."""

    __slots__ = ("entries",)

    def __init__(self, entries: Entries) -> None:
        self.entries = entries

    def __enter__(self) -> Entries:
        self.entries.lock.acquire()
        return self.entries

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.entries._release(hooks=exc_type is None)


class Entries:
    """The managed blocks of one store, and the moves between tiers that need no waiting.

    Every method but :meth:`locked` (which takes it) requires :attr:`lock` held and never releases
    it (see the module's lock rules).

    Parameters
    ----------
    policy : eviction policy (``on_insert``, ``on_read``, ``on_remove``, ``hint``, ``victims``, ``prefetch``)
    size_policy : :class:`~gdask.window_cache.WindowSize`
    host_copy : bool
        Keep a block's host copy while it is on the device.
    host_memory_limit : int or None
        Bytes of host copies kept before the furthest-needed go to disk (with ``disk_dir``).
    disk_dir : str or None
        Directory of the disk tier.
    stats : StoreStats
    on_evict : callable, optional
        ``on_evict(key, nbytes)``, called after the lock is released (:meth:`locked`).
    """

    def __init__(self, policy: Any, size_policy: Any, *, host_copy: bool, host_memory_limit: int | None,
                 disk_dir: str | None, stats: StoreStats, on_evict: Callable | None = None) -> None:
        self.lock = threading.Lock()
        self.policy = policy
        self.size_policy = size_policy
        self.host_copy = host_copy
        self.host_memory_limit = host_memory_limit
        self.disk_dir = disk_dir
        self.disk: DiskTier | None = None
        self.stats = stats
        self.on_evict = on_evict
        self.tier: Any = None  # the device tier adapter, bound by the store
        self.quota = JobQuota()
        self.pins = Pins()
        self.entries: dict[Key, Entry] = {}
        self.resident: dict[Key, int] = {}  # blocks on the device -> bytes
        self.resident_bytes = 0
        self.inflight_bytes = 0
        self.host_bytes = 0
        self.largest = 0
        self.draining: list[tuple[Any, int]] = []  # (weak reference, bytes) of evicted device arrays
        self.checked: Any = None  # the last task whose inputs were checked (check_inputs)
        self._hooks: list[tuple[Callable, Key, int]] = []
        self._locked = _Locked(self)

    def locked(self) -> _Locked:
        """``with entries.locked() as en:`` holds the lock; on release, calls the eviction hooks of
        what was evicted meanwhile (a plain object, not a generator: every read takes it several
        times)."""
        return self._locked

    def _release(self, hooks: bool) -> None:
        """Release the lock, then call the eviction hooks gathered meanwhile (dropped, with ``hooks``
        false: the body raised)."""
        calls, self._hooks = self._hooks, []
        self.lock.release()
        if hooks:
            for hook, key, nbytes in calls:
                hook(key, nbytes)

    # -- the set of blocks ------------------------------------------------------------------------
    def add(self, key: Key, value: Any, nbytes: int, job: str | None) -> None:
        """A new block on the device; then a job over its request spills its own blocks, and the
        window gets back within its room (the new block may itself go to the host)."""
        e = Entry(nbytes=nbytes, device=value, job=job)
        self.entries[key] = e
        self.add_resident(key, e)
        self.largest = max(self.largest, nbytes)
        self.policy.on_insert(key)
        self.enforce_job(job)
        self.fit(protect=(), job=job)
        self.sample()

    def add_host(self, key: Key, host: Any, nbytes: int, job: str | None) -> Entry:
        """A new block on the host (one that arrived from another worker); the caller may start its
        load onto the device (:meth:`Prefetcher.load`)."""
        e = Entry(nbytes=nbytes, host=host, job=job)
        self.entries[key] = e
        self.host_bytes += nbytes
        self.largest = max(self.largest, nbytes)
        self.policy.on_insert(key)
        self.spill_host()
        self.sample()
        return e

    def pop(self, key: Key) -> Entry:
        """Forget ``key`` (``KeyError`` when it is not managed): its device, host and disk copies."""
        e = self.entries.pop(key)
        e.deleted = True
        self.policy.on_remove(key)
        if key in self.resident:
            self.remove_resident(key, e)
            e.device = None
        self.drop_lower_tiers(e)
        return e

    def add_resident(self, key: Key, e: Entry) -> None:
        self.resident[key] = e.nbytes
        self.resident_bytes += e.nbytes
        self.quota.add(e.job, e.nbytes)

    def remove_resident(self, key: Key, e: Entry) -> None:
        del self.resident[key]
        self.resident_bytes -= e.nbytes
        self.quota.remove(e.job, e.nbytes)

    def in_use(self, key: Key) -> bool:
        """Whether a running task holds ``key`` on the device (evicting it frees nothing until then)."""
        return self.pins.count(key) > 0 and key in self.resident

    # -- room ---------------------------------------------------------------------------------------
    def draining_bytes(self) -> int:
        """Bytes of evicted device arrays not freed yet (a reader still holds them): the memory comes
        back when the last reader drops them."""
        alive = []
        total = 0
        for ref, n in self.draining:
            if ref() is not None:
                alive.append((ref, n))
                total += n
        self.draining = alive
        return total

    def held(self) -> int:
        """Device bytes the window holds: blocks on the device, copies in flight, evicted arrays not freed yet."""
        return self.resident_bytes + self.inflight_bytes + self.draining_bytes()

    def room(self) -> int:
        """Device bytes the window may still fill without eating into the reserve. Evicted blocks
        that readers still hold count as free: they are, once those readers are done (evicting more
        blocks instead would cost hits); an allocation that finds them not yet freed is retried
        later (prefetch) or waits (demand load)."""
        t = self.tier
        return t.budget - self.size_policy.reserve_bytes(t.budget, self.largest) - t.used + self.draining_bytes()

    def capacity(self) -> int:
        """Bytes the window may hold now (follows free device memory; 0 without a device)."""
        if self.tier is None:
            return 0
        return self.size_policy.capacity(budget=self.tier.budget, used=self.tier.used, held=self.held(),
                                         largest=self.largest)

    def sample(self) -> None:
        """Record the window size (when it changed)."""
        if self.tier is not None:
            self.stats.sample(self.capacity(), self.resident_bytes + self.inflight_bytes, len(self.resident))

    # -- eviction -----------------------------------------------------------------------------------
    def evictable(self, protect, *, job: str | None = None, free_now: bool = False) -> dict[Key, int]:
        """Blocks on the device that may be evicted to make room for ``job``: never those in
        ``protect`` or of another job within its request; with ``free_now`` none a running task
        holds (evicting it would free nothing now). May be :attr:`resident` itself (read it before
        evicting)."""
        keep = self.quota.protected(job)
        if not keep and not free_now:  # the common case: no copy when nothing is protected (a prefetch
            # protects the block it loads, which is not on the device)
            resident = self.resident
            if not any(k in resident for k in protect):
                return resident
            return {k: n for k, n in resident.items() if k not in protect}
        out = {}
        for k, n in self.resident.items():
            if k in protect:
                continue
            e = self.entries[k]
            if e.job is not None and e.job in keep:
                continue
            if free_now and self.pins.count(k):
                continue
            out[k] = n
        return out

    def evict(self, key: Key) -> int:
        """Move ``key`` from the device to the host (copying it back unless a host or disk copy is
        kept); returns its bytes."""
        e = self.entries[key]
        dev = e.device
        if e.host is None and e.disk is None:
            e.host = self.tier.to_host(dev)
            self.host_bytes += e.nbytes
            self.stats.add("bytes_d2h", e.nbytes)
        self.remove_resident(key, e)
        e.device = None
        e.prefetched = False
        try:
            self.draining.append((weakref.ref(dev), e.nbytes))
        except TypeError:  # an array type without weak references: counted as freed
            pass
        del dev
        self.stats.add("evictions")
        if self.on_evict is not None:
            self._hooks.append((self.on_evict, key, e.nbytes))
        self.spill_host()
        return e.nbytes

    def evict_bytes(self, nbytes: int, *, job: str | None = None, free_now: bool = False) -> int:
        """Evict blocks (furthest needed first) until ``nbytes`` are evicted; returns the bytes."""
        victims = self.policy.victims(self.evictable((), job=job, free_now=free_now), max(0, nbytes))
        return sum(self.evict(k) for k in victims)

    def spill(self, key: Key) -> int:
        """Move ``key`` to the host now for its job's request; the device bytes freed (0 when not on the device)."""
        if key not in self.resident:
            return 0
        n = self.evict(key)
        self.quota.record_spill(self.entries[key].job, n)
        return n

    def enforce_job(self, job: str | None, protect=()) -> None:
        """A job over its memory request moves its own blocks (furthest needed first) to the host."""
        over = self.quota.over(job)
        if over <= 0:
            return
        mine = {k: n for k, n in self.resident.items() if self.entries[k].job == job and k not in protect}
        for k in self.policy.victims(mine, over):
            self.quota.record_spill(job, self.evict(k))

    def fit(self, protect, job: str | None = None) -> None:
        """Evict until the reserve is free again (after something new landed on the device)."""
        while self.room() < 0:
            victims = self.policy.victims(self.evictable(protect, job=job), -self.room())
            if not victims:
                return
            for k in victims:
                self.evict(k)

    def make_room(self, need: int, *, before: float | None, protect, job: str | None = None) -> bool:
        """Evict blocks needed later than ``before`` (any, for None) until ``need`` bytes fit; False
        when they do not."""
        while self.room() < need:
            victims = self.policy.victims(self.evictable(protect, job=job), need - self.room(), before=before)
            if not victims:
                return False
            for k in victims:
                self.evict(k)
        return True

    # -- host and disk tiers ------------------------------------------------------------------------
    def spill_host(self) -> None:
        """Move host blocks (not on the device, furthest needed first) to disk over the host limit."""
        if self.host_memory_limit is None or self.host_bytes <= self.host_memory_limit or not self.disk_dir:
            return
        if self.disk is None:
            self.disk = DiskTier(self.disk_dir)
        cand = {k: e.nbytes for k, e in self.entries.items()
                if e.host is not None and e.device is None and e.inflight is None}
        for k in self.policy.victims(cand, self.host_bytes - self.host_memory_limit):
            e = self.entries[k]
            e.disk = self.disk.write(e.host)
            e.host = None
            self.host_bytes -= e.nbytes
            self.stats.add("bytes_to_disk", e.nbytes)

    def host_value(self, e: Entry) -> Any:
        """The block's host copy (read back from disk when it is there)."""
        if e.host is not None:
            return e.host
        value = aligned(self.disk.read(e.disk))
        self.stats.add("bytes_from_disk", e.nbytes)
        return value

    def drop_lower_tiers(self, e: Entry) -> None:
        """Forget an entry's host and disk copies."""
        if e.host is not None:
            self.host_bytes -= e.nbytes
            e.host = None
        if e.disk is not None:
            self.disk.delete(e.disk)
            e.disk = None

    # -- loads: the steps that need no waiting ---------------------------------------------------
    def check_fits(self, key: Key, nbytes: int) -> None:
        """Raise :class:`WindowCacheMemoryError` when a block of ``nbytes`` can never be on the device."""
        budget = self.tier.budget
        reserve = self.size_policy.reserve_bytes(budget, 0)
        if nbytes > budget - reserve:
            raise WindowCacheMemoryError(
                f"block {key!r} of {format_bytes(nbytes)} can never fit on the device: the window's budget is "
                f"{format_bytes(budget)} of device memory minus a reserve of {format_bytes(reserve)}. Use "
                "smaller blocks (block_rows=...), more devices, or a smaller gdask.window-cache.reserve."
            )

    def check_inputs(self, task: Key) -> None:
        """Raise when the device blocks ``task`` reads (the inputs it pinned) cannot all be on the
        device at once; checked once per task."""
        inputs = self.pins.inputs(task)
        if inputs is None or task == self.checked:
            return
        self.checked = task
        blocks = [self.entries[k].nbytes for k in inputs if k in self.entries]
        total = sum(blocks)
        budget = self.tier.budget
        reserve = self.size_policy.reserve_bytes(budget, 0)
        if total > budget - reserve:
            raise WindowCacheMemoryError(
                f"task {task!r} reads {len(blocks)} device blocks of {format_bytes(total)} in all (the largest "
                f"{format_bytes(max(blocks))}), more than the device's {format_bytes(budget)} minus a reserve of "
                f"{format_bytes(reserve)}: a task needs all its input blocks on the device at once. Use smaller blocks "
                "(block_rows=...), tasks that read fewer blocks, or more device memory.")

    def allocate(self, e: Entry, host: Any, ev: threading.Event) -> bool:
        """Allocate ``e``'s device buffer for a copy from ``host`` (one try); False when it does not fit."""
        try:
            dev = self.tier.alloc(host)
        except DeviceMemoryError:
            return False
        e.pending = (dev, host, ev)
        self.inflight_bytes += e.nbytes
        return True

    def begin_prefetch(self, key: Key, e: Entry) -> bool:
        """Start a prefetch of ``key``: room from blocks needed after it, then its buffer; False (the
        prefetch is dropped) rather than evicting a block needed sooner or waiting for memory."""
        budget = self.tier.budget
        if e.nbytes > budget - self.size_policy.reserve_bytes(budget, 0):
            return False  # never fits: its reader gets the error
        ev = e.claim()
        before = self.policy.order.next_use(key) if hasattr(self.policy, "order") else None
        if self.make_room(e.nbytes, before=before, protect={key}, job=e.job):
            if self.allocate(e, self.host_value(e), ev):
                return True
        e.release_claim(ev)
        return False

    def land(self, key: Key, e: Entry, ok: bool, pending: tuple | None = None) -> None:
        """The copy of ``e``'s load ended (``ok``: it succeeded): the block is on the device, unless
        it was deleted meanwhile; readers waiting for it go on. ``pending`` is the load the caller
        copied: when another load of the block landed first, this one only ends (its buffer is
        dropped) and the block keeps the copy that landed."""
        pending = e.pending if pending is None else pending
        if e.pending is not pending:
            self.inflight_bytes -= e.nbytes
            pending[2].set()
            return
        dev, _, ev = pending
        e.pending = None
        self.inflight_bytes -= e.nbytes
        if ok:
            self.stats.add("bytes_h2d", e.nbytes)
        if e.inflight is ev:
            e.inflight = None
        if ok and not e.deleted:
            e.device = dev
            self.add_resident(key, e)
            if not self.host_copy:  # exclusive tiers: the device copy is the only one
                self.drop_lower_tiers(e)
            self.enforce_job(e.job, protect={key})
        ev.set()

    # -- reports ------------------------------------------------------------------------------------
    def memory_report(self) -> str:
        """Where the device memory the store knows about is: for out-of-memory errors."""
        busy = sum(n for k, n in self.resident.items() if self.pins.count(k))
        jobs = self.quota.describe()
        return (f"the window cache holds {format_bytes(self.resident_bytes)} in {len(self.resident)} blocks "
                f"({format_bytes(busy)} of them read by running tasks), {format_bytes(self.draining_bytes())} "
                f"of evicted blocks are still read by running tasks" + (f"; {jobs}" if jobs else ""))

    def states(self) -> dict[State, int]:
        """Blocks per state."""
        out = dict.fromkeys(State, 0)
        for e in self.entries.values():
            out[e.state] += 1
        return out
