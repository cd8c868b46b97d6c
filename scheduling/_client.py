"""Client side of gdask's scheduling: installing the plugins, jobs (``gdask.job``), tables, reports.

* :func:`ensure_plugins` installs what gdask needs on any cluster, once per client.
* :func:`job` (``gdask.job``) is the context manager users write around a job's computations: the
  tasks submitted inside it are annotated ``gdask_job=<name>`` and the GDataSets created inside it
  get job-private keys, so one job never reads another job's cached blocks.
* :func:`jobs`, :func:`device_table`: tables from the scheduler plugins.
* :func:`report_work`: durations of device work that ran inside longer tasks, for placement.
"""

from __future__ import annotations

import contextvars
import threading
import uuid
import weakref
from typing import Any

import dask

from gdask import protocol
from gdask._compat import scheduler_workers
from gdask.devices import parse_size
from gdask.scheduling._interference import JobProfile
from gdask.scheduling._sharing import JobRequest
from gdask.scheduling._worker_jobs import set_limit

__all__ = ["Job", "current_job", "device_table", "ensure_plugins", "job", "job_salt", "jobs", "report_work"]


def current_job() -> str | None:
    """The job of the running task on a worker, else the job of the enclosing ``gdask.job`` block."""
    try:
        from distributed import get_worker
        from distributed.worker import thread_state

        key = getattr(thread_state, "key", None)
        if key is not None:
            ts = get_worker().state.tasks.get(key)
            ann = (ts.annotations or {}) if ts is not None else {}
            if ann.get(protocol.ANN_JOB) is not None:
                return ann[protocol.ANN_JOB]
    except ValueError:  # not on a worker
        pass
    return dask.get_annotations().get(protocol.ANN_JOB)


def job_salt() -> tuple:
    """What makes keys job-private: inside ``gdask.job(...)`` the job's name and the secret the
    scheduler granted it (GDataSets created there get keys no other job can name); elsewhere
    nothing (keys unchanged). A ``dask.annotate(gdask_job=...)`` without the secret salts with
    ``None``: its keys are not the job's."""
    ann = dask.get_annotations()
    job = ann.get(protocol.ANN_JOB)
    return () if job is None else ("gdask-job", job, ann.get(protocol.ANN_JOB_SECRET))


#: client -> names of the plugins known to be installed on its cluster (the one "once per client" cache)
_installed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_installed_lock = threading.Lock()


def _cluster_has(names: list[str], dask_scheduler: Any = None) -> dict[str, bool]:
    """(on the scheduler) Which plugins of ``names`` are installed: scheduler plugins by name,
    worker plugins on every worker (``dask_scheduler.worker_plugins``), the device plugin also
    when every device worker already reports a device."""
    out = {}
    wplugins = getattr(dask_scheduler, "worker_plugins", {}) or {}
    for name in names:
        out[name] = name in dask_scheduler.plugins or name in wplugins
    # workers started with gdask's worker plugins (LocalGPUCluster, gdask worker, the preload) report a
    # device; registering those plugins again would replace theirs (a worker tears down a plugin it is
    # sent again), so they are only added to clusters where no worker has them
    started = any((ws.metrics or {}).get(protocol.METRIC_DEVICE) for ws in dask_scheduler.workers.values())
    for name in (protocol.PLUGIN_DEVICE, protocol.PLUGIN_JOB_MONITOR, protocol.PLUGIN_WINDOW_CACHE):
        if name in out and not out[name]:
            out[name] = started
    return out


