"""``persist()`` of blocks made from in-memory arrays through files in shared memory.

Blocks made by :func:`~gdask.gdataset.from_array` from a NumPy array travel in the graph: client to
scheduler, scheduler to worker, each hop a copy into fresh memory (a 144 MB dataset took 0.6-0.9 s to
reach a freshly started 2-worker cluster on one 2-core machine, 0.3-0.6 s a warm one). When the
scheduler and every worker run on the client's host, :func:`persist` writes each block into a file in
shared memory (:mod:`gdask._shm`) and the block's task maps it (0.26-0.35 s for the same data). The task
keeps the block's key and its place (the same annotations), and the scheduler keeps the task, so a block
lost with a worker is read again from its file.

Each file belongs to the scheduler's :class:`SharedBlockFiles` plugin (installed on first use), which
removes it when the scheduler forgets the block's key (no client holds it and no task needs it for
recovery), and removes what is left when the scheduler closes. The blocks go in the graph as before when
the transfer is off (config ``gdask.gdataset.same-host-transfer``), the data is small
(:data:`MIN_BYTES`), some worker or the scheduler is elsewhere or does not see the files, or there is no
room in the directory (config ``gdask.shared-memory-dir``).

Where every worker's device is emulated, a 2-D block's file holds it feature-major, the device layout
(:func:`file_order`): the device keeps the file's private mapping as the block
(:meth:`~gdask.devices.EmulatedDevice.hand_over`), so the worker neither copies it nor touches fresh
memory for it (256 MB in 8 blocks: the first fit's placement 190-310 -> 35-65 ms on a 2-core machine,
for 60-100 ms more of the client's writing), and the dataset is in memory once. A GPU's worker gets rows
and makes them feature-major on the device, which costs it next to nothing and the client no time.
:func:`held` persists blocks that the client holds already without writing or sending anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from dask.base import DaskMethodsMixin, get_scheduler
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.task_spec import Task
from distributed import Future
from distributed.diagnostics.plugin import SchedulerPlugin

from gdask import _shm, config, protocol
from gdask._compat import run_on_scheduler_sync, run_sync, scheduler_workers
from gdask.gdataset import _blocks
from gdask.gdataset.locality import default_client_or_none

__all__ = ["MIN_BYTES", "PLUGIN_NAME", "SharedBlock", "SharedBlockFiles", "file_order", "held", "load", "persist"]

#: data smaller than this goes in the graph (a file per block and two round trips cost more than it saves)
MIN_BYTES = 16 << 20

#: the most threads that write a dataset's files at once
WRITERS = 4
#: the scheduler plugin's name
PLUGIN_NAME = "gdask-shared-block-files"


@dataclass(frozen=True)
class SharedBlock:
    """A block in a file: where it is, its shape, and the token of its content (the block's key
    names it): tasks that read the same block tokenize alike whatever file holds it."""

    file: _shm.SharedArrays
    shape: tuple[int, ...]
    token: str
    order: str = "C"  # of the block in its file ("F": feature-major, as on the device)

    def __dask_tokenize__(self) -> tuple:
        return ("gdask-shared-block", self.token, self.shape)

    @property
    def nbytes(self) -> int:
        """The block's bytes (in its file): what the task that loads it makes, before it has run once."""
        return sum(np.dtype(dtype).itemsize * length for dtype, length, _ in self.file.specs)


def load(block: SharedBlock) -> Any:
    """(On the worker) the block from its file, copied to this worker's device as ``to_device`` does."""
    arrays = _shm.read(block.file)
    if arrays is None:
        raise FileNotFoundError(
            f"the file {block.file.path} of a block persisted through shared memory is not there: this worker "
            "is on another host (or sees another shared-memory directory), or the file was removed "
            "(config gdask.gdataset.same-host-transfer: false sends the blocks in the graph)")
    return _blocks.to_device(arrays[0].reshape(block.shape, order=block.order), handed=True)


