"""The engine on the client: what it finds out before a loop, the driver's context of the client and
stream modes, and the client's part of a loop on the workers.

* :func:`survey`: persist the datasets, tell whether they fit on the devices, ask where the blocks
  are (the :class:`~gdask.gdataset.engine._plan.Situation` the mode choice needs).
* :class:`ClientContext`: a pass is one graph, one task per group of blocks held by a worker thread
  (``"client"``) or one task per block in alternating scan order through the window cache
  (``"stream"``); :func:`bounded_compute` waits for it, bounded by ``gdask.timeouts.pass``. Without
  a Client, on Dask's threaded scheduler, a pass over blocks held in memory calls the tasks' function
  on a thread pool, without a graph (:class:`LocalPasses`).
* :func:`run_workers_loop`: start the ranks of a loop on the workers, relay their checkpoints to
  the fit's records in this thread, and after a failure find the newest checkpoint a survivor kept.
* :func:`drop_state`: forget the fit's per-worker state at its end.
"""

from __future__ import annotations

import logging
import pickle
import time
from concurrent.futures import FIRST_EXCEPTION, Executor, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import dask
import dask.array as da
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph
from dask.system import CPU_COUNT
from dask.task_spec import DataNode, Task
from distributed import wait

from gdask import config, protocol
from gdask._compat import run_async, run_sync, scheduler_workers
from gdask.gdataset import _blocks
from gdask.gdataset._core import GDataSet, _Operands, device_layer
from gdask.gdataset.collective import CollectiveError, run_on_workers
from gdask.gdataset.engine import _worker
from gdask.gdataset.engine._api import Blocks, IterativeAlgorithm, LoopContext, block_arg, pass_name
from gdask.gdataset.engine._blas import ONE_BLAS_THREAD
from gdask.gdataset.engine._events import CheckpointEvents, LoopEvents, loop_topic
from gdask.gdataset.engine._plan import Situation
from gdask.gdataset.engine._records import Records
from gdask.gdataset.locality import block_places, default_client_or_none, persisted_futures
from gdask.scheduling import ensure_plugins
from gdask.window_cache import scan
from gdask.window_cache import stats as window_stats

logger = logging.getLogger("gdask.gdataset")

__all__ = ["ClientContext", "WorkersOutcome", "bounded_compute", "drop_state", "exceeds_devices", "run_workers_loop",
           "survey"]


# -- before the loop ------------------------------------------------------------------------------------
def device_memories(client: Any = None) -> list[int]:
    """The memory (bytes) of each device of ``client``'s cluster, as the devices were set up (not
    what is free now); ``[]`` without a client or where no device reported yet.

    Parameters
    ----------
    client : distributed.Client, optional
        Default: the current client.

    Returns
    -------
    list of int
    """
    client = client if client is not None else default_client_or_none()
    if client is None:
        return []
    specs = getattr(getattr(client, "cluster", None), "device_specs", None)
    if specs:  # a LocalGPUCluster in this process knows its devices: no round trip
        return [int(s.memory or 0) for s in specs]
    workers = scheduler_workers(client).values()
    found = [int((w.get("metrics", {}).get(protocol.METRIC_DEVICE) or {}).get("memory") or 0) for w in workers]
    return [m for m in found if m > 0]


def exceeds_devices(nbytes: int, client: Any = None, fraction: float = 0.8) -> bool:
    """Whether ``nbytes`` of data take more than ``fraction`` of the client's devices' memory (then
    loops stream their blocks through the window cache, one task per block).

    Parameters
    ----------
    nbytes : int
    client : distributed.Client, optional
        Default: the current client; without one, False.
    fraction : float
        Of the devices' memory, the part data may take.

    Returns
    -------
    bool
    """
    total = sum(device_memories(client))
    return total > 0 and nbytes > fraction * total


