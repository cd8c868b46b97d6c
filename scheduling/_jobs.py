"""Jobs that share devices: ``gdask.job(...)``, its scheduler plugin and its worker monitor.

Thin adapters around the pure policies of :mod:`gdask.scheduling._sharing` (``ShareLedger``,
``place``, ``first_fit``, ``whole_device``) and :mod:`gdask.scheduling._interference`
(``InterferenceModel``):

* :class:`JobScheduler` (scheduler plugin ``gdask-jobs``) grants each job a fraction of one or
  more devices and an amount of their memory, or queues it until one fits; learns each job kind's
  profile and the interference model from what the workers measure; feeds ``jobs(client)``.
  :class:`~gdask.scheduling.GPUPlacement` places a job's tasks on its devices only.
* :class:`JobMonitor` (worker plugin ``gdask-job-monitor``) measures every job task (duration,
  which other jobs ran on the device meanwhile and for how long, the device's per-job usage where
  the device reports it) and reports it to the scheduler as a ``gdask-job-task`` event. It also
  enforces memory requests: when a job's blocks on the device exceed its request, *that job's*
  blocks are moved to the host tier of the window cache.
* :func:`job` (``gdask.job``) is the context manager users write around a job's computations: the
  tasks submitted inside it are annotated ``gdask_job=<name>`` and the GDataSets created inside it
  get job-private keys, so one job never reads another job's cached blocks.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import threading
import time
import uuid
import weakref
from collections import defaultdict, deque
from typing import Any

import dask
from dask.utils import key_split
from distributed import SchedulerPlugin, WorkerPlugin

from gdask import _config
from gdask._devices._spec import parse_size
from gdask.scheduling._interference import InterferenceModel, JobProfile
from gdask.scheduling._sharing import (DeviceCapacity, JobRequest, ShareError, ShareLedger, first_fit, jobs_table,
                                       place, whole_device)
from gdask.scheduling._topology import Topology

logger = logging.getLogger("gdask.scheduling")

__all__ = ["Job", "JobMonitor", "JobScheduler", "current_job", "job", "jobs"]

#: task annotation naming the job a task belongs to
JOB = "gdask_job"
#: task annotation naming the job's kind (jobs of one kind share measured profiles)
KIND = "gdask_job_kind"
#: event topic of the workers' per-task measurements
TOPIC = "gdask-job-task"

POLICIES = {"gdask": place, "first-fit": first_fit, "whole-device": whole_device}

#: overlap (fraction of a task's time) below which another job did not really co-run, and above
#: which it co-ran for the whole task: tasks in between are not clean measurements
_NONE, _FULL = 0.02, 0.9
#: tasks shorter than this are not timed for slowdowns (timer and scheduling noise)
_MIN_SECONDS = 0.002


def current_job() -> str | None:
    """The job of the running task on a worker, else the job of the enclosing ``gdask.job`` block."""
    try:
        from distributed import get_worker
        from distributed.worker import thread_state

        key = getattr(thread_state, "key", None)
        if key is not None:
            ts = get_worker().state.tasks.get(key)
            ann = (ts.annotations or {}) if ts is not None else {}
            if ann.get(JOB) is not None:
                return ann[JOB]
    except ValueError:  # not on a worker
        pass
    return dask.get_annotations().get(JOB)


# -- scheduler side ---------------------------------------------------------------------------------
class _JobRecord:
    __slots__ = ("request", "kind", "devices", "submitted", "started", "finished", "waiter", "count",
                 "slowdowns", "spilled", "given_profile", "status")

    def __init__(self, request: JobRequest, kind: str, count: int, given_profile: bool) -> None:
        self.request = request
        self.kind = kind
        self.count = count
        self.devices: list[str] = []
        self.submitted = time.time()
        self.started: float | None = None
        self.finished: float | None = None
        self.waiter: asyncio.Future | None = None
        self.slowdowns: list[float] = []
        self.spilled = 0
        self.given_profile = given_profile
        self.status = "waiting"


class JobScheduler(SchedulerPlugin):
    """Grants jobs shares of devices, queues them when none fits, and learns how they interfere.

    Parameters
    ----------
    policy : {"gdask", "first-fit", "whole-device"}, optional
        ``"gdask"``: interference-aware, multi-dimensional, topology-aware :func:`place`;
        ``"first-fit"``: naive packing; ``"whole-device"``: one job per device. Default config
        ``gdask.scheduling.sharing.policy``.
    model : InterferenceModel, optional
        Learned online from the workers' measurements (a new one by default).
    topology : Topology, optional
        Links between devices, keyed by worker address. Default: from NVML where workers report
        it, else config ``gdask.scheduling.sharing.links`` (``{"0-1": "nvlink"}``, keyed by worker
        names), else ``pcie-host`` between devices of one host and ``network`` across hosts.
    bottleneck_penalty : float, optional
        Score per co-runner with the same bottleneck (config ``...sharing.bottleneck-penalty``).
    """

    name = "gdask-jobs"
    idempotent = True

    def __init__(self, policy: str | None = None, model: InterferenceModel | None = None,
                 topology: Topology | None = None, bottleneck_penalty: float | None = None) -> None:
        policy = policy or _config.get("scheduling.sharing.policy", "gdask")
        if policy not in POLICIES:
            raise ValueError(f"unknown sharing policy {policy!r}; choose one of {sorted(POLICIES)}")
        self.policy = policy
        self.model = model or InterferenceModel()
        self.topology = topology
        self._given_topology = topology is not None
        self.bottleneck_penalty = float(bottleneck_penalty if bottleneck_penalty is not None
                                        else _config.get("scheduling.sharing.bottleneck-penalty", 0.25))
        self.ledger = ShareLedger()
        self.records: dict[str, _JobRecord] = {}
        self.queue: deque[str] = deque()
        self.kind_profiles: dict[str, JobProfile] = {}
        self._profile_samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.baselines: dict[tuple[str, str], float] = {}  # (kind, task prefix) -> solo seconds at speed 1
        self.observations: list[dict[str, Any]] = []  # clean co-run measurements, with predictions
        self._seen_sets: set[frozenset] = set()
        self.scheduler: Any = None
        self.keep_finished = 1000  # finished jobs kept for jobs(client)

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        scheduler.handlers["gdask_job_open"] = self._handle_open
        scheduler.handlers["gdask_job_close"] = self._handle_close
        scheduler.handlers["gdask_jobs"] = self._handle_jobs

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        if worker in self.ledger.devices:
            for name in self.ledger.remove_device(worker):
                rec = self.records.get(name)
                if rec is not None and worker in rec.devices:
                    rec.devices.remove(worker)
                    logger.warning("job %r lost device %s", name, worker)
        self._dispatch()

    # -- devices ------------------------------------------------------------------------------------
    def _device_workers(self) -> dict[str, Any]:
        """Running workers that report a gdask device (``worker.metrics["gdask_device"]``)."""
        s = self.scheduler
        return {ws.address: ws for ws in s.running if (ws.metrics or {}).get("gdask_device")}

    def _refresh_devices(self) -> None:
        workers = self._device_workers()
        for addr, ws in workers.items():
            if addr not in self.ledger.devices:
                dev = ws.metrics["gdask_device"]
                speed = float(dev.get("speed") or 1.0)
                self.ledger.add_device(DeviceCapacity(addr, int(dev.get("memory") or 1), compute=speed,
                                                      bandwidth=speed))
        if not self._given_topology:
            self.topology = self._make_topology(workers)

    def _make_topology(self, workers: dict[str, Any]) -> Topology:
        nvml = {addr: (ws.metrics.get("gdask_nvml") or {}) for addr, ws in workers.items()}
        hosts = {addr: ws.host for addr, ws in workers.items()}
        if any(v.get("topology") for v in nvml.values()):
            physical = {addr: int(ws.metrics["gdask_device"].get("physical", 0)) for addr, ws in workers.items()}
            details = {physical[a]: nvml[a] for a in workers}
            return Topology.from_nvml(details, devices=physical, hosts=hosts, default="socket")
        topo = Topology(default="network")
        addrs = sorted(workers)
        for i, a in enumerate(addrs):
            for b in addrs[i + 1:]:
                topo.set_link(a, b, "pcie-host" if hosts[a] == hosts[b] else "network")
        links = _config.get("scheduling.sharing.links", None) or {}
        by_name = {str(ws.name): addr for addr, ws in workers.items()}
        for pair, kind in links.items():
            parts = [p.strip() for p in str(pair).replace(",", "-").split("-")]
            if len(parts) == 2 and all(p in by_name for p in parts) and parts[0] != parts[1]:
                topo.set_link(by_name[parts[0]], by_name[parts[1]], kind)
        return topo

    # -- grants -------------------------------------------------------------------------------------
    def _decide(self, rec: _JobRecord) -> tuple:
        policy = POLICIES[self.policy]
        if rec.kind in self.kind_profiles and not rec.given_profile:
            req = JobRequest(rec.request.name, rec.request.gpu, rec.request.memory, self.kind_profiles[rec.kind])
        else:
            req = rec.request
        return policy(req, None, self.ledger, self.model, count=rec.count, topology=self.topology).devices

    def _grant(self, rec: _JobRecord, devices: tuple) -> None:
        for d in devices:
            self.ledger.grant(rec.request, d)
        if rec.kind in self.kind_profiles and not rec.given_profile:
            self.ledger.set_profile(rec.request.name, self.kind_profiles[rec.kind])
        rec.devices = list(devices)
        rec.started = time.time()
        rec.status = "running"

    def _dispatch(self) -> None:
        """Grant waiting jobs that fit now, oldest first (later ones may pass a blocked one)."""
        if not self.queue:
            return
        self._refresh_devices()
        for name in list(self.queue):
            rec = self.records[name]
            if rec.waiter is None or rec.waiter.done():
                self.queue.remove(name)
                continue
            devices = self._decide(rec)
            if devices:
                self._grant(rec, devices)
                self.queue.remove(name)
                rec.waiter.set_result(list(devices))

    def _never_fits(self, req: JobRequest, count: int) -> str | None:
        caps = [self.ledger.capacity(d) for d in self.ledger.devices]
        if not caps:
            return None  # no device yet: wait for workers
        big = [c for c in caps if c.memory >= req.memory]
        if len(big) < count:
            largest = max(c.memory for c in caps)
            return (f"job {req.name!r} asks for {req.memory} bytes of device memory on {count} device(s); "
                    f"the cluster has {len(big)} device(s) that large (largest {largest} bytes)")
        return None

    async def _handle_open(self, name: str, gpu: float, memory: Any = None, count: int = 1, kind: str | None = None,
                           profile: dict | None = None, timeout: float | None = None, **kwargs: Any) -> dict:
        if name in self.records and self.records[name].status in ("waiting", "running"):
            raise ShareError(f"a job named {name!r} is already {self.records[name].status}; job names must be unique")
        self._refresh_devices()
        if memory is None:  # default: the same fraction of the smallest device's memory
            sizes = [self.ledger.capacity(d).memory for d in self.ledger.devices] or [0]
            memory = int(float(gpu) * min(sizes))
        prof = JobProfile(**profile) if profile else None
        req = JobRequest(name, gpu, memory, prof)
        count = int(count)
        if count < 1:
            raise ValueError(f"job {name!r}: devices must be >= 1, got {count}")
        why = self._never_fits(req, count)
        if why:
            raise ShareError(why + ": ask for less memory or fewer devices")
        rec = _JobRecord(req, kind or name, count, prof is not None)
        self.records[name] = rec
        devices = self._decide(rec) if not self.queue else ()
        if devices:
            self._grant(rec, devices)
        else:
            rec.waiter = asyncio.get_running_loop().create_future()
            self.queue.append(name)
            deadline = None if timeout is None else time.monotonic() + float(timeout)
            try:
                while not rec.waiter.done():  # woken by releases; also retried as devices appear
                    self._dispatch()
                    left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                    if left <= 0:
                        raise asyncio.TimeoutError
                    await asyncio.wait({rec.waiter}, timeout=left)
                if rec.waiter.cancelled():
                    raise ShareError(f"job {name!r} was closed while it waited for a device share")
            except asyncio.TimeoutError:
                if name in self.queue:
                    self.queue.remove(name)
                rec.status = "timed out"
                rec.finished = time.time()
                raise TimeoutError(f"job {name!r} waited {timeout} s for a device share "
                                   f"(gpu={req.gpu:g}, memory={req.memory} bytes); running: "
                                   f"{[n for n, r in self.records.items() if r.status == 'running']}") from None
        return {"devices": rec.devices, "memory": req.memory, "waited": (rec.started or time.time()) - rec.submitted}

    def _handle_close(self, name: str, **kwargs: Any) -> dict:
        rec = self.records.get(name)
        if rec is None:
            raise ShareError(f"no job named {name!r}")
        if rec.status == "waiting":
            if rec.waiter is not None and not rec.waiter.done():
                rec.waiter.cancel()
            if name in self.queue:
                self.queue.remove(name)
        if name in self.ledger.jobs:
            self.ledger.release(name)
        if rec.status in ("waiting", "running"):
            rec.status = "done"
            rec.finished = time.time()
        ended = [n for n, r in self.records.items() if r.finished is not None]
        for n in ended[:max(0, len(ended) - self.keep_finished)]:  # the table keeps the newest ones
            del self.records[n]
        self._dispatch()
        return {"slowdown": _mean(rec.slowdowns)}

    def devices_for(self, ts: Any) -> set[str] | None:
        """The devices a task may run on: its job's devices, or None (not a job task)."""
        ann = ts.annotations
        if not ann:
            return None
        name = ann.get(JOB)
        if name is None:
            return None
        rec = self.records.get(name)
        if rec is None or not rec.devices:
            return None
        return set(rec.devices)

    # -- measurements -------------------------------------------------------------------------------
    def log_event(self, topic: str, msg: Any) -> None:
        if topic != TOPIC or not isinstance(msg, dict):
            return
        try:
            self._measured(msg)
        except Exception:  # a bad measurement must never break the scheduler
            logger.exception("gdask-jobs: could not use a task measurement %r", msg)

    def _speed(self, worker: str) -> float:
        ws = self.scheduler.workers.get(worker) if self.scheduler is not None else None
        dev = ((ws.metrics or {}).get("gdask_device") or {}) if ws is not None else {}
        return float(dev.get("speed") or 1.0)

    def _measured(self, msg: dict) -> None:
        name, kind, worker = msg["job"], msg.get("kind") or msg["job"], msg["worker"]
        rec = self.records.get(name)
        if rec is None:
            return
        rec.spilled = max(rec.spilled, int(msg.get("spilled", 0)))
        if "resident" in msg and name in self.ledger.jobs and worker in self.ledger.devices_of(name):
            self.ledger.uncharge(name, self.ledger.used(name).get(worker, 0), worker)
            self.ledger.charge(name, int(msg["resident"]), worker)  # enforced on the worker itself
        usage = msg.get("usage")
        if (usage is not None and usage.get("active", 0) <= 0) or float(msg["duration"]) < _MIN_SECONDS:
            return  # no device work in it (e.g. a combine on the host), or too short to time
        others = {j: f for j, f in (msg.get("others") or {}).items() if f >= _NONE}
        key = (kind, msg["prefix"])
        seconds = float(msg["duration"]) * self._speed(worker)  # at speed 1
        if not others:
            old = self.baselines.get(key)
            self.baselines[key] = seconds if old is None else 0.8 * old + 0.2 * seconds
            if usage:  # active > 0: checked above
                self._profile_sample(kind, usage["compute"] / usage["active"], usage["bandwidth"] / usage["active"])
            return
        base = self.baselines.get(key)
        if base is None or base <= 0:
            return
        slowdown = max(seconds / base, 1e-3)
        rec.slowdowns.append(slowdown)
        if min(others.values()) < _FULL or worker not in self.ledger.devices:
            return  # a co-runner came or left during the task: not a clean co-location
        if name not in self.ledger.jobs or any(o not in self.ledger.jobs for o in others):
            return
        if not self._has_profile(name) or not all(self._has_profile(o) for o in others):
            return
        own = self.ledger.profile(name, worker)
        profs = [self.ledger.profile(o, worker) for o in others]
        kinds = frozenset([kind, *(self.records[o].kind for o in others)])
        new_set = kinds not in self._seen_sets
        self._seen_sets.add(kinds)
        predicted = self.model.observe(own, profs, slowdown)
        self.observations.append({"job": name, "kind": kind, "co_runners": sorted(others), "measured": slowdown,
                                  "predicted": predicted, "new_colocation": new_set})

    def _has_profile(self, name: str) -> bool:
        rec = self.records[name]
        return rec.given_profile or rec.kind in self.kind_profiles

    def _profile_sample(self, kind: str, compute: float, bandwidth: float) -> None:
        samples = self._profile_samples[kind]
        samples.append((compute, bandwidth))
        del samples[:-20]
        c = sum(s[0] for s in samples) / len(samples)
        b = sum(s[1] for s in samples) / len(samples)
        prof = JobProfile(compute=c, bandwidth=b)
        self.kind_profiles[kind] = prof
        for n, rec in self.records.items():
            if rec.kind == kind and not rec.given_profile and n in self.ledger.jobs:
                self.ledger.set_profile(n, prof)

    # -- report -------------------------------------------------------------------------------------
    def model_error(self, new_only: bool = False) -> float | None:
        """Mean absolute percentage error (a fraction) of the predictions made before each clean
        measurement was learned from; ``new_only``: only for co-locations (sets of job kinds) seen
        for the first time."""
        obs = [o for o in self.observations if o["new_colocation"] or not new_only]
        if not obs:
            return None
        return sum(abs(o["predicted"] - o["measured"]) / o["measured"] for o in obs) / len(obs)

    def table_rows(self) -> list[dict[str, Any]]:
        measured = {n: _mean(r.slowdowns) for n, r in self.records.items()}
        active = jobs_table(self.ledger, self.model, measured)
        rows = []
        for name, rec in self.records.items():
            row = {"job": name, "kind": rec.kind, "status": rec.status, "devices": list(rec.devices),
                   "share": rec.request.gpu, "memory": rec.request.memory, "memory_used": 0,
                   "bottleneck": None, "co_runners": [], "predicted_slowdown": math.nan,
                   "measured_slowdown": measured[name], "spilled_bytes": rec.spilled,
                   "waited": ((rec.started or rec.finished or time.time()) - rec.submitted),
                   "runtime": ((rec.finished or time.time()) - rec.started) if rec.started else math.nan}
            if name in active.index:
                live = active.loc[name]
                for col in ("memory_used", "bottleneck", "co_runners", "predicted_slowdown"):
                    row[col] = live[col]
            rows.append(row)
        return rows

    def _handle_jobs(self, **kwargs: Any) -> dict[str, Any]:
        return {"rows": self.table_rows(), "policy": self.policy, "model_error": self.model_error(),
                "model_error_new": self.model_error(new_only=True), "observations": len(self.observations),
                "profiles": {k: {"compute": p.compute, "bandwidth": p.bandwidth} for k, p in self.kind_profiles.items()}}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


