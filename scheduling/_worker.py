"""Worker side of gdask's scheduling: the plugin that owns a worker's device, and its reports.

:class:`DeviceSetup` (plugin ``gdask-device``) gives a worker process its device (emulated pool, or
CUDA context + RMM pool), its stream executor and its gdask state (:attr:`DeviceSetup.state`, per
computation), binds the worker's data store (the window cache) to the device, and publishes the
device, streams, window and NVML metrics. All metrics are registered once, at setup, by replacing
``worker.metrics`` with a new dict: distributed's heartbeat iterates that dict while it awaits
async metrics (RMM's), so adding a key to it later can end the worker ("dictionary changed size
during iteration").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from dask.utils import format_bytes
from distributed import WorkerPlugin

from gdask import config, protocol
from gdask._compat import executor as worker_executor
from gdask._compat import process_workers, set_executor
from gdask.devices import DeviceSpec, StateSpaces, make_device, make_specs, parse_size

logger = logging.getLogger("gdask")
#: the worker's own log (configured by distributed in every worker process): one line about its device
worker_log = logging.getLogger("distributed.worker.gdask")

__all__ = ["DeviceReporter", "DeviceSetup", "StreamSettings", "add_metrics", "device_info", "install_stream_executor",
           "parse_pool_size", "stream_executor", "stream_settings"]


def parse_pool_size(value: Any, device_memory: int) -> int | None:
    """RMM pool size from config: bytes, a "40GiB" string, a fraction of memory, or None."""
    if value is None:
        return None
    if isinstance(value, float) and 0 < value <= 1:
        return int(value * device_memory)
    return parse_size(value, name="rmm_pool_size")


@dataclass(frozen=True)
class StreamSettings:
    """How a device worker runs its tasks: on the stream executor or not, with how many streams.

    Attributes
    ----------
    executor : bool
        Run the worker's tasks on a :class:`gdask.scheduling.StreamThreadPoolExecutor`.
    streams : int
        Stream count ``K`` the worker starts with (the fixed count when not adaptive).
    max_streams : int
        Upper bound of ``K``; the worker needs this many threads (``nthreads``).
    adaptive : bool
        Tune ``K`` in ``[1, max_streams]`` from measured throughput.
    round_tasks : int or None
        Tasks per feedback round (None: the executor's default).
    """

    executor: bool
    streams: int
    max_streams: int
    adaptive: bool
    round_tasks: int | None = None

    @property
    def nthreads(self) -> int:
        """Threads the worker must have: distributed runs at most ``nthreads`` tasks at once."""
        return self.max_streams if self.executor else self.streams


def _check_int(value: Any, name: str, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def stream_settings(
    spec: DeviceSpec,
    *,
    max_streams: int | None = None,
    adaptive_streams: bool | str | None = None,
    stream_executor: bool | None = None,
) -> StreamSettings:
    """Resolve a device's stream settings; keyword arguments override config ``gdask.device.*``.

    Parameters
    ----------
    spec : DeviceSpec
        The device; ``spec.streams`` is the starting (or fixed) stream count.
    max_streams : int, optional
        Upper bound when adaptive (config ``max-streams``).
    adaptive_streams : bool or "auto", optional
        "auto" (config ``adaptive-streams``) tunes on CUDA devices only: emulated devices do not
        model how streams share a GPU (each thread would run at full emulated speed).
    stream_executor : bool, optional
        Config ``stream-executor``; False keeps distributed's own thread pool (no tuning).

    Raises
    ------
    ValueError
        An invalid setting; the message names it.
    """
    if max_streams is None:
        max_streams = config.get("device.max-streams", 4)
    if adaptive_streams is None:
        adaptive_streams = config.get("device.adaptive-streams", "auto")
    if stream_executor is None:
        stream_executor = config.get("device.stream-executor", True)
    round_tasks = config.get("device.stream-round-tasks", None)
    _check_int(max_streams, "max_streams (gdask.device.max-streams)")
    if round_tasks is not None:
        _check_int(round_tasks, "gdask.device.stream-round-tasks")
    if isinstance(adaptive_streams, str):  # DASK_GDASK__DEVICE__ADAPTIVE_STREAMS=true arrives as text
        adaptive_streams = {"true": True, "false": False}.get(adaptive_streams.lower(), adaptive_streams)
    if isinstance(stream_executor, str):
        stream_executor = {"true": True, "false": False}.get(stream_executor.lower(), stream_executor)
    if adaptive_streams not in (True, False, "auto"):
        raise ValueError(f"adaptive_streams must be True, False or 'auto', got {adaptive_streams!r}")
    if stream_executor not in (True, False):
        raise ValueError(f"stream_executor must be True or False, got {stream_executor!r}")
    adaptive = bool(stream_executor) and (
        spec.backend == "cuda" if adaptive_streams == "auto" else bool(adaptive_streams)
    )
    top = max(max_streams, spec.streams) if adaptive else spec.streams
    return StreamSettings(executor=bool(stream_executor), streams=spec.streams, max_streams=top,
                          adaptive=adaptive, round_tasks=round_tasks)


class HeartbeatAtClose(logging.Filter):
    """Drops the errors of a worker heartbeat that fails because the worker is closing: when every
    worker of this process is closing, distributed's "Failed to communicate with scheduler during
    heartbeat" / "Unexpected exception during heartbeat" (a heartbeat sent just before
    ``Worker.close`` stopped the periodic callbacks finds the connection pool that ``close`` itself
    shut) and tornado's "Exception in callback ... Worker.heartbeat" for the same failure. They
    print tracebacks that say nothing at the end of scripts on loaded machines. A running worker's
    heartbeat failures are logged as before. Stateless: it reads the workers' status when a record
    comes. Installed on the loggers :data:`HEARTBEAT_LOGGERS` by the device plugin."""

    MESSAGES = ("Failed to communicate with scheduler during heartbeat", "Unexpected exception during heartbeat")

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if not (msg.startswith(self.MESSAGES) or (msg.startswith("Exception in callback")
                                                   and "Worker.heartbeat" in record.getMessage())):
            return True
        from distributed.core import Status

        workers = process_workers()
        return not workers or any(w.status not in (Status.closing, Status.closed, Status.closing_gracefully)
                                  for w in workers)


#: the loggers a heartbeat failure at close is reported on
HEARTBEAT_LOGGERS = ("distributed.worker", "tornado.application")

#: one filter per process (``addFilter`` adds an equal filter once)
HEARTBEAT_AT_CLOSE = HeartbeatAtClose()


def add_metrics(worker: Any, metrics: dict[str, Callable[[Any], Any]]) -> None:
    """Publish ``metrics`` on ``worker`` by replacing ``worker.metrics`` with a new dict.

    Never mutate the dict in place: the heartbeat iterates it across an ``await`` (RMM's async
    metric), and a new key in the middle ends the worker. Call this at setup only.
    """
    worker.metrics = {**worker.metrics, **metrics}


class DeviceSetup(WorkerPlugin):
    """Give the worker its device (emulated pool, or CUDA context + RMM pool), its stream executor
    and its gdask state; bind its data store to the device; publish its metrics.

    Arguments are validated here, on the client; heavy libraries are imported in ``setup``, on the
    worker (the dask-cuda plugin pattern). After setup the instance held by the worker
    (``worker.plugins["gdask-device"]``) is that worker's gdask context: :attr:`device`,
    :attr:`state` (see :func:`gdask.devices.context`).

    Parameters
    ----------
    specs : dict, optional
        Worker name -> :class:`~gdask.devices.DeviceSpec`; every worker looks up its own spec by
        name. ``None``: each worker makes one device from config (``gdask.backend``, ...), CUDA
        where available (the first GPU of its ``CUDA_VISIBLE_DEVICES``), else emulated, as
        ``dask worker --preload gdask.scheduling`` does.
    rmm_pool_size : int, float, str or None
        Pool per CUDA worker (bytes, "40GiB", fraction of the device's memory, or None). Default
        config ``gdask.cuda.rmm-pool-size``.
    max_streams, adaptive_streams, stream_executor : optional
        Stream settings (see :func:`stream_settings`); None reads config ``gdask.device.*``.

    Notes
    -----
    With the stream executor (the default) the worker's ``"default"`` executor (and ``"gpu"``)
    becomes a :class:`gdask.scheduling.StreamThreadPoolExecutor`: every task of the device worker
    runs on one of its streams without any annotation. The worker must have
    ``nthreads >= max_streams`` (:meth:`worker_threads`); with fewer the bound is lowered to
    ``nthreads``.
    """

    name = protocol.PLUGIN_DEVICE
    idempotent = True

    def __init__(
        self,
        specs: dict[Any, DeviceSpec] | None = None,
        rmm_pool_size: Any = None,
        *,
        max_streams: int | None = None,
        adaptive_streams: bool | str | None = None,
        stream_executor: bool | None = None,
    ) -> None:
        for k, s in (specs or {}).items():
            if not isinstance(s, DeviceSpec):
                raise TypeError(f"specs[{k!r}] must be a DeviceSpec, got {type(s).__name__}")
        self.specs = None if specs is None else {str(k): s for k, s in specs.items()}
        if rmm_pool_size is None:
            rmm_pool_size = config.get("cuda.rmm-pool-size")
        if isinstance(rmm_pool_size, str):
            parse_size(rmm_pool_size, name="rmm_pool_size")  # fail here, with the user's value
        self.rmm_pool_size = rmm_pool_size
        self._stream_kw = {"max_streams": max_streams, "adaptive_streams": adaptive_streams,
                           "stream_executor": stream_executor}
        self.streams = {k: stream_settings(s, **self._stream_kw) for k, s in (self.specs or {}).items()}
        # the worker's gdask context, set by setup
        self.device: Any = None
        self.state = StateSpaces()
        self.worker: Any = None
        #: the worker's stream executor (:class:`StreamThreadPoolExecutor`), set by setup when enabled
        self.executor: Any = None
        self.nvml: dict[str, Any] | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(device=None, worker=None, state=None, nvml=None, executor=None)  # each worker makes its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.state = StateSpaces()

    def worker_threads(self) -> int:
        """``nthreads`` the device workers need (the largest over all devices)."""
        return max((st.nthreads for st in self.streams.values()), default=1)

    def spec_for(self, worker: Any) -> DeviceSpec | None:
        """The device spec of ``worker``. Without specs, one device made from config, with as many
        streams as the worker has threads (at least config ``gdask.device.streams``)."""
        if self.specs is None:
            streams = max(int(config.get("device.streams", 1)), int(worker.state.nthreads))
            return make_specs(1, streams=streams)[0]
        return self.specs.get(str(worker.name))

    def setup(self, worker: Any) -> None:
        for name in HEARTBEAT_LOGGERS:
            logging.getLogger(name).addFilter(HEARTBEAT_AT_CLOSE)
        spec = self.spec_for(worker)
        if spec is None:
            logger.info("gdask: worker %s has no device spec; it runs non-device work only", worker.name)
            return
        device = make_device(spec)
        pool = "numpy pool"
        if spec.backend == "cuda":
            from gdask.devices import setup_rmm_pool

            device.allocator = pool = setup_rmm_pool(parse_pool_size(self.rmm_pool_size, spec.memory), spec.memory)
        self.device = device
        self.worker = worker
        settings = self.streams.get(str(worker.name)) or stream_settings(spec, **self._stream_kw)
        if settings.executor:
            self.executor = install_stream_executor(worker, device, settings)
        attach = getattr(worker.data, "attach_device", None)
        if attach is not None:  # the window cache: its device tier lives in this device's memory
            attach(device)
        add_metrics(worker, {
            protocol.METRIC_DEVICE: _device_metrics,
            protocol.METRIC_STREAMS: _stream_metrics,
            protocol.METRIC_WINDOW: _window_metrics,
            protocol.METRIC_NVML: _nvml_metrics,
        })
        streams = (f"{settings.streams} stream(s)" + (f", adaptive up to {settings.max_streams}" if settings.adaptive
                                                       else "")) if settings.executor else "no stream executor"
        store = type(worker.data).__name__
        worker_log.info("gdask: worker %s owns %s device %d (%s), memory %s, %s, %s, data store %s", worker.name,
                    spec.backend, spec.index, spec.name, format_bytes(spec.memory), pool, streams, store)

    def teardown(self, worker: Any) -> None:
        detach = getattr(worker.data, "detach_device", None)
        if detach is not None and self.device is not None:
            detach(self.device)


class DeviceReporter(DeviceSetup):
    """:class:`DeviceSetup` for workers of a cluster not started by gdask: each worker makes its
    device from config (``client.register_plugin(DeviceReporter())``); kept under this name for
    scripts written against earlier gdask versions.

    Parameters
    ----------
    create_device : bool
        Must be True (the worker gets a device); False is no longer supported (the device plugin
        is what publishes the device's metrics).
    """

    def __init__(self, create_device: bool = True, **kwargs: Any) -> None:
        if not create_device:
            raise ValueError("DeviceReporter(create_device=False) is no longer supported: the device plugin "
                             "publishes the device's metrics; use DeviceReporter() or DeviceSetup()")
        super().__init__(None, **kwargs)


def install_stream_executor(worker, device, settings: StreamSettings | None = None):
    """Make a :class:`gdask.scheduling.StreamThreadPoolExecutor` the worker's "default" and "gpu"
    executor and return it (call it at setup: it replaces executors distributed holds).

    Parameters
    ----------
    worker : distributed.Worker
    device : EmulatedDevice or CudaDevice
        The worker's device (its CUDA streams back the executor's slots).
    settings : StreamSettings, optional
        Default: :func:`stream_settings` of ``device.spec`` from config.
    """
    from gdask.scheduling._executor import StreamThreadPoolExecutor, device_stream_context

    if settings is None:
        settings = stream_settings(device.spec)

    nthreads = worker.state.nthreads
    top = settings.max_streams
    if nthreads < top:
        logger.warning(
            "gdask: worker %s has nthreads=%d < max_streams=%d; streams are capped at %d "
            "(start the worker with nthreads >= max_streams)", worker.name, nthreads, top, nthreads,
        )
        top = nthreads
    executor = StreamThreadPoolExecutor(
        top, min(settings.streams, top), adaptive=settings.adaptive and top > 1,
        round_tasks=settings.round_tasks, slot_context=device_stream_context(device),
        thread_name_prefix=f"{worker.name}-gdask-stream",
    )
    old = set_executor(worker, ("default", "gpu"), executor)
    if old is not None and old is not worker_executor(worker, "offload") and old is not executor:
        old.shutdown(wait=False)  # tasks already on it finish; it takes no new ones
    return executor


def _plugin(worker: Any) -> DeviceSetup | None:
    plugin = worker.plugins.get(protocol.PLUGIN_DEVICE)
    return plugin if getattr(plugin, "device", None) is not None else None


def stream_executor(dask_worker: Any = None) -> Any:
    """The worker's :class:`StreamThreadPoolExecutor` (None without one): e.g.
    ``client.run(lambda dask_worker: stream_executor(dask_worker).trace)``."""
    if dask_worker is None:
        from distributed import get_worker

        dask_worker = get_worker()
    plugin = dask_worker.plugins.get(protocol.PLUGIN_DEVICE)
    return getattr(plugin, "executor", None)


def _stream_metrics(worker) -> dict[str, Any]:
    ex = stream_executor(worker)
    return {} if ex is None else ex.metrics()


def _window_metrics(worker) -> dict[str, Any]:
    metrics = getattr(worker.data, "metrics", None)
    return metrics() if callable(metrics) else {}


def _device_metrics(worker) -> dict[str, Any]:
    plugin = _plugin(worker)
    if plugin is None:
        return {}
    info = _with_streams(plugin.device.info(), dask_worker=worker)
    return {k: v for k, v in info.items() if isinstance(v, (int, float, str)) or v is None}


def _nvml_metrics(worker: Any) -> dict[str, Any]:
    """SM count and topology of a CUDA device (static: probed once, kept on the plugin)."""
    plugin = _plugin(worker)
    if plugin is None or getattr(plugin.device, "backend", None) != "cuda":
        return {}
    if plugin.nvml is None:
        from gdask.devices import nvml_details

        plugin.nvml = nvml_details(plugin.device.spec.physical)
    return plugin.nvml


def _with_streams(info: dict[str, Any], dask_worker) -> dict[str, Any]:
    """The device's info with the live stream count of its executor, if it has one."""
    ex = stream_executor(dask_worker)
    if ex is not None:
        info = {**info, "streams": ex.streams, "max_streams": ex.max_streams,
                "adaptive_streams": ex.adaptive}
    return info


def device_info(dask_worker=None) -> dict[str, Any] | None:
    """The worker's device description: ``client.run(device_info)``."""
    if dask_worker is None:
        from distributed import get_worker

        dask_worker = get_worker()
    plugin = _plugin(dask_worker)
    return None if plugin is None else _with_streams(plugin.device.info(), dask_worker)
