"""Device-aware scheduling: pure policies (placement, block mapping, streams, sharing, topology) and
their thin Dask adapters, one module per process side:

* scheduler: :class:`GPUPlacement` (task placement), :class:`JobScheduler` (device shares),
  :class:`ExecutionLogPlugin` (which tasks ran, for reuse accounting);
* worker: :class:`DeviceSetup` (the worker's device, streams, state and metrics), :class:`JobMonitor`;
* client: :func:`ensure_plugins`, :func:`job` / :func:`jobs`, :func:`device_table`, :func:`report_work`.

``dask scheduler --preload gdask.scheduling`` and ``dask worker --preload gdask.scheduling`` install
them on a cluster started by hand (:func:`dask_setup`).
"""

from __future__ import annotations

from typing import Any

from gdask.scheduling._client import (
    Job,
    current_job,
    device_table,
    ensure_plugins,
    job,
    job_salt,
    jobs,
    report_work,
)
from gdask.scheduling._executor import StreamThreadPoolExecutor
from gdask.scheduling._interference import InterferenceModel, JobProfile
from gdask.scheduling._mapping import makespan, proportional_mapping, rebalance_plan
from gdask.scheduling._placement import DurationModel, EarliestFinish
from gdask.scheduling._registry import device_rows
from gdask.scheduling._scheduler import GPUPlacement, is_gpu_task
from gdask.scheduling._scheduler_jobs import JobScheduler
from gdask.scheduling._sharing import (
    DeviceCapacity,
    JobRequest,
    Placement,
    ShareError,
    ShareExceededError,
    ShareLedger,
    device_score,
    first_fit,
    jobs_table,
    place,
    whole_device,
)
from gdask.scheduling._streams import StreamController
from gdask.scheduling._topology import Topology, link_rank
from gdask.scheduling._tracker_plugin import ExecutionLogPlugin
from gdask.scheduling._worker import (
    DeviceReporter,
    DeviceSetup,
    StreamSettings,
    device_info,
    install_stream_executor,
    parse_pool_size,
    stream_executor,
    stream_settings,
)
from gdask.scheduling._worker_jobs import JobMonitor

__all__ = [
    "report_work",
    "DeviceCapacity", "DeviceReporter", "DeviceSetup", "DurationModel", "EarliestFinish", "ExecutionLogPlugin",
    "GPUPlacement",
    "InterferenceModel", "Job", "JobMonitor", "JobProfile", "JobRequest", "JobScheduler", "Placement",
    "ShareError", "ShareExceededError", "ShareLedger", "StreamController", "StreamSettings",
    "StreamThreadPoolExecutor", "Topology", "current_job", "dask_setup", "device_info", "device_rows",
    "device_score", "device_table", "ensure_plugins", "first_fit", "install_stream_executor", "is_gpu_task",
    "job", "job_salt", "jobs", "jobs_table",
    "link_rank", "makespan", "parse_pool_size", "place", "proportional_mapping",
    "rebalance_plan", "scheduler_plugins", "stream_executor", "stream_settings", "whole_device", "worker_plugins",
]


def scheduler_plugins() -> list[Any]:
    """The scheduler plugins of a gdask cluster: placement and device shares, then the window
    cache's residency (a block's replica stays on the worker whose device holds it)."""
    from gdask.window_cache import Residency

    return [GPUPlacement(), JobScheduler(), Residency()]


def worker_plugins(specs: dict | None = None, rmm_pool_size: Any = None, **stream_kw: Any) -> list[Any]:
    """The worker plugins every gdask device worker gets, whoever starts it (``LocalGPUCluster``,
    ``gdask worker``, the preload): its device (:class:`DeviceSetup`, ``specs`` by worker name or
    None for one device made from config per worker), the job monitor and the window store's
    hooks (transfers from the host copy, pins of running tasks' inputs)."""
    from gdask.window_cache import WindowCachePlugin

    return [DeviceSetup(specs, rmm_pool_size=rmm_pool_size, **stream_kw), JobMonitor(), WindowCachePlugin()]


async def dask_setup(service: Any) -> None:
    """Preload hook. ``dask scheduler --preload gdask.scheduling`` installs :func:`scheduler_plugins`;
    ``dask worker --preload gdask.scheduling`` gives the worker gdask's window store as its data
    (blocks beyond device memory on the host, when the worker holds no data yet) and
    :func:`worker_plugins` with a device made from config: CUDA where available (the first GPU of
    ``CUDA_VISIBLE_DEVICES``), else emulated."""
    from distributed import Scheduler, Worker

    if isinstance(service, Scheduler):
        for plugin in scheduler_plugins():
            service.add_plugin(plugin)  # started with the scheduler's other plugins
    elif isinstance(service, Worker):
        from gdask.window_cache import use_window_store

        use_window_store(service)
        for plugin in worker_plugins():
            await service.plugin_add(plugin=plugin, catch_errors=False)