def ensure_plugins(client: Any, extra: tuple = (), *, standard: bool = True) -> None:
    """Install gdask's plugins on ``client``'s cluster where they are missing: placement and jobs on
    the scheduler, a device (made from config: CUDA where available, else emulated) and the job
    monitor on every worker, plus the plugin objects in ``extra`` (e.g. the collective mailboxes of
    loops on the workers; ``standard=False``: only those). One round trip the first time per client
    and plugin set, none after.

    ``LocalGPUCluster``, ``gdask worker`` and ``--preload gdask.scheduling`` install them already; on
    any other Dask cluster the first gdask call that needs them does this.
    """
    from gdask.scheduling._scheduler import GPUPlacement
    from gdask.scheduling._scheduler_jobs import JobScheduler
    from gdask.scheduling._worker import DeviceSetup
    from gdask.scheduling._worker_jobs import JobMonitor
    from gdask.window_cache import Residency, WindowCachePlugin

    wanted: dict[str, Any] = {}
    if standard:
        wanted = {protocol.PLUGIN_PLACEMENT: GPUPlacement, protocol.PLUGIN_JOBS: JobScheduler,
                  protocol.PLUGIN_RESIDENCY: Residency, protocol.PLUGIN_DEVICE: DeviceSetup,
                  protocol.PLUGIN_JOB_MONITOR: JobMonitor, protocol.PLUGIN_WINDOW_CACHE: WindowCachePlugin}
    wanted.update({p.name: p for p in extra})
    with _installed_lock:
        done = _installed.setdefault(client, set())
        missing = [n for n in wanted if n not in done]
        if not missing:
            return
        have = client.run_on_scheduler(_cluster_has, missing)
        absent = [n for n in _SCHEDULER_PLUGINS if n in missing and not have.get(n)]
        if absent and client.run_on_scheduler(_tasks_held):  # work ran without them: say so, once
            _warn_missing_scheduler_plugins(absent)
        for name in missing:
            if not have.get(name):
                make = wanted[name]
                client.register_plugin(make() if isinstance(make, type) else make, name=name)
                if name == protocol.PLUGIN_DEVICE:
                    _wait_for_devices(client)
            done.add(name)


#: gdask's scheduler plugins: without them Dask places blocks by its own rules (not by device speed)
_SCHEDULER_PLUGINS = (protocol.PLUGIN_PLACEMENT, protocol.PLUGIN_JOBS)


def _tasks_held(dask_scheduler: Any = None) -> int:
    """(on the scheduler) Tasks it knows of: work submitted before gdask's plugins were there."""
    return len(dask_scheduler.tasks)


def _warn_missing_scheduler_plugins(absent: list[str]) -> None:
    """Warn (a :class:`gdask.GDaskWarning`) that work ran on the cluster without gdask's scheduler
    plugins: what was placed before they are installed now was placed by Dask's own rules. Once per
    client and cluster: :func:`ensure_plugins` asks the scheduler once per client and plugin, and
    installs them right after."""
    import warnings

    from gdask import GDaskWarning

    warnings.warn(
        f"gdask: this cluster's scheduler ran work without gdask's scheduler plugins ({', '.join(absent)}): gdask "
        "installs them now. Work submitted before now, e.g. blocks persisted already, was placed by Dask's own "
        "rules, not by device speed (persist them again to place them). Start the scheduler with "
        "`dask scheduler --preload gdask.scheduling` to have them from the start.", GDaskWarning, stacklevel=3)


def _devices_reported(dask_scheduler: Any = None) -> bool:
    return all((ws.metrics or {}).get(protocol.METRIC_DEVICE) for ws in dask_scheduler.workers.values())


def _wait_for_devices(client: Any) -> None:
    """Wait (at most config ``gdask.plugins.timeout`` seconds) until every worker's heartbeat has
    reported the device it was just given, so tables and placement see it at once."""
    import time

    from gdask import config

    timeout = float(config.get("plugins.timeout", 10))
    deadline = time.monotonic() + timeout
    while not client.run_on_scheduler(_devices_reported):
        if time.monotonic() > deadline:
            import logging

            logging.getLogger("gdask.scheduling").warning(
                "gdask: not every worker reported its new device within %g s (gdask.plugins.timeout)", timeout)
            return
        time.sleep(0.1)


#: jobs opened in this context (thread, task), innermost last
_open_jobs: contextvars.ContextVar[tuple] = contextvars.ContextVar("gdask_open_jobs", default=())


def _annotate_with(job: Job | None) -> None:
    """Make ``job`` (or no job) the one annotated on tasks submitted from this context, keeping
    the other annotations: unlike ``with dask.annotate``, this lets jobs close in any order."""
    from dask.base import _annotations

    ours = (protocol.ANN_JOB, protocol.ANN_JOB_KIND, protocol.ANN_JOB_SECRET)
    ann = {k: v for k, v in dask.get_annotations().items() if k not in ours}
    if job is not None:
        ann.update({protocol.ANN_JOB: job.name, protocol.ANN_JOB_KIND: job.kind, protocol.ANN_JOB_SECRET: job.secret})
    _annotations.set(ann or None)


