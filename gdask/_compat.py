"""Every use of distributed's private or internal API, in one module.

gdask extends distributed through its public hooks (scheduler and worker plugins, handlers,
``Worker(data=...)``). A few things have no public hook; they are named here, one small function
each, so that a change inside distributed breaks one module (and ``tests/gdask/test_compat.py``,
which pins the supported range), not many:

* :func:`run_async`: ``Client._run``, the coroutine behind ``Client.run``, for code that already
  runs on the client's event loop (``Client.run`` would block it) or needs ``callback_timeout``.
* :func:`wait_for_signals`: ``distributed._signals``, as ``dask worker`` waits for SIGINT/SIGTERM.
* :func:`set_executor`: a worker's executors by name (``Worker.executors`` is a plain dict the
  worker reads at each task; distributed has no hook to add one).
* :func:`set_worker_data`: a worker's data store after the worker was made (a preload on a plain
  ``dask worker`` cannot pass ``data=``).
* :func:`wrap_transfer_handler`: run a worker's ``get_data`` handler (what sends its data to other
  workers and to clients) inside a context of gdask's (the window cache marks those reads).
* :func:`wrap_execute`: run a worker's ``execute`` (which reads a task's inputs from the data store,
  then runs the task on its executor) through a wrapper of gdask's (the window cache pins a running
  task's inputs and marks the reads that assemble them). ``execute`` is the abstract method of
  distributed's ``BaseWorker`` that the worker state machine calls for every task; there is no hook
  around it.
* :func:`process_workers`: the workers of this process (``Worker._instances``), for a log filter
  that must know whether they are all closing.
* :func:`event_topics` / :func:`forget_events`: the events a scheduler keeps of one topic
  (``Scheduler.log_event`` stores every event of a topic, for ``Client.get_events``, and never drops
  a topic; distributed's only clean-up is per client, after the client left).
* :func:`scheduler_workers`: the scheduler's workers, asked for at each call. ``Client.scheduler_info()``
  fetches them but returns the client's cached identity, which the client's own periodic refresh
  (it asks for no workers) can overwrite in between: an empty ``"workers"`` for a cluster that has
  some, seen on a loaded machine. This asks the scheduler's ``identity`` handler (what
  ``scheduler_info`` calls) and returns its answer as it came.

Nothing else in gdask reads or writes an underscored attribute of a distributed object
(``tests/test_layering.py`` checks it).
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager

#: the distributed releases gdask is tested with (inclusive lower, exclusive upper bound)
SUPPORTED_DISTRIBUTED = ("2025.1", "2027.1")

__all__ = ["SUPPORTED_DISTRIBUTED", "event_topics", "forget_events", "process_workers", "run_async", "run_sync",
           "scheduler_workers", "set_executor", "set_worker_data", "wait_for_signals", "wrap_execute",
           "wrap_transfer_handler"]


def process_workers() -> list[Any]:
    """The distributed workers alive in this process."""
    from distributed import Worker

    return list(Worker._instances)


def run_async(client: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """``client.run(func, *args, **kwargs)`` as a coroutine, to await on the client's event loop
    (``workers=``, ``wait=``, ``on_error=`` as for ``Client.run``)."""
    return client._run(func, *args, **kwargs)


def scheduler_workers(client: Any, timeout: float | None = None) -> dict[str, dict]:
    """``{address: info}`` of the scheduler's workers now (as ``client.scheduler_info()["workers"]``,
    without its race), within ``timeout`` seconds (default config ``gdask.timeouts.scheduler-info``).
    An asynchronous client cannot wait here: it gets the client's cached view, as from
    ``scheduler_info``."""
    if getattr(client, "asynchronous", False):
        return dict(client.scheduler_info()["workers"])
    if timeout is None:
        from gdask import config

        timeout = float(config.get("timeouts.scheduler-info", 30))
    try:
        info = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout)
    except TimeoutError as e:
        raise TimeoutError(f"the scheduler did not list its workers within {timeout:g} s "
                           "(config gdask.timeouts.scheduler-info)") from e
    return dict(info.get("workers", {}))


def run_sync(client: Any, func: Any, *args: Any, timeout: float, **kwargs: Any) -> Any:
    """``client.run(func, *args, **kwargs)`` from a thread other than the client's event loop,
    giving up after ``timeout`` seconds (``TimeoutError``)."""
    return client.sync(client._run, func, *args, callback_timeout=timeout, **kwargs)


def run_on_scheduler_sync(client: Any, func: Any, *args: Any, timeout: float, **kwargs: Any) -> Any:
    """``client.run_on_scheduler(func, *args, **kwargs)``, giving up after ``timeout`` seconds
    (``TimeoutError``)."""
    return client.sync(client._run_on_scheduler, func, *args, callback_timeout=timeout, **kwargs)


async def wait_for_signals() -> int:
    """Wait for SIGINT or SIGTERM (as ``dask worker`` does) and return the signal's number."""
    from distributed._signals import wait_for_signals as wait

    return await wait()