# -- worker side ------------------------------------------------------------------------------------
class JobMonitor(WorkerPlugin):
    """Measures job tasks on a worker and enforces the jobs' memory requests there.

    For every finished task of a job (annotated ``gdask_job``) it sends a ``gdask-job-task`` event:
    its duration, the fraction of that time each other job had tasks running on this worker, the
    device's usage counters for the job over the task (emulated devices report them) and the
    bytes of the job's blocks spilled so far. A job whose blocks on the device exceed its memory
    request has its own oldest blocks moved to the host tier (``worker.data.spill``).
    """

    name = "gdask-job-monitor"
    idempotent = True

    def __init__(self) -> None:
        self.limits: dict[str, int] = {}
        self.spilled: dict[str, int] = defaultdict(int)
        self._keys: dict[str, dict[Any, None]] = defaultdict(dict)  # job -> its keys in memory, oldest first
        self._running: dict[Any, list] = {}  # key -> [job, start, overlap {job: seconds}, usage at start]
        self._active: dict[str, int] = defaultdict(int)  # job -> tasks executing
        self._last = time.perf_counter()
        self._lock = threading.Lock()
        self.worker: Any = None

    def __getstate__(self) -> dict:
        return {}  # sent to workers: each starts empty

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def setup(self, worker: Any) -> None:
        self.worker = worker

    def _job_of(self, key: Any) -> tuple[str | None, str | None]:
        ts = self.worker.state.tasks.get(key) if self.worker is not None else None
        ann = (ts.annotations or {}) if ts is not None else {}
        return ann.get(JOB), ann.get(KIND)

    def _usage(self, job: str) -> dict[str, float] | None:
        dev = getattr(self.worker, "gdask_device", None)
        get = getattr(dev, "job_usage", None)
        if get is None or getattr(dev, "_clock", None) is None:
            return None
        return get(job)

    def _tick(self, now: float) -> None:
        dt = now - self._last
        self._last = now
        if dt <= 0 or not self._running:
            return
        busy = [j for j, n in self._active.items() if n > 0]
        for entry in self._running.values():
            for j in busy:
                if j != entry[0]:
                    entry[2][j] = entry[2].get(j, 0.0) + dt

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if self.worker is None:
            return
        if finish == "executing":
            job, _ = self._job_of(key)
            if job is None:
                return
            with self._lock:
                self._tick(time.perf_counter())
                self._running[key] = [job, time.perf_counter(), {}, self._usage(job)]
                self._active[job] += 1
            return
        if start == "executing" and key in self._running:
            with self._lock:
                now = time.perf_counter()
                self._tick(now)
                job, t0, overlap, usage0 = self._running.pop(key)
                self._active[job] -= 1
            if finish == "memory":
                self._report(key, job, now - t0, overlap, usage0)
        if finish == "memory":
            job, _ = self._job_of(key)
            if job is not None:
                self._keys[job][key] = None
                self._enforce(job)
        elif finish in ("released", "forgotten", "error"):
            job, _ = self._job_of(key)
            if job is not None:
                self._keys[job].pop(key, None)

    def _report(self, key: Any, job: str, duration: float, overlap: dict, usage0: dict | None) -> None:
        _, kind = self._job_of(key)
        ts = self.worker.state.tasks.get(key)
        prefix = key_split(key) if ts is None else ts.prefix
        msg = {"job": job, "kind": kind or job, "prefix": str(prefix), "worker": self.worker.address,
               "duration": duration, "others": {j: s / duration for j, s in overlap.items()} if duration > 0 else {},
               "spilled": self.spilled.get(job, 0), "resident": self.usage(job)}
        usage1 = self._usage(job) if usage0 is not None else None
        if usage0 is not None and usage1 is not None:
            msg["usage"] = {k: usage1[k] - usage0[k] for k in ("active", "compute", "bandwidth")}
        try:
            self.worker.log_event(TOPIC, msg)
        except Exception:  # pragma: no cover - reporting is best effort
            logger.debug("gdask-jobs: could not report %r", key, exc_info=True)

    def _enforce(self, job: str) -> None:
        limit = self.limits.get(job)
        data = getattr(self.worker, "data", None)
        spill = getattr(data, "spill", None)
        size = getattr(data, "device_bytes", None)
        if limit is None or spill is None or size is None:
            return
        keys = self._keys[job]
        used = self.usage(job)
        for k in list(keys):  # oldest first
            if used <= limit:
                break
            freed = spill(k)
            used -= freed
            self.spilled[job] += freed

    def usage(self, job: str) -> int:
        """Bytes of ``job``'s blocks on this worker's device now."""
        size = getattr(getattr(self.worker, "data", None), "device_bytes", None)
        return sum(size(k) for k in self._keys.get(job, ())) if size is not None else 0


