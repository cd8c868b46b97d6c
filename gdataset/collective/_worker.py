"""The worker side of loops on the workers: the mailboxes, their plugin, and the communicator a
loop's task uses to all-gather with the loop's other tasks.

The messages go through handlers that the ``gdask-collective`` worker plugin (:class:`CollectivePlugin`)
adds to each worker; the client side (:func:`gdask.gdataset.collective.run_on_workers`) installs it.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from distributed import WorkerPlugin, get_worker
from distributed.core import Status
from distributed.protocol import to_serialize

from gdask import protocol
from gdask.gdataset.collective import _direct

logger = logging.getLogger("gdask.gdataset")

__all__ = ["CollectiveError", "CollectivePlugin", "Communicator", "Mailbox", "Stopped", "abort_on_worker",
           "mailbox", "rank_task"]

_MAX_KEPT = 1024

#: values an all-gather sends as one pickled frame when their pickle is at most this long (bytes)
_SMALL = 256 * 1024

#: the worker's periodic callbacks of distributed's statistical profiler (``distributed.worker.profile``)
_PROFILER = ("profile", "profile-cycle")


def pack(value: Any) -> tuple[Any, bool]:
    """What an all-gather sends for ``value``, and whether it is packed.

    A small value (its pickle and buffers at most :data:`_SMALL` bytes) goes as one pickled frame: a
    K-means pass's partials are dozens of small arrays, which distributed's serialization sends as a
    frame each (measured: ~6x the CPU of one pickle, on both ends). A large value goes through
    distributed's serialization as before (its buffers are not copied)."""
    buffers: list = []
    try:
        head = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        size = len(head) + sum(b.raw().nbytes for b in buffers)
        if size > _SMALL:
            return to_serialize(value), False
        return pickle.dumps(value, protocol=5), True  # the buffers in-band: one frame
    except Exception:  # noqa: BLE001 - not picklable as is (or a buffer not contiguous): distributed's serializers
        return to_serialize(value), False


class CollectiveError(RuntimeError):
    """A loop on the workers could not run to its end (the caller falls back to one graph per step).
    Raised on the workers (a rank stopped) and on the client (:func:`run_on_workers`)."""


def _remember(d: OrderedDict, key: Any, value: Any) -> None:
    d.setdefault(key, value)
    while len(d) > _MAX_KEPT:
        d.popitem(last=False)


#: values whose frames take more than this many bytes go through distributed's worker RPC also when
#: the tasks are connected directly (measured between two workers here, 4 MiB a step: 0.9 ms over the
#: sockets with reused receive buffers, 6.2 ms by RPC; the sockets were slower, 7 ms, while every frame
#: came into fresh memory): what bounds the receive buffers a task keeps (:class:`gdask.devices.BufferPool`)
_DIRECT_MAX = 64 << 20
assert _DIRECT_MAX > _SMALL  # a direct value too large for the socket goes by RPC unpacked


class _ViaRPC:
    """What a task sends over its direct connections when its value of the step went by RPC."""