class Job:
    """A job's share of the cluster's devices; see :func:`job`."""

    def __init__(self, client: Any = None, gpu: float = 1.0, memory: int | str | None = None,
                 name: str | None = None, *, devices: int = 1, kind: str | None = None,
                 profile: JobProfile | None = None, timeout: float | None = None) -> None:
        if client is None:
            from distributed import get_client

            try:
                client = get_client()
            except ValueError:
                raise ValueError("gdask.job needs a distributed Client: gdask.job(client, gpu=0.25, ...)") from None
        elif not hasattr(client, "scheduler"):
            raise TypeError(f"gdask.job's first argument is the distributed Client (or None: the current one), got "
                            f"{type(client).__name__} {client!r}; name the job with name=...")
        self.client = client
        self.name = name or f"job-{uuid.uuid4().hex[:8]}"
        # validate here, with the user's values, before anything is sent
        JobRequest(self.name, gpu, memory if memory is not None else 1, profile)
        self.gpu = float(gpu)
        self.memory = None if memory is None else parse_size(memory, name=f"job {self.name!r} memory")
        if int(devices) < 1:
            raise ValueError(f"job {self.name!r}: devices must be >= 1, got {devices!r}")
        self.count = int(devices)
        self.kind = kind or self.name
        self.profile = profile
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        self.timeout = timeout
        self.devices: list[str] = []
        self.waited: float | None = None
        self.secret: str | None = None  # granted by the scheduler when the job opens
        self.status = "new"

    def open(self) -> Job:
        """Ask for the share (waits while no device has room) and start annotating tasks."""
        if self.status == "running":
            return self
        if self.status != "new":
            raise RuntimeError(f"job {self.name!r} is {self.status}; a job runs once: make a new one")
        ensure_plugins(self.client)
        prof = None if self.profile is None else {"compute": self.profile.compute, "bandwidth": self.profile.bandwidth,
                                                  "memory": self.profile.memory}
        self.status = "waiting"
        from gdask import config

        timeout = self.timeout if self.timeout is not None else float(config.get("timeouts.job-open", 3600))
        try:
            info = self.client.sync(getattr(self.client.scheduler, protocol.HANDLER_JOB_OPEN), name=self.name,
                                    gpu=self.gpu,
                                    memory=self.memory, count=self.count, kind=self.kind, profile=prof,
                                    timeout=timeout)
        except BaseException:
            self.status = "failed"
            raise
        self.devices = list(info["devices"])
        self.memory = int(info["memory"])
        self.waited = float(info["waited"])
        self.secret = info.get("secret")
        self.status = "running"
        self.client.run(set_limit, self.name, self.memory, self.secret, workers=self.devices)
        _open_jobs.set((*_open_jobs.get(), self))
        _annotate_with(self)
        return self

    def close(self) -> None:
        """Release the share; the job's blocks stay until their futures are released."""
        if self.status not in ("running", "waiting"):
            return
        stack = tuple(j for j in _open_jobs.get() if j is not self)
        _open_jobs.set(stack)
        if dask.get_annotations().get(protocol.ANN_JOB) == self.name:  # jobs may close in any order
            _annotate_with(stack[-1] if stack else None)
        try:
            self.client.sync(getattr(self.client.scheduler, protocol.HANDLER_JOB_CLOSE), name=self.name)
            self.client.run(set_limit, self.name, None, workers=self.devices or None)
        finally:
            self.status = "done"

    def __enter__(self) -> Job:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        from dask.utils import format_bytes  # the units of the jobs table and the dashboard

        mem = "auto" if self.memory is None else format_bytes(int(self.memory))
        return f"<gdask.job {self.name!r} gpu={self.gpu:g} memory={mem} {self.status} on {self.devices}>"


def job(client: Any = None, gpu: float = 1.0, memory: int | str | None = None, name: str | None = None, *,
        devices: int = 1, kind: str | None = None, profile: JobProfile | None = None,
        timeout: float | None = None) -> Job:
    """A share of the cluster's devices for the computations of one job.

    .. code-block:: python

        with gdask.job(client, gpu=0.25, memory="4GiB", name="tuning-3"):
            km = gdask.ml.KMeans(16).fit(X)

    Entering waits until ``devices`` devices each have ``gpu`` of their compute and ``memory``
    bytes free (granted by the cluster's sharing policy, see :class:`JobScheduler`); then every
    task submitted inside the block runs on those devices only, the job's blocks on a device never
    take more than ``memory`` (beyond it the job's own blocks move to host memory), and GDataSets
    created inside it have job-private keys. ``job.open()`` / ``job.close()`` do the same without
    ``with`` (e.g. across notebook cells).

    Parameters
    ----------
    client : distributed.Client, optional
        Default: the current client.
    gpu : float
        Fraction of each device, in (0, 1].
    memory : int or str, optional
        Device memory per device (``"4GiB"``). Default: ``gpu`` times the smallest device's memory.
    name : str, optional
        Unique job name (default: a random one), shown by :func:`jobs`.
    devices : int
        Devices the job needs (its tasks exchange data: placed on the best-linked group).
    kind : str, optional
        Jobs of one kind share their measured profile (default: the name).
    profile : JobProfile, optional
        The job's compute / bandwidth use of a device alone, if known; otherwise measured.
    timeout : float, optional
        Seconds to wait for a share before raising ``TimeoutError`` (default config
        ``gdask.timeouts.job-open``, an hour).

    Raises
    ------
    ShareError
        If no device could ever hold the request (more memory than any device has).
    """
    return Job(client, gpu, memory, name, devices=devices, kind=kind, profile=profile, timeout=timeout)


