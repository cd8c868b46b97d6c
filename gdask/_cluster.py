"""LocalGPUCluster: a LocalCluster with one worker process per (GPU or emulated) device."""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import multiprocessing
import numbers
import time
import warnings
from typing import Any

import dask
from dask.utils import format_bytes, parse_timedelta
from distributed import LocalCluster
from distributed.core import Status
from distributed.deploy.cluster import Cluster

from gdask import GDaskWarning, WorkerStartError, config, protocol
from gdask.devices import DeviceSpec, make_specs, parse_size, worker_environment

__all__ = ["LocalGPUCluster", "WorkerStartError", "worker_memory_limit"]

#: the smallest device memory that holds a useful block; smaller values are typing mistakes
#: (``device_memory=1.5`` meant "1.5GiB")
_MIN_DEVICE_MEMORY = 2**10  # catches bytes given for GiB (device_memory=4); tests use tiny devices

MAIN_GUARD_HINT = (
    "Worker processes are started with 'spawn': each re-imports the script that created the cluster, so a "
    "script must start the cluster (and its work) under 'if __name__ == \"__main__\":', and be a file (not "
    "standard input)."
)


def _bootstrapping() -> bool:
    """Whether this process is a spawned child still importing its parent's main module (the
    script creates a cluster at import time: it has no ``if __name__ == "__main__":`` guard)."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def _check_device_memory(value: Any) -> None:
    """Device memory given by the user: a whole number of bytes, at least 1 KiB; an emulated
    device's pool lives in host memory, so more than this machine's memory is refused."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
        raise TypeError(f"device_memory must be bytes (an integer) or a string like '2GiB', got {value!r}")
    if isinstance(value, numbers.Real) and (not math.isfinite(value) or value != int(value)):
        raise ValueError(f"device_memory={value!r} is not a whole number of bytes; give an integer or a string "
                         f"like '{value:g}GiB'" if math.isfinite(value) else
                         f"device_memory must be a finite number of bytes, got {value!r}")
    nbytes = parse_size(value, name="device_memory")
    if nbytes < _MIN_DEVICE_MEMORY:
        raise ValueError(f"device_memory={value!r} is {format_bytes(nbytes)}, less than the "
                         f"{format_bytes(_MIN_DEVICE_MEMORY)} a device needs; did you mean '{value}GiB'?")


def _check_host_memory(specs: list[DeviceSpec]) -> None:
    """Emulated pools are host memory: one device larger than the machine is an error, all of them
    together larger than it a warning (the budgets are limits, used only as data arrives)."""
    from distributed.system import MEMORY_LIMIT

    emulated = [s for s in specs if s.backend == "emulated"]
    if not emulated or not MEMORY_LIMIT:
        return
    largest = max(s.memory for s in emulated)
    if largest > MEMORY_LIMIT:
        raise ValueError(f"device_memory of {format_bytes(largest)} per emulated device is more than this machine's "
                         f"memory ({format_bytes(MEMORY_LIMIT)}): emulated devices keep their blocks in host memory; "
                         "ask for less")
    total = sum(s.memory for s in emulated)
    if total > MEMORY_LIMIT:
        warnings.warn(f"{len(emulated)} emulated devices of {format_bytes(largest)} ({format_bytes(total)} together) "
                      f"are more than this machine's memory ({format_bytes(MEMORY_LIMIT)}); filling them all would "
                      "run the machine out of memory", GDaskWarning, stacklevel=3)


