"""The client side of loops on the workers: start one task per rank, watch them, stop them all.

A loop that cannot run to its end (a task raised, a worker left, or a task could not start because
its worker is busy) ends with :class:`~gdask.gdataset.collective.CollectiveError` here, after every
task of the loop was told to stop.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import Any, Callable, Sequence

import dask
from dask import is_dask_collection
from distributed import Future, wait
from distributed.client import FutureCancelledError, FuturesCancelledError

from gdask import config
from gdask._compat import scheduler_workers
from gdask.gdataset.collective._worker import CollectiveError, CollectivePlugin, Stopped, abort_on_worker, rank_task
from gdask.scheduling import ensure_plugins

logger = logging.getLogger("gdask.gdataset")

__all__ = ["run_on_workers"]


def run_on_workers(client: Any, func: Callable[..., Any], peers: Sequence[str], args: Sequence[tuple],
                   *, name: str = "loop", poll: float = 0.1, on_poll: Callable[[], None] | None = None,
                   check_workers: float = 1.0, same_results: bool = False) -> list[Any]:
    """Run ``func(comm, *args[r])`` as one task per rank ``r`` on worker ``peers[r]``, all at once;
    their results in rank order.

    ``args`` may hold Dask collections and futures (e.g. persisted blocks): they arrive computed,
    and blocks already on ``peers[r]`` are not moved (futures only in lists, tuples and dicts make
    the cheapest start: the arguments are not walked by ``dask.delayed``). ``on_poll()`` is called
    in this thread every ``poll`` seconds while the tasks run (e.g. to show progress they send); whether a peer left the
    cluster is checked every ``check_workers`` seconds. ``same_results``: every rank returns the
    whole result (e.g. all-gathered at its end), so one rank's result is fetched, from a worker
    still there, and returned as a one-item list: a worker lost after its task finished costs
    nothing. Raises :class:`CollectiveError` if the loop did not run to its end (a task stopped or
    raised, a worker left, or a task could not start within ``gdask.collective.start-timeout``);
    every task still running is then told to stop. The tasks are released when this returns.
    """
    ensure_plugins(client, extra=(CollectivePlugin(),), standard=False)
    start_timeout = float(config.get("collective.start-timeout", 10))
    timeout = config.get("collective.timeout", 600)
    timeout = None if timeout is None else float(timeout)
    direct = bool(config.get("collective.direct", True))
    pause_profiler = bool(config.get("collective.pause-profiler", True))
    token = uuid.uuid4().hex
    peers = list(peers)
    futures = []
    for r, (addr, a) in enumerate(zip(peers, args)):
        key = f"{name}-{token}-{r}"
        head = (key, token, r, peers, start_timeout, timeout, direct, pause_profiler, func)
        if all(_submittable(x) for x in a):  # futures at most in lists, tuples and dicts: one task, as it is
            futures.append(client.submit(rank_task, *head, *a, key=key, workers=[addr], allow_other_workers=False,
                                         pure=False))
        else:  # collections (or futures inside other objects) to compute first: dask.delayed finds them
            task = dask.delayed(rank_task, pure=False)(*head, *a, dask_key_name=key)
            futures.append(client.compute(task, workers=[addr], allow_other_workers=False))
    next_check = time.monotonic() + check_workers
    try:
        while True:
            try:  # the tasks end together: this returns for the first, and waits for the others next
                with client.as_current():  # distributed's wait asks the current client: this one, default or not
                    wait([f for f in futures if f.status == "pending"], timeout=poll, return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass
            except FuturesCancelledError:  # a task lost its inputs (e.g. scattered to a worker that died):
                pass  # its future is "cancelled", a failure of the loop, raised below as CollectiveError
            if on_poll is not None:
                on_poll()
            failed = [f for f in futures if f.status in ("error", "cancelled", "lost")]
            if failed:
                exc = failed[0].exception() if failed[0].status == "error" else failed[0].status
                raise CollectiveError(f"{name} on the workers failed: {exc!r}") from (
                    exc if isinstance(exc, BaseException) else None)
            if all(f.status == "finished" for f in futures):
                return _results(client, futures, peers, start_timeout, name, same_results)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + check_workers
                gone = set(peers) - _workers(client)
                if gone:
                    raise CollectiveError(f"{name} on the workers lost worker(s) {sorted(gone)}")
    except BaseException as e:
        _stop(client, token, peers, futures, f"stopped by the client: {e!r}")
        raise
    finally:
        client.cancel(futures)  # released: a result lost with its worker is not recomputed


def _submittable(obj: Any, inside: bool = False) -> bool:
    """Whether ``client.submit`` passes ``obj`` as it should: no Dask collection in it, and futures
    only where ``submit`` finds them (in lists, tuples and dicts, not ``inside`` other objects such as
    dataclasses). ``dask.delayed`` finds both everywhere, but walking a large argument costs milliseconds."""
    if is_dask_collection(obj) or (inside and isinstance(obj, Future)):
        return False
    if isinstance(obj, (list, tuple, set)):
        return all(_submittable(x, inside) for x in obj)
    if isinstance(obj, dict):
        return all(_submittable(x, inside) for x in obj.values())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return all(_submittable(getattr(obj, f.name), True) for f in dataclasses.fields(obj))
    return True


def _workers(client: Any) -> set[str]:
    return set(scheduler_workers(client))


def _results(client: Any, futures: list, peers: list[str], timeout: float, name: str, same: bool) -> list[Any]:
    """The finished tasks' results, each fetched within ``timeout`` seconds (a result lost with its
    worker after the task finished cannot come back: the task may run on that worker only, and
    ``client.gather`` would wait for it forever). ``same``: the first result that comes back, from a
    worker still there. A rank that stopped (:class:`Stopped`) ends the loop with its reason."""
    ranks = list(range(len(futures)))
    if same:  # ranks on workers still there first; each tried briefly before any is waited for in full
        alive = _workers(client)
        ranks.sort(key=lambda r: peers[r] not in alive)
        ranks = [(r, min(1.0, timeout)) for r in ranks] + [(r, timeout) for r in ranks]
    else:
        ranks = [(r, timeout) for r in ranks]
    out, lost = [], None
    for rank, limit in ranks:
        try:
            res = futures[rank].result(timeout=limit)
        except (TimeoutError, FutureCancelledError) as e:
            lost = CollectiveError(f"{name} on the workers: the result of rank {rank} was lost with its worker "
                                   f"({type(e).__name__}; not back within {limit:g} s)")
            if same:
                continue
            raise lost from None
        if isinstance(res, Stopped):
            raise CollectiveError(f"{name} on the workers stopped: {res.reason}")
        out.append(res)
        if same:
            return out
    if lost is not None:
        raise lost
    return out


def _stop(client: Any, token: str, peers: list[str], futures: list, reason: str) -> None:
    try:
        alive = set(peers) & _workers(client)
        if alive:
            client.run(abort_on_worker, token, reason, workers=sorted(alive), on_error="ignore")
    except Exception as e:  # noqa: BLE001 - the cluster may be going away
        logger.debug("could not stop loop %s on the workers: %r", token, e)
