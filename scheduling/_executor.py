"""The stream executor: a worker executor that runs tasks on ``K`` streams and tunes ``K``.

Each of its ``max_streams`` slots is one thread bound to one stream (a CUDA stream on CUDA devices,
the thread itself on emulated devices). At most ``K`` tasks start at once; ``K`` is fixed
(:meth:`StreamThreadPoolExecutor.set_streams`) or tuned from measured throughput
(:meth:`StreamThreadPoolExecutor.adapt`) by the pure :class:`gdask.scheduling.StreamController`.
This module is the thin adapter around that policy: clocks, threads and locks live here only.

Dask detail: ``distributed`` propagates the worker context (``get_worker()``, the task key) only into
executors whose class name contains ``"ThreadPoolExecutor"``, hence the name. A worker starts at most
``nthreads`` tasks at once whatever the executor, so device workers run with
``nthreads = max_streams`` and this executor holds back all but ``K`` of them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import itertools
import threading
import time
from typing import Any, Callable, ContextManager

from gdask.scheduling._streams import StreamController

__all__ = ["StreamThreadPoolExecutor", "device_stream_context"]


_TRACE_LEN = 1000


class _WorkItem:
    __slots__ = ("future", "fn", "args", "kwargs")

    def __init__(self, future: concurrent.futures.Future, fn: Callable, args: tuple, kwargs: dict) -> None:
        self.future = future
        self.fn = fn
        self.args = args
        self.kwargs = kwargs


def _secession_state():
    """distributed's thread-local that ``secede``/``rejoin`` use (None if distributed is absent)."""
    try:
        from distributed.threadpoolexecutor import thread_state
    except ImportError:  # pragma: no cover - distributed is a dependency
        return None
    return thread_state


