"""The loop on the workers, worker side: the task one rank runs, its driver's context, the
checkpoint it keeps, and the blocks it reads from its worker's store.

One task per worker holding blocks runs :func:`driver_on_worker` (through
:func:`gdask.gdataset.collective.run_on_workers`): the algorithm's driver over that worker's blocks,
a pass all-gathering the per-block results between the ranks. Every rank keeps its last
checkpoint and its recent records in its worker's state space of the loop (:func:`checkpoint_space`),
so that after a failure the client can ask the survivors where the fit got to; rank 0 also sends
the records as events (progress in the client's thread), in batches.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Sequence

from distributed.comm import get_address_host

from gdask import protocol
from gdask.devices import context
from gdask.gdataset import _blocks
from gdask.gdataset.collective import CollectiveError
from gdask.gdataset.engine._api import BlockIndex, Blocks, IterativeAlgorithm, LoopContext, block_arg, pass_name
from gdask.window_cache import worker_store

__all__ = ["RankResult", "RankTask", "StoreBlocks", "StoreKey", "WorkersContext", "checkpoint_space",
           "drop_on_worker", "driver_on_worker", "last_checkpoint"]

#: the key of a rank's last checkpoint in the loop's state space (and the space's suffix)
_CHECKPOINT = "engine-checkpoint"
#: the key of a rank's recent records there: ``((iteration, record), ...)``, oldest first
_RECENT = "engine-recent"
#: rank 0 sends its records at the latest when this many wait; every rank keeps twice as many recent
#: ones, so a survivor still has those a lost rank 0 had not sent
_UNSENT_MAX = 128


# -- the checkpoint store -------------------------------------------------------------------------------
def checkpoint_space(worker: Any, token: str) -> dict:
    """The loop's own state space on ``worker`` (the algorithm's per-block state has the token's)."""
    return context(worker).state.get(f"{token}-{_CHECKPOINT}")


async def last_checkpoint(token: str, wait: float = 0.0, dask_worker: Any = None) -> tuple[bytes, bytes] | None:
    """(on a worker, through ``client.run``) The last checkpoint a rank of loop ``token`` kept here
    and its recent records: ``(pickle of (iteration, state, record), pickle of ((iteration, record),
    ...))``, or None. A rank of the loop still running here (a stopped loop's rank slow to wake may
    still finish a step whose values all came) is waited for, at most ``wait`` seconds."""
    plugin = dask_worker.plugins.get(protocol.PLUGIN_COLLECTIVE) if dask_worker is not None else None
    deadline = time.monotonic() + wait
    while plugin is not None and plugin.mailbox.running_loop(token) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    space = context(dask_worker).state.get(f"{token}-{_CHECKPOINT}", create=False)
    if space is None or space.get(_CHECKPOINT) is None:
        return None
    return _pickled(space[_CHECKPOINT]), pickle.dumps(space.get(_RECENT, ()), protocol=5)


def _pickled(kept: Any) -> bytes:
    """A kept checkpoint as the pickle of ``(iteration, state, record)`` (kept unpickled: pickled now)."""
    return kept if isinstance(kept, bytes) else pickle.dumps(kept, protocol=5)


def drop_on_worker(token: str, dask_worker: Any = None) -> bool:
    """Forget loop ``token``'s state in this process (its checkpoints and the algorithm's state)."""
    state = context(dask_worker).state
    state.drop(f"{token}-{_CHECKPOINT}")
    return state.drop(token)


async def drop_on_worker_async(token: str, dask_worker: Any = None) -> bool:
    """:func:`drop_on_worker` run in the worker's event loop (``client.run`` without a thread)."""
    return drop_on_worker(token, dask_worker)


# -- blocks left in the worker's store ------------------------------------------------------------------
@dataclass(frozen=True)
class StoreKey:
    """A block left in the worker's store (read on use), in the arguments of a lazy loop task."""

    key: Any


class StoreBlocks(Mapping):
    """``{dataset name: block}`` of one block index: blocks of this worker stay in its store and each
    access reads the store (the window cache moves the block onto the device if it is not there);
    blocks of other workers came with the task."""

    def __init__(self, worker: Any, handles: dict[str, Any]) -> None:
        self.worker = worker
        self.handles = handles

    def __getitem__(self, name: str) -> Any:
        h = self.handles[name]
        if not isinstance(h, StoreKey):
            return h
        try:
            return self.worker.data[h.key]
        except KeyError:
            raise CollectiveError(f"block {h.key!r} is no longer on worker {self.worker.address} (moved or lost); "
                                  "the loop restarts where the blocks are now") from None

    def __iter__(self):
        return iter(self.handles)

    def __len__(self) -> int:
        return len(self.handles)

    def keys_in_order(self) -> list:
        return [h.key for h in self.handles.values() if isinstance(h, StoreKey)]


