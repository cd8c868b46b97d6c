"""Where a GDataSet's blocks are on the cluster: persisted or not, on which worker, in which tier.

The cluster-view helpers the engine, ``GDataSet.block_groups`` and the HTML repr share. Each asks
the scheduler (and, for tiers, the workers holding blocks) once per call: call them once per loop,
not once per iteration.

* :func:`default_client_or_none`: the current Client, or None.
* :func:`persisted_futures`: the futures of a dataset's blocks when all of them are held in cluster
  memory.
* :func:`block_places` (a :class:`BlockPlaces`) / :func:`block_workers` (the same as a tuple): the
  worker holding each block, and the workers' thread counts.
* :func:`groups_of`: blocks grouped by the worker thread that holds them.
* :func:`block_status`: every block's worker and window-store tier, bounded in time (for displays).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

from distributed import default_client, futures_of
from distributed import wait as wait_for_futures

from gdask import config
from gdask._compat import run_async, scheduler_workers
from gdask.window_cache import worker_store

__all__ = ["BlockPlaces", "block_places", "block_status", "block_workers", "default_client_or_none", "groups_of",
           "persisted_futures"]

logger = logging.getLogger("gdask.gdataset")


def default_client_or_none() -> Any:
    """The current Dask client, or None when there is none.

    Returns
    -------
    distributed.Client or None
    """
    try:
        return default_client()
    except ValueError:
        return None


def persisted_futures(x: Any) -> list | None:
    """The futures of ``x``'s blocks when every block is held in cluster memory.

    Parameters
    ----------
    x : GDataSet (or any Dask collection)

    Returns
    -------
    list of distributed.Future or None
        None when some block is not persisted (``x`` is lazy, or holds other futures as well).
    """
    futures = futures_of(x)
    keys = set(x.__dask_keys__())
    if len(futures) < len(keys) or not all(f.key in keys for f in futures):
        return None  # not (only) persisted blocks
    return futures


@dataclass(frozen=True)
class BlockPlaces:
    """Where the persisted blocks of one dataset are.

    Attributes
    ----------
    workers : dict
        ``{block index: worker address}`` (one holder of each block in memory: see :func:`_one_holder`).
    nthreads : dict
        ``{worker address: threads}`` of every worker of the cluster.
    """

    workers: dict[int, str]
    nthreads: dict[str, int]

    def complete(self, nblocks: int) -> bool:
        """Whether every one of ``nblocks`` blocks is held by a worker."""
        return len(self.workers) == nblocks

    def groups(self, nblocks: int) -> list[list[int]] | None:
        """Block indices grouped by the worker thread that holds them: each worker's blocks (in order)
        dealt round robin into as many groups as it has threads (at most one per block). None when
        not all ``nblocks`` blocks are held."""
        if not self.complete(nblocks):
            return None
        groups: list[list[int]] = []
        for addr in sorted(set(self.workers.values())):
            mine = sorted(i for i, w in self.workers.items() if w == addr)
            t = max(1, min(self.nthreads.get(addr, 1), len(mine)))
            groups.extend(mine[j::t] for j in range(t))
        return groups

    def as_tuple(self) -> tuple[dict[int, str], dict[str, int]]:
        """``(workers, nthreads)``, as :func:`block_workers` returns them."""
        return self.workers, self.nthreads


def _wait_computed(x: Any, futures: list) -> None:
    """Wait (config ``gdask.timeouts.blocks``) for blocks ``persist`` is still computing; a block that
    could not be made raises its error."""
    limit = float(config.get("timeouts.blocks", 600))
    try:
        wait_for_futures(futures, timeout=limit)
    except TimeoutError:
        raise TimeoutError(f"the persisted blocks of {x.name} were not all computed within {limit:g} s "
                           "(gdask.timeouts.blocks)") from None
    failed = next((f for f in futures if f.status == "error"), None)
    if failed is not None:  # a block could not be made: say why, rather than "not persisted"
        raise failed.exception()


def block_places(x: Any, client: Any = None, wait_ready: bool = False) -> BlockPlaces | None:
    """Where the blocks of ``x`` held in cluster memory are (one round trip to the scheduler).

    Parameters
    ----------
    x : GDataSet
    client : distributed.Client, optional
        Default: the current client.
    wait_ready : bool
        Wait for blocks still being computed by ``persist`` (bounded by config
        ``gdask.timeouts.blocks``; a block that failed raises its error).

    Returns
    -------
    BlockPlaces or None
        None without a client, when ``x`` is not persisted, or when the scheduler is gone.
    """
    client = client if client is not None else default_client_or_none()
    if client is None:
        return None
    futures = persisted_futures(x)
    if futures is None:
        return None
    index = {k: i for i, k in enumerate(x.__dask_keys__())}
    keys = [f.key for f in futures]

    async def ask():  # both questions in one round trip
        return await asyncio.gather(client.scheduler.who_has(keys=keys), client.scheduler.ncores())

    if wait_ready:
        _wait_computed(x, futures)
    try:
        who, nthreads = client.sync(ask)
    except OSError:  # the scheduler is gone: treat as not persisted
        return None
    held = {index[k]: sorted(addrs) for k, addrs in who.items() if k in index and addrs}
    threads = {addr: int(n) for addr, n in nthreads.items()}
    return BlockPlaces(_one_holder(held, getattr(x, "row_blocks", None), threads), threads)


def _one_holder(held: dict[int, list[str]], rows: Sequence[int] | None, nthreads: dict[str, int]) -> dict[int, str]:
    """One holder per block: a block held by one worker stays there; a block several workers hold
    (a task elsewhere fetched it, e.g. a reduction's) goes, in block order, to the holder with the
    fewest rows per thread so far. The first holder of each (as before) put 6 of 8 blocks on one of
    two workers after a reduction had fetched half of them: a loop's ranks then ran 6:2."""
    size = (lambda b: float(rows[b])) if rows is not None and len(rows) > max(held, default=-1) else (lambda b: 1.0)
    load: dict[str, float] = defaultdict(float)
    out: dict[int, str] = {}
    for b, addrs in held.items():
        if len(addrs) == 1:
            out[b] = addrs[0]
            load[addrs[0]] += size(b)
    for b in sorted(b for b, addrs in held.items() if len(addrs) > 1):
        a = min(held[b], key=lambda w: ((load[w] + size(b)) / max(1, nthreads.get(w, 1)), w))
        out[b] = a
        load[a] += size(b)
    return dict(sorted(out.items()))


def block_workers(x: Any, client: Any = None, wait_ready: bool = False) -> tuple[dict[int, str], dict[str, int]] | None:
    """``({block index: worker address}, {worker address: nthreads})`` for the blocks of ``x`` held
    in cluster memory (one holder of each): :func:`block_places` as a tuple.

    Returns
    -------
    tuple or None
        None without a client or persisted blocks.
    """
    places = block_places(x, client, wait_ready)
    return None if places is None else places.as_tuple()


def groups_of(where: BlockPlaces | tuple[dict[int, str], dict[str, int]] | None,
              nblocks: int) -> list[list[int]] | None:
    """:meth:`GDataSet.block_groups` from :func:`block_places` / :func:`block_workers`'s answer.

    Parameters
    ----------
    where : BlockPlaces or tuple or None
    nblocks : int

    Returns
    -------
    list of list of int or None
        None when ``where`` is None or does not hold all ``nblocks`` blocks.
    """
    if where is None:
        return None
    places = where if isinstance(where, BlockPlaces) else BlockPlaces(*where)
    return places.groups(nblocks)


def _tiers_on_worker(keys: list, dask_worker: Any = None) -> list[str | None]:
    """(on a worker) The window-store tier of each key it holds (``device``, ``host``, ``disk``,
    ``in-flight``), or None for a plain store / a plain value."""
    store = worker_store(dask_worker)
    out = []
    for k in keys:
        k = tuple(k) if isinstance(k, list) else k
        st = store.state(k) if store is not None else None
        out.append(None if st is None else str(getattr(st, "value", st)))
    return out


def _ask_tiers(client: Any, by_worker: dict[str, list], wait: float) -> dict[Any, str | None]:
    """``{key: tier}`` from the workers holding the keys (one round trip, all workers at once)."""
    async def ask():
        return await asyncio.wait_for(asyncio.gather(*[
            run_async(client, _tiers_on_worker, ks, workers=[a], on_error="return")
            for a, ks in by_worker.items()]),
            timeout=wait)

    out: dict[Any, str | None] = {}
    for (addr, ks), res in zip(by_worker.items(), client.sync(ask) if by_worker else []):
        tiers = res.get(addr) if isinstance(res, dict) else None
        if isinstance(tiers, list):
            out.update(zip(ks, tiers))
    return out


def block_status(x: Any, wait: float = 5.0) -> dict[int, dict[str, Any]] | None:
    """Where each block of ``x`` is, for displays (never raises, bounded in time).

    Asks the scheduler and the holding workers once each, waiting at most ``wait`` seconds for
    blocks still landing after ``persist()``.

    Returns
    -------
    dict or None
        ``{index: {"worker", "name", "tier"}}``, blocks still being computed as
        ``{"worker": None, "tier": "computing"}``; None when ``x`` is not persisted or there is no
        client.
    """
    client = default_client_or_none()
    if client is None:
        return None
    futures = persisted_futures(x)
    if futures is None:
        return None
    try:
        wait_for_futures(futures, timeout=wait)
    except TimeoutError:
        pass  # some blocks are still computing: shown as such
    index = {k: i for i, k in enumerate(x.__dask_keys__())}
    try:
        who = client.who_has(futures)
        info = scheduler_workers(client)
    except Exception as e:  # noqa: BLE001 - a display must never raise: no scheduler, shown as not persisted
        logger.debug("GDataSet repr: could not ask where the blocks are: %r", e)
        return None
    names = {addr: str(w.get("name", addr)) for addr, w in info.items()}
    out: dict[int, dict[str, Any]] = {i: {"worker": None, "name": None, "tier": "computing"} for i in index.values()}
    by_worker: dict[str, list] = {}
    for k, addrs in who.items():
        if k in index and addrs:
            addr = sorted(addrs)[0]
            out[index[k]] = {"worker": addr, "name": names.get(addr, addr), "tier": None}
            by_worker.setdefault(addr, []).append(k)
    try:
        for k, tier in _ask_tiers(client, by_worker, wait).items():
            out[index[k]]["tier"] = tier
    except Exception as e:  # noqa: BLE001 - tiers are a nicety: the diagram shows devices without them
        logger.debug("GDataSet repr: could not ask the workers for the blocks' tiers: %r", e)
    return out
