"""The names gdask's processes agree on: plugins, worker metrics, task annotations, RPC handlers.

Scheduler, workers and clients of one cluster exchange these names; each is defined here once and
read from here everywhere (like distributed's ``shuffle`` extensions keep their names in one
place). This module imports nothing, so every layer of gdask can use it.
"""

from __future__ import annotations

__all__ = [
    "ANN_GPU", "ANN_JOB", "ANN_JOB_KIND", "ANN_JOB_SECRET",
    "EVENT_JOB_TASK", "EVENT_LOOP_PREFIX", "EVENT_OBSERVE",
    "HANDLER_COLLECTIVE", "HANDLER_COLLECTIVE_ABORT", "HANDLER_DEVICE_TABLE", "HANDLER_EXECUTION_LOG", "HANDLER_JOBS",
    "HANDLER_JOB_CLOSE", "HANDLER_JOB_OPEN", "HANDLER_LOOP_EVENTS_DONE", "HANDLER_OBSERVE", "HANDLER_PLACEMENT_STATS",
    "HANDLER_STATE",
    "METRIC_DEVICE", "METRIC_NVML", "METRIC_STREAMS", "METRIC_WINDOW",
    "PLUGIN_COLLECTIVE", "PLUGIN_DASHBOARD", "PLUGIN_DEVICE", "PLUGIN_EXECUTION_LOG", "PLUGIN_JOBS",
    "PLUGIN_JOB_MONITOR", "PLUGIN_LOOP_EVENTS", "PLUGIN_PLACEMENT", "PLUGIN_RESIDENCY", "PLUGIN_WINDOW_CACHE",
]

# -- plugins (``plugin.name``: one instance per scheduler / worker) ----------------------------------
#: scheduler: places device tasks (:class:`gdask.scheduling.GPUPlacement`)
PLUGIN_PLACEMENT = "gdask-placement"
#: scheduler: grants device shares to jobs (:class:`gdask.scheduling.JobScheduler`)
PLUGIN_JOBS = "gdask-jobs"
#: scheduler: samples devices for gdask's dashboard page (``/gdask``), added by the two above
PLUGIN_DASHBOARD = "gdask-dashboard"
#: scheduler: records which tasks ran (GTracker's execution log)
PLUGIN_EXECUTION_LOG = "gdask-execution-log"
#: worker: owns the worker's device, its stream executor and the worker's gdask state
PLUGIN_DEVICE = "gdask-device"
#: worker: measures job tasks and enforces job memory requests
PLUGIN_JOB_MONITOR = "gdask-job-monitor"
#: worker: mailboxes of loops that run on the workers (collective all-gather)
PLUGIN_COLLECTIVE = "gdask-collective"
#: worker: the window store's hooks (transfers from the host copy, pins of running tasks' inputs)
PLUGIN_WINDOW_CACHE = "gdask-window-cache"
#: scheduler: keeps a block's replica on the worker whose device holds it (active memory manager)
PLUGIN_RESIDENCY = "gdask-residency"
#: scheduler: keeps no copy of the checkpoint events of loops on the workers, drops their topics at the end
PLUGIN_LOOP_EVENTS = "gdask-loop-events"

# -- worker metrics (``worker.metrics[name]``, in ``WorkerState.metrics`` every heartbeat) -----------
#: the device: spec, memory budget and use, transfers, busy time (a flat dict of scalars)
METRIC_DEVICE = "gdask_device"
#: the stream executor: current / maximum streams, throughput
METRIC_STREAMS = "gdask_streams"
#: the window cache of the worker's data store: hits, misses, bytes moved, window size
METRIC_WINDOW = "gdask_window"
#: static NVML details of a CUDA device: SM count, topology
METRIC_NVML = "gdask_nvml"

# -- task annotations ---------------------------------------------------------------------------------
#: device work: set on every GDataSet task (value: the kind of block operation, e.g. ``"to_device"``);
#: the placement plugin places exactly the tasks that carry it (or read results of tasks that do)
ANN_GPU = "gdask_gpu"
#: the ``gdask.job`` a task belongs to (its name)
ANN_JOB = "gdask_job"
#: the job's kind: jobs of one kind share their measured profile
ANN_JOB_KIND = "gdask_job_kind"
#: the secret the scheduler granted the job when it opened: a task annotated with a job's name but
#: not its secret is not that job's (not placed on its devices, not counted in its memory; keys made
#: under it differ from the job's), so a job cannot read or claim another job's blocks by name
ANN_JOB_SECRET = "gdask_job_secret"

# -- events (``worker.log_event(topic, msg)`` -> ``SchedulerPlugin.log_event``) ----------------------
#: per-task measurement of a job task (duration, co-runners, device usage)
EVENT_JOB_TASK = "gdask-job-task"
#: durations of device work that ran inside a longer task (a loop on the workers), for the placement
#: plugin: ``{"records": [[kind, input bytes, worker address, seconds], ...]}``
EVENT_OBSERVE = "gdask-observe"
#: the topics of loops on the workers (one per fit: the prefix and the fit's token): rank 0's checkpoints
EVENT_LOOP_PREFIX = "gdask-loop-"

# -- RPC handlers -------------------------------------------------------------------------------------
#: scheduler: device table rows
HANDLER_DEVICE_TABLE = "gdask_device_table"
#: scheduler: placement statistics per worker
HANDLER_PLACEMENT_STATS = "gdask_placement_stats"
#: scheduler: pop the execution log's records (tasks that ran) and the sizes of keys in memory
HANDLER_EXECUTION_LOG = "gdask_execution_log"
#: scheduler: durations of device work that ran inside longer tasks
HANDLER_OBSERVE = "gdask_observe"
#: scheduler: open / close a job, the jobs table
HANDLER_JOB_OPEN = "gdask_job_open"
HANDLER_JOB_CLOSE = "gdask_job_close"
HANDLER_JOBS = "gdask_jobs"
#: scheduler: a fit's loop on the workers ended: drop its event topic
HANDLER_LOOP_EVENTS_DONE = "gdask_loop_events_done"
#: worker: a message of a loop on the workers / stop a loop
HANDLER_COLLECTIVE = "gdask_collective"
HANDLER_COLLECTIVE_ABORT = "gdask_collective_abort"
#: worker: drop a fit's per-worker state
HANDLER_STATE = "gdask_drop_state"
