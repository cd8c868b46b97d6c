"""LocalGPUCluster: a LocalCluster with one worker process per (GPU or emulated) device."""

from __future__ import annotations

import copy
import logging
from typing import Any

from distributed import LocalCluster

from gdask import config
from gdask.devices import DeviceSpec, make_specs

__all__ = ["LocalGPUCluster"]


class LocalGPUCluster(LocalCluster):
    """A local Dask cluster with one worker process per device.

    With CUDA GPUs each worker sees one GPU (``CUDA_VISIBLE_DEVICES``) and routes CuPy allocations
    through an RMM pool; without, each worker owns an emulated device (a NumPy memory pool with a
    byte budget, optional speed and bandwidth), so the same code runs on a laptop.

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
        Install gdask's GPU placement scheduler plugin (:class:`gdask.scheduling.GPUPlacement`);
        default config ``gdask.scheduling.placement`` (True). False leaves placement to stock Dask.
    data : optional
        The workers' data store; default a :class:`gdask.window_cache.WindowStore` (config
        ``gdask.window-cache.enabled``), which keeps blocks beyond device memory on the host.
    **kwargs
        Passed to :class:`distributed.LocalCluster` (``dashboard_address``, ``memory_limit``, ...).

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
        for bad in ("n_workers", "threads_per_worker", "processes", "worker_class"):
            if bad in kwargs:
                raise TypeError(
                    f"LocalGPUCluster sets {bad!r} itself (one worker process per device); "
                    "use n_devices= and streams= instead"
                )
        self.device_specs: list[DeviceSpec] = make_specs(
            n_devices, backend=backend, device_memory=device_memory, device_speeds=device_speeds,
            bandwidth=bandwidth, streams=streams,
        )
        self.backend = self.device_specs[0].backend
        self._spec_by_name = {i: s for i, s in enumerate(self.device_specs)}
        from gdask.scheduling import scheduler_plugins, worker_plugins

        self._worker_plugins = worker_plugins(self._spec_by_name, rmm_pool_size=rmm_pool_size,
                                              max_streams=max_streams, adaptive_streams=adaptive_streams)
        streams = self._worker_plugins[0].worker_threads()  # distributed runs at most nthreads tasks at once
        if config.get("ml.warm-kernels", True):  # compile gdask.ml's kernels while the workers start
            from gdask._warm import WarmKernels

            self._worker_plugins.append(WarmKernels())
        if "data" not in kwargs and config.get("window-cache.enabled", True):
            from gdask.window_cache import WindowStore

            kwargs["data"] = WindowStore  # blocks beyond device memory: sliding window over host memory
        kwargs.setdefault("silence_logs", logging.ERROR)
        if placement is None:
            placement = bool(config.get("scheduling.placement", True))
        self.placement: Any = None
        self.jobs: Any = None  # gdask.job shares
        if placement:
            self.placement, self.jobs = scheduler_plugins()
            skw = dict(kwargs.pop("scheduler_kwargs", None) or {})
            skw["plugins"] = [*(skw.get("plugins") or ()), self.placement, self.jobs]
            kwargs["scheduler_kwargs"] = skw
        super().__init__(n_workers=0, threads_per_worker=streams, processes=True, **kwargs)
        self.scale(len(self.device_specs))
        self.sync(self._correct_state)

    def new_worker_spec(self) -> dict[Any, dict[str, Any]]:
        free = [i for i in self._spec_by_name if i not in self.worker_spec]
        if not free:
            raise ValueError(
                f"LocalGPUCluster has {len(self.device_specs)} devices and cannot scale beyond them"
            )
        name = free[0]
        spec = copy.deepcopy(self.new_spec)
        dev = self._spec_by_name[name]
        env = dict(spec["options"].get("env") or {})
        if dev.backend == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = str(dev.physical)  # an NVML index: CUDA numbers GPUs alike
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"           # only in PCI bus order
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