class Mailbox:
    """The messages of loops on one worker. A worker may run several ranks of one loop (several
    threads, or ``processes=False``): every message is addressed to one rank, and each rank's end is
    its own."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.box: dict[tuple[str, int, int], dict[int, Any]] = {}  # (loop, step, to rank) -> {from: value}
        self.aborted: OrderedDict[str, str] = OrderedDict()  # loop token -> why it was stopped
        self.finished: OrderedDict[tuple[str, int], None] = OrderedDict()  # ranks that ended: late messages dropped
        self.running: dict[Any, str] = {}  # task key of a rank running here -> its loop's token
        self.cancelled: OrderedDict[str, None] = OrderedDict()  # loops stopped because a task of theirs was cancelled
        self.wakers: dict[str, set[Any]] = {}  # loop token -> wakers of its ranks here waiting on direct connections

    def add_waker(self, token: str, waker: Any) -> None:
        with self.cond:
            self.wakers.setdefault(token, set()).add(waker)

    def remove_waker(self, token: str, waker: Any) -> None:
        with self.cond:
            ws = self.wakers.get(token)
            if ws is not None:
                ws.discard(waker)
                if not ws:
                    del self.wakers[token]

    def _wake(self, token: str) -> None:
        for w in self.wakers.get(token, ()):
            w.poke()

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
            self._wake(token)

    def started(self, key: Any, token: str) -> None:
        with self.cond:
            self.running[key] = token

    def cancel(self, key: Any) -> None:
        """The task ``key`` was released while it ran (its client left, or cancelled it): if it is a
        rank of a loop, stop the loop's ranks here."""
        with self.cond:
            token = self.running.get(key)
        if token is not None:
            self.cancel_loop(token, f"its task {key!r} was cancelled (its client left or released it)")

    def cancel_loop(self, token: str, reason: str) -> None:
        """Loop ``token`` was cancelled (a task of it was released while it ran: its client is gone or
        released the fit, and releases every task of the loop): stop its ranks here, and nobody
        resumes from their state. Also when something stopped the loop before (the reason stays)."""
        with self.cond:
            _remember(self.aborted, token, reason)
            _remember(self.cancelled, token, None)
            self.cond.notify_all()
            self._wake(token)

    def running_loop(self, token: str) -> bool:
        """Whether a rank of loop ``token`` still runs on this worker."""
        with self.cond:
            return token in self.running.values()

    def finish(self, token: str, rank: int, key: Any = None) -> None:
        with self.cond:
            _remember(self.finished, (token, rank), None)
            self.running.pop(key, None)
            for key in [k for k in self.box if k[0] == token and k[2] == rank]:
                del self.box[key]

    # worker handlers (a handler without a ``comm`` parameter gets the message as keywords)
    async def handle(self, token: str = "", step: int = 0, dest: int = 0, src: int = 0, data: Any = None,
                     packed: bool = False) -> str:
        self.deliver(token, step, dest, src, pickle.loads(data) if packed else data)
        return "OK"

    async def handle_abort(self, token: str = "", reason: str = "", cancelled: bool = False) -> str:
        if cancelled:
            self.cancel_loop(token, reason)
        else:
            self.abort(token, reason)
        return "OK"


class CollectivePlugin(WorkerPlugin):
    """Gives every worker (also ones that join later) the :class:`Mailbox` of loops on the workers and
    its message handlers, and stops a loop's ranks on this worker when one of its tasks is cancelled
    while it runs (distributed cannot interrupt a running task: its client's death, or ``cancel``,
    would leave the loop running to its end, holding its blocks).

    While ranks run on the worker, it can pause the worker's statistical profiler
    (:meth:`rank_started`)."""

    name = protocol.PLUGIN_COLLECTIVE
    idempotent = True

    def __init__(self) -> None:
        self.mailbox = Mailbox()
        self._lock = threading.Lock()
        self._ranks = 0  # ranks running on this worker that asked for the profiler's pause
        self._paused: list = []  # the profiler's periodic callbacks this plugin stopped

    def __getstate__(self) -> dict:
        return {}  # every worker starts with an empty mailbox

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def setup(self, worker: Any) -> None:
        worker.handlers[protocol.HANDLER_COLLECTIVE] = self.mailbox.handle
        worker.handlers[protocol.HANDLER_COLLECTIVE_ABORT] = self.mailbox.handle_abort

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if start in ("executing", "long-running") and finish in ("released", "cancelled", "forgotten"):
            self.mailbox.cancel(key)

    # -- the profiler's pause ------------------------------------------------------------------
    # A rank keeps a core busy from its first step to its last, and the ranks of a loop wait for each
    # other every step. distributed's profiler samples the threads' stacks every 10 ms on the event
    # loop's thread (~3% of a core here), which then takes that core from a rank, and the other ranks
    # wait for it: K-means on two ranks that fill 2 cores, late iterations 27.9 -> 25.9 ms with it paused.
    # A rank's profile is one long task anyway. The periodic callbacks are stopped and started on the
    # event loop (tornado's are not thread-safe), never added or removed.
    def rank_started(self, worker: Any) -> None:
        """(in a rank's thread) A rank that pauses the profiler starts on ``worker``: the first one
        stops the profiler's periodic callbacks that run."""
        with self._lock:
            self._ranks += 1
            first = self._ranks == 1
        if first:
            worker.loop.add_callback(self._pause, worker)

    def rank_finished(self, worker: Any) -> None:
        """(in a rank's thread) A rank of :meth:`rank_started` ended: the last one starts again what
        the first stopped, unless the worker is closing."""
        with self._lock:
            self._ranks -= 1
            last = self._ranks == 0
        if last:
            worker.loop.add_callback(self._resume, worker)

    def _pause(self, worker: Any) -> None:
        with self._lock:
            if self._ranks == 0:  # the ranks ended before the event loop came here
                return
            for name in _PROFILER:
                pc = worker.periodic_callbacks.get(name)
                if pc is not None and pc.is_running():
                    pc.stop()
                    self._paused.append(pc)

    def _resume(self, worker: Any) -> None:
        with self._lock:
            if self._ranks:  # another rank started meanwhile: it keeps the pause
                return
            paused, self._paused = self._paused, []
        if worker.status in (Status.running, Status.paused):  # a closing worker stopped them for good
            for pc in paused:
                pc.start()

    @property
    def profiler_paused(self) -> bool:
        """Whether this plugin holds the worker's profiler stopped."""
        return bool(self._paused)


