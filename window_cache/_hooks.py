"""The window store's hooks into a distributed worker, in one module.

* **Installing the store.** ``Worker(data=WindowStore)`` (``LocalGPUCluster`` and ``gdask worker``
  pass it); for a plain ``dask worker --preload gdask.scheduling``, :func:`use_window_store` makes
  it the data of the worker before it holds any (through ``gdask._compat.set_worker_data``).
* **The transfer handler.** :class:`WindowCachePlugin` runs the worker's ``get_data`` handler (it
  sends data to other workers and to clients) inside
  :func:`~gdask.window_cache._pins.reading_for_transfer`: a block not on the device is sent from
  its host copy, without loading it onto the device.
* **The task pin protocol.** The plugin runs the worker's ``execute`` through a wrapper that pins
  the task's inputs (its dependencies, from the worker's state) before they are read, marks the
  reads that assemble them (:func:`~gdask.window_cache._pins.reading_inputs_of`) and releases the
  pins when the task ends, whatever its executor (gdask's stream executor or distributed's thread
  pool). Its ``transition`` hook releases them again when the task leaves its running states
  (finished, erred, released after a cancel), so a missed release cannot pin a block for ever.

The wrappers go through ``gdask._compat`` (distributed has no hook around ``execute`` or a
handler); the plugin undoes them at teardown.
"""

from __future__ import annotations

from typing import Any, Callable

from distributed import WorkerPlugin

from gdask import protocol
from gdask._compat import set_worker_data, wrap_execute, wrap_transfer_handler
from gdask.window_cache._pins import reading_for_transfer, reading_inputs_of
from gdask.window_cache._store import WindowStore

__all__ = ["RUNNING", "WindowCachePlugin", "use_window_store", "worker_store"]

#: the worker states of a task whose code may be running (a cancelled or resumed task runs until it returns)
RUNNING = frozenset({"executing", "long-running", "cancelled", "resumed"})


def worker_store(dask_worker: Any = None) -> WindowStore | None:
    """The worker's :class:`WindowStore` (its ``data``), or ``None`` when it uses another store."""
    if dask_worker is None:
        from distributed import get_worker

        dask_worker = get_worker()
    data = getattr(dask_worker, "data", None)
    return data if isinstance(data, WindowStore) else None


def use_window_store(worker: Any, **kwargs: Any) -> bool:
    """Give ``worker`` (a distributed Worker that holds no data yet) a :class:`WindowStore` as its
    data; the worker's device plugin binds it to the device. Returns False (and changes nothing)
    when the worker already holds data or has a window store."""
    data = worker.data
    if isinstance(data, WindowStore) or len(data):
        return False
    set_worker_data(worker, WindowStore(**kwargs))
    return True


class WindowCachePlugin(WorkerPlugin):
    """The window store's hooks on one worker: transfers from the host copy, pins of running tasks'
    inputs. Does nothing on a worker whose data is not a :class:`WindowStore`.

    Every gdask device worker gets it (``gdask.scheduling.worker_plugins``); on any other cluster,
    ``client.register_plugin(WindowCachePlugin())``.
    """

    name = protocol.PLUGIN_WINDOW_CACHE
    idempotent = True

    def __init__(self) -> None:
        self.worker: Any = None
        self.store: WindowStore | None = None
        self._undo: list[Callable[[], None]] = []

    def __getstate__(self) -> dict:
        return {}  # sent to workers: each starts empty

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def setup(self, worker: Any) -> None:
        store = worker_store(worker)
        if store is None:
            return
        self.worker, self.store = worker, store
        self._undo = [wrap_transfer_handler(worker, reading_for_transfer), wrap_execute(worker, self._execute)]

    def teardown(self, worker: Any) -> None:
        for undo in self._undo:
            undo()
        self._undo = []

    async def _execute(self, execute: Callable[..., Any], key: Any, *, stimulus_id: str) -> Any:
        """distributed's ``execute`` of task ``key``, with its inputs pinned while it runs."""
        store = self.store
        ts = self.worker.state.tasks.get(key)
        store.task_started(key, [d.key for d in ts.dependencies] if ts is not None else ())
        try:
            with reading_inputs_of(key):
                return await execute(key, stimulus_id=stimulus_id)
        finally:
            store.task_finished(key)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if self.store is not None and start in RUNNING and finish not in RUNNING:
            self.store.task_finished(key)
