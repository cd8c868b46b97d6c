"""The iteration engine: how every iterative algorithm over GDataSet blocks runs.

An algorithm (K-means, logistic regression, an LSTM trainer, ...) supplies only its mathematics, as
an :class:`IterativeAlgorithm`: a *driver* ``run(state, ctx)`` that loops over iterations and asks
the :class:`LoopContext` for passes over the blocks (``ctx.map`` / ``ctx.reduce``: a per-block
function, its results in block order), and an optional final pass. The engine decides where the
driver runs and owns everything else:

* ``"workers"``: the driver runs in one task per worker that holds blocks (the same code on every
  worker, to the same result); a pass computes the worker's own blocks and all-gathers the
  per-block results worker to worker (:mod:`gdask.gdataset._collective`): no client or scheduler
  round trip per iteration. Needs a Client, persisted data that fits on the devices and config
  ``gdask.ml.worker-loop``.
* ``"client"``: the driver runs here; a pass is one graph, one task per group of blocks held by a
  worker thread (one small result per block comes back).
* ``"stream"``: data larger than the devices' memory: one task per block, alternating scan order
  and the window cache told the order, so the blocks left on the device are the next needed.

An algorithm that can only run on the workers (``modes = ("workers",)``, e.g. data-parallel training
that keeps a model replica per worker) also runs there when its data is larger than the devices: its
blocks are then read from each worker's store when the driver asks for them (``ctx.streaming``;
``ctx.hint(blocks)`` tells the window cache the order of the next reads), not held by its task.
Without a Client, such an algorithm runs in this process as the only rank over all blocks (mode
``"local"``, the same driver code). If its loop fails because a worker or a peer was lost, the
engine runs it on the workers again from the last checkpoint, after the lost blocks came back from
lineage, at most config ``gdask.engine.max-restarts`` times; an exception raised by the driver
itself ends the fit at once.

Per-block results are always combined in block order, never in the order of placement, so a
seeded fit gives the same bits however the blocks are placed, moved or recomputed. After every
finished iteration the driver calls ``ctx.checkpoint(state, **record)``: the record feeds progress
(:class:`gdask.gdataset.Progress`: bar, lines, ``callback``), the state is where the fit resumes if
the loop on the workers fails (a worker lost, busy or failing): the engine then runs the driver
from the client, from that state, not from the start. Per-worker state of a fit (K-means bounds)
lives in the workers' state spaces under the fit's token (:func:`gdask.devices.worker_state`) and is
dropped at the end. The durations of the passes on the workers are reported to the placement plugin
(device speeds, rebalancing), as the tasks of the client loop report themselves.
"""

from __future__ import annotations

import logging
import pickle
import queue
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import dask
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import Task

from gdask import config
from gdask._compat import run_async, run_sync
from gdask.gdataset import _blocks
from gdask.gdataset._collective import CollectiveError, run_on_workers
from gdask.gdataset._core import GDataSet, _Operands, device_layer
from gdask.gdataset._progress import Progress
from gdask.gdataset._repr import default_client_or_none
from gdask.gdataset._share import DeviceShare

logger = logging.getLogger("gdask.gdataset")

__all__ = ["Blocks", "EngineResult", "IterativeAlgorithm", "LoopContext", "MODES", "run_loop"]

MODES = ("workers", "client", "stream")


def _lost_work_errors() -> tuple[type[BaseException], ...]:
    """Errors of a computation whose worker died under it (its inputs come back from lineage)."""
    from distributed.client import FutureCancelledError
    from distributed.comm.core import CommClosedError
    from distributed.scheduler import KilledWorker

    return (KilledWorker, FutureCancelledError, CommClosedError)


_LOST_WORK = _lost_work_errors()


@dataclass(frozen=True)
class Blocks:
    """A handle to one dataset of a loop, ``ctx.data[name]``: passed to ``ctx.map`` in place of the
    dataset, it is replaced by each block of that dataset (``None`` datasets give ``None``)."""

    name: str