def jobs(client: Any = None) -> Any:
    """Per job: status, devices, share, memory (requested, used), predicted and measured slowdown.

    Returns
    -------
    pandas.DataFrame
        Raw values (bytes, seconds, worker addresses), displayed in human units with worker names.
        Indexed by job name; ``df.attrs`` holds the sharing ``policy``, the interference model's
        ``model_error`` (mean absolute percentage error of its predictions before each clean
        measurement, a fraction) and the measured ``profiles`` per job kind.
    """
    import pandas as pd

    from gdask.scheduling._registry import TableFrame

    if client is None:
        from distributed import get_client

        client = get_client()
    ensure_plugins(client)
    info = client.sync(getattr(client.scheduler, protocol.HANDLER_JOBS))
    columns = ["job", "kind", "status", "devices", "share", "memory", "memory_used", "spilled_bytes", "bottleneck",
               "co_runners", "predicted_slowdown", "measured_slowdown", "waited", "runtime"]
    df = pd.DataFrame(info["rows"], columns=columns).set_index("job")
    names = {a: str(w.get("name", a)) for a, w in scheduler_workers(client).items()}
    df = TableFrame(df, names=names, title=f"gdask jobs: {len(df)} (sharing policy {info.get('policy')})")
    df.attrs.update({k: v for k, v in info.items() if k != "rows"})
    return df


def report_work(client: Any, records: list[tuple[str, float, str, float]]) -> bool:
    """Tell the placement plugin about device work that ran inside longer tasks, as
    ``(kind, input bytes, worker address, seconds)`` records (what those tasks' durations would
    have been): a loop on the workers runs every iteration's block work in one task. False when the
    scheduler has no placement plugin (asked once per client)."""
    if not records:
        return False
    with _installed_lock:
        done = _installed.setdefault(client, set())
        if protocol.PLUGIN_PLACEMENT not in done:
            if not client.run_on_scheduler(_cluster_has, [protocol.PLUGIN_PLACEMENT])[protocol.PLUGIN_PLACEMENT]:
                return False  # a cluster without gdask's placement: nothing learns from durations
            done.add(protocol.PLUGIN_PLACEMENT)
    client.sync(getattr(client.scheduler, protocol.HANDLER_OBSERVE), records=[list(r) for r in records])
    return True


def device_table(client: Any = None, all_columns: bool = False):
    """Every device of the cluster with its memory, speed, streams and load.

    Parameters
    ----------
    client : distributed.Client, optional
        Default: the current client.
    all_columns : bool
        Display every column; default a compact view (name, memory, streams, speeds, placed, busy
        time, window hit rate, ...). The frame holds every column either way.

    Returns
    -------
    pandas.DataFrame
        Raw values (bytes, seconds), displayed in human units. One row per device worker:
        ``memory_total / used / free / peak``, ``pool`` (CUDA
        allocator), ``streams``, ``speed_configured``, ``speed_measured`` (relative, learned by the
        placement plugin from task durations), ``tasks`` and ``busy_time`` (device counters),
        ``placed`` and ``backlog_s`` (placement plugin), on CUDA ``gpu_util``, ``mem_util``,
        ``sm_count``, ``topology``; plus one ``<part>.<field>`` column per value other gdask
        components publish (``streams.k``, ``window.hits``, ...).

    Examples
    --------
    >>> gdask.scheduling.device_table(client)  # doctest: +SKIP
    """
    from gdask.scheduling._registry import frame

    if client is None:
        from distributed import default_client

        client = default_client()
    ensure_plugins(client)
    rows = client.sync(getattr(client.scheduler, protocol.HANDLER_DEVICE_TABLE))
    return frame(rows, all_columns=all_columns)
