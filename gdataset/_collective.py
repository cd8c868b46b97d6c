"""Loops that run on the workers: one long task per worker, small results exchanged worker to worker.

An iterative fit driven from the client pays, every iteration, for a graph sent to the scheduler,
tasks sent to the workers, results reported back and gathered by the client: on a small cluster
that round trip is tens of milliseconds, which late in a K-means fit is longer than the
iteration's own work. When the data is persisted and fits on the devices, the loop can instead
run inside one task per worker (the workers that hold the blocks) that exchange their partial
results directly, as cuML's multi-GPU estimators do with NCCL and xgboost's Dask interface with
its allreduce: :meth:`Communicator.allgather` is one message from each worker to each other one.
Every worker then combines the same partials in the same order, so all of them compute the same
next iterate without the client.

The messages go through a handler that the ``gdask-collective`` worker plugin adds to each worker
(:func:`gdask.scheduling.ensure_plugins`, once per client). A loop that cannot run this way, because a worker is
busy with other tasks when it starts, leaves, or raises, ends with :class:`CollectiveError` on the
client after every task of the loop was told to stop: the caller then runs its ordinary
graph-per-iteration loop, with the same result.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any, Callable, Sequence

import dask
from distributed import WorkerPlugin

from gdask import config, protocol

logger = logging.getLogger("gdask.gdataset")

__all__ = ["CollectiveError", "CollectivePlugin", "Communicator", "Mailbox", "run_on_workers"]

_MAX_KEPT = 1024


class CollectiveError(RuntimeError):
    """A loop on the workers could not run to its end (the caller falls back to one graph per step)."""


def _remember(d: OrderedDict, key: Any, value: Any) -> None:
    d.setdefault(key, value)
    while len(d) > _MAX_KEPT:
        d.popitem(last=False)


class Mailbox:
    """The messages of loops on one worker. A worker may run several ranks of one loop (several
    threads, or ``processes=False``): every message is addressed to one rank, and each rank's end is
    its own."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.box: dict[tuple[str, int, int], dict[int, Any]] = {}  # (loop, step, to rank) -> {from: value}
        self.aborted: OrderedDict[str, str] = OrderedDict()  # loop token -> why it was stopped
        self.finished: OrderedDict[tuple[str, int], None] = OrderedDict()  # ranks that ended: late messages dropped

    def deliver(self, token: str, step: int, dest: int, src: int, data: Any) -> None:
        with self.cond:
            if (token, dest) in self.finished:
                return
            self.box.setdefault((token, step, dest), {})[src] = data
            self.cond.notify_all()

    def abort(self, token: str, reason: str) -> None:
        with self.cond:
            _remember(self.aborted, token, reason)
            self.cond.notify_all()

    def finish(self, token: str, rank: int) -> None:
        with self.cond:
            _remember(self.finished, (token, rank), None)
            for key in [k for k in self.box if k[0] == token and k[2] == rank]:
                del self.box[key]

    # worker handlers (a handler without a ``comm`` parameter gets the message as keywords)
    async def handle(self, token: str = "", step: int = 0, dest: int = 0, src: int = 0, data: Any = None) -> str:
        self.deliver(token, step, dest, src, data)
        return "OK"

    async def handle_abort(self, token: str = "", reason: str = "") -> str:
        self.abort(token, reason)
        return "OK"


class CollectivePlugin(WorkerPlugin):
    """Gives every worker (also ones that join later) the :class:`Mailbox` of loops on the workers and
    its message handlers."""

    name = protocol.PLUGIN_COLLECTIVE
    idempotent = True

    def __init__(self) -> None:
        self.mailbox = Mailbox()

    def __getstate__(self) -> dict:
        return {}  # every worker starts with an empty mailbox

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def setup(self, worker: Any) -> None:
        worker.handlers[protocol.HANDLER_COLLECTIVE] = self.mailbox.handle
        worker.handlers[protocol.HANDLER_COLLECTIVE_ABORT] = self.mailbox.handle_abort