# -- the driver's context ----------------------------------------------------------------------------------
class WorkersContext(LoopContext):
    """A driver's context in its task on one worker: ``owned`` = ``[(block, {name: block array})]``."""

    mode = "workers"

    def __init__(self, comm: Any, owned: list, names: Sequence[str], nblocks: int, token: str, iteration: int,
                 topic: str | None, streaming: bool = False, state_every: float = 0.0,
                 progress_every: float = 0.0, keep_states: bool = False) -> None:
        super().__init__(names, nblocks, token, iteration)
        self.keep_states = bool(keep_states)  # the driver's checkpointed states are copies: kept unpickled
        self.comm = comm
        self.owned = owned
        self.streaming = streaming
        self.rank = comm.rank
        self.size = comm.size
        self.topic = topic
        self.observed: list[tuple[str, int, float]] = []
        self._t0 = time.perf_counter()
        self.state_every = float(state_every)
        self.progress_every = float(progress_every)
        self._state_sent = self._sent = self._t0
        self._unsent: list[tuple[int, dict]] = []  # rank 0: records not sent yet
        self._recent: deque = deque(maxlen=2 * _UNSENT_MAX)

    def local(self) -> list[tuple[int, dict[str, Any]]]:
        """This worker's blocks: ``[(block index, {dataset name: block array})]``, in block order.
        When :attr:`streaming`, each mapping reads its block from the worker's store on every access
        (through the window cache): keep a block only while it is used."""
        return self.owned

    @property
    def address(self) -> str:
        """This rank's worker address."""
        return self.comm.worker.address

    @property
    def host(self) -> str:
        """The host (name or IP) of this rank's worker, as its peers reach it (for side channels
        such as a ``torch.distributed`` rendezvous)."""
        return get_address_host(self.address)

    def hint(self, blocks):
        if not self.streaming:
            return
        store = getattr(self.comm.worker, "data", None)
        if hasattr(store, "hint"):
            keys = {b: arrays for b, arrays in self.owned}
            store.hint([k for b in blocks if b in keys for k in keys[b].keys_in_order()])

    def capacity(self):
        store = worker_store(self.comm.worker) if self.comm.worker is not None else None
        if store is not None:
            return int(store.capacity())
        memory = getattr(getattr(_blocks.current_device(), "spec", None), "memory", None)
        return int(memory) if memory else None

    def _call(self, func, args, kwargs, blocks: dict[str, Any], b: int) -> Any:
        # host operands reach the device through it, as in the tasks of the client loop
        resolved = [block_arg(a, b, blocks) if isinstance(a, (Blocks, BlockIndex)) else _blocks.on_device(a)
                    for a in args]
        return func(*resolved, **kwargs)

    def each_block(self, func, args, kwargs, wanted: set[int] | None = None,
                   observe: str | None = None) -> list[tuple[int, Any]]:
        """``[(block, func's host result)]`` over this rank's blocks (those in ``wanted``); each call's
        duration recorded under ``observe`` when given."""
        dev = _blocks.current_device()
        # host operands reach the device once per pass, not once per block
        args = [a if isinstance(a, Blocks) else _blocks.on_device(a, dev) for a in args]
        own = []
        for b, arrays in self.owned:
            if wanted is not None and b not in wanted:
                continue
            t = time.perf_counter()
            r = _blocks.to_host(dev.compute(self._call, func, args, kwargs, arrays, b))
            if observe is not None:
                nbytes = sum(int(getattr(arrays.get(a.name), "nbytes", 0) or 0) for a in args if isinstance(a, Blocks))
                self.observed.append((observe, nbytes, time.perf_counter() - t))
            own.append((b, r))
        return own

    def map(self, func, *args, blocks=None, name=None, **kwargs):
        if not any(isinstance(a, Blocks) for a in args):
            raise ValueError("ctx.map needs at least one dataset argument (ctx.data[name])")
        wanted = None if blocks is None else set(int(b) for b in blocks)
        own = self.each_block(func, args, kwargs, wanted, observe=name or pass_name(func))
        got = sorted((p for ps in self.comm.allgather(own) for p in ps), key=lambda p: p[0])
        return [r for _, r in got]

    def allgather(self, value):
        return self.comm.allgather(value)

    def observe(self, kind, nbytes, seconds):
        self.observed.append((str(kind), int(nbytes), float(seconds)))

    def checkpoint(self, state, **record):
        now = time.perf_counter()
        rec = self._record(record, now - self._t0)
        self._t0 = now
        # every rank keeps its last checkpoint and its recent records in its worker's state of this loop:
        # when a worker dies, the client asks the survivors for them, which does not depend on when events
        # arrive. Rank 0 alone sends events (the others' would be duplicates the client drops): its records
        # in batches, at most every ``progress_every`` seconds (an event wakes the worker's event loop, whose
        # thread then takes the GIL from this one: ~1 ms per event measured on 2 cores, a tenth of a
        # K-means step), and the state with them only every ``state_every`` seconds (where the fit resumes
        # should every worker be lost). distributed keeps the last messages of every stream (its low-level
        # log), so a state per iteration would stay in memory many times over. Events must be msgpack-able:
        # pickled. A driver that checkpoints copies (IterativeAlgorithm.checkpoint_copies) has its states
        # kept as they are and pickled when sent or asked for: pickling K-means' state every iteration cost
        # ~1 ms of a 16 ms step on each rank (its bounds history, ~1 MB late in a fit, in fresh memory)
        entry = (self.iteration, state, rec)
        kept = entry if self.keep_states else pickle.dumps(entry, protocol=5)
        self._recent.append((self.iteration, rec))
        space = checkpoint_space(self.comm.worker, self.token)
        space[_CHECKPOINT] = kept
        space[_RECENT] = tuple(self._recent)  # a snapshot: the event loop's thread may read it meanwhile
        if self.topic and self.rank == 0:
            self._unsent.append((self.iteration, rec))
            if now - self._state_sent >= self.state_every:
                self._state_sent = now
                self._send(_pickled(kept))
            elif now - self._sent >= self.progress_every or len(self._unsent) >= _UNSENT_MAX:
                self._send()

    def _send(self, payload: bytes | None = None) -> None:
        """(rank 0) One event with the records not sent yet; ``payload``: the last one's checkpoint
        (with its state) instead of its record alone."""
        records = self._unsent[:-1] if payload is not None else self._unsent
        msg: dict[str, Any] = {"checkpoint": payload} if payload is not None else {}
        if records:
            msg["progress"] = pickle.dumps(records, protocol=5)
        self._unsent = []
        self._sent = time.perf_counter()
        self.comm.worker.log_event(self.topic, msg)

    def flush(self) -> None:
        """(rank 0) Send the records still waiting: at the loop's end, ahead of its result."""
        if self.topic and self.rank == 0 and self._unsent:
            self._send()