def mailbox(worker: Any) -> Mailbox:
    """``worker``'s mailbox (the collective plugin must be installed: the client's ``run_on_workers`` does)."""
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

    #: connections to the other tasks (all on this host), once made (:meth:`connect_direct`)
    direct: _direct.Direct | None = None
    _waker: _direct.Waker | None = None

    def __init__(self, token: str, rank: int, peers: Sequence[str], timeout: float | None) -> None:
        self.token = token
        self.rank = rank
        self.peers = list(peers)
        self.size = len(self.peers)
        self.timeout = timeout
        self._step = 0
        self.worker = get_worker()  # the distributed.Worker this task runs on
        self.mailbox = mailbox(self.worker)

    def start(self, timeout: float, direct: bool) -> bool:
        """Wait until every task of the loop runs (an all-gather within ``timeout`` seconds: a worker
        still busy with other tasks ends the loop now instead of stalling it), and with ``direct``
        connect to the other tasks directly (:mod:`._direct`) when each runs in its own worker process
        on this host. The first all-gather carries each task's address for those connections. Every
        task takes the same decision (an all-gather of whether its connections were made). Returns
        whether the loop's all-gathers go over direct connections from now on."""
        wanted = direct and self.size >= 2 and _direct.same_host(self.peers)  # the same for every task
        srv = path = None
        if wanted:
            try:
                srv, path = _direct.listen()
            except OSError as e:
                logger.debug("loop %s: no direct connections (%r)", self.token, e)
        try:
            paths = self.allgather(path, timeout=timeout)
            return wanted and self._connect_direct(paths, srv, timeout)
        finally:
            _direct.unlisten(srv, path)

    def _connect_direct(self, paths: list, srv: Any, timeout: float) -> bool:
        direct = None
        if all(paths):
            try:
                direct = _direct.connect(self.rank, paths, srv, timeout)
            except (OSError, _direct.DirectError) as e:
                logger.debug("loop %s: direct connections failed (%r)", self.token, e)
        if not all(self.allgather(direct is not None, timeout=timeout)):
            if direct is not None:
                direct.close()
            return False
        self.direct, self._waker = direct, _direct.Waker()
        self.mailbox.add_waker(self.token, self._waker)
        return True

    def close(self) -> None:
        """Close the direct connections (the loop's task ends); a cancelled loop tells its peers first,
        so that they too know nobody resumes it (the scheduler's word may reach them later)."""
        if self.direct is not None:
            if self.cancelled:
                self.direct.notify_cancelled()
            self.direct.close()
            self.direct = None
        if self._waker is not None:
            self.mailbox.remove_waker(self.token, self._waker)
            self._waker.close()
            self._waker = None

    @property
    def cancelled(self) -> bool:
        """Whether the loop stopped because one of its tasks was cancelled (its client is gone, or
        released the fit): nobody will resume it, so its state can go."""
        return self.token in self.mailbox.cancelled

    def _send(self, addr: str, handler: str, **msg: Any):
        worker = self.worker
        coro = getattr(worker.rpc(addr), handler)(**msg)
        return asyncio.run_coroutine_threadsafe(coro, worker.loop.asyncio_loop)

    def allgather(self, value: Any, timeout: float | None = None) -> list[Any]:
        """Every task's ``value``, in rank order (each task calls this the same number of times).

        Raises :class:`CollectiveError` when the loop was aborted (another task failed, or the
        client stopped it) or no value came from some task within ``timeout`` seconds (default
        the communicator's)."""
        step = self._step
        self._step += 1
        if self.direct is not None:
            return self._allgather_direct(step, value, timeout)
        me = self.worker.address
        sends = []
        wire = None
        for r, addr in enumerate(self.peers):
            if r == self.rank:
                continue
            if addr == me:  # a rank on this worker
                self.mailbox.deliver(self.token, step, r, self.rank, value)
            else:
                if wire is None:
                    wire = pack(value)
                data, packed = wire
                sends.append(self._send(addr, protocol.HANDLER_COLLECTIVE, token=self.token, step=step, dest=r,
                                        src=self.rank, data=data, packed=packed))
        self.mailbox.deliver(self.token, step, self.rank, self.rank, value)
        limit = self.timeout if timeout is None else timeout
        deadline = None if limit is None else time.monotonic() + limit
        got = self._wait_box(step, range(self.size), deadline, limit)
        self._sent(sends)
        return [got[r] for r in range(self.size)]

    def _wait_box(self, step: int, ranks: Any, deadline: float | None, limit: float | None) -> dict[int, Any]:
        """The values of ``ranks`` for ``step`` that came through the mailbox, once all are there."""
        box = self.mailbox
        want = set(ranks)
        key = (self.token, step, self.rank)
        with box.cond:
            while True:
                got = box.box.get(key, {})
                if want <= set(got):  # a step whose values all came is complete, even in a loop stopped
                    del box.box[key]  # meanwhile (a rank slow to wake checkpoints it; the next step stops)
                    return got
                if self.token in box.aborted:
                    raise CollectiveError(f"loop stopped: {box.aborted[self.token]}")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    missing = sorted(want - set(got))
                    raise CollectiveError(f"no value from rank(s) {missing} of {self.size} within {limit:g} s "
                                          f"(step {step})")
                box.cond.wait(left if left is not None else 1.0)

    @staticmethod
    def _sent(sends: list) -> None:
        for s in sends:  # a peer that could not be reached: stop here, not in the next step
            try:
                s.result()
            except Exception as e:  # noqa: BLE001 - any failure to deliver ends the loop
                raise CollectiveError(f"could not reach a peer: {e!r}") from e

    def _allgather_direct(self, step: int, value: Any, timeout: float | None) -> list[Any]:
        limit = self.timeout if timeout is None else timeout
        deadline = None if limit is None else time.monotonic() + limit

        def stopped() -> str | None:
            with self.mailbox.cond:
                return self.mailbox.aborted.get(self.token)

        frames = _direct.frames(value)
        sends = []
        if sum(f.nbytes for f in frames) > _DIRECT_MAX:  # large: distributed's serialization carries it (it
            data = to_serialize(value)                     # moves megabytes faster than the socket's small
            for r, addr in enumerate(self.peers):          # buffers), the socket a note to look there; over
                if r != self.rank:                         # pack's _SMALL, so not pickled again to size it
                    sends.append(self._send(addr, protocol.HANDLER_COLLECTIVE, token=self.token, step=step, dest=r,
                                            src=self.rank, data=data, packed=False))
            frames = _direct.frames(_ViaRPC())
        try:
            got = self.direct.allgather(step, frames, value, self.size, self._waker, deadline, stopped)
            via = [r for r, v in enumerate(got) if isinstance(v, _ViaRPC)]
            if via:
                box = self._wait_box(step, via, deadline, limit)
                for r in via:
                    got[r] = box[r]
            self._sent(sends)
            return got
        except _direct.LoopStopped as e:
            raise CollectiveError(f"loop stopped: {e}") from None
        except TimeoutError as e:
            raise CollectiveError(f"{e} within {limit:g} s (step {step})") from None
        except _direct.PeerCancelled as e:  # the loop was cancelled: this task's release is on its way
            reason = f"{e} (its client left or released it)"
            self.mailbox.cancel_loop(self.token, reason)
            raise CollectiveError(f"loop stopped: {reason}") from None
        except _direct.DirectError as e:  # a peer's worker died, or its task ended
            raise CollectiveError(f"lost the connection to {e}") from e

    def abort(self, reason: str) -> None:
        """Tell every task of the loop (this one included) to stop, and whether the loop was cancelled;
        best effort, does not wait."""
        cancelled = self.cancelled
        if not cancelled:
            self.mailbox.abort(self.token, reason)
        for addr in set(self.peers) - {self.worker.address}:
            try:
                self._send(addr, protocol.HANDLER_COLLECTIVE_ABORT, token=self.token, reason=reason,
                           cancelled=cancelled)
            except Exception as e:  # noqa: BLE001 - the peer may be gone
                logger.debug("could not tell %s to stop loop %s: %r", addr, self.token, e)