class SharedBlockFiles(SchedulerPlugin):
    """(On the scheduler) the files of blocks persisted through shared memory, by key.

    A persist hands the plugin its files before it sends its graph (:meth:`expect`); when the graph
    comes, a file whose task the scheduler took is kept until the scheduler forgets its key, and a file
    whose task it did not take (the key was there already, with its own task) is removed at once.
    The scheduler takes graphs and key releases in the order a client sends them, so a key released and
    persisted again at once keeps the new file and loses only the old one. All are removed when the
    scheduler closes."""

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.files: dict[Any, list[str]] = {}  # the files of the scheduler's tasks
        self.expected: dict[Any, list[str]] = {}  # files of graphs not seen yet

    def expect(self, files: dict) -> None:
        for key, path in files.items():
            self.expected.setdefault(key, []).append(path)

    def update_graph(self, scheduler: Any, *, tasks: Any = (), **kwargs: Any) -> None:
        if not self.expected:
            return
        for key in tasks:
            paths = self.expected.pop(key, None)
            if not paths:
                continue
            ts = scheduler.tasks.get(key)
            taken = {a.file.path for a in getattr(ts.run_spec, "args", ()) if isinstance(a, SharedBlock)} if ts else ()
            for path in paths:
                if path in taken:
                    self.files.setdefault(key, []).append(path)
                else:
                    _shm.remove(path)

    def drop(self, keys: Any, expected: bool = False) -> None:
        """Remove the files of ``keys``: of their tasks, or (``expected``) of graphs never sent."""
        held = self.expected if expected else self.files
        for key in keys:
            for path in held.pop(key, ()):
                _shm.remove(path)

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "forgotten" and self.files:
            self.drop([key])

    async def close(self) -> None:
        self.drop(list(self.files))
        self.drop(list(self.expected), expected=True)


def _expect(files: dict, probe: str, dask_scheduler: Any = None) -> bool:
    """(On the scheduler) whether the scheduler sees file ``probe``; then the plugin (installed if it
    is not yet) expects ``files`` ({key: path})."""
    if not os.path.exists(probe):
        return False
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None:
        plugin = SharedBlockFiles()
        dask_scheduler.add_plugin(plugin, name=PLUGIN_NAME)
    plugin.expect(files)
    return True


def _forget_expected(keys: list, dask_scheduler: Any = None) -> None:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is not None:
        plugin.drop(keys, expected=True)


def _host_blocks(G: Any) -> list[tuple[Any, np.ndarray]] | None:
    """``[(key, host chunk)]`` when ``G`` is a dataset straight from in-memory dense NumPy arrays (one
    ``to_device`` task per block), else None."""
    graph = G.__dask_graph__()
    if not isinstance(graph, HighLevelGraph) or len(graph.layers) != 1:
        return None
    layer = next(iter(graph.layers.values()))
    out = []
    for key, task in layer.items():
        if not isinstance(task, Task) or task.func is not _blocks.to_device or len(task.args) != 1:
            return None
        chunk = task.args[0]
        if type(chunk) is not np.ndarray or chunk.dtype.hasobject:
            return None
        out.append((key, chunk))
    return out if len(out) == G.nblocks else None


def _workers_on_this_host(client: Any) -> dict | None:
    """The scheduler's ``{address: info}`` of its workers when it and every worker are on this host."""
    try:
        workers = scheduler_workers(client)
    except (OSError, TimeoutError):  # the scheduler does not answer: the usual persist says so, as before
        return None
    if workers and _shm.on_this_host(client.scheduler.address) and all(
            _shm.on_this_host(addr, info) for addr, info in workers.items()):
        return workers
    return None


def file_order(workers: dict) -> str:
    """The layout of 2-D blocks in their files for these workers (their scheduler ``info``): "F"
    (feature-major) when every worker's device is emulated, which keeps such a file's mapping as the
    block; else "C" (rows: a GPU makes them feature-major on the device)."""
    def backend(info: dict) -> Any:
        return ((info.get("metrics") or {}).get(protocol.METRIC_DEVICE) or {}).get("backend")

    return "F" if workers and all(backend(info) == "emulated" for info in workers.values()) else "C"


def _client_in_effect(G: Any, kwargs: dict) -> Any:
    """The default client when it is what persists ``G`` (synchronous), else None (no cluster, a
    GTracker's or another scheduler in effect, or an asynchronous client)."""
    if kwargs.get("scheduler") is not None or kwargs.get("get") is not None:
        return None
    client = default_client_or_none()
    if client is None or getattr(client, "asynchronous", False) or get_scheduler(collections=[G]) != client.get:
        return None
    return client