def survey(datasets: dict[str, GDataSet | None], client: Any, workers_only: bool
           ) -> tuple[dict[str, GDataSet | None], Situation]:
    """The datasets as the loop will use them (persisted: with a Client, or here when they take less than
    half the free memory, :func:`_room_here`) and the :class:`Situation`
    of the mode choice: whether they fit on the devices, and where their blocks are (asked, waiting
    for blocks still being persisted, unless the data streams for an algorithm that can leave the
    workers)."""
    ref = next((g for g in datasets.values() if g is not None), None)
    worker_loop = bool(config.get("ml.worker-loop", True))
    if client is None and ref is not None and _room_here(datasets):  # blocks made once, not by every pass's graph
        datasets = {n: (g if g is None or held_blocks(g) is not None else g.persist()) for n, g in datasets.items()}
    if client is None or ref is None:
        return datasets, Situation(client is not None, ref is not None, 0 if ref is None else ref.nblocks,
                                   worker_loop=worker_loop)
    datasets = {n: (g if g is None or persisted_futures(g) is not None else g.persist()) for n, g in datasets.items()}
    ref = next(g for g in datasets.values() if g is not None)  # the persisted blocks (for their places)
    streaming = exceeds_devices(sum(g.nbytes for g in datasets.values() if g is not None), client)
    # a workers-only driver reads data larger than the devices through the window cache, where it is
    places = block_places(ref, client, wait_ready=True) if not streaming or workers_only else None
    return datasets, Situation(True, True, ref.nblocks, streaming, places, worker_loop)


# -- from the client (and streaming) ----------------------------------------------------------------
def bounded_compute(collections: Sequence[Any], what: str) -> tuple:
    """``dask.compute(*collections)``, waiting at most config ``gdask.timeouts.pass`` seconds for a
    Client's cluster (else :class:`TimeoutError` naming ``what`` and the setting; the pass's tasks
    are cancelled). Without a Client: Dask's local scheduler."""
    client = default_client_or_none()
    if client is None:
        return dask.compute(*collections)
    limit = float(config.get("timeouts.pass", 3600))
    futures = client.compute(list(collections))
    try:
        wait(futures, timeout=limit)
    except TimeoutError:
        client.cancel(futures)
        raise TimeoutError(f"{what} did not finish within {limit:g} s (gdask.timeouts.pass)") from None
    return tuple(client.gather(futures))


def _window_bytes_h2d() -> int | None:
    """Bytes the workers' window stores copied to their devices so far (one round trip), or None."""
    client = default_client_or_none()
    if client is None:
        return None
    try:
        return int(window_stats(client)["bytes_h2d"])
    except Exception as e:  # noqa: BLE001 - progress must not end a fit: the record just lacks the field
        logger.debug("could not read the window stores' transfer counters: %r", e)
        return None


def _room_here(datasets: dict[str, GDataSet | None]) -> bool:
    """Whether the datasets' blocks, made once and kept in this process for a loop without a Client, take
    less than half of the memory free now (else every pass makes them again, as a graph, one at a time:
    a 1M x 32 float32 logistic regression's passes took 90 ms each instead of 9)."""
    import psutil

    need = sum(g.nbytes for g in datasets.values() if g is not None)
    return need < psutil.virtual_memory().available / 2


def held_blocks(g: GDataSet) -> list | None:
    """The blocks of ``g`` as values when its graph holds them (persisted without a Client), else None
    (a task computes some block)."""
    graph = g.__dask_graph__()
    values = []
    for key in g.__dask_keys__():
        v = graph.get(key)
        if isinstance(v, DataNode):
            v = v.value
        elif not (hasattr(v, "shape") and hasattr(v, "dtype")):  # a task (or an alias) computes it
            return None
        values.append(v)
    return values