def set_executor(worker: Any, names: tuple[str, ...], executor: Any) -> Any:
    """Make ``executor`` the worker's executor under each of ``names`` (tasks choose one by the
    ``executor`` annotation; ``"default"`` runs the rest). Returns the executor that was "default"."""
    old = worker.executors.get("default")
    for name in names:
        worker.executors[name] = executor
    return old


def executor(worker: Any, name: str) -> Any:
    """The worker's executor called ``name``, or None."""
    return worker.executors.get(name)


def set_worker_data(worker: Any, store: Any) -> None:
    """Make ``store`` (a MutableMapping) the data store of a running ``worker`` that holds no data
    yet: where its memory manager spills from and where its state machine keeps task results."""
    worker.memory_manager.data = store
    worker.state.data = store


def wrap_transfer_handler(worker: Any, around: Callable[[Any], ContextManager[Any]]) -> Callable[[], None]:
    """Run ``worker``'s ``get_data`` handler (it reads the data it sends to other workers and to
    clients from the worker's data store) inside ``around(who)``: ``who`` is the address of the
    worker that asks (a dependency fetch, a replica), None for a client or the scheduler. Returns a
    function that undoes it (when nothing replaced the handler since)."""
    original = worker.handlers["get_data"]

    async def get_data(comm: Any, keys: Any, who: Any = None, serializers: Any = None, **kwargs: Any) -> Any:
        with around(who):
            return await original(comm, keys=keys, who=who, serializers=serializers, **kwargs)

    worker.handlers["get_data"] = get_data

    def undo() -> None:
        if worker.handlers.get("get_data") is get_data:
            worker.handlers["get_data"] = original

    return undo


def wrap_execute(worker: Any, wrapper: Callable[..., Any]) -> Callable[[], None]:
    """Run every task of ``worker`` through ``await wrapper(execute, key, stimulus_id=...)``, which
    must return ``await execute(key, stimulus_id=...)``: distributed's ``Worker.execute``, which reads
    the task's inputs from the data store (on the event loop, before its first ``await``), runs the
    task on its executor and returns the state machine's event. Returns a function that undoes it
    (when nothing replaced it since)."""
    original = worker.execute

    async def execute(key: Any, *, stimulus_id: str) -> Any:
        return await wrapper(original, key, stimulus_id=stimulus_id)

    worker.execute = execute

    def undo() -> None:
        if worker.execute is execute:
            worker.execute = original

    return undo


def event_topics(scheduler: Any) -> list[str]:
    """The names of every event topic ``scheduler`` has (with events or subscribers)."""
    return list(scheduler._broker._topics)


def forget_events(scheduler: Any, topic: str, *, unsubscribe: str | None = None, drop: bool = False) -> bool:
    """Drop the events ``scheduler`` keeps of ``topic`` (those it already sent to the topic's
    subscribers); ``unsubscribe``: a client to take off the topic's subscribers first; ``drop``: also
    the topic itself, when no client subscribes to it any more. Whether the scheduler has no such
    topic now. Never makes a topic (``Scheduler.unsubscribe_topic`` does, for a name it lacks)."""
    broker = scheduler._broker
    kept = broker._topics.get(topic)
    if kept is None:
        return True
    if unsubscribe is not None:
        kept.unsubscribe(unsubscribe)
    kept.truncate()
    if drop and not kept.subscribers:
        del broker._topics[topic]
        return True
    return False