class IterativeAlgorithm:
    """What an iterative algorithm supplies to :func:`run_loop`. Subclass and override.

    The object is sent to the workers with the loop: keep it small (parameters, not data).

    Attributes
    ----------
    name : str
        Shown in progress and used in task names.
    modes : tuple of str
        Where its driver may run (``"workers"``, ``"client"``, ``"stream"``); the engine picks the
        first that the situation allows, in the order of :data:`MODES`.
    """

    name = "loop"
    modes: tuple[str, ...] = MODES

    def run(self, state: Any, ctx: LoopContext) -> Any:
        """The driver: iterate from ``state`` (``ctx.iteration`` iterations are already done) and
        return the final state. Call ``ctx.checkpoint(state, ...)`` after every iteration. Must
        take the same decisions from the same inputs wherever it runs (no unseeded randomness)."""
        raise NotImplementedError

    def final(self, state: Any) -> tuple[Callable, tuple, dict] | None:
        """An optional last pass ``(func, args, kwargs)``, run where the blocks are; its per-block
        results come back to the client (:attr:`EngineResult.finals`, in block order)."""
        return None


@dataclass
class EngineResult:
    """What :func:`run_loop` returns.

    Attributes
    ----------
    state : the driver's final state
    finals : list or None
        The final pass's per-block results, in block order.
    mode : str
        Where the driver ran last (``"workers"``, ``"client"``, ``"stream"``, or ``"local"``: a
        workers-only driver run in this process without a Client).
    history : list of dict
        The checkpoint records, one per iteration.
    restarts : int
        Times the loop failed and the fit resumed from its last checkpoint (from the client, or on
        the workers again for a workers-only algorithm).
    iterations : int
        Iterations done (``ctx.iteration`` at the end).
    """

    state: Any
    finals: list | None
    mode: str
    history: list[dict] = field(default_factory=list)
    restarts: int = 0
    iterations: int = 0


class LoopContext:
    """What a driver uses: passes over the blocks, checkpoints, collective exchange.

    Attributes
    ----------
    mode : str
    token : str
        The fit's token: the key of its per-worker state (:func:`gdask.devices.worker_state`).
    nblocks : int
    iteration : int
        Iterations finished (counted by :meth:`checkpoint`).
    data : dict
        ``{name: Blocks}``: the loop's datasets, to pass to :meth:`map`.
    rank, size : int
        This driver's rank among the drivers that run at once (one per worker; 0 / 1 from the client).
    """

    mode = "client"
    #: the blocks of :meth:`local` are read from the worker's store on use (data larger than the devices)
    streaming = False

    def __init__(self, names: Sequence[str], nblocks: int, token: str, iteration: int) -> None:
        self.data = {n: Blocks(n) for n in names}
        self.nblocks = nblocks
        self.token = token
        self.iteration = iteration
        self.rank = 0
        self.size = 1

    def map(self, func: Callable, *args: Any, blocks: Sequence[int] | None = None, name: str | None = None,
            **kwargs: Any) -> list:
        """``func(*args_b, **kwargs)`` for every block ``b`` (or the ``blocks`` given), where each
        :class:`Blocks` argument is replaced by its dataset's block ``b``; the results, as host data,
        in block order (every rank gets all of them)."""
        raise NotImplementedError

    def reduce(self, chunk: Callable, combine: Callable[[list], Any], *args: Any, name: str | None = None,
               **kwargs: Any) -> Any:
        """``combine`` of the per-block results of :meth:`map`, in block order."""
        return combine(self.map(chunk, *args, name=name, **kwargs))

    def allgather(self, value: Any) -> list:
        """Every driver's ``value``, in rank order (``[value]`` from the client)."""
        return [value]

    def hint(self, blocks: Sequence[int]) -> None:
        """The driver's next reads of its own blocks follow ``blocks`` (block indices, in order): the
        window cache prefetches them in that order. Only does something when :attr:`streaming`."""

    def capacity(self) -> int | None:
        """Bytes of blocks this rank's device can keep resident at once (its window cache's room: the
        device's memory less its reserve and other use), or None where unknown. A driver that reads
        its blocks itself (:attr:`streaming`) sizes its windows of blocks by it."""
        return None

    def observe(self, kind: str, nbytes: int, seconds: float) -> None:
        """Device work the driver did itself (not through :meth:`map`) on ``nbytes`` of its blocks, for
        the placement plugin's speed model (reported when the loop on the workers ends)."""

    def checkpoint(self, state: Any, **record: Any) -> None:
        """End of an iteration: ``state`` is where the fit resumes after a failure; ``record``
        (e.g. ``inertia=``, ``loss=``, ``line=`` for verbose output) goes to progress."""
        raise NotImplementedError

    def _record(self, record: dict, seconds: float) -> dict:
        self.iteration += 1
        return {"iteration": self.iteration, "seconds": seconds, "mode": self.mode, **record}