def worker_memory_limit(memory_limit: Any, n_workers: int) -> Any:
    """Host memory limit of each of ``n_workers`` device workers on one host.

    ``"auto"`` (the default of ``LocalGPUCluster`` and ``gdask worker``): this host's memory
    (``distributed.system.MEMORY_LIMIT``, cgroup limits included) over the device workers, as
    ``dask cuda worker`` does. distributed's own ``"auto"``
    (memory x threads / cores) gives a device worker a core count's share: about 42 GB on a
    192-core, 2 TB node with 8 GPUs, less than one GPU's evicted blocks, and the nanny restarts a
    worker at 95% of it. Any other value (bytes, ``"100GB"``, a fraction, ``0`` or ``None`` for no
    limit) is the user's and passes as given.
    """
    if memory_limit != "auto":
        return memory_limit
    from distributed import system

    return max(1, int(system.MEMORY_LIMIT) // max(1, int(n_workers)))


def _check_speeds(speeds: Any) -> None:
    if speeds is None:
        return
    for s in speeds:
        if isinstance(s, bool) or not isinstance(s, numbers.Real) or not math.isfinite(s) or s <= 0:
            raise ValueError(f"device_speeds must be finite numbers > 0 (1.0 = full speed), got {list(speeds)!r}")


def _check_pool_size(value: Any) -> None:
    if value is None or isinstance(value, str):
        return  # strings are parsed (and refused with the value) by the device plugin
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"rmm_pool_size must be bytes, a string like '40GiB', a fraction of the device's memory in "
                         f"(0, 1], or None; got {value!r}")