@dataclass(frozen=True)
class Stopped:
    """What a rank's task returns when its loop stopped (a peer failed or left, the client stopped it,
    its task was cancelled): an expected end, which the client turns into :class:`CollectiveError`,
    not an error for the worker to log."""

    reason: str


def rank_task(key: Any, token: str, rank: int, peers: list[str], start_timeout: float, timeout: float | None,
              direct: bool, pause_profiler: bool, func: Callable[..., Any], *args: Any) -> Any:
    """The task ``key`` of rank ``rank`` of a loop on the workers: ``func(comm, *args)`` once every rank
    runs; a rank that fails (or is stopped, or whose task is cancelled) tells the others to stop. A
    stopped rank returns :class:`Stopped`; any other exception is raised. ``direct``: all-gather over
    direct connections when every rank has its own worker on this host (:meth:`Communicator.connect_direct`).
    ``pause_profiler``: the worker's statistical profiler pauses while the rank runs
    (:meth:`CollectivePlugin.rank_started`)."""
    comm = Communicator(token, rank, peers, timeout)
    comm.mailbox.started(key, token)
    plugin = comm.worker.plugins.get(protocol.PLUGIN_COLLECTIVE) if pause_profiler else None
    if plugin is not None:
        plugin.rank_started(comm.worker)
    try:
        # every task must be running before any waits for another's work: a worker still busy
        # with other tasks ends the loop now (the caller falls back) instead of stalling it
        comm.start(start_timeout, direct)
        return func(comm, *args)
    except CollectiveError as e:  # a rank that starts after the loop was stopped stops in its first allgather
        comm.abort(str(e))
        return Stopped(f"rank {rank}: {e}")
    except BaseException as e:
        comm.abort(f"rank {rank} raised {e!r}")
        raise
    finally:
        comm.close()
        comm.mailbox.finish(token, rank, key)
        if plugin is not None:
            plugin.rank_finished(comm.worker)


def abort_on_worker(token: str, reason: str, dask_worker: Any = None) -> None:
    """(on a worker, through ``client.run``) Stop loop ``token``'s ranks on this worker."""
    plugin = dask_worker.plugins.get(protocol.PLUGIN_COLLECTIVE)
    if plugin is not None:
        plugin.mailbox.abort(token, reason)