# -- from the client (and streaming) ----------------------------------------------------------------
class _ClientContext(LoopContext):
    def __init__(self, data: dict[str, GDataSet | None], groups: list[list[int]] | None, token: str,
                 iteration: int, progress: Callable[[Any, dict], None], stream: bool = False) -> None:
        ref = next((g for g in data.values() if g is not None), None)
        super().__init__(list(data), 0 if ref is None else ref.nblocks, token, iteration)
        self.datasets = data
        self.ref = ref
        self.groups = groups or [[b] for b in range(self.nblocks)]
        self.stream = stream
        self.mode = "stream" if stream else "client"
        self._progress = progress
        self._t0 = time.perf_counter()
        self._passes = 0
        self._moved = _window_bytes_h2d() if stream else None

    def _resolve(self, a: Any) -> Any:
        return self.datasets[a.name] if isinstance(a, Blocks) else a

    def map(self, func, *args, blocks=None, name=None, **kwargs):
        args = tuple(self._resolve(a) for a in args)
        if not any(isinstance(a, GDataSet) for a in args):
            raise ValueError("ctx.map needs at least one dataset argument (ctx.data[name])")
        wanted = list(range(self.nblocks)) if blocks is None else sorted(set(int(b) for b in blocks))
        keep = set(wanted)
        if self.stream:
            groups = [[b] for b in wanted]
        else:
            groups = [g2 for g2 in ([b for b in g if b in keep] for g in self.groups) if g2]
        prefix = name or _blocks_name(func)
        ops = _Operands(self.ref, args)
        token = tokenize(func, *ops.tokens(), kwargs, groups, self.token)
        part = f"{prefix}-{token}"
        layer = dict(ops.graph)
        for gi, g in enumerate(groups):
            flat = [a for b in g for a in ops.block_args(b)]
            layer[(part, gi)] = Task((part, gi), _blocks.group_map_op, func, len(flat) // len(g), *flat, **kwargs)
        graph = HighLevelGraph.from_collections(part, device_layer(layer, "reduce"), dependencies=ops.deps)
        outs = [Delayed((part, gi), graph, layer=part) for gi in range(len(groups))]
        if self.stream:
            from gdask.window_cache import scan

            with scan(self.ref.__dask_keys__(), self._passes):
                results = bounded_compute(outs, f"pass {self._passes} ({prefix}) of a {self.mode} loop")
        else:
            results = bounded_compute(outs, f"pass {self._passes} ({prefix}) of a {self.mode} loop")
        self._passes += 1
        by_block = {b: r for g, res in zip(groups, results) for b, r in zip(g, res)}
        return [by_block[b] for b in wanted]

    def checkpoint(self, state, **record):
        now = time.perf_counter()
        if self.stream and "bytes_h2d" not in record:  # streaming: what the window copied this iteration
            moved = _window_bytes_h2d()
            if moved is not None:
                if self._moved is not None:
                    record["bytes_h2d"] = max(0, moved - self._moved)
                self._moved = moved
        rec = self._record(record, now - self._t0)
        self._t0 = now
        self._progress(state, rec)


def _window_bytes_h2d() -> int | None:
    """Bytes the workers' window stores copied to their devices so far (one round trip), or None."""
    client = default_client_or_none()
    if client is None:
        return None
    from gdask.window_cache import stats

    try:
        return int(stats(client)["bytes_h2d"])
    except Exception as e:  # noqa: BLE001 - progress must not end a fit: the record just lacks the field
        logger.debug("could not read the window stores' transfer counters: %r", e)
        return None


def bounded_compute(collections: Sequence[Any], what: str) -> tuple:
    """``dask.compute(*collections)``, waiting at most config ``gdask.timeouts.pass`` seconds for a
    Client's cluster (else :class:`TimeoutError` naming ``what`` and the setting; the pass's tasks
    are cancelled). Without a Client: Dask's local scheduler."""
    client = default_client_or_none()
    if client is None:
        return dask.compute(*collections)
    from distributed import wait

    limit = float(config.get("timeouts.pass", 3600))
    futures = client.compute(list(collections))
    try:
        wait(futures, timeout=limit)
    except TimeoutError:
        client.cancel(futures)
        raise TimeoutError(f"{what} did not finish within {limit:g} s (gdask.timeouts.pass)") from None
    return tuple(client.gather(futures))


def _blocks_name(func: Callable) -> str:
    n = getattr(func, "__name__", None) or type(func).__name__
    return n.strip("_").replace("<", "").replace(">", "") or "pass"


# -- on the workers -----------------------------------------------------------------------------------
class _WorkersContext(LoopContext):
    """A driver's context in its task on one worker: ``owned`` = ``[(block, {name: block array})]``."""

    mode = "workers"

    def __init__(self, comm: Any, owned: list, names: Sequence[str], nblocks: int, token: str, iteration: int,
                 topic: str | None, streaming: bool = False) -> None:
        super().__init__(names, nblocks, token, iteration)
        self.comm = comm
        self.owned = owned
        self.streaming = streaming
        self.rank = comm.rank
        self.size = comm.size
        self.topic = topic
        self.observed: list[tuple[str, int, float]] = []
        self._t0 = time.perf_counter()

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
        from distributed.comm import get_address_host

        return get_address_host(self.address)

    def hint(self, blocks):
        if not self.streaming:
            return
        store = getattr(self.comm.worker, "data", None)
        if hasattr(store, "hint"):
            keys = {b: arrays for b, arrays in self.owned}
            store.hint([k for b in blocks if b in keys for k in keys[b].keys_in_order()])

    def capacity(self):
        from gdask.window_cache import worker_store

        store = worker_store(self.comm.worker) if self.comm.worker is not None else None
        if store is not None:
            return int(store.capacity())
        memory = getattr(getattr(_blocks.current_device(), "spec", None), "memory", None)
        return int(memory) if memory else None

    def _call(self, func, args, kwargs, blocks: dict[str, Any]) -> Any:
        # host operands reach the device through it, as in the tasks of the client loop
        resolved = [blocks.get(a.name) if isinstance(a, Blocks) else _blocks.on_device(a) for a in args]
        return func(*resolved, **kwargs)

    def _each_block(self, func, args, kwargs, wanted: set[int] | None = None,
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
            r = _blocks.to_host(dev.compute(self._call, func, args, kwargs, arrays))
            if observe is not None:
                nbytes = sum(int(getattr(arrays.get(a.name), "nbytes", 0) or 0) for a in args if isinstance(a, Blocks))
                self.observed.append((observe, nbytes, time.perf_counter() - t))
            own.append((b, r))
        return own

    def map(self, func, *args, blocks=None, name=None, **kwargs):
        if not any(isinstance(a, Blocks) for a in args):
            raise ValueError("ctx.map needs at least one dataset argument (ctx.data[name])")
        wanted = None if blocks is None else set(int(b) for b in blocks)
        own = self._each_block(func, args, kwargs, wanted, observe=name or _blocks_name(func))
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
        # every rank keeps its last checkpoint in its worker's state of this loop: when a worker dies, the
        # client asks the survivors for it, which does not depend on when events arrive. Rank 0 alone sends
        # it as an event (progress, records; the others' would be duplicates the client drops: one event
        # per iteration, not one per rank). Events must be msgpack-able: the state is pickled
        payload = pickle.dumps((self.iteration, state, rec), protocol=5)
        _blocks_state(self.comm.worker, self.token)[_CHECKPOINT] = payload
        if self.topic and self.rank == 0:
            self.comm.worker.log_event(self.topic, {"checkpoint": payload})


_CHECKPOINT = "engine-checkpoint"


def _blocks_state(worker: Any, token: str) -> dict:
    """The loop's own state space on ``worker`` (the algorithm's per-block state has the token's)."""
    from gdask.devices import context

    return context(worker).state.get(f"{token}-{_CHECKPOINT}")


def _last_checkpoint(token: str, dask_worker: Any = None) -> bytes | None:
    from gdask.devices import context

    space = context(dask_worker).state.get(f"{token}-{_CHECKPOINT}", create=False)
    return None if space is None else space.get(_CHECKPOINT)


@dataclass(frozen=True)
class _StoreKey:
    """A block left in the worker's store (read on use), in the arguments of a lazy loop task."""

    key: Any


class _StoreBlocks(Mapping):
    """``{dataset name: block}`` of one block index: blocks of this worker stay in its store and each
    access reads the store (the window cache moves the block onto the device if it is not there);
    blocks of other workers came with the task."""

    def __init__(self, worker: Any, handles: dict[str, Any]) -> None:
        self.worker = worker
        self.handles = handles

    def __getitem__(self, name: str) -> Any:
        h = self.handles[name]
        if not isinstance(h, _StoreKey):
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
        return [h.key for h in self.handles.values() if isinstance(h, _StoreKey)]


def _driver_on_worker(comm: Any, algorithm: IterativeAlgorithm, mine: list, names: list[str], nblocks: int,
                      token: str, iteration: int, state: Any, topic: str | None, lazy: bool = False) -> dict:
    """One worker's task of the loop on the workers (``mine`` = ``[(block, [arrays by name])]``, or
    ``[(block, [keys by name])]`` when ``lazy``: blocks read from the worker's store on use)."""
    if lazy:
        owned = [(b, _StoreBlocks(comm.worker, dict(zip(names, handles)))) for b, handles in mine]
    else:
        owned = [(b, dict(zip(names, arrays))) for b, arrays in mine]
    ctx = _WorkersContext(comm, owned, names, nblocks, token, iteration, topic, streaming=lazy)
    state = algorithm.run(state, ctx)
    finals = None
    spec = algorithm.final(state)
    if spec is not None:
        func, args, kwargs = spec
        finals = dict(ctx._each_block(func, args, kwargs))
    return {"state": state, "finals": finals, "observed": ctx.observed, "iteration": ctx.iteration}


# -- in this process, without a Client -----------------------------------------------------------------
class _SelfComm:
    """The communicator of the only rank: nothing to exchange."""

    rank = 0
    size = 1
    worker = None

    def allgather(self, value: Any, timeout: float | None = None) -> list:
        return [value]


class _LocalContext(_WorkersContext):
    """A workers-mode driver run here, without a Client: the only rank, holding every block."""

    mode = "local"

    def __init__(self, owned: list, names: Sequence[str], nblocks: int, token: str, iteration: int,
                 progress: Callable[[Any, dict], None]) -> None:
        super().__init__(_SelfComm(), owned, names, nblocks, token, iteration, None)
        self._progress = progress

    address = "local"
    host = "127.0.0.1"

    def checkpoint(self, state, **record):
        now = time.perf_counter()
        rec = self._record(record, now - self._t0)
        self._t0 = now
        self._progress(state, rec)


def _run_here(algorithm: IterativeAlgorithm, datasets: dict, token: str, last: dict,
              record: Callable[[Any, dict], None]) -> EngineResult:
    """A workers-only algorithm without a Client: its blocks computed onto this process's device
    (Dask's local scheduler), its driver run here as rank 0 of 1."""
    names = list(datasets)
    nblocks = next(g for g in datasets.values() if g is not None).nblocks
    per_block = dask.compute(*[[None if datasets[n] is None else datasets[n].block(b) for n in names]
                               for b in range(nblocks)])
    owned = [(b, dict(zip(names, arrays))) for b, arrays in enumerate(per_block)]
    ctx = _LocalContext(owned, names, nblocks, token, last["iteration"], record)
    state = algorithm.run(last["state"], ctx)
    finals = None
    spec = algorithm.final(state)
    if spec is not None:
        func, args, kwargs = spec
        finals = [r for _, r in ctx._each_block(func, args, kwargs)]
    return EngineResult(state, finals, "local", [], 0, ctx.iteration)


def _retryable(e: CollectiveError) -> bool:
    """Whether a failed loop on the workers lost a worker or a peer (worth running again where the
    blocks are now), rather than stopped on an exception of the driver itself."""
    cause = e.__cause__
    return cause is None or isinstance(cause, (CollectiveError, *_LOST_WORK))


# -- the engine ---------------------------------------------------------------------------------------
def _device_memory(client: Any) -> int:
    specs = getattr(getattr(client, "cluster", None), "device_specs", None)
    if specs:  # a LocalGPUCluster in this process knows its devices: no round trip
        return sum(int(s.memory or 0) for s in specs)
    from gdask import protocol

    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    return sum(int((w.get("metrics", {}).get(protocol.METRIC_DEVICE) or {}).get("memory") or 0) for w in workers)


def exceeds_devices(nbytes: int, client: Any = None, fraction: float = 0.8) -> bool:
    """Whether ``nbytes`` of data take more than ``fraction`` of the client's devices' memory (then
    loops stream their blocks through the window cache, one task per block)."""
    client = client if client is not None else default_client_or_none()
    if client is None:
        return False
    total = _device_memory(client)
    return total > 0 and nbytes > fraction * total


def _persisted(data: dict[str, GDataSet | None]) -> dict[str, GDataSet | None]:
    from gdask.gdataset._repr import persisted_futures

    return {n: (g if g is None or persisted_futures(g) is not None else g.persist()) for n, g in data.items()}


def run_loop(algorithm: IterativeAlgorithm, data: dict[str, GDataSet | None], state: Any, *,
             client: Any = None, mode: str | None = None, progress: Progress | None = None,
             share: DeviceShare | None = None) -> EngineResult:
    """Run ``algorithm`` over ``data`` from ``state``; see the module's description.

    Parameters
    ----------
    algorithm : IterativeAlgorithm
    data : dict
        ``{name: GDataSet or None}``, all blocked alike (the first is the reference). Persisted here
        when a Client exists and they are not yet.
    state : any
        The driver's initial state (small host data).
    client : distributed.Client, optional
        Default: the current client; without one the loop runs with Dask's local scheduler.
    mode : {"workers", "client", "stream"}, optional
        Force a mode (default: the first of ``algorithm.modes`` the situation allows).
    progress : Progress, optional
        Receives every checkpoint record (in the calling thread); default: nothing shown.
    share : DeviceShare, optional
        The fit's share of the devices: the loop runs inside ``gdask.job(...)`` (see
        :func:`~gdask.gdataset.device_share`; nothing when a job is open already or without a Client).

    Returns
    -------
    EngineResult

    Raises
    ------
    ValueError
        No dataset, datasets blocked differently, or a mode the algorithm does not allow.
    """
    datasets = {n: g for n, g in (data or {}).items()}
    ref = next((g for g in datasets.values() if g is not None), None)
    if ref is None and tuple(algorithm.modes) != ("client",):
        raise ValueError("run_loop needs at least one GDataSet in data (only client-mode algorithms, which "
                         "build their own graphs, run without)")
    for n, g in datasets.items():
        if g is not None and g.row_blocks != ref.row_blocks:
            raise ValueError(f"dataset {n!r} is blocked differently from the others; block it with "
                             f"block_rows=X.row_blocks")
    if mode is not None and (mode not in MODES or mode not in algorithm.modes):
        raise ValueError(f"mode must be one of {algorithm.modes} for {algorithm.name}, got {mode!r}")
    client = client if client is not None else default_client_or_none()
    progress = progress or Progress(verbose=0)
    token = uuid.uuid4().hex
    history: list[dict] = []
    last = {"iteration": 0, "state": state}

    def record(st: Any, rec: dict) -> None:
        last["iteration"], last["state"] = rec["iteration"], st
        history.append(rec)
        progress.update(rec)

    streaming = False
    groups = where = None
    workers_only = tuple(algorithm.modes) == ("workers",)
    if client is not None and ref is not None:
        datasets = _persisted(datasets)
        ref = next(g for g in datasets.values() if g is not None)  # the persisted blocks (for their places)
        streaming = exceeds_devices(sum(g.nbytes for g in datasets.values() if g is not None), client)
        if not streaming or workers_only:  # a workers-only driver reads larger data through the window
            from gdask.gdataset._repr import block_workers, groups_of

            where = block_workers(ref, client, wait_ready=True)
            groups = groups_of(where, ref.nblocks)
    if mode is None:
        allowed = {"workers": client is not None and (not streaming or workers_only) and groups is not None
                   and (workers_only or bool(config.get("ml.worker-loop", True))),
                   "stream": streaming, "client": not streaming or "stream" not in algorithm.modes}
        mode = next((m for m in MODES if m in algorithm.modes and allowed[m]), None)
        if mode is None:
            mode = "client" if "client" in algorithm.modes else algorithm.modes[0]
    restarts = 0
    max_restarts = int(config.get("engine.max-restarts", 3))
    try:
        if mode == "workers" and client is None:
            if ref is None:
                raise ValueError(f"{algorithm.name} runs on the workers and needs a GDataSet in data")
            res = _run_here(algorithm, datasets, token, last, record)
            res.history = history
            return res
        if mode == "workers" and groups is None:
            raise ValueError(f"{algorithm.name} runs on the workers and needs its blocks in cluster memory; they "
                             "are not (persist them with the same Client)")
        while mode == "workers":
            try:
                res = _run_on_workers(algorithm, datasets, groups, where[0], client, token, last, record,
                                      lazy=streaming)
                return EngineResult(res["state"], res["finals"], "workers", history, restarts, res["iteration"])
            except CollectiveError as e:
                if "client" not in algorithm.modes:
                    if not _retryable(e):  # the driver's own error: running it again would repeat it
                        raise e.__cause__ from None
                    if restarts >= max_restarts:
                        raise CollectiveError(
                            f"{algorithm.name}: the loop on the workers failed {restarts + 1} times, the last time "
                            f"with: {e}. The last finished iteration is {last['iteration']}; check the workers' "
                            "logs, or raise gdask.engine.max-restarts") from e
                    restarts += 1
                    logger.warning("%s: the loop on the workers did not run to its end (%s); running it on the "
                                   "workers again from iteration %d (restart %d of %d)", algorithm.name, e,
                                   last["iteration"], restarts, max_restarts)
                    from gdask.gdataset._repr import block_workers, groups_of

                    # the lost blocks come back from lineage: wait for them, then start where they are
                    where = block_workers(next(g for g in datasets.values() if g is not None), client,
                                          wait_ready=True)
                    groups = groups_of(where, ref.nblocks)
                    if groups is None:
                        raise CollectiveError(f"{algorithm.name}: after a failed loop on the workers its blocks are "
                                              "not all in cluster memory any more") from e
                    continue
                restarts = 1
                logger.warning("%s: the loop on the workers did not run to its end (%s); resuming from the "
                               "client at iteration %d", algorithm.name, e, last["iteration"])
                where = None
                from gdask.gdataset._repr import block_workers, groups_of

                where = block_workers(ref, client, wait_ready=True) if client is not None else None
                groups = groups_of(where, ref.nblocks)
                mode = "client"
        while True:
            ctx = _ClientContext(datasets, groups, token, last["iteration"], record, stream=(mode == "stream"))
            try:
                st = algorithm.run(last["state"], ctx)
                finals = None
                spec = algorithm.final(st)
                if spec is not None:
                    func, args, kwargs = spec
                    finals = ctx.map(func, *args, name=f"{algorithm.name}-final", **kwargs)
                return EngineResult(st, finals, mode, history, restarts, ctx.iteration)
            except _LOST_WORK as e:  # a worker died under a pass: the blocks come back from lineage
                if client is None or restarts >= max_restarts:
                    raise
                restarts += 1
                logger.warning("%s: a pass lost its work (%r); resuming at iteration %d (restart %d of %d)",
                               algorithm.name, e, last["iteration"], restarts, max_restarts)
                if ref is not None and mode == "client":
                    from gdask.gdataset._repr import block_workers, groups_of

                    groups = groups_of(block_workers(ref, client, wait_ready=True), ref.nblocks)
    finally:
        progress.close()
        _drop_state(client, token)


def _run_on_workers(algorithm: IterativeAlgorithm, datasets: dict, groups: list[list[int]],
                    workers: dict[int, str], client: Any, token: str, last: dict,
                    record: Callable[[Any, dict], None], lazy: bool = False) -> dict:
    """The loop on the workers: one task per worker holding blocks; checkpoints come back as events
    and are handed to ``record`` in this thread. Raises CollectiveError when it could not finish.
    ``lazy``: the tasks get the blocks' keys and read them from their worker's store on use."""
    names = list(datasets)
    nblocks = next(g.nblocks for g in datasets.values() if g is not None)
    peers = sorted({workers[g[0]] for g in groups})
    mine: dict[str, list] = {a: [] for a in peers}
    held: dict[str, dict[int, str]] = {}
    if lazy:  # where each dataset's blocks are: those on the rank's own worker stay in its store
        from gdask.gdataset._repr import block_workers

        for n in names:
            w = None if datasets[n] is None else block_workers(datasets[n], client, wait_ready=True)
            held[n] = w[0] if w is not None else {}
    for g in groups:
        for b in g:
            addr = workers[g[0]]
            handles = [None if datasets[n] is None
                       else _StoreKey((datasets[n].name, b)) if lazy and held[n].get(b) == addr
                       else datasets[n].block(b) for n in names]
            mine[addr].append((b, handles))
    for a in peers:
        mine[a].sort(key=lambda p: p[0])
    topic = f"gdask-loop-{token}"
    events: queue.Queue = queue.Queue()
    client.subscribe_topic(topic, lambda event: events.put(pickle.loads(event[1]["checkpoint"])))
    seen = {"iteration": last["iteration"]}

    def drain() -> None:
        while True:
            try:
                it, st, rec = events.get_nowait()
            except queue.Empty:
                return
            if it > seen["iteration"]:  # in order, once each
                seen["iteration"] = it
                record(st, rec)

    try:
        try:
            results = run_on_workers(client, _driver_on_worker, peers,
                                     [(algorithm, mine[a], names, nblocks, token, last["iteration"], last["state"],
                                       topic, lazy) for a in peers],
                                     name=algorithm.name, on_poll=drain)
        except CollectiveError:
            # where the fit resumes: the checkpoints the events brought, and the newest one the
            # survivors kept (the failure may overtake their last events on the way here)
            drain()
            _newest_checkpoint(client, token, seen, record)
            raise
    finally:
        drain()
        client.unsubscribe_topic(topic)
        drain()
    r0 = results[0]
    # records the events did not bring in time (the driver's own count is authoritative)
    if r0["iteration"] > seen["iteration"]:
        for it in range(seen["iteration"] + 1, r0["iteration"] + 1):
            record(r0["state"], {"iteration": it, "mode": "workers"})
    finals = None
    if r0["finals"] is not None:
        merged = {b: v for r in results for b, v in r["finals"].items()}
        finals = [merged[b] for b in sorted(merged)]
    try:
        from gdask.scheduling import report_work

        report_work(client, [(kind, nbytes, addr, sec) for addr, r in zip(peers, results)
                             for kind, nbytes, sec in r["observed"]])
    except Exception as e:  # noqa: BLE001 - the fit is done: a scheduler that cannot take this loses nothing
        logger.debug("could not report the passes' durations to the placement plugin: %r", e)
    return {"state": r0["state"], "finals": finals, "iteration": r0["iteration"]}


def _newest_checkpoint(client: Any, token: str, seen: dict, record: Callable[[Any, dict], None]) -> None:
    """After a failed loop on the workers: the newest checkpoint any surviving worker kept, recorded
    if the events did not bring it (bounded by config ``gdask.engine.checkpoint-timeout``)."""
    try:
        found = run_sync(client, _last_checkpoint, token, on_error="ignore",
                         timeout=float(config.get("engine.checkpoint-timeout", 10)))
    except Exception as e:  # noqa: BLE001 - the cluster may be in trouble: resume from what the events brought
        logger.debug("could not ask the workers for their checkpoints of loop %s: %r", token, e)
        return
    best = max((pickle.loads(v) for v in found.values() if isinstance(v, bytes)), key=lambda c: c[0], default=None)
    if best is not None and best[0] > seen["iteration"]:
        for it in range(seen["iteration"] + 1, best[0]):  # iterations whose records were lost with a worker
            record(best[1], {"iteration": it, "mode": "workers"})
        seen["iteration"] = best[0]
        record(best[1], best[2])


def _drop_on_worker(token: str, dask_worker: Any = None) -> bool:
    from gdask.devices import context

    state = context(dask_worker).state
    state.drop(f"{token}-{_CHECKPOINT}")
    return state.drop(token)


def _drop_state(client: Any, token: str) -> None:
    """Forget the fit's per-worker state here and, without waiting, on every worker."""
    from gdask.devices import context

    context().state.drop(token)
    context().state.drop(f"{token}-{_CHECKPOINT}")
    if client is None:
        return
    try:  # on the client's event loop, so the caller does not wait for the broadcast's round trip
        client.loop.add_callback(_drop_everywhere, client, token)
    except (AttributeError, RuntimeError) as e:  # a client without a running loop (closing)
        logger.debug("could not drop the state of loop %s on the workers: %r", token, e)


async def _drop_everywhere(client: Any, token: str) -> None:
    try:
        await run_async(client, _drop_async, token, wait=False, on_error="ignore")
    except Exception as e:  # noqa: BLE001 - the client closed meanwhile: the states go with the workers
        logger.debug("could not drop the state of loop %s on the workers: %r", token, e)


async def _drop_async(token: str, dask_worker: Any = None) -> bool:
    return _drop_on_worker(token, dask_worker)