def _reasons(exc: BaseException) -> list[str]:
    """The messages along an exception's chain of causes, outermost first."""
    out, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = " ".join(str(exc).split())
        out.append(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
        exc = exc.__cause__ or exc.__context__
    return out


def _plugins_starting(dask_worker: Any) -> list[str]:
    """The names of the worker's plugins that say they are still getting ready (``starting()``)."""
    return sorted(name for name, p in dict(dask_worker.plugins).items()
                  if callable(getattr(p, "starting", None)) and p.starting())


def _start_error(exc: BaseException, n: int) -> WorkerStartError:
    reasons = _reasons(exc)
    msg = f"LocalGPUCluster: its {n} worker(s) did not all start: " + " <- ".join(reasons)
    # a worker process that died before it could report its own error: most often a script without the
    # guard (its child re-imported it and failed there: that error is printed above this one)
    if any("bootstrapping phase" in r or "__main__" in r or "failed to start worker process" in r for r in reasons):
        msg += (". The worker process ended before it could report its error (see the output above). "
                + MAIN_GUARD_HINT)
    return WorkerStartError(msg)


class LocalGPUCluster(LocalCluster):
    """A local Dask cluster with one worker process per device.

    With CUDA GPUs each worker owns one GPU (or a MIG instance, or a share of a GPU when there are
    more devices than GPUs) and routes CuPy allocations through an RMM pool; its
    ``CUDA_VISIBLE_DEVICES`` lists the cluster's GPUs with its own first (CUDA device 0 of the
    worker), so NCCL and CUDA IPC reach the peers. Without GPUs, each worker owns an emulated device
    (a NumPy memory pool with a byte budget, optional speed and bandwidth), so the same code runs on
    a laptop. Each worker's host memory limit is this machine's memory over the devices (as
    ``dask cuda worker``), unless ``memory_limit`` is given. Every worker gets the plugins of config
    ``gdask.plugins.worker`` (its device, the job monitor, gdask.ml's kernel warm-up), the scheduler
    those of ``gdask.plugins.scheduler`` (placement, device shares).

    Parameters
    ----------
    n_devices : int, optional
        Number of devices (= worker processes). Default: every GPU, or config
        ``gdask.emulated.n-devices`` (2) emulated devices.
    backend : {"auto", "cuda", "emulated", "emulated-strict"}, optional
        "auto" uses CUDA where a driver and a device exist. "emulated-strict": emulated devices whose
        blocks are ``array_api_strict`` arrays (mixing them with NumPy arrays raises, as with CuPy).
        Default: config ``gdask.backend`` ("auto").
    device_memory : int or str, optional
        Memory per device ("2GiB"). Emulated: the pool budget (default config, 4 GiB). CUDA: a cap.
    device_speeds : list of float, optional
        Relative speed per emulated device (1.0 = full speed, 0.5 = half).
    bandwidth : int or str, optional
        Emulated host<->device bandwidth in bytes/s ("2GB").
    streams : int, optional
        Streams (threads on emulated devices) each device worker starts with (its fixed count unless
        adaptive); default config ``gdask.device.streams``.
    max_streams : int, optional
        Upper bound of the stream count when it is tuned; default config ``gdask.device.max-streams`` (4).
    adaptive_streams : bool or "auto", optional
        Tune each worker's stream count from measured throughput; default config
        ``gdask.device.adaptive-streams`` ("auto": CUDA devices only).
    rmm_pool_size : int, float or str, optional
        RMM pool per CUDA worker; default config ``gdask.cuda.rmm-pool-size`` (0.8 of the device).
    placement : bool, optional
        Install the scheduler plugins of config ``gdask.plugins.scheduler`` (gdask's GPU placement,
        :class:`gdask.scheduling.GPUPlacement`, and device shares); default config
        ``gdask.scheduling.placement`` (True). False leaves placement to stock Dask.
    data : optional
        The workers' data store; default a :class:`gdask.window_cache.WindowStore` (config
        ``gdask.window-cache.enabled``), which keeps blocks beyond device memory on the host.
    **kwargs
        Passed to :class:`distributed.LocalCluster` (``dashboard_address``, ...). ``memory_limit``:
        host memory per worker (default and ``"auto"``: this machine's memory / ``n_devices``).

    Raises
    ------
    WorkerStartError
        A worker did not start (within config ``gdask.timeouts.cluster-start`` seconds): the message
        holds the worker's own error, and says when the cause is a script without an
        ``if __name__ == "__main__":`` guard (worker processes re-import the main script).
    ValueError
        An invalid device setting (``device_memory`` not a whole number of bytes or under 1 MiB, more
        than the machine's memory per emulated device, non-finite ``device_speeds``, ...).

    Notes
    -----
    Worker processes are *spawned*: in a script, create the cluster under
    ``if __name__ == "__main__":``.

    Examples
    --------
    >>> from distributed import Client
    >>> with gdask.LocalGPUCluster(n_devices=2, backend="emulated") as cluster, Client(cluster) as client:
    ...     X = gdask.from_array(np.ones((1000, 4)))
    """

    def __init__(
        self,
        n_devices: int | None = None,
        *,
        backend: str | None = None,
        device_memory: int | str | None = None,
        device_speeds: list[float] | None = None,
        bandwidth: int | str | None = None,
        streams: int | None = None,
        rmm_pool_size: Any = None,
        placement: bool | None = None,
        max_streams: int | None = None,
        adaptive_streams: bool | str | None = None,
        **kwargs: Any,
    ) -> None:
        if _bootstrapping():
            raise RuntimeError("LocalGPUCluster was created while a worker process was starting: the worker "
                               "re-imported the script that creates the cluster. " + MAIN_GUARD_HINT)
        for bad in ("n_workers", "threads_per_worker", "processes", "worker_class"):
            if bad in kwargs:
                raise TypeError(
                    f"LocalGPUCluster sets {bad!r} itself (one worker process per device); "
                    "use n_devices= and streams= instead"
                )
        _check_device_memory(device_memory)
        _check_speeds(device_speeds)
        _check_pool_size(rmm_pool_size)
        self.device_specs: list[DeviceSpec] = make_specs(
            n_devices, backend=backend, device_memory=device_memory, device_speeds=device_speeds,
            bandwidth=bandwidth, streams=streams,
        )
        self.backend = self.device_specs[0].backend
        _check_host_memory(self.device_specs)
        self._spec_by_name = {i: s for i, s in enumerate(self.device_specs)}
        # the plugins config lists (gdask.plugins.worker / .scheduler): the device and job monitor,
        # gdask.ml's kernel warm-up, placement and device shares
        from gdask._plugins import device_plugin, scheduler_plugins, worker_plugins

        self._worker_plugins = worker_plugins(self._spec_by_name, rmm_pool_size=rmm_pool_size,
                                              max_streams=max_streams, adaptive_streams=adaptive_streams)
        streams = device_plugin(self._worker_plugins).worker_threads()  # distributed runs at most nthreads tasks
        if "data" not in kwargs and config.get("window-cache.enabled", True):
            from gdask.window_cache import WindowStore

            kwargs["data"] = WindowStore  # blocks beyond device memory: sliding window over host memory
        kwargs.setdefault("silence_logs", logging.ERROR)
        if placement is None:
            placement = bool(config.get("scheduling.placement", True))
        self.placement: Any = None
        self.jobs: Any = None  # gdask.job shares
        plugins = scheduler_plugins()  # config gdask.plugins.scheduler: placement, jobs, the window's residency
        named = {getattr(p, "name", None): p for p in plugins}
        if placement:
            self.placement, self.jobs = named.get(protocol.PLUGIN_PLACEMENT), named.get(protocol.PLUGIN_JOBS)
        else:
            plugins = [p for p in plugins if getattr(p, "name", None) not in (protocol.PLUGIN_PLACEMENT,
                                                                                 protocol.PLUGIN_JOBS)]
        skw = dict(kwargs.pop("scheduler_kwargs", None) or {})
        skw["plugins"] = [*(skw.get("plugins") or ()), *plugins]
        kwargs["scheduler_kwargs"] = skw
        kwargs["memory_limit"] = worker_memory_limit(kwargs.get("memory_limit", "auto"), len(self.device_specs))
        super().__init__(n_workers=0, threads_per_worker=streams, processes=True, **kwargs)
        n = len(self.device_specs)
        try:
            # not ``scale``: it starts the workers in a callback whose errors are only logged
            for _ in range(n):
                self.worker_spec.update(self.new_worker_spec())
            self.sync(self._correct_state)  # raises the nanny's error when a worker fails to start
            self.wait_for_workers(n, timeout=float(config.get("timeouts.cluster-start", 120)))
            self._wait_for_plugins()
        except Exception as e:
            try:
                self.close()
            except Exception as close_error:  # noqa: BLE001 - the start error is the one to report
                logging.getLogger("gdask").debug("closing a cluster that did not start: %r", close_error)
            raise _start_error(e, n) from e

    def _wait_for_plugins(self) -> None:
        """Return once no worker plugin is still getting ready (a plugin with a ``starting()`` method
        that answers True: gdask.ml's kernel warm-up while it loads the kernels from numba's cache, about
        half a second), for at most config ``gdask.timeouts.worker-plugins-ready`` seconds (0: do not
        wait). Past that the cluster is returned anyway (logged): the plugins only make the first tasks
        faster. Measured: a two-iteration K-means fit of 1.5M x 24 rows right after the cluster started
        took 1.47-1.62 s beside the warm-up, 1.00-1.27 s after it (0.90-1.31 s after a 3 s pause)."""
        limit = float(config.get("timeouts.worker-plugins-ready", 30))
        if limit <= 0:
            return
        from distributed import Client

        deadline = time.monotonic() + limit
        with Client(self, set_as_default=False) as client:
            while True:
                left = {w: names for w, names in client.run(_plugins_starting).items() if names}
                if not left:
                    return
                if time.monotonic() > deadline:
                    logging.getLogger("gdask").info(
                        "LocalGPUCluster: worker plugins still getting ready after %g s "
                        "(gdask.timeouts.worker-plugins-ready), going on: %s", limit, left)
                    return
                time.sleep(0.05)

    def _update_worker_status(self, op: str, msg: Any) -> None:
        """Scheduler updates. A worker that left is given ``distributed.deploy.lost-worker-timeout``
        to come back (its nanny restarts a process that died); then, while its nanny still has a live
        process (a restart under way), the check repeats, for at most config
        ``gdask.timeouts.cluster-start`` seconds. A nanny without a live process (it could not restart
        the worker) is closed and the device gets a new worker (``_correct_state``).

        Stock ``SpecCluster`` closes the nanny after the timeout whenever the name is absent, also when
        the worker, killed once, is killed again during the next restart: the device was lost for good."""
        if op != "remove":
            return super()._update_worker_status(op, msg)
        name = self.scheduler_info["workers"][msg]["name"]
        Cluster._update_worker_status(self, op, msg)  # forget the worker (not SpecCluster's rule)
        delay = parse_timedelta(dask.config.get("distributed.deploy.lost-worker-timeout"))
        give_up = time.monotonic() + float(config.get("timeouts.cluster-start", 120))
        loop = asyncio.get_running_loop()

        def check() -> None:
            nanny = self.workers.get(name)
            if (nanny is None or self.status in (Status.closing, Status.closed)
                    or any(d["name"] == name for d in self.scheduler_info["workers"].values())):
                return  # back (or gone with the cluster)
            process = getattr(nanny, "process", None)
            alive = process is not None and process.is_alive()
            if alive and time.monotonic() < give_up:
                loop.call_later(delay, check)  # its nanny is still restarting it
                return
            logging.getLogger("gdask").warning("LocalGPUCluster: worker %r did not come back (its nanny %s); "
                                               "starting a new one for its device", name,
                                               "has no live process" if not alive else "took too long")
            del self.workers[name]
            self._futures.add(asyncio.ensure_future(self._replace(nanny)))

        loop.call_later(delay, check)

    async def _replace(self, nanny: Any) -> None:
        try:
            await nanny.close()
        finally:
            if self.status not in (Status.closing, Status.closed):
                await self._correct_state()  # the name is still in worker_spec: a new worker for it

    def new_worker_spec(self) -> dict[Any, dict[str, Any]]:
        free = [i for i in self._spec_by_name if i not in self.worker_spec]
        if not free:
            raise ValueError(
                f"LocalGPUCluster has {len(self.device_specs)} devices and cannot scale beyond them"
            )
        name = free[0]
        spec = copy.deepcopy(self.new_spec)
        env = dict(spec["options"].get("env") or {})
        env.update(worker_environment(self.device_specs, name))  # every GPU of the cluster, its own first
        spec["options"]["env"] = env
        plugins = set(spec["options"].get("plugins") or ())
        plugins.update(self._worker_plugins)
        spec["options"]["plugins"] = plugins
        spec["options"]["resources"] = {"GPU": 1}
        return {name: spec}

    def _device_rows(self) -> list[dict[str, Any]]:
        """One row per device: its spec, and the live figures its worker reported (if running)."""
        from gdask import protocol

        live: dict[str, dict] = {}
        try:
            for w in (self.scheduler_info or {}).get("workers", {}).values():
                dev = (w.get("metrics") or {}).get(protocol.METRIC_DEVICE) or {}
                if dev:
                    live[str(w.get("name"))] = dev
        except (AttributeError, TypeError):  # not started yet
            pass
        rows = []
        for s in self.device_specs:
            d = live.get(str(s.index), {})
            rows.append({"index": s.index, "backend": s.backend, "name": s.name, "memory": s.memory,
                         "speed": s.speed, "used": d.get("memory_used"), "tasks": d.get("tasks"),
                         "running": bool(d)})
        return rows

    def _repr_html_(self, cluster_status=None) -> str:
        import html

        from dask.utils import format_bytes

        rows = "".join(
            f"<tr><td>{r['index']}</td><td>{html.escape(r['backend'])}</td><td>{html.escape(str(r['name']))}</td>"
            f"<td>{format_bytes(int(r['memory']))}</td><td>{r['speed']:g}</td>"
            f"<td>{'–' if r['used'] is None else format_bytes(int(r['used']))}</td>"
            f"<td>{'–' if r['tasks'] is None else r['tasks']}</td>"
            f"<td>{'running' if r['running'] else 'starting'}</td></tr>"
            for r in self._device_rows()
        )
        table = (
            "<table><tr><th>device</th><th>backend</th><th>name</th><th>memory</th><th>speed</th><th>used</th>"
            f"<th>tasks</th><th>worker</th></tr>{rows}</table>"
        )
        link = ""
        try:
            if self.dashboard_link:
                page = self.dashboard_link.rsplit("/", 1)[0] + "/gdask"
                link = f' · <a href="{html.escape(page)}" target="_blank">gdask dashboard</a>'
        except (AttributeError, KeyError, TypeError):  # no HTTP server
            pass
        head = (f"<div><strong>gdask LocalGPUCluster</strong>: {len(self.device_specs)} {html.escape(self.backend)} "
                f"device(s){link}</div>")
        return head + table + super()._repr_html_(cluster_status=cluster_status)