# -- the task of one rank ------------------------------------------------------------------------------------
@dataclass
class RankTask:
    """What one rank's task of a loop on the workers gets.

    Attributes
    ----------
    names : list of str
        The datasets' names, in the order of each block's list.
    nblocks : int
    token : str
        The fit's token.
    iteration : int
        Iterations done before (the driver resumes there).
    state : any
        The driver's state after those iterations.
    topic : str or None
        Where rank 0 sends its checkpoints as events.
    lazy : bool
        Data larger than the devices: blocks are read from the worker's store on use.
    state_every : float
        Seconds between the states rank 0 sends with its records (config
        ``gdask.engine.checkpoint-interval``); every iteration's state stays on each rank's worker.
    progress_every : float
        Seconds between the batches of records rank 0 sends (config ``gdask.engine.progress-interval``).
    """

    names: list[str]
    nblocks: int
    token: str
    iteration: int
    state: Any
    topic: str | None
    lazy: bool = False
    state_every: float = 0.0
    progress_every: float = 0.0


@dataclass
class RankResult:
    """What one rank's task returns (every rank the same): the driver's final ``state`` and
    ``iteration`` count, the final pass's per-block results of every rank's blocks (``finals``:
    ``{block: result}`` or None) and the device work the ranks ``observed`` (``[(kind, bytes, worker
    address, seconds)]``, for the placement plugin)."""

    state: Any
    finals: dict[int, Any] | None
    observed: list[tuple[str, int, str, float]]
    iteration: int


def driver_on_worker(comm: Any, algorithm: IterativeAlgorithm, task: RankTask, blocks: list) -> RankResult:
    """One worker's task of the loop on the workers: the driver over this rank's blocks from the
    task's checkpoint, then the algorithm's final pass over them. ``blocks``: ``[(block, [block by
    dataset name])]`` of this rank, in block order; with ``task.lazy``, the blocks of this rank's
    worker are :class:`StoreKey` s (read from its store on use)."""
    if task.lazy:
        owned = [(b, StoreBlocks(comm.worker, dict(zip(task.names, handles)))) for b, handles in blocks]
    else:
        owned = [(b, dict(zip(task.names, arrays))) for b, arrays in blocks]
    ctx = WorkersContext(comm, owned, task.names, task.nblocks, task.token, task.iteration, task.topic,
                         streaming=task.lazy, state_every=task.state_every, progress_every=task.progress_every,
                         keep_states=bool(getattr(algorithm, "checkpoint_copies", False)))
    try:
        state = algorithm.run(task.state, ctx)
    except CollectiveError:
        if comm.cancelled:  # the client is gone (or released the fit): nobody resumes from this state
            drop_on_worker(task.token, comm.worker)
        raise
    finally:
        ctx.flush()
    mine = None
    spec = algorithm.final(state)
    if spec is not None:
        func, args, kwargs = spec
        mine = dict(ctx.each_block(func, args, kwargs))
    # every rank returns the whole result (the client fetches one, from a worker still there)
    address = comm.worker.address
    everything = comm.allgather((mine, [(kind, nbytes, address, sec) for kind, nbytes, sec in ctx.observed]))
    finals = None if spec is None else {b: v for part, _ in everything for b, v in part.items()}
    observed = [o for _, obs in everything for o in obs]
    if comm.rank == 0 and observed:  # for the placement plugin: on the stream that carries this task's end, ahead of it
        comm.worker.log_event(protocol.EVENT_OBSERVE, {"records": [list(o) for o in observed]})
    return RankResult(state, finals, observed, ctx.iteration)