class StreamThreadPoolExecutor(concurrent.futures.Executor):
    """Run submitted callables on at most ``K`` of ``max_streams`` stream slots at once.

    Parameters
    ----------
    max_streams : int
        Number of slots (threads, each with its own stream); the upper bound of ``K``.
    streams : int
        Initial ``K`` (clipped to ``[1, max_streams]``).
    adaptive : bool
        Tune ``K`` from measured throughput with a :class:`StreamController` starting at ``streams``.
    controller : StreamController, optional
        Policy to use when adaptive (its ``max_streams`` must equal this executor's).
    round_tasks : int, optional
        A feedback round ends once this many tasks completed (default ``max(8, 4 * max_streams)``)
        and at least ``round_seconds`` of busy time passed.
    round_seconds : float
        Minimum busy time of a round, in seconds (longer rounds average out more noise).
    slot_context : callable, optional
        ``slot_context(slot) -> context manager`` entered around every task run on ``slot``
        (``0 <= slot < max_streams``) in that slot's thread; on CUDA it makes the slot's stream
        current (:func:`device_stream_context`). Default: nothing.
    thread_name_prefix : str
        Prefix of the slot threads' names.
    clock : callable
        Monotonic clock in seconds (injectable for tests).

    Notes
    -----
    Throughput is measured in rounds, adaptive or not (:attr:`throughput`, :attr:`trace`). The
    throughput of a round is *tasks completed per second of busy time* (time with at least one
    task queued or running), so idle gaps between computations do not count against ``K``. Tasks
    that secede (``distributed.secede``, ``worker_client``) leave their slot, as in distributed's
    own thread pool, and are not counted.
    """

    def __init__(
        self,
        max_streams: int,
        streams: int = 1,
        *,
        adaptive: bool = False,
        controller: StreamController | None = None,
        round_tasks: int | None = None,
        round_seconds: float = 0.0,
        slot_context: Callable[[int], ContextManager[Any]] | None = None,
        thread_name_prefix: str = "gdask-stream",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not isinstance(max_streams, int) or isinstance(max_streams, bool) or max_streams < 1:
            raise ValueError(f"max_streams must be an integer >= 1, got {max_streams!r}")
        if round_tasks is None:
            round_tasks = max(8, 4 * max_streams)
        if round_tasks < 1:
            raise ValueError(f"round_tasks must be >= 1, got {round_tasks!r}")
        if round_seconds < 0:
            raise ValueError(f"round_seconds must be >= 0, got {round_seconds!r}")
        self.max_streams = max_streams
        self.round_tasks = int(round_tasks)
        self.round_seconds = float(round_seconds)
        self._slot_context = slot_context
        self._prefix = thread_name_prefix
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[_WorkItem] = collections.deque()
        self._k = min(max(int(streams), 1), max_streams)
        self._running = 0
        self._max_running = 0  # the highest concurrency seen (for tests and diagnostics)
        self._shutdown = False
        self._slot_threads: dict[int, threading.Thread] = {}
        self._slot_of: dict[threading.Thread, int] = {}
        self._counter = itertools.count()
        # the protocol of distributed.threadpoolexecutor.secede / rejoin
        self._threads: set[threading.Thread] = set()
        self._rejoin_list: list[tuple[threading.Thread, threading.Event]] = []
        self._rejoin_lock = threading.Lock()
        self._thread_state = _secession_state()  # imported here, not in the first slot thread
        # feedback
        self._controller: StreamController | None = None
        self.completed = 0
        self.failed = 0
        self.rounds = 0
        self.throughput: float | None = None
        # (K, throughput) of the last rounds (bounded: a worker lives long)
        self.trace: collections.deque[tuple[int, float]] = collections.deque(maxlen=_TRACE_LEN)
        self._busy_since: float | None = None
        self._round_busy = 0.0
        self._round_done = 0
        if controller is not None or adaptive:
            self.adapt(controller)

    # -- public state -------------------------------------------------------------------------
    @property
    def streams(self) -> int:
        """The current stream count ``K``."""
        return self._k

    @property
    def adaptive(self) -> bool:
        """Whether ``K`` is tuned from feedback."""
        return self._controller is not None

    @property
    def controller(self) -> StreamController | None:
        return self._controller

    @property
    def running(self) -> int:
        """Tasks executing now (seceded tasks excluded)."""
        return self._running

    @property
    def queued(self) -> int:
        """Tasks waiting for a stream."""
        return len(self._queue)

    def set_streams(self, k: int) -> None:
        """Fix ``K`` (turns feedback off) and start a new measurement round. Queued tasks start as
        slots allow; none is dropped.

        Raises
        ------
        ValueError
            ``k`` outside ``[1, max_streams]``.
        """
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= self.max_streams:
            raise ValueError(f"streams must be an integer in [1, {self.max_streams}], got {k!r}")
        with self._cond:
            self._controller = None
            self._new_round()
            self._apply(k)

    def adapt(self, controller: StreamController | None = None) -> StreamController:
        """Tune ``K`` from measured throughput, from now on; returns the controller used.

        Parameters
        ----------
        controller : StreamController, optional
            Default: ``StreamController(max_streams, start=K)``.
        """
        if controller is None:
            controller = StreamController(self.max_streams, start=self._k)
        elif controller.max_streams != self.max_streams:
            raise ValueError(
                f"controller.max_streams ({controller.max_streams}) must equal the executor's "
                f"max_streams ({self.max_streams})"
            )
        with self._cond:
            self._controller = controller
            self._new_round()
            self._apply(controller.k)
        return controller

    def metrics(self) -> dict[str, Any]:
        """Scalars for ``worker.metrics`` (and so for the device table)."""
        return {
            "streams": self._k,
            "max_streams": self.max_streams,
            "adaptive": self.adaptive,
            "throughput": self.throughput,
            "rounds": self.rounds,
            "running": self._running,
            "queued": len(self._queue),
            "completed": self.completed,
        }

    def __repr__(self) -> str:
        mode = "adaptive" if self.adaptive else "fixed"
        return (f"<{type(self).__name__}: {self._k}/{self.max_streams} streams ({mode}), "
                f"running={self._running}, queued={len(self._queue)}>")

    # -- Executor API -------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("cannot schedule new tasks after shutdown")
            if self._busy_since is None:
                self._busy_since = self._clock()
            self._queue.append(_WorkItem(future, fn, args, kwargs))
            self._start_threads()
            self._cond.notify_all()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting tasks; queued ones still run unless ``cancel_futures``."""
        with self._cond:
            self._shutdown = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft().future.cancel()
            threads = list(self._slot_threads.values())
            self._cond.notify_all()
        if wait:
            me = threading.current_thread()
            for t in threads:
                if t is not me:
                    t.join()

    # -- internals (call with self._cond held) ------------------------------------------------
    def _new_round(self) -> None:
        """Start a fresh measurement round (a K set from outside makes the current one moot)."""
        self._round_done = 0
        self._round_busy = 0.0
        if self._busy_since is not None:
            self._busy_since = self._clock()

    def _apply(self, k: int) -> None:
        self._k = min(max(int(k), 1), self.max_streams)
        self._start_threads()
        self._cond.notify_all()

    def _start_threads(self) -> None:
        """Start the thread of every usable slot that has none, if there is work for it."""
        if not self._queue and not self._rejoin_list:
            return
        for slot in range(self._k):
            if slot not in self._slot_threads:
                self._spawn(slot)

    def _spawn(self, slot: int) -> None:
        t = threading.Thread(
            target=self._worker, args=(slot,), daemon=True,
            name=f"{self._prefix}-{slot}-{next(self._counter)}",
        )
        self._slot_threads[slot] = t
        self._slot_of[t] = slot
        self._threads.add(t)
        t.start()

    def _can_start(self, slot: int) -> bool:
        return slot < self._k and self._running < self._k

    def _record(self, ok: bool | None) -> None:
        now = self._clock()
        if not self._queue and self._running == 0 and self._busy_since is not None:
            self._round_busy += now - self._busy_since  # going idle: stop the busy clock
            self._busy_since = None
        if ok is None:  # cancelled before it started
            return
        self.completed += 1
        self.failed += not ok
        self._round_done += 1
        if self._round_done < self.round_tasks:
            return
        busy = self._round_busy + (now - self._busy_since if self._busy_since is not None else 0.0)
        if busy < self.round_seconds or busy <= 0:
            return
        thr = self._round_done / busy
        self.throughput = thr
        self.trace.append((self._k, thr))
        self.rounds += 1
        self._round_done = 0
        self._round_busy = 0.0
        if self._busy_since is not None:
            self._busy_since = now
        if self._controller is not None:
            self._apply(self._controller.observe(thr))

    # -- slot threads -------------------------------------------------------------------------
    def _worker(self, slot: int) -> None:
        ts = self._thread_state
        me = threading.current_thread()
        if ts is not None:
            ts.proceed = True
            ts.executor = self
        try:
            while True:
                with self._cond:
                    while True:
                        slot = self._slot_of[me]
                        if self._rejoin_list and self._can_start(slot):
                            self._hand_over(me, slot)  # a seceded task rejoins on this slot
                            return
                        if self._queue and self._can_start(slot):
                            break
                        if self._shutdown and (not self._queue or slot >= self._k):
                            self._retire(me, slot)
                            return
                        self._cond.wait()
                    item = self._queue.popleft()
                    self._running += 1
                    self._max_running = max(self._max_running, self._running)
                ok = self._run(item, slot)
                # drop the finished task now: an idle slot thread would otherwise keep its inputs and
                # result (device blocks) alive until it takes the next task, and that memory could not
                # be reclaimed while the next task's inputs are loaded
                del item
                with self._cond:
                    if ts is not None and not getattr(ts, "proceed", True):
                        # the task seceded: its slot was given away in _adjust_thread_count
                        self._slot_of.pop(me, None)
                        self._cond.notify_all()
                        return
                    self._running -= 1
                    self._record(ok)
                    self._cond.notify_all()
        finally:
            if ts is not None:
                for attr in ("proceed", "executor"):
                    with contextlib.suppress(AttributeError):
                        delattr(ts, attr)

    def _run(self, item: _WorkItem, slot: int) -> bool | None:
        """Run one task; True if it succeeded, False if it failed, None if it was cancelled."""
        if not item.future.set_running_or_notify_cancel():
            return None
        try:
            if self._slot_context is None:
                result = item.fn(*item.args, **item.kwargs)
            else:
                with self._slot_context(slot):
                    result = item.fn(*item.args, **item.kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the future, never swallowed
            item.future.set_exception(exc)
            return False
        item.future.set_result(result)
        # distributed's _run_task reports task errors in its result instead of raising
        return not (isinstance(result, dict) and result.get("op") == "task-erred")

    def _retire(self, me: threading.Thread, slot: int) -> None:
        if self._slot_threads.get(slot) is me:
            del self._slot_threads[slot]
        self._slot_of.pop(me, None)
        self._threads.discard(me)

    # -- distributed secede / rejoin protocol -------------------------------------------------
    def _adjust_thread_count(self) -> None:
        """Called by ``distributed.secede`` after it removed the calling thread from ``_threads``:
        free that thread's slot (a fresh thread takes it) and stop counting its task."""
        me = threading.current_thread()
        with self._cond:
            slot = self._slot_of.get(me)
            if slot is None or self._slot_threads.get(slot) is not me:
                return
            self._running -= 1
            del self._slot_threads[slot]
            self._threads.discard(me)
            if not self._shutdown or self._queue:
                self._spawn(slot)
            self._cond.notify_all()

    def _hand_over(self, me: threading.Thread, slot: int) -> None:
        """Give this idle thread's slot to a thread that called ``distributed.rejoin``."""
        with self._rejoin_lock:
            other, event = self._rejoin_list.pop()
        self._retire(me, slot)
        self._slot_threads[slot] = other
        self._slot_of[other] = slot
        self._threads.add(other)
        self._running += 1  # the rejoined task occupies the slot until it ends
        event.set()


@contextlib.contextmanager
def _cuda_slot(device: Any, stream: Any):
    with device.device, stream:
        yield
    stream.synchronize()  # results are complete before another stream (or the host) reads them


def device_stream_context(device: Any) -> Callable[[int], ContextManager[Any]] | None:
    """``slot_context`` for :class:`StreamThreadPoolExecutor` on ``device``'s backend.

    On CUDA every slot gets its own non-blocking CuPy stream (made lazily by the device module,
    one per slot thread), made current around each task and synchronized when the task returns.
    Emulated devices need none: their streams are the slot threads themselves.
    """
    if getattr(device, "backend", None) != "cuda":
        return None

    def slot_context(slot: int) -> ContextManager[Any]:
        return _cuda_slot(device, device.stream())

    return slot_context