class LocalPasses:
    """A client-mode loop's passes without a Client: each group's task called on a thread pool, without
    building, optimising and ordering a graph for every pass (3-4 ms of the main thread's time per
    K-means iteration, most of it holding the GIL while the pool's threads waited for it).

    Used only where Dask's local scheduler would run the pass on threads (``scheduler`` unset,
    ``"threads"`` or an executor) and every dataset's blocks are values in memory (persisted here);
    otherwise :meth:`ClientContext.map` builds the graph as before. The pool is Dask's ``pool`` or
    ``scheduler`` executor when configured, else one of ``num_workers`` (default: the CPU count)
    threads that :meth:`close` shuts down. From the first pass whose tasks run side by side until
    :meth:`close`, BLAS runs one thread a call (:data:`~gdask.gdataset.engine._blas.ONE_BLAS_THREAD`;
    setting it for each pass cost more than it saved: OpenBLAS starts its threads again)."""

    def __init__(self) -> None:
        self._pool: Executor | None = None
        self._own = False
        self._threads = 0  # of the pool this object made
        self._one_blas = False  # holds ONE_BLAS_THREAD (from the first pass with tasks side by side)
        self._blocks: dict[str, list | None] = {}

    def executor(self) -> Executor | None:
        """The pool a pass runs on, or None where Dask's configuration asks for another scheduler."""
        sched = dask.config.get("scheduler", None)
        if isinstance(sched, Executor):
            return sched
        if sched not in (None, "threads", "threading"):
            return None
        pool = dask.config.get("pool", None)
        if isinstance(pool, Executor):
            return pool
        if self._pool is None:
            n = int(dask.config.get("num_workers", None) or CPU_COUNT)
            self._pool, self._own = ThreadPoolExecutor(max_workers=n, thread_name_prefix="gdask-pass"), True
            self._threads = n
        return self._pool

    def blocks(self, g: GDataSet) -> list | None:
        """The blocks of ``g`` as values, when its graph holds them (else None: a graph computes them)."""
        if g.name not in self._blocks:
            self._blocks[g.name] = held_blocks(g)
        return self._blocks[g.name]

    def calls(self, ref: GDataSet, args: tuple, groups: list[list[int]]) -> list[list] | None:
        """Each group's flat argument list (as :func:`~gdask.gdataset._blocks.group_map_op` takes it),
        or None when some operand needs a graph (a dask array, a delayed value, blocks not in memory,
        or blocks unlike ``ref``'s: the graph's operands raise the error)."""
        per: list[Any] = []
        for a in args:
            if isinstance(a, GDataSet):
                values = None if a.row_blocks != ref.row_blocks else self.blocks(a)
                if values is None:
                    return None
                per.append(values)
            elif isinstance(a, (da.Array, Delayed)):
                return None
            else:
                per.append(a)
        return [[(v[b] if isinstance(a, GDataSet) else block_arg(v, b)) for b in g for a, v in zip(args, per)]
                for g in groups]

    def run(self, pool: Executor, func: Callable, nargs: int, calls: list[list], kwargs: dict,
            what: str) -> list:
        """Run the groups' tasks on ``pool``; bounded by config ``gdask.timeouts.pass`` (then
        :class:`TimeoutError` naming ``what``)."""
        limit = float(config.get("timeouts.pass", 3600))
        if not self._one_blas and len(calls) > 1 and (not self._own or self._threads > 1):
            ONE_BLAS_THREAD.hold()  # tasks side by side are the parallelism: until close()
            self._one_blas = True
        futures = [pool.submit(_blocks.group_map_op, func, nargs, *flat, **kwargs) for flat in calls]
        done, pending = wait_futures(futures, timeout=limit, return_when=FIRST_EXCEPTION)
        for f in futures:
            if f in done and f.exception() is not None:
                for p in pending:
                    p.cancel()
                raise f.exception()
        if pending:
            for p in pending:
                p.cancel()
            raise TimeoutError(f"{what} did not finish within {limit:g} s (gdask.timeouts.pass)")
        return [f.result() for f in futures]

    def close(self) -> None:
        """Shut the pool down if this object made it (its threads finish their tasks and end)."""
        if self._own and self._pool is not None:
            self._pool.shutdown(wait=False)
        self._pool, self._own = None, False
        self._blocks.clear()
        if self._one_blas:
            self._one_blas = False
            ONE_BLAS_THREAD.release()


