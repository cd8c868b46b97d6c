"""window_cache: the tiered device/host(/disk) block store with the variable sliding window.

``WindowStore`` is a worker data store (``Worker(data=WindowStore)``, or
``LocalGPUCluster(data=WindowStore)``): GDataSet blocks that do not all fit in device memory are
kept on the device as far as free memory allows (minus a reserve), the rest on the host (pinned on
CUDA) or disk. Blocks of the next predicted reads are prefetched by a copy thread while the current
ones compute, and the block needed furthest in the future is evicted. Policies are pure objects
(:class:`ScanOrder`, :class:`FurthestInFuture`, :class:`LRU`, :class:`WindowSize`).

How a store learns the order of a pass: from the reads it sees (a pass ends when a block is read a
second time; the next pass is predicted to repeat the last one, or to reverse it when the last two
were reverses of each other), or from a hint: build a pass inside
``with gdask.window_cache.scan(G.__dask_keys__(), iteration):`` to run it forward on even and
backward on odd iterations (task priorities) and tell the workers that order
(:func:`hint_order`). ``gdask.window_cache.stats(client)`` returns hits, misses, prefetch hits,
bytes copied each way, stall time and the window size over time, per worker and in total.

Who reads a block and which blocks are in use is told to the store by gdask's worker hooks
(:class:`WindowCachePlugin`: transfers to other workers are sent from the host copy; a running
task's inputs are pinned), never guessed. On the scheduler, :class:`Residency` keeps a block's
replica on the worker whose device holds it when distributed's active memory manager drops the
extra copies other workers fetched.

Tasks must read one block each (``GDataSet.reduce_blocks``, ``map_blocks``): a worker gathers all
inputs of a task before running it, so a task over many blocks needs them all on the device at once.
"""

from __future__ import annotations

from gdask.window_cache._client import WindowStats, hint_order, stats
from gdask.window_cache._hooks import WindowCachePlugin, use_window_store, worker_store
from gdask.window_cache._pins import Pins
from gdask.window_cache._policy import LRU, FurthestInFuture, ScanOrder, WindowSize, scan_order
from gdask.window_cache._quota import JobQuota
from gdask.window_cache._residency import KeepDeviceReplicas, Residency
from gdask.window_cache._scan import scan, scan_priority
from gdask.window_cache._store import State, WindowCacheMemoryError, WindowStore, make_room

__all__ = [
    "FurthestInFuture",
    "JobQuota",
    "KeepDeviceReplicas",
    "LRU",
    "Pins",
    "Residency",
    "ScanOrder",
    "State",
    "WindowCacheMemoryError",
    "WindowCachePlugin",
    "WindowSize",
    "WindowStats",
    "WindowStore",
    "hint_order",
    "make_room",
    "scan",
    "scan_order",
    "scan_priority",
    "stats",
    "use_window_store",
    "worker_store",
]
