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

Tasks must read one block each (``GDataSet.reduce_blocks``, ``map_blocks``): a worker gathers all
inputs of a task before running it, so a task over many blocks needs them all on the device at once.
"""

from __future__ import annotations

from gdask.window_cache._policy import LRU, FurthestInFuture, ScanOrder, WindowSize, scan_order
from gdask.window_cache._scan import scan, scan_priority
from gdask.window_cache._stats import WindowStats, hint_order, stats, worker_store
from gdask.window_cache._store import State, WindowCacheMemoryError, WindowStore, make_room, use_window_store

__all__ = [
    "FurthestInFuture",
    "LRU",
    "ScanOrder",
    "State",
    "WindowCacheMemoryError",
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