def _set_limit(name: str, nbytes: int | None, dask_worker: Any = None) -> bool:
    mon = dask_worker.plugins.get(JobMonitor.name)
    if mon is None:
        return False
    if nbytes is None:
        mon.limits.pop(name, None)
        mon._keys.pop(name, None)
    else:
        mon.limits[name] = int(nbytes)
    return getattr(getattr(dask_worker, "data", None), "spill", None) is not None


# -- client side ------------------------------------------------------------------------------------
_ready: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
_ready_lock = threading.Lock()


def _ensure_plugins(client: Any) -> None:
    """Install the job plugins on the client's cluster once (LocalGPUCluster already has them)."""
    with _ready_lock:
        if _ready.get(client):
            return

        def has(dask_scheduler=None):
            return ([n in dask_scheduler.plugins for n in ("gdask-placement", JobScheduler.name)]
                    + [any((ws.metrics or {}).get("gdask_device") for ws in dask_scheduler.workers.values())])

        placement, jobs_, devices = client.run_on_scheduler(has)
        if not placement:
            from gdask.scheduling._plugin import GPUPlacement

            client.register_plugin(GPUPlacement())
        if not jobs_:
            client.register_plugin(JobScheduler())
        if not devices:  # a plain Dask cluster: give each worker a device (CUDA, else emulated)
            from gdask.scheduling._plugin import DeviceReporter

            client.register_plugin(DeviceReporter(create_device=True))
        client.register_plugin(JobMonitor())  # idempotent: workers that have it keep theirs
        _ready[client] = True


