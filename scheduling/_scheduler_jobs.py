"""Scheduler side of device sharing: the ``gdask-jobs`` plugin (:class:`JobScheduler`).

A thin adapter around the pure policies of :mod:`gdask.scheduling._sharing` (``ShareLedger``,
``place``, ``first_fit``, ``whole_device``) and :mod:`gdask.scheduling._interference`
(``InterferenceModel``): it grants each job a fraction of one or more devices and an amount of their
memory, or queues it until one fits; learns each job kind's profile and the interference model from
what the workers measure (:class:`~gdask.scheduling.JobMonitor`); feeds ``jobs(client)``.
:class:`~gdask.scheduling.GPUPlacement` places a job's tasks on its devices only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import defaultdict, deque
from typing import Any

from distributed import SchedulerPlugin

from gdask import config, protocol
from gdask.scheduling._interference import InterferenceModel, JobProfile
from gdask.scheduling._sharing import (
    DeviceCapacity,
    JobRequest,
    ShareError,
    ShareLedger,
    first_fit,
    jobs_table,
    place,
    whole_device,
)
from gdask.scheduling._topology import Topology

logger = logging.getLogger("gdask.scheduling")

__all__ = ["JobScheduler", "POLICIES"]

POLICIES = {"gdask": place, "first-fit": first_fit, "whole-device": whole_device}

#: overlap (fraction of a task's time) below which another job did not really co-run, and above
#: which it co-ran for the whole task: tasks in between are not clean measurements
_NONE, _FULL = 0.02, 0.9
#: tasks shorter than this are not timed for slowdowns (timer and scheduling noise)
_MIN_SECONDS = 0.002


class _JobRecord:
    __slots__ = ("request", "kind", "devices", "submitted", "started", "finished", "waiter", "count",
                 "slowdowns", "spilled", "given_profile", "status", "secret")

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
        self.secret = secrets.token_hex(16)  # granted to the client that opens the job, nobody else


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

    name = protocol.PLUGIN_JOBS
    idempotent = True

    def __init__(self, policy: str | None = None, model: InterferenceModel | None = None,
                 topology: Topology | None = None, bottleneck_penalty: float | None = None) -> None:
        policy = policy or config.get("scheduling.sharing.policy", "gdask")
        if policy not in POLICIES:
            raise ValueError(f"unknown sharing policy {policy!r}; choose one of {sorted(POLICIES)}")
        self.policy = policy
        self.model = model or InterferenceModel()
        self.topology = topology
        self._given_topology = topology is not None
        self.bottleneck_penalty = float(bottleneck_penalty if bottleneck_penalty is not None
                                        else config.get("scheduling.sharing.bottleneck-penalty", 0.25))
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
        scheduler.handlers[protocol.HANDLER_JOB_OPEN] = self._handle_open
        scheduler.handlers[protocol.HANDLER_JOB_CLOSE] = self._handle_close
        scheduler.handlers[protocol.HANDLER_JOBS] = self._handle_jobs
        from gdask.scheduling._dashboard import register

        register(scheduler)  # the /gdask page of the dashboard

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
        return {ws.address: ws for ws in s.running if (ws.metrics or {}).get(protocol.METRIC_DEVICE)}

    def _refresh_devices(self) -> None:
        workers = self._device_workers()
        for addr, ws in workers.items():
            if addr not in self.ledger.devices:
                dev = ws.metrics[protocol.METRIC_DEVICE]
                speed = float(dev.get("speed") or 1.0)
                self.ledger.add_device(DeviceCapacity(addr, int(dev.get("memory") or 1), compute=speed,
                                                      bandwidth=speed))
        if not self._given_topology:
            self.topology = self._make_topology(workers)

    def _make_topology(self, workers: dict[str, Any]) -> Topology:
        nvml = {addr: (ws.metrics.get(protocol.METRIC_NVML) or {}) for addr, ws in workers.items()}
        hosts = {addr: ws.host for addr, ws in workers.items()}
        if any(v.get("topology") for v in nvml.values()):
            physical = {addr: int(ws.metrics[protocol.METRIC_DEVICE].get("physical", 0))
                        for addr, ws in workers.items()}
            details = {physical[a]: nvml[a] for a in workers}
            return Topology.from_nvml(details, devices=physical, hosts=hosts, default="socket")
        topo = Topology(default="network")
        addrs = sorted(workers)
        for i, a in enumerate(addrs):
            for b in addrs[i + 1:]:
                topo.set_link(a, b, "pcie-host" if hosts[a] == hosts[b] else "network")
        links = config.get("scheduling.sharing.links", None) or {}
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
                raise TimeoutError(f"job {name!r} waited {timeout} s for a device share (timeout=, default "
                                   f"gdask.timeouts.job-open) "
                                   f"(gpu={req.gpu:g}, memory={req.memory} bytes); running: "
                                   f"{[n for n, r in self.records.items() if r.status == 'running']}") from None
        return {"devices": rec.devices, "memory": req.memory, "waited": (rec.started or time.time()) - rec.submitted,
                "secret": rec.secret}

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
        """The devices a task may run on: its job's devices, or None (not a job task, or a task that
        names a job without its secret: it cannot claim the job's devices)."""
        ann = ts.annotations
        if not ann:
            return None
        name = ann.get(protocol.ANN_JOB)
        if name is None:
            return None
        rec = self.records.get(name)
        if rec is None or not rec.devices or ann.get(protocol.ANN_JOB_SECRET) != rec.secret:
            return None
        return set(rec.devices)

    # -- measurements -------------------------------------------------------------------------------
    def log_event(self, topic: str, msg: Any) -> None:
        if topic != protocol.EVENT_JOB_TASK or not isinstance(msg, dict):
            return
        try:
            self._measured(msg)
        except Exception:  # a bad measurement must never break the scheduler
            logger.exception("gdask-jobs: could not use a task measurement %r", msg)

    def _speed(self, worker: str) -> float:
        ws = self.scheduler.workers.get(worker) if self.scheduler is not None else None
        dev = ((ws.metrics or {}).get(protocol.METRIC_DEVICE) or {}) if ws is not None else {}
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
                "profiles": {k: {"compute": p.compute, "bandwidth": p.bandwidth}
                             for k, p in self.kind_profiles.items()}}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