def mailbox(worker: Any) -> Mailbox:
    """``worker``'s mailbox (the collective plugin must be installed: :func:`run_on_workers` does)."""
    plugin = worker.plugins.get(protocol.PLUGIN_COLLECTIVE)
    if plugin is None:
        raise CollectiveError(f"worker {worker.address} has no {protocol.PLUGIN_COLLECTIVE!r} plugin")
    return plugin.mailbox


class Communicator:
    """What a loop's task on one worker uses to talk to the loop's other tasks.

    ``rank`` is this task's index in ``peers`` (worker addresses, one per task; a worker may
    appear more than once). :meth:`allgather` gives every task the list of all tasks' values in
    rank order.
    """

    def __init__(self, token: str, rank: int, peers: Sequence[str], timeout: float | None) -> None:
        self.token = token
        self.rank = rank
        self.peers = list(peers)
        self.size = len(self.peers)
        self.timeout = timeout
        self._step = 0
        from distributed import get_worker

        self.worker = get_worker()  # the distributed.Worker this task runs on
        self.mailbox = mailbox(self.worker)

    def _send(self, addr: str, handler: str, **msg: Any):
        worker = self.worker
        coro = getattr(worker.rpc(addr), handler)(**msg)
        return asyncio.run_coroutine_threadsafe(coro, worker.loop.asyncio_loop)

    def allgather(self, value: Any, timeout: float | None = None) -> list[Any]:
        """Every task's ``value``, in rank order (each task calls this the same number of times).

        Raises :class:`CollectiveError` when the loop was aborted (another task failed, or the
        client stopped it) or no value came from some task within ``timeout`` seconds (default
        the communicator's)."""
        from distributed.protocol import to_serialize

        step = self._step
        self._step += 1
        me = self.worker.address
        box = self.mailbox
        sends = []
        for r, addr in enumerate(self.peers):
            if r == self.rank:
                continue
            if addr == me:  # a rank on this worker
                box.deliver(self.token, step, r, self.rank, value)
            else:
                sends.append(self._send(addr, protocol.HANDLER_COLLECTIVE, token=self.token, step=step, dest=r,
                                        src=self.rank, data=to_serialize(value)))
        box.deliver(self.token, step, self.rank, self.rank, value)
        limit = self.timeout if timeout is None else timeout
        deadline = None if limit is None else time.monotonic() + limit
        key = (self.token, step, self.rank)
        with box.cond:
            while True:
                if self.token in box.aborted:
                    raise CollectiveError(f"loop stopped: {box.aborted[self.token]}")
                got = box.box.get(key, {})
                if len(got) == self.size:
                    del box.box[key]
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    missing = sorted(set(range(self.size)) - set(got))
                    raise CollectiveError(f"no value from rank(s) {missing} of {self.size} within {limit:g} s "
                                          f"(step {step})")
                box.cond.wait(left if left is not None else 1.0)
        for s in sends:  # a peer that could not be reached: stop here, not in the next step
            try:
                s.result()
            except Exception as e:  # noqa: BLE001 - any failure to deliver ends the loop
                raise CollectiveError(f"could not reach a peer: {e!r}") from e
        return [got[r] for r in range(self.size)]

    def abort(self, reason: str) -> None:
        """Tell every task of the loop (this one included) to stop; best effort, does not wait."""
        self.mailbox.abort(self.token, reason)
        for addr in set(self.peers) - {self.worker.address}:
            try:
                self._send(addr, protocol.HANDLER_COLLECTIVE_ABORT, token=self.token, reason=reason)
            except Exception as e:  # noqa: BLE001 - the peer may be gone
                logger.debug("could not tell %s to stop loop %s: %r", addr, self.token, e)


def _task(token: str, rank: int, peers: list[str], start_timeout: float, timeout: float | None,
          func: Callable[..., Any], *args: Any) -> Any:
    comm = Communicator(token, rank, peers, timeout)
    try:
        # every task must be running before any waits for another's work: a worker still busy
        # with other tasks ends the loop now (the caller falls back) instead of stalling it
        comm.allgather(None, timeout=start_timeout)
        return func(comm, *args)
    except BaseException as e:  # a rank that starts after the loop was stopped raises in its first allgather
        comm.abort(str(e) if isinstance(e, CollectiveError) else f"rank {rank} raised {e!r}")
        raise
    finally:
        comm.mailbox.finish(token, rank)