#: jobs opened in this context (thread, task), innermost last
_open_jobs: contextvars.ContextVar[tuple] = contextvars.ContextVar("gdask_open_jobs", default=())


def _annotate_with(job: Job | None) -> None:
    """Make ``job`` (or no job) the one annotated on tasks submitted from this context, keeping
    the other annotations: unlike ``with dask.annotate``, this lets jobs close in any order."""
    from dask.base import _annotations

    ann = {k: v for k, v in dask.get_annotations().items() if k not in (JOB, KIND)}
    if job is not None:
        ann.update({JOB: job.name, KIND: job.kind})
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
        self.status = "new"

    def open(self) -> Job:
        """Ask for the share (waits while no device has room) and start annotating tasks."""
        if self.status == "running":
            return self
        if self.status != "new":
            raise RuntimeError(f"job {self.name!r} is {self.status}; a job runs once: make a new one")
        _ensure_plugins(self.client)
        prof = None if self.profile is None else {"compute": self.profile.compute, "bandwidth": self.profile.bandwidth,
                                                  "memory": self.profile.memory}
        self.status = "waiting"
        try:
            info = self.client.sync(self.client.scheduler.gdask_job_open, name=self.name, gpu=self.gpu,
                                    memory=self.memory, count=self.count, kind=self.kind, profile=prof,
                                    timeout=self.timeout)
        except BaseException:
            self.status = "failed"
            raise
        self.devices = list(info["devices"])
        self.memory = int(info["memory"])
        self.waited = float(info["waited"])
        self.status = "running"
        self.client.run(_set_limit, self.name, self.memory, workers=self.devices)
        _open_jobs.set((*_open_jobs.get(), self))
        _annotate_with(self)
        return self

    def close(self) -> None:
        """Release the share; the job's blocks stay until their futures are released."""
        if self.status not in ("running", "waiting"):
            return
        stack = tuple(j for j in _open_jobs.get() if j is not self)
        _open_jobs.set(stack)
        if dask.get_annotations().get(JOB) == self.name:  # jobs may close in any order
            _annotate_with(stack[-1] if stack else None)
        try:
            self.client.sync(self.client.scheduler.gdask_job_close, name=self.name)
            self.client.run(_set_limit, self.name, None, workers=self.devices or None)
        finally:
            self.status = "done"

    def __enter__(self) -> Job:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        mem = "auto" if self.memory is None else f"{self.memory / 2**30:.3g} GiB"
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
        Seconds to wait for a share before raising ``TimeoutError`` (default: forever).

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
        Indexed by job name; ``df.attrs`` holds the sharing ``policy``, the interference model's
        ``model_error`` (mean absolute percentage error of its predictions before each clean
        measurement, a fraction) and the measured ``profiles`` per job kind.
    """
    import pandas as pd

    if client is None:
        from distributed import get_client

        client = get_client()
    _ensure_plugins(client)
    info = client.sync(client.scheduler.gdask_jobs)
    columns = ["job", "kind", "status", "devices", "share", "memory", "memory_used", "spilled_bytes", "bottleneck",
               "co_runners", "predicted_slowdown", "measured_slowdown", "waited", "runtime"]
    df = pd.DataFrame(info["rows"], columns=columns).set_index("job")
    df.attrs.update({k: v for k, v in info.items() if k != "rows"})
    return df
