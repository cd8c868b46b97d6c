"""WindowStore: the tiered device/host(/disk) block store, usable as ``Worker(data=...)``.

A thin ``MutableMapping`` (as distributed's ``spill.py`` is over ``zict.Buffer``): device arrays stored
in it (GDataSet blocks) are *managed* by :class:`~gdask.window_cache._entries.Entries` (on device, on
host, on disk, in flight), which keeps as many of them on the device as free device memory allows,
following an eviction policy (:class:`~gdask.window_cache.FurthestInFuture`, the sliding window, or
:class:`~gdask.window_cache.LRU`). Reading a block that is not on the device copies it there first
(a *miss*: the reader waits, :mod:`~gdask.window_cache._loads`); with the window policy the blocks
of the next predicted reads are copied ahead by the prefetch thread
(:mod:`~gdask.window_cache._prefetch`). A block another worker's store sent (a fetch, a replica, a
placement move) is a managed block here too, copied to the device when it fits
(:mod:`~gdask.window_cache._arrivals`). Anything else (small results, host arrays, Python objects)
lives in a plain dict.

Who reads and which blocks are in use is told to the store, never guessed
(:mod:`~gdask.window_cache._pins`): gdask's worker hooks (:mod:`~gdask.window_cache._hooks`) mark
transfers to other workers and the reads of a task's inputs, and pin a running task's inputs.

A distributed worker reads every dependency of a task before the task runs, so a task that takes many
blocks needs all of them on the device at once: per-block tasks are what let a window work.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Callable, Hashable, Iterable, Iterator

from dask.sizeof import sizeof
from dask.utils import format_bytes

from gdask import config
from gdask.devices import parse_size
from gdask.window_cache._arrivals import arrived, for_worker
from gdask.window_cache._entries import Entries, State, WindowCacheMemoryError, aligned
from gdask.window_cache._loads import read
from gdask.window_cache._pins import current_reader
from gdask.window_cache._policy import LRU, FurthestInFuture, WindowSize
from gdask.window_cache._prefetch import Prefetcher
from gdask.window_cache._stats import StoreStats
from gdask.window_cache._tiers import device_tier

__all__ = ["State", "WindowCacheMemoryError", "WindowStore", "make_room"]

Key = Hashable


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


def _make_policy(policy: Any, prefetch: int | None) -> Any:
    if prefetch is None:
        prefetch = int(config.get("window-cache.prefetch", 2))
    policy = config.get("window-cache.policy", "window") if policy is None else policy
    if not isinstance(policy, str):
        return policy
    if policy == "window":
        return FurthestInFuture(lookahead=prefetch)
    if policy == "lru":
        return LRU()
    raise ValueError(f"policy must be 'window', 'lru' or a policy object, got {policy!r}")


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
        policy = _make_policy(policy, prefetch)
        if reserve is None:
            reserve = config.get("window-cache.reserve", 0.05)
        if isinstance(reserve, str):
            reserve = parse_size(reserve, name="reserve")
        if host_memory_limit is None:
            host_memory_limit = config.get("window-cache.host-memory-limit")
        disk = disk if disk is not None else config.get("window-cache.disk")
        self._entries = Entries(policy, WindowSize(reserve), host_copy=bool(host_copy),
                                host_memory_limit=parse_size(host_memory_limit, name="host_memory_limit"),
                                disk_dir=disk, stats=StoreStats(window_samples, window_interval), on_evict=on_evict)
        self._prefetcher = Prefetcher(self._entries)
        self._size = size or sizeof
        self._on_hit, self._on_miss = on_hit, on_miss
        self._device = device
        self._plain: dict[Key, Any] = {}
        #: ``job_of(key) -> job name or None`` (set by the worker's job monitor)
        self.job_of: Callable[[Key], str | None] | None = None

    # -- configuration and state, as attributes ----------------------------------------------------
    @property
    def policy(self) -> Any:
        """The eviction policy object."""
        return self._entries.policy

    @property
    def size_policy(self) -> WindowSize:
        """The window size rule (reserve)."""
        return self._entries.size_policy

    @property
    def host_copy(self) -> bool:
        return self._entries.host_copy

    @property
    def counters(self) -> dict[str, int]:
        """Event counters (reads, hits, misses, bytes moved, ...)."""
        return self._entries.stats.counters

    @property
    def job_limits(self) -> dict[str, int]:
        """Device memory requests of jobs by name (bytes)."""
        return self._entries.quota.limits

    @property
    def job_spilled(self) -> dict[str, int]:
        """Bytes of each job's blocks moved to the host to keep it within its request."""
        return self._entries.quota.spilled

    # -- binding -------------------------------------------------------------------------------
    @property
    def tier(self):
        """The device tier adapter (``None`` while no device is bound)."""
        if self._entries.tier is None and self._device is not None:
            self.attach_device(self._device)
        return self._entries.tier

    def attach_device(self, device: Any) -> None:
        """Keep the device tier in ``device``'s memory and let the device ask this store for room
        when an allocation does not fit (its reclaimers). Done by the worker's device plugin."""
        with self._entries.locked() as en:
            if en.tier is not None and en.tier.device is device:
                return
            old = en.tier.device if en.tier is not None else None
            self._device = device
            en.tier = device_tier(device)
        if old is not None:
            old.remove_reclaimer(self._reclaim)
        device.add_reclaimer(self._reclaim)

    def detach_device(self, device: Any) -> None:
        """Stop answering ``device``'s requests for room (the device plugin's teardown)."""
        device.remove_reclaimer(self._reclaim)

    def _reclaim(self, nbytes: int, device: Any) -> int:
        """The device's request for room (an allocation failed): evict blocks that no running task
        holds, so the memory is free at once, never blocks of another job within its request.
        Returns the bytes freed."""
        return self.evict_bytes(nbytes, job=self._running_job(), free_now=True)

    def _running_job(self) -> str | None:
        """The job of the task running in this thread (whose allocation asks for room)."""
        if self.job_of is None:
            return None
        from distributed.worker import thread_state

        key = getattr(thread_state, "key", None)
        return None if key is None else self.job_of(key)

    # -- mapping protocol ------------------------------------------------------------------------
    def __setitem__(self, key: Key, value: Any) -> None:
        if key in self:
            del self[key]
        tier = self.tier
        received = tier is not None and arrived(value)  # a block another worker's store sent
        if not received and (tier is None or not tier.owns(value)):
            self._plain[key] = aligned(value)
            return
        nbytes = int(self._size(value))
        job = self.job_of(key) if self.job_of is not None else None
        with self._entries.locked() as en:
            if received:  # on the host until its copy to the device lands (when it fits)
                e = en.add_host(key, aligned(value), nbytes, job)
                self._prefetcher.load(key, e)
            else:
                en.add(key, value, nbytes, job)

    def __getitem__(self, key: Key) -> Any:
        try:
            return self._plain[key]
        except KeyError:
            pass
        reader = current_reader()
        value, kind, nbytes = read(self._entries, self._prefetcher, key, reader)
        hook = self._on_hit if kind == "hit" else self._on_miss if kind == "miss" else None
        if hook is not None:
            hook(key, nbytes)
        if reader is not None and reader.to_worker:  # sent to another worker: it arrives as a block
            return for_worker(self.tier, value)
        return value

    def __delitem__(self, key: Key) -> None:
        if key in self._plain:
            del self._plain[key]
            return
        with self._entries.locked() as en:
            en.pop(key)

    def __contains__(self, key: object) -> bool:
        return key in self._plain or key in self._entries.entries

    def __iter__(self) -> Iterator[Key]:
        yield from list(self._plain)
        yield from list(self._entries.entries)

    def __len__(self) -> int:
        return len(self._plain) + len(self._entries.entries)

    # -- the task protocol (gdask's worker hooks call these) ----------------------------------------
    def task_started(self, task: Key, inputs: Iterable[Key]) -> None:
        """Task ``task`` runs and holds ``inputs``: pin them until :meth:`task_finished` (a second
        call for a task that holds pins changes nothing)."""
        inputs = list(inputs)
        with self._entries.locked() as en:
            en.pins.take(task, inputs)

    def task_finished(self, task: Key) -> None:
        """Task ``task`` ended (finished, erred or was cancelled): release its pins (idempotent)."""
        with self._entries.locked() as en:
            en.pins.release(task)

    def pins(self, key: Key) -> int:
        """Running tasks that hold ``key``."""
        with self._entries.locked() as en:
            return en.pins.count(key)

    def pinned_tasks(self) -> list[Key]:
        """The tasks that hold pins now."""
        with self._entries.locked() as en:
            return en.pins.tasks()

    # -- public helpers ----------------------------------------------------------------------------
    def state(self, key: Key) -> State | None:
        """Where a managed block is (``None`` for plain values)."""
        e = self._entries.entries.get(key)
        return None if e is None else e.state

    def hint(self, keys: Iterable[Key]) -> None:
        """The next pass reads these keys in this order (see :class:`ScanOrder`); prefetches the
        first blocks of that pass at once."""
        with self._entries.locked() as en:
            order = getattr(en.policy, "order", None)
            if order is not None and order.current_pass:
                en.stats.add("passes")  # the hint ends the current pass
            en.policy.hint([k for k in keys if k in en.entries])
            self._prefetcher.plan()

    def evict_bytes(self, nbytes: int, *, job: str | None = None, free_now: bool = False) -> int:
        """Evict blocks (furthest needed first) until ``nbytes`` are evicted; returns the bytes.

        Blocks of another job that is within its memory request are never evicted (``job``: the job
        that asks for the room, whose own blocks may go). ``free_now``: only blocks no running task
        holds (evicting the others frees nothing until their tasks end)."""
        with self._entries.locked() as en:
            return en.evict_bytes(nbytes, job=job, free_now=free_now)

    def set_job_limit(self, job: str, nbytes: int | None) -> None:
        """Set (or clear, ``None``) the device memory request of ``job``: beyond it the job's own
        blocks move to the host, and other jobs' allocations never evict its blocks while it is
        within it."""
        with self._entries.locked() as en:
            en.quota.set_limit(job, nbytes)
            if nbytes is not None:
                en.enforce_job(job)

    def job_usage(self, job: str) -> int:
        """Device bytes of ``job``'s blocks now."""
        return self._entries.quota.usage(job)

    def memory_report(self) -> str:
        """Where the device memory this store knows about is: for out-of-memory errors."""
        with self._entries.locked() as en:
            return en.memory_report()

    def spill(self, key: Key) -> int:
        """Move ``key``'s device copy to the host tier now; returns the device bytes freed (0 when
        the key is not on the device). Used to enforce per-job memory requests."""
        with self._entries.locked() as en:
            return en.spill(key)

    def device_bytes(self, key: Key) -> int:
        """Bytes ``key`` holds on the device now (0 when it is on the host, on disk or unknown)."""
        return self._entries.resident.get(key, 0)

    def capacity(self) -> int:
        """Bytes the window may hold now (follows free device memory)."""
        if self.tier is None:
            return 0
        with self._entries.locked() as en:
            return en.capacity()

    def metrics(self) -> dict[str, Any]:
        """Scalar metrics (the worker's ``gdask_window`` metric and the device table).
        ``device_bytes`` is the bytes of the blocks on the device; ``window_bytes`` adds the copies
        in flight."""
        with self._entries.locked() as en:
            c = en.stats.snapshot()
            states = en.states()
            reads = c["reads"]
            c.update(
                hit_rate=c["hits"] / reads if reads else 0.0,
                device_bytes=en.resident_bytes,
                window_bytes=en.resident_bytes + en.inflight_bytes,
                window_blocks=len(en.resident),
                capacity_bytes=en.capacity(),
                host_bytes=en.host_bytes,
                device_blocks=states[State.DEVICE], host_blocks=states[State.HOST],
                disk_blocks=states[State.DISK], in_flight_blocks=states[State.IN_FLIGHT],
                plain_keys=len(self._plain),
                pinned_tasks=len(en.pins),
                policy=type(en.policy).__name__,
            )
            return c

    def stats(self) -> dict[str, Any]:
        """:meth:`metrics` plus the window size over time: ``window`` = list of
        ``(seconds since start, capacity bytes, window bytes, blocks on device)``."""
        out = self.metrics()
        with self._entries.locked() as en:
            out["window"] = list(en.stats.window)
        return out

    def reset_stats(self) -> None:
        """Zero the counters and drop the window samples."""
        with self._entries.locked() as en:
            en.stats.reset()

    def close(self) -> None:
        """Stop the prefetch thread and remove the disk tier's files."""
        self._prefetcher.close()
        disk = self._entries.disk
        if disk is not None:
            import shutil

            shutil.rmtree(disk.directory, ignore_errors=True)

    def __repr__(self) -> str:
        m = self.metrics()
        return (f"<WindowStore policy={m['policy']} blocks device/host/disk="
                f"{m['device_blocks']}/{m['host_blocks']}/{m['disk_blocks']} plain={m['plain_keys']} "
                f"window={format_bytes(m['window_bytes'])}>")