def held(G: Any, kwargs: dict) -> Any:
    """``G`` persisted when the client holds every one of its blocks already (the same arrays persisted
    again, as a second fit on them does; keys name the content): the client's futures of them, and no
    graph sent (a graph of in-memory blocks costs its bytes to write or send, however many of its
    tasks the scheduler has). None otherwise, or when a block is lost or failed."""
    client = _client_in_effect(G, kwargs)
    if client is None:
        return None
    keys = list(flatten(G.__dask_keys__()))
    states = [client.futures.get(k) for k in keys]
    if any(s is None or s.status not in ("pending", "finished") for s in states):
        return None
    futures = {k: Future(k, client) for k in keys}
    # a key released between the look and the futures (a finalizer dropped its last holder) got a
    # new state that nothing will finish: then the usual persist, which sends its task again
    if any(client.futures.get(k) is not s for k, s in zip(keys, states)):
        return None
    func, args = G.__dask_postpersist__()
    return func(futures, *args)


def persist(G: Any, kwargs: dict) -> Any:
    """``G.persist(**kwargs)`` through files in shared memory, or None where that does not apply
    (then the caller persists as usual: see the module doc)."""
    client = _client_in_effect(G, kwargs)
    if client is None:
        return None
    where = _shm.directory("gdataset.same-host-transfer")
    blocks = _host_blocks(G) if where else None
    if not blocks:
        return None
    nbytes = sum(c.nbytes for _, c in blocks)
    workers = _workers_on_this_host(client) if nbytes >= MIN_BYTES and _shm.room(nbytes, where) else None
    if not workers:
        return None
    order = file_order(workers)
    files = _write_all([chunk for _, chunk in blocks], where, order)
    return None if files is None else _persist_files(G, client, blocks, files, kwargs, order)


def _write_all(chunks: list[np.ndarray], where: str, order: str = "C") -> list | None:
    """A file in ``where`` for each chunk, written by up to :data:`WRITERS` threads at once (a memory
    file system's pages are given out per writer: 256 MB in 8 files 135 -> 75 ms with 2 on 2 cores),
    or None, and no file left, when one could not be written."""
    from concurrent.futures import ThreadPoolExecutor

    threads = max(1, min(WRITERS, os.cpu_count() or 1, len(chunks)))
    if threads == 1:
        files = [_write(c, where, order) for c in chunks]
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="gdask-shm-write") as pool:
            files = list(pool.map(lambda c: _write(c, where, order), chunks))
    if any(f is None for f in files):
        for f in files:
            if f is not None:
                _shm.remove(f)
        return None
    return files


def _order(chunk: np.ndarray, order: str) -> str:
    """A chunk's layout in its file: ``order`` (:func:`file_order`) for a 2-D one."""
    return order if chunk.ndim == 2 else "C"


def _write(chunk: np.ndarray, where: str, order: str) -> Any:
    return _shm.write([chunk], where, order=_order(chunk, order))


def _persist_files(G: Any, client: Any, blocks: list, files: list, kwargs: dict, order: str = "C") -> Any:
    timeout = float(config.get("timeouts.same-host-check", 30))
    keys = [key for key, _ in blocks]
    try:
        seen = run_on_scheduler_sync(client, _expect, {k: f.path for k, f in zip(keys, files)}, files[0].path,
                                     timeout=timeout)
        seen = seen and all(run_sync(client, os.path.exists, files[0].path, timeout=timeout).values())
    except Exception:  # a scheduler without gdask, a worker that does not answer: the graph, as usual
        seen = False
    if not seen:
        _not_sent(client, keys, files, timeout)
        return None
    layer = next(iter(G.__dask_graph__().layers.values()))
    tasks = {key: Task(key, load, SharedBlock(f, chunk.shape, f"{key}", _order(chunk, order)))
             for (key, chunk), f in zip(blocks, files)}
    graph = HighLevelGraph.from_collections(G.name, MaterializedLayer(tasks, annotations=layer.annotations),
                                            dependencies=())
    try:
        return DaskMethodsMixin.persist(G._rebuild(graph), **kwargs)
    except BaseException:
        _not_sent(client, keys, files, timeout)
        raise


def _not_sent(client: Any, keys: list, files: list, timeout: float) -> None:
    """Remove the files of a graph that was not sent, and the plugin's note of them."""
    for f in files:
        _shm.remove(f)
    try:
        run_on_scheduler_sync(client, _forget_expected, keys, timeout=timeout)
    except Exception:
        pass  # the scheduler is gone (its plugin removed what it knew when it closed) or never had them