class ClientContext(LoopContext):
    """A driver's context from the client: one graph per pass (``stream``: one task per block;
    without a Client, blocks in memory: :class:`LocalPasses`)."""

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
        self._local = LocalPasses()

    def _resolve(self, a: Any) -> Any:
        return self.datasets[a.name] if isinstance(a, Blocks) else a

    def _graph(self, func, args, kwargs, groups, prefix) -> list[Delayed]:
        """One task per group: ``func`` over each of its blocks, the results in block order."""
        ops = _Operands(self.ref, args)
        token = tokenize(func, *ops.tokens(), kwargs, groups, self.token)
        part = f"{prefix}-{token}"
        layer = dict(ops.graph)
        for gi, g in enumerate(groups):
            flat = [block_arg(a, b) for b in g for a in ops.block_args(b)]
            layer[(part, gi)] = Task((part, gi), _blocks.group_map_op, func, len(flat) // len(g), *flat, **kwargs)
        graph = HighLevelGraph.from_collections(part, device_layer(layer, "reduce"), dependencies=ops.deps)
        return [Delayed((part, gi), graph, layer=part) for gi in range(len(groups))]

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
        prefix = name or pass_name(func)
        what = f"pass {self._passes} ({prefix}) of a {self.mode} loop"
        results = self._map_here(func, args, kwargs, groups, what)
        if results is None:
            outs = self._graph(func, args, kwargs, groups, prefix)
            if self.stream:
                with scan(self.ref.__dask_keys__(), self._passes):
                    results = bounded_compute(outs, what)
            else:
                results = bounded_compute(outs, what)
        self._passes += 1
        by_block = {b: r for g, res in zip(groups, results) for b, r in zip(g, res)}
        return [by_block[b] for b in wanted]

    def _map_here(self, func, args, kwargs, groups, what) -> list | None:
        """The pass without a graph (:class:`LocalPasses`), or None where it needs one."""
        if self.stream or default_client_or_none() is not None:
            return None
        pool = self._local.executor()
        calls = None if pool is None else self._local.calls(self.ref, args, groups)
        if calls is None:
            return None
        return self._local.run(pool, func, len(args), calls, kwargs, what)

    def close(self) -> None:
        """Release what the passes held (the local pool)."""
        self._local.close()

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


# -- the loop on the workers, from the client -------------------------------------------------------------
@dataclass(frozen=True)
class WorkersOutcome:
    """A loop on the workers that ran to its end: the driver's final ``state``, the final pass's
    per-block results in block order (``finals``, or None) and the ``iteration`` count."""

    state: Any
    finals: list | None
    iteration: int


def _rank_blocks(datasets: dict, groups: list[list[int]], workers: dict[int, str], client: Any,
                 lazy: bool) -> dict[str, list]:
    """``{worker address: [(block, [handle by dataset])]}`` in block order: each group's blocks go to
    the worker holding its first block. A handle is the block's future (a block not persisted: the
    block itself, computed for the task). ``lazy``: a block on its rank's own worker stays in that
    worker's store (a :class:`~gdask.gdataset.engine._worker.StoreKey`), the others come with the task."""
    names = list(datasets)
    held: dict[str, dict[int, str]] = {}
    futures = {n: {f.key: f for f in persisted_futures(g) or ()} for n, g in datasets.items() if g is not None}
    if lazy:  # where each dataset's blocks are: those on the rank's own worker stay in its store
        for n in names:
            places = None if datasets[n] is None else block_places(datasets[n], client, wait_ready=True)
            held[n] = places.workers if places is not None else {}
    mine: dict[str, list] = {a: [] for a in sorted({workers[g[0]] for g in groups})}
    for g in groups:
        addr = workers[g[0]]
        for b in g:
            handles = [None if datasets[n] is None
                       else _worker.StoreKey((datasets[n].name, b)) if lazy and held[n].get(b) == addr
                       else _handle(datasets[n], b, futures[n]) for n in names]
            mine[addr].append((b, handles))
    for blocks in mine.values():
        blocks.sort(key=lambda p: p[0])
    return mine


def _handle(g: GDataSet, b: int, futures: dict) -> Any:
    """Block ``b`` of ``g`` for a rank's task: its future, or the block to compute when not persisted."""
    f = futures.get((g.name, b))
    return g.block(b) if f is None else f


def run_workers_loop(algorithm: IterativeAlgorithm, datasets: dict, groups: list[list[int]],
                     workers: dict[int, str], client: Any, token: str, records: Records,
                     lazy: bool = False) -> WorkersOutcome:
    """The loop on the workers: one task per worker holding blocks, from ``records.resume``; the
    checkpoints come back as events and go to ``records`` in this thread. Raises
    :class:`~gdask.gdataset.collective.CollectiveError` when it could not finish. ``lazy``: the
    tasks get the blocks' keys and read them from their worker's store on use."""
    names = list(datasets)
    nblocks = next(g.nblocks for g in datasets.values() if g is not None)
    mine = _rank_blocks(datasets, groups, workers, client, lazy)
    peers = sorted(mine)
    ensure_plugins(client, extra=(LoopEvents(),), standard=False)
    topic = loop_topic(token)
    start = records.resume
    every = float(config.get("engine.checkpoint-interval", 1.0))
    batch = float(config.get("engine.progress-interval", 0.1))
    # the blocks' futures at the top of the arguments, where the task's start finds them without walking the rest
    tasks = [(algorithm, _worker.RankTask(names, nblocks, token, start.iteration, start.state, topic, lazy,
                                          state_every=every, progress_every=batch), mine[a]) for a in peers]
    events = CheckpointEvents(client, topic, records)

    def on_poll() -> None:
        events.drain()
        records.poll()

    try:
        try:
            results = run_on_workers(client, _worker.driver_on_worker, peers, tasks, name=algorithm.name,
                                     on_poll=on_poll, same_results=True)
        except CollectiveError:
            # where the fit resumes: the checkpoints the events brought, and the newest one the
            # survivors kept (the failure may overtake their last events on the way here)
            events.drain()
            _newest_checkpoint(client, token, records)
            raise
    finally:
        events.close()
    r0 = results[0]
    records.fill(r0.iteration, r0.state)  # records the events did not bring in time
    finals = None if r0.finals is None else [r0.finals[b] for b in sorted(r0.finals)]
    return WorkersOutcome(r0.state, finals, r0.iteration)


def _newest_checkpoint(client: Any, token: str, records: Records) -> None:
    """After a failed loop on the workers: the newest checkpoint any surviving worker kept, recorded
    if the events did not bring it (bounded by config ``gdask.engine.checkpoint-timeout``)."""
    limit = float(config.get("engine.checkpoint-timeout", 10))
    try:  # a stopped rank still running may finish the step it has all values of: waited for, half the limit
        found = run_sync(client, _worker.last_checkpoint, token, limit / 2, on_error="ignore", timeout=limit)
    except Exception as e:  # noqa: BLE001 - the cluster may be in trouble: resume from what the events brought
        logger.debug("could not ask the workers for their checkpoints of loop %s: %r", token, e)
        return
    kept = [(pickle.loads(v[0]), pickle.loads(v[1])) for v in found.values() if isinstance(v, (tuple, list))]
    if not kept:
        return
    best, recent = max(kept, key=lambda c: c[0][0])
    if best[0] > records.resume.iteration:
        for it, rec in recent:  # the records rank 0 had not sent yet (it sends them in batches)
            if it < best[0]:
                records.fill_history(it - 1)
                records.newer(it, None, rec)
        records.fill_history(best[0] - 1)  # iterations whose records were lost with a worker
        records.newer(*best)


# -- after the loop -------------------------------------------------------------------------------------------
def drop_state(client: Any, token: str) -> None:
    """Forget the fit's per-worker state here and, without waiting, on every worker."""
    _worker.drop_on_worker(token)  # here: a loop without a Client, or run inside a task, kept state here
    if client is None:
        return
    try:  # on the client's event loop, so the caller does not wait for the broadcast's round trip
        client.loop.add_callback(_drop_everywhere, client, token)
    except (AttributeError, RuntimeError) as e:  # a client without a running loop (closing)
        logger.debug("could not drop the state of loop %s on the workers: %r", token, e)


async def _drop_everywhere(client: Any, token: str) -> None:
    try:
        await run_async(client, _worker.drop_on_worker_async, token, wait=False, on_error="ignore")
    except Exception as e:  # noqa: BLE001 - the client closed meanwhile: the states go with the workers
        logger.debug("could not drop the state of loop %s on the workers: %r", token, e)
