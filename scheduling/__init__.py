"""Device-aware scheduling: pure policies (block-to-device mapping, stream count)."""

from __future__ import annotations

from gdask.scheduling._mapping import makespan, proportional_mapping, rebalance_plan
from gdask.scheduling._placement import DurationModel, EarliestFinish
from gdask.scheduling._plugin import DeviceReporter, GPUPlacement, is_gpu_task
from gdask.scheduling._registry import device_table
from gdask.scheduling._streams import StreamController
from gdask.scheduling._executor import StreamThreadPoolExecutor
from gdask.scheduling._interference import InterferenceModel, JobProfile
from gdask.scheduling._sharing import (DeviceCapacity, JobRequest, Placement, ShareError, ShareExceededError,
                                       ShareLedger, device_score, first_fit, jobs_table, place, whole_device)
from gdask.scheduling._topology import Topology, link_rank
from gdask.scheduling._jobs import Job, JobMonitor, JobScheduler, current_job, job, jobs

__all__ = ["StreamController", "StreamThreadPoolExecutor", "proportional_mapping"]
__all__ += ["DeviceReporter", "DurationModel", "EarliestFinish", "GPUPlacement", "device_table", "is_gpu_task",
            "makespan", "rebalance_plan", "dask_setup"]
__all__ += ["DeviceCapacity", "InterferenceModel", "JobProfile", "JobRequest", "Placement", "ShareError",
            "ShareExceededError", "ShareLedger", "Topology", "device_score", "first_fit", "jobs_table",
            "link_rank", "place", "whole_device"]
__all__ += ["Job", "JobMonitor", "JobScheduler", "current_job", "job", "jobs"]


def dask_setup(service) -> None:
    """Preload hook: ``dask scheduler --preload gdask.scheduling`` installs :class:`GPUPlacement`;
    and :class:`JobScheduler`; ``dask worker --preload gdask.scheduling`` gives the worker a device
    (CUDA where available, else emulated) and installs :class:`DeviceReporter` and :class:`JobMonitor`."""
    from distributed import Scheduler, Worker

    if isinstance(service, Scheduler):
        service.add_plugin(GPUPlacement())  # started with the scheduler's other plugins
        service.add_plugin(JobScheduler())
    elif isinstance(service, Worker):
        reporter = DeviceReporter(create_device=True)
        reporter.setup(service)
        service.plugins[reporter.name] = reporter
        monitor = JobMonitor()
        monitor.setup(service)
        service.plugins[monitor.name] = monitor
