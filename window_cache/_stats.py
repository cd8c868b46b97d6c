"""Counters and window samples of one window store (the worker side of ``gdask.window_cache.stats``).

Kept apart from the store's data and moves, as distributed's ``spill.py`` keeps its metrics: the
store counts events here (under its own lock: this object has none) and samples the window size
when it changes.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

__all__ = ["COUNTERS", "StoreStats"]

#: the event counters of a store (``WindowStore.counters``)
COUNTERS = ("reads", "hits", "misses", "prefetch_hits", "host_reads", "prefetches", "prefetch_dropped", "evictions",
            "bytes_h2d", "bytes_d2h", "bytes_to_disk", "bytes_from_disk", "passes")


class StoreStats:
    """Event counters, stall time and the window size over time.

    Parameters
    ----------
    samples : int
        Window samples kept (the oldest are dropped).
    interval : float
        Seconds between two kept samples; changes closer together are coalesced into the last one.
    """

    def __init__(self, samples: int = 1000, interval: float = 0.01) -> None:
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        #: seconds readers waited for copies to the device
        self.stall_time = 0.0
        #: ``(seconds since start, capacity bytes, window bytes, blocks on the device)``
        self.window: deque[tuple[float, int, int, int]] = deque(maxlen=samples)
        self.interval = float(interval)
        self.t0 = time.time()

    def add(self, name: str, n: int = 1) -> None:
        """Count ``n`` more of ``name`` (one of :data:`COUNTERS`)."""
        self.counters[name] += n

    def sample(self, capacity: int, window_bytes: int, blocks: int) -> None:
        """Record the window now, if it changed since the last sample."""
        sample = (time.time() - self.t0, int(capacity), int(window_bytes), int(blocks))
        if not self.window:
            self.window.append(sample)
        elif self.window[-1][1:] != sample[1:]:
            if len(self.window) > 1 and sample[0] - self.window[-2][0] < self.interval:
                self.window[-1] = sample  # coalesce changes closer than the interval
            else:
                self.window.append(sample)

    def snapshot(self) -> dict[str, Any]:
        """The counters and the stall time."""
        return {**self.counters, "stall_time": self.stall_time}

    def reset(self) -> None:
        """Zero the counters and the stall time, drop the samples."""
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.stall_time = 0.0
        self.window.clear()
