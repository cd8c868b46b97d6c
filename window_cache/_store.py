"""WindowStore: the tiered device/host(/disk) block store, usable as ``Worker(data=...)``.

Device arrays stored in it (GDataSet blocks) are *managed*: each has a state (on device, on host,
on disk, in flight) and the store keeps as many of them on the device as free device memory
allows, following an eviction policy (:class:`~gdask.window_cache.FurthestInFuture`, the sliding
window, or :class:`~gdask.window_cache.LRU`). Reading a block that is not on the device copies it
there first (a *miss*, the reader waits: stall time); with the window policy the blocks of the next
predicted reads are copied ahead by a prefetch thread while the current blocks compute. Anything
else (small results, host arrays, Python objects) lives in a plain dict.

Worker reads happen on the worker's event loop (``Worker._prepare_args_for_execution`` reads every
dependency of a task before it runs), so a task that takes many blocks needs all of them on the
device at once: per-block tasks are what let a window work.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import MutableMapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Hashable, Iterator

import numpy as np
from dask.sizeof import sizeof
from dask.utils import format_bytes

from gdask import DeviceMemoryError, config
from gdask._compat import set_worker_data
from gdask.devices import parse_size
from gdask.window_cache._policy import LRU, FurthestInFuture, WindowSize
from gdask.window_cache._tiers import DiskTier, device_tier

__all__ = ["State", "WindowCacheMemoryError", "WindowStore", "make_room", "use_window_store"]

Key = Hashable

#: how long a demand load for a transfer to another worker (not for a task) waits for device memory
#: held by running tasks before it sends the host copy (s)
_WAIT_FOR_MEMORY = 0.5


def _in_use(e: _Entry) -> bool:
    """Whether something besides the store holds the entry's device array (a running task reads it,
    or a view of it): evicting it would free no memory until that reader is done. The store's own
    reference and ``getrefcount``'s argument count 2."""
    return e.device is not None and sys.getrefcount(e.device) > 2


def _reader() -> tuple[str, Any]:
    """Who reads (a distributed worker reads its data store on its event loop): ``("task", ts)``
    when it assembles the inputs of task ``ts`` (``Worker.execute``), ``("transfer", None)`` when it
    sends data to another worker (``Worker.get_data``: served from the host copy, as loading a block
    onto the device only to send it would pin device memory for the whole transfer), else
    ``("other", None)`` (direct use of the store: a read as a task's)."""
    frame = sys._getframe(2)  # _getframe(0) = here, 1 = __getitem__, 2 = the reader
    for _ in range(2):  # get_data reads in a comprehension (its own frame before Python 3.12)
        if frame is None:
            break
        name = frame.f_code.co_name
        if name == "execute":
            return "task", frame.f_locals.get("ts")
        if name == "get_data":
            return "transfer", None
        frame = frame.f_back
    return "other", None


def _aligned(value: Any) -> Any:
    """An array as its own aligned copy when its data is not aligned to its item size (data received
    from another worker is deserialized at any offset of the message's buffer). NumPy computes on
    misaligned arrays without BLAS, summing in another order: the same block would give other bits
    depending on where it was computed (placement must not change results)."""
    if isinstance(value, np.ndarray) and not value.flags.aligned:
        return np.copy(value, order="K")
    return value


def _memory_timeout() -> float:
    return float(config.get("timeouts.memory", 5))

_COUNTERS = ("reads", "hits", "misses", "prefetch_hits", "host_reads", "prefetches", "prefetch_dropped", "evictions",
             "bytes_h2d", "bytes_d2h", "bytes_to_disk", "bytes_from_disk", "passes")


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
class _Entry:
    nbytes: int
    device: Any = None
    host: Any = None
    disk: str | None = None
    pending: Any = None  # (device buffer being filled, its host source), set with ``inflight``
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


def make_room(nbytes: int, device: Any = None) -> int:
    """Evict blocks of the window stores bound to ``device`` (default: the calling worker's device)
    until ``nbytes`` more device memory is free, ignoring the prefetch rules; returns the bytes
    evicted.

    For allocations outside the store that failed with :class:`~gdask.DeviceMemoryError`: call
    ``make_room(nbytes)`` and retry once (gdask's own allocations do this by themselves).
    """
    if device is None:
        from gdask.devices import current_device

        device = current_device()
    return device.reclaim(nbytes)