def run_on_workers(client: Any, func: Callable[..., Any], peers: Sequence[str], args: Sequence[tuple],
                   *, name: str = "loop", poll: float = 0.1, on_poll: Callable[[], None] | None = None,
                   check_workers: float = 1.0) -> list[Any]:
    """Run ``func(comm, *args[r])`` as one task per rank ``r`` on worker ``peers[r]``, all at once;
    their results in rank order.

    ``args`` may hold Dask collections and futures (e.g. persisted blocks): they arrive computed,
    and blocks already on ``peers[r]`` are not moved. ``on_poll()`` is called in this thread every
    ``poll`` seconds while the tasks run (e.g. to show progress they send); whether a peer left the
    cluster is checked every ``check_workers`` seconds. Raises :class:`CollectiveError` if the loop
    did not run to its end (a task raised, a worker left, or a task could not start within
    ``gdask.collective.start-timeout``); every task still running is then told to stop.
    """
    from distributed import wait

    from gdask.scheduling import ensure_plugins

    ensure_plugins(client, extra=(CollectivePlugin(),), standard=False)
    start_timeout = float(config.get("collective.start-timeout", 10))
    timeout = config.get("collective.timeout", 600)
    timeout = None if timeout is None else float(timeout)
    token = uuid.uuid4().hex
    peers = list(peers)
    futures = []
    for r, (addr, a) in enumerate(zip(peers, args)):
        task = dask.delayed(_task, pure=False)(token, r, peers, start_timeout, timeout, func, *a,
                                               dask_key_name=f"{name}-{token}-{r}")
        futures.append(client.compute(task, workers=[addr], allow_other_workers=False))
    next_check = time.monotonic() + check_workers
    try:
        while True:
            try:  # the tasks end together: this returns for the first, and waits for the others next
                wait([f for f in futures if f.status == "pending"], timeout=poll, return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass
            if on_poll is not None:
                on_poll()
            failed = [f for f in futures if f.status in ("error", "cancelled", "lost")]
            if failed:
                exc = failed[0].exception() if failed[0].status == "error" else failed[0].status
                raise CollectiveError(f"{name} on the workers failed: {exc!r}") from (
                    exc if isinstance(exc, BaseException) else None)
            if all(f.status == "finished" for f in futures):
                return _results(futures, start_timeout, name)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + check_workers
                gone = set(peers) - set(client.scheduler_info(n_workers=-1)["workers"])
                if gone:
                    raise CollectiveError(f"{name} on the workers lost worker(s) {sorted(gone)}")
    except BaseException as e:
        _stop(client, token, peers, futures, f"stopped by the client: {e!r}")
        raise


def _results(futures: list, timeout: float, name: str) -> list[Any]:
    """The finished tasks' results, each fetched within ``timeout`` seconds: a result lost with its
    worker after the task finished cannot come back (the task may run on that worker only), and
    ``client.gather`` would wait for it forever."""
    from distributed.client import FutureCancelledError

    out = []
    for rank, f in enumerate(futures):
        try:
            out.append(f.result(timeout=timeout))
        except (TimeoutError, FutureCancelledError) as e:
            raise CollectiveError(f"{name} on the workers: the result of rank {rank} was lost with its worker "
                                  f"({type(e).__name__}; not back within {timeout:g} s)") from None
    return out


def _stop(client: Any, token: str, peers: list[str], futures: list, reason: str) -> None:
    alive = set(peers)
    try:
        alive &= set(client.scheduler_info(n_workers=-1)["workers"])
        if alive:
            client.run(_abort_on_worker, token, reason, workers=sorted(alive), on_error="ignore")
    except Exception as e:  # noqa: BLE001 - the cluster may be going away
        logger.debug("could not stop loop %s on the workers: %r", token, e)
    client.cancel(futures)


def _abort_on_worker(token: str, reason: str, dask_worker: Any = None) -> None:
    plugin = dask_worker.plugins.get(protocol.PLUGIN_COLLECTIVE)
    if plugin is not None:
        plugin.mailbox.abort(token, reason)
