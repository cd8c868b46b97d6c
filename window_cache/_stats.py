"""Cluster-side helpers: window cache statistics and scan-order hints for every worker."""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["hint_order", "stats", "worker_store"]

#: counters summed over workers in ``stats(client)["totals"]``
_SUMMED = ("reads", "hits", "misses", "prefetch_hits", "host_reads", "prefetches", "prefetch_dropped", "evictions",
           "bytes_h2d", "bytes_d2h", "bytes_to_disk", "bytes_from_disk", "stall_time", "window_bytes",
           "window_blocks", "capacity_bytes", "device_blocks", "host_blocks", "disk_blocks")


def worker_store(dask_worker: Any = None):
    """The worker's :class:`WindowStore` (its ``data``), or ``None`` when it uses another store."""
    from gdask.window_cache._store import WindowStore

    if dask_worker is None:
        from distributed import get_worker

        dask_worker = get_worker()
    data = getattr(dask_worker, "data", None)
    return data if isinstance(data, WindowStore) else None


def _worker_stats(dask_worker=None, reset: bool = False) -> dict[str, Any] | None:
    store = worker_store(dask_worker)
    if store is None:
        return None
    out = store.stats()
    if reset:
        store.reset_stats()
    return out


def _worker_hint(keys, dask_worker=None) -> int:
    store = worker_store(dask_worker)
    if store is None:
        return 0
    store.hint([tuple(k) if isinstance(k, list) else k for k in keys])
    return 1


def stats(client: Any = None, *, reset: bool = False) -> dict[str, Any]:
    """Window cache statistics of every worker and in total.

    Parameters
    ----------
    client : distributed.Client, optional
        Default: the current client.
    reset : bool
        Reset the workers' counters after reading them (to measure one phase of a loop).

    Returns
    -------
    dict
        ``hits``, ``misses``, ``prefetch_hits``, ``reads``, ``hit_rate`` (hits / reads: reads served
        by blocks kept on the device, no copy), ``bytes_h2d``, ``bytes_d2h``, ``stall_time``
        (seconds readers waited for copies), ... summed over workers, and ``workers``:
        ``{address: per-worker metrics, with "window": [(t, capacity, window bytes, blocks), ...]}``.
        Workers whose data store is not a :class:`WindowStore` are left out.
    """
    if client is None:
        from distributed import default_client

        client = default_client()
    per = {w: s for w, s in client.run(_worker_stats, reset=reset).items() if s is not None}
    totals: dict[str, Any] = {k: 0 for k in _SUMMED}
    for s in per.values():
        for k in _SUMMED:
            totals[k] += s.get(k, 0)
    totals["hit_rate"] = totals["hits"] / totals["reads"] if totals["reads"] else 0.0
    totals["workers"] = per
    return totals


def hint_order(client: Any, keys: Iterable[Any]) -> int:
    """Tell every worker's store the order the next pass reads ``keys`` in (each worker keeps the
    keys it holds). Call it before submitting each pass; it also marks the start of the pass.

    Returns the number of workers with a window store.
    """
    keys = list(keys)
    return sum(v for v in client.run(_worker_hint, keys).values())