def use_window_store(worker: Any, **kwargs: Any) -> bool:
    """Give ``worker`` (a distributed Worker that holds no data yet) a :class:`WindowStore` as its
    data; the worker's device plugin binds it to the device. Returns False (and changes nothing)
    when the worker already holds data or has a window store."""
    data = worker.data
    if isinstance(data, WindowStore) or len(data):
        return False
    store = WindowStore(**kwargs)
    set_worker_data(worker, store)
    return True


def _config_policy() -> str:
    return config.get("window-cache.policy", "window")


class WindowStore(MutableMapping):
    """Tiered block store with the variable sliding window.

    Parameters
    ----------
    policy : {"window", "lru"} or policy object, optional
        ``"window"``: furthest-in-future eviction on the learnt scan order, prefetch of the next
        blocks (:class:`FurthestInFuture`). ``"lru"``: least recently used, no prefetch. Or any
        object with the policy interface (``on_insert``, ``on_read``, ``on_remove``, ``hint``,
        ``victims``, ``prefetch``). Default: config ``gdask.window-cache.policy``.
    device : gdask device, optional
        Device whose memory holds the device tier. On a worker, leave it out: the worker's device
        plugin binds the store to the worker's device (:meth:`attach_device`) after the worker
        made its data store. Until a device is bound everything lives in a plain dict.
    reserve : int, float or str, optional
        Device memory kept free: bytes, "64MiB", or a fraction (< 1) of the budget; at least the
        largest block is always kept free. Default config ``gdask.window-cache.reserve``.
    prefetch : int, optional
        Predicted reads ahead that are copied to the device in advance (window policy). Default
        config ``gdask.window-cache.prefetch``.
    host_copy : bool
        Keep the host copy of a block that is moved to the device (default), so evicting it later
        copies nothing. ``False`` = exclusive tiers, as dask-cuda's device->host spilling: every
        eviction copies the block back to the host.
    disk : str, optional
        Directory for the disk tier; used when the host tier exceeds ``host_memory_limit``.
    host_memory_limit : int or str, optional
        Bytes of managed blocks kept in host memory before the furthest-needed ones go to disk.
    size : callable, optional
        ``size(value) -> bytes`` (default ``dask.sizeof``).
    on_hit, on_miss, on_evict : callable, optional
        Hooks ``f(key, nbytes)`` called (outside the store's lock) on a device hit, on a read that
        needed a copy (miss or prefetch), and on every eviction from the device.
    window_samples : int
        Samples of the window size kept for ``stats()["window"]``.
    window_interval : float
        Seconds between two window samples; changes closer together are coalesced.

    Examples
    --------
    >>> cluster = gdask.LocalGPUCluster(n_devices=2, data=gdask.window_cache.WindowStore)  # doctest: +SKIP
    """

    def __init__(self, policy: Any = None, *, device: Any = None, reserve: Any = None, prefetch: int | None = None,
                 host_copy: bool = True, disk: str | None = None, host_memory_limit: Any = None,
                 size: Callable[[Any], int] | None = None, on_hit: Callable | None = None,
                 on_miss: Callable | None = None, on_evict: Callable | None = None,
                 window_samples: int = 1000, window_interval: float = 0.01) -> None:
        if prefetch is None:
            prefetch = int(config.get("window-cache.prefetch", 2))
        policy = _config_policy() if policy is None else policy
        if isinstance(policy, str):
            if policy == "window":
                policy = FurthestInFuture(lookahead=prefetch)
            elif policy == "lru":
                policy = LRU()
            else:
                raise ValueError(f"policy must be 'window', 'lru' or a policy object, got {policy!r}")
        self.policy = policy
        if reserve is None:
            reserve = config.get("window-cache.reserve", 0.05)
        if isinstance(reserve, str):
            reserve = parse_size(reserve, name="reserve")
        self.size_policy = WindowSize(reserve)
        self.host_copy = bool(host_copy)
        if host_memory_limit is None:
            host_memory_limit = config.get("window-cache.host-memory-limit")
        self.host_memory_limit = parse_size(host_memory_limit, name="host_memory_limit")
        disk = disk if disk is not None else config.get("window-cache.disk")
        self._disk_dir = disk
        self._disk: DiskTier | None = None
        self._size = size or sizeof
        self._on_hit, self._on_miss, self._on_evict = on_hit, on_miss, on_evict
        self._device = device
        self._tier = None
        self._plain: dict[Key, Any] = {}
        self._entries: dict[Key, _Entry] = {}
        self._resident: dict[Key, int] = {}  # blocks on the device -> bytes
        self._resident_bytes = 0
        #: ``job_of(key) -> job name or None`` (set by the worker's job monitor); device memory
        #: requests of jobs by name (``job_limits``), their blocks' device bytes and what was spilled
        self.job_of: Callable[[Key], str | None] | None = None
        self.job_limits: dict[str, int] = {}
        self._job_bytes: dict[str, int] = {}
        self.job_spilled: dict[str, int] = {}
        self._inflight_bytes = 0
        self._host_bytes = 0
        self._largest = 0
        self._draining: list[tuple[Any, int]] = []
        self._lock = threading.RLock()
        self._checked: Any = None  # the last task whose inputs were checked (_check_inputs)
        self._queue: deque[tuple[Key, _Entry]] = deque()
        self._cond = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self.stall_time = 0.0
        self.window: deque[tuple[float, int, int, int]] = deque(maxlen=window_samples)
        self._window_interval = float(window_interval)
        self._t0 = time.time()

    # -- binding -------------------------------------------------------------------------------
    @property
    def tier(self):
        """The device tier adapter (``None`` while no device is bound)."""
        if self._tier is None and self._device is not None:
            self.attach_device(self._device)
        return self._tier

    def attach_device(self, device: Any) -> None:
        """Keep the device tier in ``device``'s memory and let the device ask this store for room
        when an allocation does not fit (its reclaimers). Done by the worker's device plugin."""
        with self._lock:
            if self._tier is not None and self._tier.device is device:
                return
            if self._tier is not None:
                self._tier.device.remove_reclaimer(self._reclaim)
            self._device = device
            self._tier = device_tier(device)
        device.add_reclaimer(self._reclaim)

    def detach_device(self, device: Any) -> None:
        """Stop answering ``device``'s requests for room (the device plugin's teardown)."""
        device.remove_reclaimer(self._reclaim)

    def _reclaim(self, nbytes: int, device: Any) -> int:
        """The device's request for room (an allocation failed): evict blocks that no running task
        reads, so the memory is free at once, never blocks of another job within its request.
        Returns the bytes freed."""
        return self.evict_bytes(nbytes, job=self._running_job(), free_now=True)

    def _running_job(self) -> str | None:
        """The job of the task running in this thread (whose allocation asks for room)."""
        if self.job_of is None:
            return None
        try:
            from distributed.worker import thread_state
        except ImportError:  # pragma: no cover - distributed is a dependency
            return None
        key = getattr(thread_state, "key", None)
        return None if key is None else self.job_of(key)

    # -- mapping protocol ------------------------------------------------------------------------
    def __setitem__(self, key: Key, value: Any) -> None:
        if key in self:
            del self[key]
        tier = self.tier
        if tier is None or not tier.owns(value):
            self._plain[key] = _aligned(value)
            return
        nbytes = int(self._size(value))
        job = self.job_of(key) if self.job_of is not None else None
        with self._lock:
            e = _Entry(nbytes=nbytes, device=value, job=job)
            self._entries[key] = e
            self._add_resident(key, e)
            self._largest = max(self._largest, nbytes)
            self.policy.on_insert(key)
            # a new device block: a job over its request spills its own blocks; then get back within
            # the window (it may itself go to the host)
            self._enforce_job(job)
            self._fit(protect=(), job=job)
            self._sample()

    def __getitem__(self, key: Key) -> Any:
        try:
            return self._plain[key]
        except KeyError:
            pass
        hook = None
        with self._lock:
            e = self._entries[key]
            self.counters["reads"] += 1
            if self.policy.on_read(key):
                self.counters["passes"] += 1
                self._sample()
            reader, ts = ("other", None) if e.device is not None else _reader()
            if ts is not None and self._tier is not None:
                self._check_inputs(ts)
            if e.device is None and e.inflight is None and reader == "transfer":
                # to another worker: the host copy, without a copy to the device
                self.counters["host_reads"] += 1
                value = self._host_value(e)
            elif e.device is not None:
                value = e.device
                if e.prefetched:
                    e.prefetched = False
                    self.counters["prefetch_hits"] += 1
                    hook = self._on_miss
                else:
                    self.counters["hits"] += 1
                    hook = self._on_hit
            else:
                t0 = time.perf_counter()
                value = self._wait_or_load(key, e)
                e.prefetched = False
                self.stall_time += time.perf_counter() - t0
                hook = self._on_miss
            self._schedule_prefetch()
        if hook is not None:
            hook(key, e.nbytes)
        return value

    def _wait_or_load(self, key: Key, e: _Entry) -> Any:
        """The device copy of a block not on the device (lock held): wait for the load that owns the
        entry, if any, else load it. Re-checked after every wait: the block may have been evicted
        again, and another reader's load may own the entry by then."""
        limit = float(config.get("timeouts.block-copy", 120))
        deadline = time.monotonic() + limit
        first = True
        while True:
            if e.device is not None:
                return e.device
            if e.deleted:
                raise KeyError(key)
            ev = e.inflight
            if ev is None:  # demand load: the reader waits for the copy
                if first:
                    self.counters["misses"] += 1
                return self._demand_load(key, e)
            if first:  # a prefetch (or another reader) is copying it: wait for that copy
                self.counters["prefetch_hits"] += 1
            first = False
            self._lock.release()
            try:
                done = ev.wait(max(0.0, deadline - time.monotonic()))
            finally:
                self._lock.acquire()
            if not done:
                raise WindowCacheMemoryError(
                    f"block {key!r} of {format_bytes(e.nbytes)}: its copy to the device did not finish within "
                    f"{limit:g} s (gdask.timeouts.block-copy)")

    def __delitem__(self, key: Key) -> None:
        if key in self._plain:
            del self._plain[key]
            return
        with self._lock:
            e = self._entries.pop(key)
            e.deleted = True
            self.policy.on_remove(key)
            if key in self._resident:
                self._remove_resident(key, e)
                e.device = None
            self._drop_lower_tiers(e)

    def _drop_lower_tiers(self, e) -> None:
        """Forget an entry's host and disk copies (caller holds the lock)."""
        if e.host is not None:
            self._host_bytes -= e.nbytes
            e.host = None
        if e.disk is not None:
            self._disk.delete(e.disk)
            e.disk = None

    def __contains__(self, key: object) -> bool:
        return key in self._plain or key in self._entries

    def __iter__(self) -> Iterator[Key]:
        yield from list(self._plain)
        yield from list(self._entries)

    def __len__(self) -> int:
        return len(self._plain) + len(self._entries)

    # -- public helpers ----------------------------------------------------------------------------
    def state(self, key: Key) -> State | None:
        """Where a managed block is (``None`` for plain values)."""
        e = self._entries.get(key)
        return None if e is None else e.state

    def hint(self, keys) -> None:
        """The next pass reads these keys in this order (see :class:`ScanOrder`); prefetches the
        first blocks of that pass at once."""
        with self._lock:
            order = getattr(self.policy, "order", None)
            if order is not None and order.current_pass:
                self.counters["passes"] += 1  # the hint ends the current pass
            self.policy.hint([k for k in keys if k in self._entries])
            self._schedule_prefetch()

    def evict_bytes(self, nbytes: int, *, job: str | None = None, free_now: bool = False) -> int:
        """Evict blocks (furthest needed first) until ``nbytes`` are evicted; returns the bytes.

        Blocks of another job that is within its memory request are never evicted (``job``: the job
        that asks for the room, whose own blocks may go). ``free_now``: only blocks no running task
        reads (evicting the others frees nothing until their readers finish)."""
        with self._lock:
            victims = self.policy.victims(self._evictable((), job=job, free_now=free_now), max(0, nbytes))
            got = 0
            for k in victims:
                got += self._resident[k]
                self._evict(k)
            return got

    def set_job_limit(self, job: str, nbytes: int | None) -> None:
        """Set (or clear, ``None``) the device memory request of ``job``: beyond it the job's own
        blocks move to the host, and other jobs' allocations never evict its blocks while it is
        within it."""
        with self._lock:
            if nbytes is None:
                self.job_limits.pop(job, None)
            else:
                self.job_limits[job] = int(nbytes)
                self._enforce_job(job)

    def job_usage(self, job: str) -> int:
        """Device bytes of ``job``'s blocks now."""
        return self._job_bytes.get(job, 0)

    def memory_report(self) -> str:
        """Where the device memory this store knows about is: for out-of-memory errors."""
        with self._lock:
            busy = sum(n for k, n in self._resident.items() if _in_use(self._entries[k]))
            jobs = ", ".join(f"job {j!r} {format_bytes(n)} (request {format_bytes(self.job_limits[j])})"
                             for j, n in self._job_bytes.items() if n and j in self.job_limits)
            return (f"the window cache holds {format_bytes(self._resident_bytes)} in {len(self._resident)} blocks "
                    f"({format_bytes(busy)} of them read by running tasks), {format_bytes(self._draining_bytes())} "
                    f"of evicted blocks are still read by running tasks" + (f"; {jobs}" if jobs else ""))

    def spill(self, key: Key) -> int:
        """Move ``key``'s device copy to the host tier now; returns the device bytes freed (0 when
        the key is not on the device). Used to enforce per-job memory requests."""
        with self._lock:
            n = self._resident.get(key)
            if n is None:
                return 0
            self._evict(key)
            e = self._entries[key]
            if e.job is not None:
                self.job_spilled[e.job] = self.job_spilled.get(e.job, 0) + n
            return n

    def device_bytes(self, key: Key) -> int:
        """Bytes ``key`` holds on the device now (0 when it is on the host, on disk or unknown)."""
        return self._resident.get(key, 0)

    def capacity(self) -> int:
        """Bytes the window may hold now (follows free device memory)."""
        tier = self.tier
        if tier is None:
            return 0
        with self._lock:
            return self.size_policy.capacity(budget=tier.budget, used=tier.used, held=self._held(),
                                             largest=self._largest)

    def metrics(self) -> dict[str, Any]:
        """Scalar metrics (the worker's ``gdask_window`` metric and the device table)."""
        with self._lock:
            c = dict(self.counters)
            states = {s: 0 for s in State}
            for e in self._entries.values():
                states[e.state] += 1
            reads = c["reads"]
            c.update(
                hit_rate=c["hits"] / reads if reads else 0.0,
                stall_time=self.stall_time,
                window_bytes=self._resident_bytes + self._inflight_bytes,
                window_blocks=len(self._resident),
                capacity_bytes=self.capacity() if self._tier is not None else 0,
                host_bytes=self._host_bytes,
                device_blocks=states[State.DEVICE], host_blocks=states[State.HOST],
                disk_blocks=states[State.DISK], in_flight_blocks=states[State.IN_FLIGHT],
                plain_keys=len(self._plain),
                policy=type(self.policy).__name__,
            )
            return c

    def stats(self) -> dict[str, Any]:
        """:meth:`metrics` plus the window size over time: ``window`` = list of
        ``(seconds since start, capacity bytes, window bytes, blocks on device)``."""
        out = self.metrics()
        with self._lock:
            out["window"] = list(self.window)
        return out

    def reset_stats(self) -> None:
        with self._lock:
            self.counters = dict.fromkeys(_COUNTERS, 0)
            self.stall_time = 0.0
            self.window.clear()

    def close(self) -> None:
        """Stop the prefetch thread and remove the disk tier's files."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._disk is not None:
            import shutil

            shutil.rmtree(self._disk.directory, ignore_errors=True)

    def __repr__(self) -> str:
        m = self.metrics()
        return (f"<WindowStore policy={m['policy']} blocks device/host/disk="
                f"{m['device_blocks']}/{m['host_blocks']}/{m['disk_blocks']} plain={m['plain_keys']} "
                f"window={format_bytes(m['window_bytes'])}>")

    # -- internals (call with the lock held) -------------------------------------------------------
    def _draining_bytes(self) -> int:
        """Bytes of evicted blocks still referenced (by running tasks): freed when they finish."""
        alive = []
        total = 0
        for ref, n in self._draining:
            if ref() is not None:
                alive.append((ref, n))
                total += n
        self._draining = alive
        return total

    def _held(self) -> int:
        return self._resident_bytes + self._inflight_bytes + self._draining_bytes()

    def _room(self) -> int:
        """Device bytes the window may still fill without eating into the reserve. Evicted blocks
        that running tasks still use count as free: they are, once those tasks finish (evicting
        more blocks instead would cost hits); an allocation that finds them not yet freed is
        retried later (prefetch) or waits (demand load)."""
        t = self._tier
        return t.budget - self.size_policy.reserve_bytes(t.budget, self._largest) - t.used + self._draining_bytes()

    def _sample(self) -> None:
        if self._tier is None:
            return
        cap = self.size_policy.capacity(budget=self._tier.budget, used=self._tier.used, held=self._held(),
                                        largest=self._largest)
        sample = (time.time() - self._t0, cap, self._resident_bytes + self._inflight_bytes,
                  len(self._resident))
        if not self.window:
            self.window.append(sample)
        elif self.window[-1][1:] != sample[1:]:
            if len(self.window) > 1 and sample[0] - self.window[-2][0] < self._window_interval:
                self.window[-1] = sample  # coalesce changes closer than the interval
            else:
                self.window.append(sample)

    def _add_resident(self, key: Key, e: _Entry) -> None:
        self._resident[key] = e.nbytes
        self._resident_bytes += e.nbytes
        if e.job is not None:
            self._job_bytes[e.job] = self._job_bytes.get(e.job, 0) + e.nbytes

    def _remove_resident(self, key: Key, e: _Entry) -> None:
        del self._resident[key]
        self._resident_bytes -= e.nbytes
        if e.job is not None:
            left = self._job_bytes.get(e.job, 0) - e.nbytes
            if left > 0:
                self._job_bytes[e.job] = left
            else:
                self._job_bytes.pop(e.job, None)

    def _protected_jobs(self, job: str | None) -> set[str]:
        """Jobs within their memory request, other than ``job``: their blocks are never evicted for
        someone else's room."""
        return {j for j, limit in self.job_limits.items() if j != job and self._job_bytes.get(j, 0) <= limit}

    def _evictable(self, protect, *, job: str | None = None, free_now: bool = False) -> dict[Key, int]:
        """Resident blocks that may be evicted to make room for ``job`` (lock held)."""
        keep = self._protected_jobs(job)
        out = {}
        for k, n in self._resident.items():
            if k in protect:
                continue
            e = self._entries[k]
            if e.job is not None and e.job in keep:
                continue
            if free_now and _in_use(e):
                continue
            out[k] = n
        return out

    def _enforce_job(self, job: str | None, protect=()) -> None:
        """A job over its memory request moves its own blocks (furthest needed first) to the host."""
        if job is None or job not in self.job_limits:
            return
        over = self._job_bytes.get(job, 0) - self.job_limits[job]
        if over <= 0:
            return
        mine = {k: n for k, n in self._resident.items() if self._entries[k].job == job and k not in protect}
        for k in self.policy.victims(mine, over):
            n = self._resident[k]
            self._evict(k)
            self.job_spilled[job] = self.job_spilled.get(job, 0) + n

    def _fit(self, protect, job: str | None = None) -> None:
        """Evict until the reserve is free again (after something new landed on the device)."""
        while self._room() < 0:
            victims = self.policy.victims(self._evictable(protect, job=job), -self._room())
            if not victims:
                return
            for k in victims:
                self._evict(k)

    def _make_room(self, need: int, *, before: float | None, protect, job: str | None = None) -> bool:
        while self._room() < need:
            victims = self.policy.victims(self._evictable(protect, job=job), need - self._room(), before=before)
            if not victims:
                return False
            for k in victims:
                self._evict(k)
        return True

    def _evict(self, key: Key) -> None:
        e = self._entries[key]
        dev = e.device
        if e.host is None and e.disk is None:
            e.host = self._tier.to_host(dev)
            self._host_bytes += e.nbytes
            self.counters["bytes_d2h"] += e.nbytes
        self._remove_resident(key, e)
        e.device = None
        e.prefetched = False
        try:
            self._draining.append((weakref.ref(dev), e.nbytes))
        except TypeError:
            pass
        del dev
        self.counters["evictions"] += 1
        if self._on_evict is not None:
            self._on_evict(key, e.nbytes)
        self._spill_host()

    def _spill_host(self) -> None:
        """Move host blocks (not on the device, furthest needed first) to disk over the limit."""
        if self.host_memory_limit is None or self._host_bytes <= self.host_memory_limit or not self._disk_dir:
            return
        if self._disk is None:
            self._disk = DiskTier(self._disk_dir)
        cand = {k: e.nbytes for k, e in self._entries.items()
                if e.host is not None and e.device is None and e.inflight is None}
        for k in self.policy.victims(cand, self._host_bytes - self.host_memory_limit):
            e = self._entries[k]
            e.disk = self._disk.write(e.host)
            e.host = None
            self._host_bytes -= e.nbytes
            self.counters["bytes_to_disk"] += e.nbytes

    def _host_value(self, e: _Entry) -> Any:
        if e.host is not None:
            return e.host
        value = _aligned(self._disk.read(e.disk))
        self.counters["bytes_from_disk"] += e.nbytes
        return value

    def _demand_load(self, key: Key, e: _Entry) -> Any:
        """Copy ``key`` to the device for a reader (lock held, released during the copy). When the
        device stays full of blocks that running tasks hold, the reader gets the host copy instead of
        an out-of-memory error (counted in ``host_reads``): the reader runs on the worker's event
        loop, where waiting long would also keep finished tasks from releasing their memory."""
        if not self._begin_load(key, e, prefetch=False):
            if e.deleted:
                raise KeyError(key)
            self.counters["host_reads"] += 1
            return self._host_value(e)
        self._lock.release()
        try:
            self._finish_load(key, e)
        finally:
            self._lock.acquire()
        if e.device is None:  # deleted while it was copied
            raise KeyError(key)
        return e.device

    def _begin_load(self, key: Key, e: _Entry, *, prefetch: bool) -> bool:
        """Make room and allocate the device buffer of ``key``; the copy is done by
        :meth:`_finish_load` without the lock. Prefetches give up (False) rather than evict a block
        needed sooner; demand loads evict whatever is needed, wait a little for memory held by
        running tasks, and raise :class:`WindowCacheMemoryError` when the block can never fit.

        From its first line the load owns the entry (``e.inflight``): the lock is released while it
        waits for memory, and another reader or the prefetch thread must not start a second load
        of the same block meanwhile (two loads of one entry raced: one ended with
        ``e.inflight = None`` under the other)."""
        n = e.nbytes
        budget = self._tier.budget
        reserve = self.size_policy.reserve_bytes(budget, 0)
        if n > budget - reserve:
            raise WindowCacheMemoryError(
                f"block {key!r} of {format_bytes(n)} can never fit on the device: the window's budget is "
                f"{format_bytes(budget)} of device memory minus a reserve of {format_bytes(reserve)}. Use "
                "smaller blocks (block_rows=...), more devices, or a smaller gdask.window-cache.reserve."
            )
        ev = threading.Event()
        e.inflight = ev
        ok = False
        try:
            before = self.policy.order.next_use(key) if prefetch and hasattr(self.policy, "order") else None
            if not self._make_room(n, before=before, protect={key}, job=e.job) and prefetch:
                return False
            host = self._host_value(e)
            deadline = time.monotonic() + _WAIT_FOR_MEMORY
            evicted_busy = False
            while True:
                try:
                    dev = self._tier.alloc(host)
                    break
                except DeviceMemoryError:
                    if prefetch or e.deleted:
                        return False
                    if self.evict_bytes(n, job=e.job, free_now=True):
                        continue  # blocks no task reads: their memory is free at once
                    if not evicted_busy:  # blocks that running tasks read free their memory when those end
                        evicted_busy = bool(self.evict_bytes(n, job=e.job))
                    if time.monotonic() > deadline:
                        return False  # the device stays full of blocks in use: the reader gets the host copy
                    self._lock.release()
                    try:
                        time.sleep(0.005)
                    finally:
                        self._lock.acquire()
            if e.deleted:
                return False
            e.pending = (dev, host, ev)
            self._inflight_bytes += n
            ok = True
            return True
        finally:
            if not ok:
                if e.inflight is ev:
                    e.inflight = None
                ev.set()

    def _check_inputs(self, ts: Any) -> None:
        """Raise when the device blocks task ``ts`` reads cannot all be on the device at once (lock
        held; checked once per task, at its first read)."""
        if ts.key == self._checked:
            return
        self._checked = ts.key
        blocks = [self._entries[d.key].nbytes for d in ts.dependencies if d.key in self._entries]
        total = sum(blocks)
        budget = self._tier.budget
        reserve = self.size_policy.reserve_bytes(budget, 0)
        if total > budget - reserve:
            raise WindowCacheMemoryError(
                f"task {ts.key!r} reads {len(blocks)} device blocks of {format_bytes(total)} in all (the largest "
                f"{format_bytes(max(blocks))}), more than the device's {format_bytes(budget)} minus a reserve of "
                f"{format_bytes(reserve)}: a task needs all its input blocks on the device at once. Use smaller blocks "
                "(block_rows=...), tasks that read fewer blocks, or more device memory.")

    def _finish_load(self, key: Key, e: _Entry) -> None:
        """The copy of a load begun by :meth:`_begin_load` (its owner calls this once); wakes the
        readers that wait for it."""
        dev, host, ev = e.pending
        try:
            self._tier.copy_to_device(dev, host)
        except BaseException:
            with self._lock:
                e.pending = None
                self._inflight_bytes -= e.nbytes
                if e.inflight is ev:
                    e.inflight = None
                ev.set()
            raise
        with self._lock:
            e.pending = None
            self._inflight_bytes -= e.nbytes
            self.counters["bytes_h2d"] += e.nbytes
            if e.inflight is ev:
                e.inflight = None
            if not e.deleted:
                e.device = dev
                self._add_resident(key, e)
                if not self.host_copy:  # exclusive tiers: the device copy is the only one
                    self._drop_lower_tiers(e)
                self._enforce_job(e.job, protect={key})
            ev.set()

    def _schedule_prefetch(self) -> None:
        if not self.policy.prefetches or self._tier is None or self._closed:
            return
        if len(self._resident) == len(self._entries):  # everything is on the device
            return
        targets = self.policy.prefetch(
            lambda k: k in self._entries and (self._entries[k].device is not None
                                              or self._entries[k].inflight is not None))
        started = False
        for key, _ in targets:
            e = self._entries.get(key)
            if e is None:
                continue
            if not self._begin_load(key, e, prefetch=True):
                self.counters["prefetch_dropped"] += 1
                break  # later targets are needed even later: no room for them either
            e.prefetched = True
            self.counters["prefetches"] += 1
            self._queue.append((key, e))
            started = True
        if started:
            if self._thread is None:
                self._thread = threading.Thread(target=_prefetch_loop, args=(weakref.ref(self),),
                                                name="gdask-window-prefetch", daemon=True)
                self._thread.start()
            self._cond.notify()
        self._sample()

def _prefetch_loop(ref: weakref.ref) -> None:
    """The prefetch thread: copies queued blocks to the device, one at a time (one copy engine).
    Holds the store weakly, so it ends when the store is closed or garbage collected."""
    while True:
        store = ref()
        if store is None:
            return
        with store._cond:
            if not store._queue and not store._closed:
                store._cond.wait(timeout=1.0)
            if store._closed:
                return
            item = store._queue.popleft() if store._queue else None
        if item is not None:
            key, e = item
            try:
                store._finish_load(key, e)
            except Exception:  # noqa: BLE001 - a failed prefetch leaves the block on the host;
                # the reader loads it on demand and sees any real error there
                with store._lock:
                    store.counters["prefetch_dropped"] += 1
        del store
