"""Worker side of gdask: the plugin that gives a worker process its device."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from distributed import WorkerPlugin

from gdask._devices import DeviceSpec

logger = logging.getLogger("gdask")


def parse_pool_size(value: Any, device_memory: int) -> int | None:
    """RMM pool size from config: bytes, a "40GiB" string, a fraction of memory, or None."""
    if value is None:
        return None
    if isinstance(value, float) and 0 < value <= 1:
        return int(value * device_memory)
    from gdask._devices import parse_size

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
    from gdask import _config

    if max_streams is None:
        max_streams = _config.get("device.max-streams", 4)
    if adaptive_streams is None:
        adaptive_streams = _config.get("device.adaptive-streams", "auto")
    if stream_executor is None:
        stream_executor = _config.get("device.stream-executor", True)
    round_tasks = _config.get("device.stream-round-tasks", None)
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


class DeviceSetup(WorkerPlugin):
    """Give the worker its device: emulated pool, or CUDA context + RMM pool.

    Arguments are validated here, on the client; heavy libraries are imported in ``setup``, on the
    worker (the dask-cuda plugin pattern).

    Parameters
    ----------
    specs : dict
        Worker name -> :class:`DeviceSpec`. Every worker looks up its own spec by name.
    rmm_pool_size : int, float, str or None
        Pool per CUDA worker (bytes, "40GiB", fraction of the device's memory, or None).
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

    name = "gdask-device"
    idempotent = True

    def __init__(
        self,
        specs: dict[Any, DeviceSpec],
        rmm_pool_size: Any = None,
        *,
        max_streams: int | None = None,
        adaptive_streams: bool | str | None = None,
        stream_executor: bool | None = None,
    ) -> None:
        for k, s in specs.items():
            if not isinstance(s, DeviceSpec):
                raise TypeError(f"specs[{k!r}] must be a DeviceSpec, got {type(s).__name__}")
        self.specs = {str(k): s for k, s in specs.items()}
        self.rmm_pool_size = rmm_pool_size
        self.streams = {
            k: stream_settings(s, max_streams=max_streams, adaptive_streams=adaptive_streams,
                               stream_executor=stream_executor)
            for k, s in self.specs.items()
        }

    def worker_threads(self) -> int:
        """``nthreads`` the device workers need (the largest over all devices)."""
        return max((st.nthreads for st in self.streams.values()), default=1)

    def setup(self, worker) -> None:
        from gdask._devices import make_device, set_current_device

        spec = self.specs.get(str(worker.name))
        if spec is None:
            logger.info("gdask: worker %s has no device spec; it runs non-device work only", worker.name)
            return
        device = make_device(spec)
        if spec.backend == "cuda":
            from gdask._devices._cuda import setup_rmm_pool

            device.allocator = setup_rmm_pool(parse_pool_size(self.rmm_pool_size, spec.memory), spec.memory)
        set_current_device(device)
        worker.gdask_device = device
        worker.metrics = {**worker.metrics, "gdask_device": lambda w: _device_metrics(w)}  # new dict: the heartbeat may be iterating the old one
        settings = self.streams[str(worker.name)]
        if settings.executor:
            install_stream_executor(worker, device, settings)
        logger.info("gdask: worker %s owns %s device %d", worker.name, spec.backend, spec.index)


def install_stream_executor(worker, device, settings: StreamSettings | None = None):
    """Make a :class:`gdask.scheduling.StreamThreadPoolExecutor` the worker's "default" and "gpu"
    executor, publish ``worker.metrics["gdask_streams"]``, and return it.

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
    old = worker.executors.get("default")
    worker.executors["default"] = executor
    worker.executors["gpu"] = executor
    worker.gdask_streams = executor
    worker.metrics = {**worker.metrics, "gdask_streams": lambda w: _stream_metrics(w)}
    if old is not None and old is not worker.executors.get("offload") and old is not executor:
        old.shutdown(wait=False)  # tasks already on it finish; it takes no new ones
    return executor


def _stream_metrics(worker) -> dict[str, Any]:
    ex = getattr(worker, "gdask_streams", None)
    return {} if ex is None else ex.metrics()


def _device_metrics(worker) -> dict[str, Any]:
    dev = getattr(worker, "gdask_device", None)
    if dev is None:
        return {}
    info = _with_streams(dev.info(), dask_worker=worker)
    return {k: v for k, v in info.items() if isinstance(v, (int, float, str)) or v is None}


def _with_streams(info: dict[str, Any], dask_worker) -> dict[str, Any]:
    """The device's info with the live stream count of its executor, if it has one."""
    ex = getattr(dask_worker, "gdask_streams", None)
    if ex is not None:
        info = {**info, "streams": ex.streams, "max_streams": ex.max_streams,
                "adaptive_streams": ex.adaptive}
    return info


def device_info(dask_worker=None) -> dict[str, Any] | None:
    """The worker's device description: ``client.run(device_info)``."""
    if dask_worker is None:
        from distributed import get_worker

        dask_worker = get_worker()
    dev = getattr(dask_worker, "gdask_device", None)
    return None if dev is None else _with_streams(dev.info(), dask_worker)
