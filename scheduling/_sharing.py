"""Fine-grained device sharing: job requests, the share ledger and multi-dimensional placement.

Pure objects: requests, grants and memory charges in; decisions (a device, bytes to spill) out.
No clocks, no I/O, no Dask: the ``gdask.job`` context manager and the scheduler plugin are thin
adapters that feed them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

from gdask.devices import parse_size
from gdask.scheduling._interference import InterferenceModel, JobProfile
from gdask.scheduling._topology import Topology

__all__ = [
    "DeviceCapacity", "JobRequest", "device_score", "Placement", "ShareError", "ShareExceededError", "ShareLedger",
    "first_fit", "jobs_table", "place", "whole_device",
]


class ShareError(RuntimeError):
    """A request to the share ledger is inconsistent (unknown job or device, duplicate grant)."""


class ShareExceededError(ShareError):
    """Granting a job would exceed a device's compute fraction or memory.

    Attributes
    ----------
    resource : {"gpu", "memory"}
    device, job : the device and job name
    requested, available : float
        Fraction of the device (``gpu``) or bytes (``memory``).
    """

    def __init__(self, resource: str, device: Hashable, job: str, requested: float, available: float) -> None:
        self.resource, self.device, self.job = resource, device, job
        self.requested, self.available = requested, available
        unit = "of the device" if resource == "gpu" else "bytes"
        super().__init__(f"job {job!r} asks for {requested:g} {unit} of {resource} on device {device!r}, "
                         f"only {available:g} are free: wait for a job to finish, ask for less, or place it "
                         "on another device")


@dataclass(frozen=True)
class JobRequest:
    """What a job asks for on each device it runs on.

    Parameters
    ----------
    name : str
        Unique job name (e.g. ``"tuning-3"``).
    gpu : float
        Fraction of a device, in (0, 1].
    memory : int or str
        Device memory in bytes, or a string such as ``"4GiB"``.
    profile : JobProfile, optional
        What the job uses of a device alone (measured). Default: its request, i.e. compute and
        bandwidth ``gpu`` (see :meth:`ShareLedger.profile`).

    Examples
    --------
    >>> JobRequest("tuning-3", gpu=0.25, memory="4GiB").memory
    4294967296
    """

    name: str
    gpu: float
    memory: int | str
    profile: JobProfile | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a job name must be a non-empty string, got {self.name!r}")
        try:
            gpu = float(self.gpu)
        except (TypeError, ValueError) as e:
            raise TypeError(f"job {self.name!r}: gpu must be a fraction of a device in (0, 1], got {self.gpu!r}") from e
        if not 0 < gpu <= 1:
            raise ValueError(f"job {self.name!r}: gpu must be a fraction of a device in (0, 1], got {self.gpu!r} "
                             "(use several jobs or one device per task for more than one device)")
        object.__setattr__(self, "gpu", gpu)
        object.__setattr__(self, "memory", parse_size(self.memory, name=f"job {self.name!r} memory"))
        if self.profile is not None and not isinstance(self.profile, JobProfile):
            raise TypeError(f"job {self.name!r}: profile must be a JobProfile, got {type(self.profile).__name__}")


@dataclass(frozen=True)
class DeviceCapacity:
    """What one device offers to the jobs that share it.

    Parameters
    ----------
    device : hashable
        Device name (worker address, logical device index, ...).
    memory : int or str
        Device memory in bytes, or a string such as ``"80GiB"``.
    compute, bandwidth : float
        Relative compute throughput and memory bandwidth (1.0 = the device job profiles refer to).
    """

    device: Hashable
    memory: int | str
    compute: float = 1.0
    bandwidth: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory", parse_size(self.memory, name=f"device {self.device!r} memory"))
        for name in ("compute", "bandwidth"):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"device {self.device!r}: {name} must be a finite number > 0, "
                                 f"got {getattr(self, name)!r}")
            object.__setattr__(self, name, v)


@dataclass
class _DeviceState:
    capacity: DeviceCapacity
    jobs: dict[str, None] = field(default_factory=dict)  # in grant order
    gpu: float = 0.0
    memory: int = 0


_EPS = 1e-9


class ShareLedger:
    """Per device, the jobs granted on it, their fractions and memory; per job, its resident bytes.

    The sum of granted fractions and of granted memory never exceeds a device's capacity, so a job
    that stays within its memory request cannot be pushed out by another. :meth:`charge` tells
    how many bytes of *that* job must be spilled when it exceeds its own request.

    Parameters
    ----------
    devices : iterable of DeviceCapacity

    Examples
    --------
    >>> ledger = ShareLedger([DeviceCapacity("gpu0", "8GiB")])
    >>> job = JobRequest("a", gpu=0.5, memory="1GiB")
    >>> ledger.grant(job, "gpu0")
    >>> ledger.charge("a", 2**30 + 100)   # 100 bytes over its request: spill 100 bytes of job a
    100
    """

    def __init__(self, devices: Iterable[DeviceCapacity] = ()) -> None:
        self._devices: dict[Hashable, _DeviceState] = {}
        self._requests: dict[str, JobRequest] = {}
        self._placed: dict[str, dict[Hashable, None]] = {}
        self._used: dict[str, dict[Hashable, int]] = {}
        self._profiles: dict[str, JobProfile] = {}
        for cap in devices:
            self.add_device(cap)

    # -- devices --------------------------------------------------------------------------------
    def add_device(self, capacity: DeviceCapacity) -> None:
        if not isinstance(capacity, DeviceCapacity):
            raise TypeError(f"add_device takes a DeviceCapacity, got {type(capacity).__name__}")
        if capacity.device in self._devices:
            raise ShareError(f"device {capacity.device!r} is already in the ledger")
        self._devices[capacity.device] = _DeviceState(capacity)

    def remove_device(self, device: Hashable) -> list[str]:
        """Forget a device that left; returns the jobs that had a grant on it (now released there)."""
        st = self._state(device)
        lost = list(st.jobs)
        for name in lost:
            self._placed[name].pop(device, None)
            self._used[name].pop(device, None)
            if not self._placed[name]:
                self._forget(name)
        del self._devices[device]
        return lost

    @property
    def devices(self) -> list[Hashable]:
        return list(self._devices)

    def capacity(self, device: Hashable) -> DeviceCapacity:
        return self._state(device).capacity

    def _state(self, device: Hashable) -> _DeviceState:
        try:
            return self._devices[device]
        except KeyError:
            raise ShareError(f"unknown device {device!r}; known: {list(self._devices)}") from None

    # -- jobs -----------------------------------------------------------------------------------
    def _name(self, job: JobRequest | str) -> str:
        name = job.name if isinstance(job, JobRequest) else job
        if name not in self._requests:
            raise ShareError(f"job {name!r} has no grant; grant it a device first")
        return name

    def free(self, device: Hashable) -> tuple[float, int]:
        """``(fraction, bytes)`` of ``device`` not granted to any job."""
        st = self._state(device)
        return max(0.0, 1.0 - st.gpu), st.capacity.memory - st.memory

    def fits(self, job: JobRequest, device: Hashable) -> bool:
        """Whether ``job`` can be granted on ``device`` now."""
        gpu, mem = self.free(device)
        return job.gpu <= gpu + _EPS and job.memory <= mem and device not in self._placed.get(job.name, {})

    def grant(self, job: JobRequest, device: Hashable) -> None:
        """Reserve ``job.gpu`` of ``device`` and ``job.memory`` bytes on it.

        Raises
        ------
        ShareExceededError
            If the device's free fraction or memory is too small.
        ShareError
            For an unknown device, a job already granted on this device, or another request with
            the same job name.
        """
        if not isinstance(job, JobRequest):
            raise TypeError(f"grant takes a JobRequest, got {type(job).__name__}")
        st = self._state(device)
        known = self._requests.get(job.name)
        if known is not None and known != job:
            raise ShareError(f"job name {job.name!r} is already used by another request ({known}); "
                             "names must be unique")
        if device in self._placed.get(job.name, {}):
            raise ShareError(f"job {job.name!r} already has a grant on device {device!r}")
        gpu, mem = self.free(device)
        if job.gpu > gpu + _EPS:
            raise ShareExceededError("gpu", device, job.name, job.gpu, gpu)
        if job.memory > mem:
            raise ShareExceededError("memory", device, job.name, job.memory, mem)
        st.jobs[job.name] = None
        st.gpu += job.gpu
        st.memory += job.memory
        self._requests[job.name] = job
        self._placed.setdefault(job.name, {})[device] = None
        self._used.setdefault(job.name, {})[device] = 0

    def release(self, job: JobRequest | str) -> list[Hashable]:
        """Free all of a job's grants; returns the devices it held."""
        name = self._name(job)
        devices = list(self._placed[name])
        self._forget(name)
        return devices

    def _forget(self, name: str) -> None:
        req = self._requests.pop(name)
        for device in self._placed.pop(name):
            st = self._devices[device]
            del st.jobs[name]
            st.gpu = max(0.0, st.gpu - req.gpu)
            st.memory -= req.memory
        self._used.pop(name, None)
        self._profiles.pop(name, None)

    def _device_of(self, name: str, device: Hashable | None) -> Hashable:
        placed = self._placed[name]
        if device is None:
            if len(placed) != 1:
                raise ShareError(f"job {name!r} runs on {len(placed)} devices: say which one is charged")
            return next(iter(placed))
        if device not in placed:
            raise ShareError(f"job {name!r} has no grant on device {device!r} (it has {list(placed)})")
        return device

    def charge(self, job: JobRequest | str, nbytes: int, device: Hashable | None = None) -> int:
        """Count ``nbytes`` more of ``job``'s blocks resident on ``device``.

        Returns
        -------
        int
            Bytes of *this job's* blocks the caller must spill to stay within its memory request
            (0 when it fits). The ledger assumes they are spilled: the job's resident bytes stay at
            most its request. Other jobs are never charged.
        """
        name = self._name(job)
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes!r}; use uncharge() for freed blocks")
        device = self._device_of(name, device)
        used = self._used[name][device] + int(nbytes)
        limit = self._requests[name].memory
        spill = max(0, used - limit)
        self._used[name][device] = used - spill
        return spill

    def uncharge(self, job: JobRequest | str, nbytes: int, device: Hashable | None = None) -> None:
        """Count ``nbytes`` of ``job``'s blocks as freed (deleted or spilled) on ``device``."""
        name = self._name(job)
        device = self._device_of(name, device)
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
        self._used[name][device] = max(0, self._used[name][device] - int(nbytes))

    # -- queries --------------------------------------------------------------------------------
    @property
    def jobs(self) -> list[str]:
        """Names of the jobs holding grants, in grant order."""
        return list(self._requests)

    def request(self, job: str) -> JobRequest:
        return self._requests[self._name(job)]

    def devices_of(self, job: JobRequest | str) -> list[Hashable]:
        return list(self._placed[self._name(job)])

    def used(self, job: JobRequest | str) -> dict[Hashable, int]:
        """Resident bytes of ``job`` per device."""
        return dict(self._used[self._name(job)])

    def jobs_on(self, device: Hashable) -> list[str]:
        return list(self._state(device).jobs)

    def set_profile(self, job: JobRequest | str, profile: JobProfile) -> None:
        """Record a measured profile for a granted job (it replaces the request's profile)."""
        if not isinstance(profile, JobProfile):
            raise TypeError(f"profile must be a JobProfile, got {type(profile).__name__}")
        self._profiles[self._name(job)] = profile

    def profile(self, job: JobRequest | str, device: Hashable | None = None) -> JobProfile:
        """The job's profile (measured, else the request's, else its fraction for compute and
        bandwidth), scaled to ``device``'s capacities when given (memory: the request's share of
        the device's memory)."""
        if isinstance(job, JobRequest):
            req = self._requests.get(job.name, job)
        else:
            req = self._requests[self._name(job)]
        prof = self._profiles.get(req.name) or req.profile
        if prof is None:
            prof = JobProfile(compute=req.gpu, bandwidth=req.gpu)
        if device is None:
            return prof
        cap = self._state(device).capacity
        # on a device, a job's memory is its reservation there
        return JobProfile(prof.compute / cap.compute, prof.bandwidth / cap.bandwidth, req.memory / cap.memory)


# -- placement ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """A placement decision: ``devices`` (empty when the job must wait) and each candidate's score
    (lower is better; devices the job does not fit on are absent)."""

    job: str
    devices: tuple
    scores: dict = field(default_factory=dict)

    @property
    def device(self) -> Hashable | None:
        """The (first) chosen device, or None when the job must queue."""
        return self.devices[0] if self.devices else None


Policy = Callable[..., Placement]


def _candidates(job: JobRequest, devices: Sequence[Hashable] | None, ledger: ShareLedger) -> list[Hashable]:
    devs = ledger.devices if devices is None else list(devices)
    return [d for d in devs if ledger.fits(job, d)]


def device_score(job: JobRequest, device: Hashable, ledger: ShareLedger, model: InterferenceModel | None = None,
                 bottleneck_penalty: float = 0.25) -> float:
    """Score of putting ``job`` on ``device`` (lower is better).

    ``max(u_compute, u_bandwidth, u_memory)`` of the device after adding the job (each the sum of
    the jobs' demands over the device's capacity), plus the predicted slowdown cost: the job's
    predicted slowdown minus 1 plus the increase of each co-runner's, plus ``bottleneck_penalty``
    per co-runner with the same bottleneck resource (compute or bandwidth) as the job.
    """
    cap = ledger.capacity(device)
    others = ledger.jobs_on(device)
    own = ledger.profile(job, device)
    profs = [ledger.profile(o, device) for o in others]
    u_c = own.compute + sum(p.compute for p in profs)
    u_b = own.bandwidth + sum(p.bandwidth for p in profs)
    u_m = (job.memory + sum(ledger.request(o).memory for o in others)) / cap.memory
    score = max(u_c, u_b, u_m)
    if model is not None:
        score += model.predict(own, profs) - 1.0
        for i, p in enumerate(profs):
            rest = profs[:i] + profs[i + 1:]
            score += model.predict(p, rest + [own]) - model.predict(p, rest)
    score += bottleneck_penalty * sum(p.bottleneck == own.bottleneck for p in profs)
    return float(score)


def place(job: JobRequest, devices: Sequence[Hashable] | None, ledger: ShareLedger,
          model: InterferenceModel | None = None, count: int = 1, topology: Topology | None = None,
          bottleneck_penalty: float = 0.25) -> Placement:
    """Interference-aware, multi-dimensional placement: the device(s) with the lowest
    :func:`device_score` among those the job fits on. Does not grant (call
    :meth:`ShareLedger.grant` for each chosen device).

    Parameters
    ----------
    job : JobRequest
    devices : sequence or None
        Candidate devices (None: all devices of the ledger). Ties go to the earliest.
    ledger : ShareLedger
    model : InterferenceModel, optional
        Predicts slowdowns; without it only utilisation and the bottleneck penalty count.
    count : int
        Devices the job needs (tasks that exchange data); with ``topology``, the group with the
        best worst link among fitting devices, ties to the lowest total score.
    topology : Topology, optional
    bottleneck_penalty : float
        Score added per co-runner with the same bottleneck.

    Returns
    -------
    Placement
        ``devices`` is empty when fewer than ``count`` devices can take the job now.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count!r}")
    cands = _candidates(job, devices, ledger)
    scores = {d: device_score(job, d, ledger, model, bottleneck_penalty) for d in cands}
    if len(cands) < count:
        return Placement(job.name, (), scores)
    ranked = sorted(cands, key=lambda d: scores[d])  # stable: ties keep candidate order
    if count == 1 or topology is None:
        return Placement(job.name, tuple(ranked[:count]), scores)
    return Placement(job.name, topology.best_group(ranked, count, load=scores), scores)


def first_fit(job: JobRequest, devices: Sequence[Hashable] | None, ledger: ShareLedger,
              model: InterferenceModel | None = None, count: int = 1, topology: Topology | None = None) -> Placement:
    """Naive packing baseline: the first device(s) the job fits on (``model`` and ``topology`` are
    ignored; same interface as :func:`place`). Scores are the device's granted fraction."""
    cands = _candidates(job, devices, ledger)
    scores = {d: 1.0 - ledger.free(d)[0] for d in cands}
    return Placement(job.name, tuple(cands[:count]) if len(cands) >= count else (), scores)


def whole_device(job: JobRequest, devices: Sequence[Hashable] | None, ledger: ShareLedger,
                 model: InterferenceModel | None = None, count: int = 1,
                 topology: Topology | None = None) -> Placement:
    """Whole-device baseline: one job per device; ``devices`` is empty (the job queues) when no
    device is idle. Same interface as :func:`place`; scores are 0 for idle devices."""
    devs = ledger.devices if devices is None else list(devices)
    idle = [d for d in devs if not ledger.jobs_on(d) and ledger.fits(job, d)]
    return Placement(job.name, tuple(idle[:count]) if len(idle) >= count else (), {d: 0.0 for d in idle})


# -- report ---------------------------------------------------------------------------------------
def jobs_table(ledger: ShareLedger, model: InterferenceModel | None = None,
               measured: Mapping[str, float] | None = None) -> Any:
    """One row per granted job: devices, share, memory, predicted and measured slowdown.

    Parameters
    ----------
    ledger : ShareLedger
    model : InterferenceModel, optional
        Without it the predicted slowdown is missing (NaN).
    measured : mapping, optional
        ``{job name: measured slowdown}`` (NaN for jobs not in it).

    Returns
    -------
    pandas.DataFrame
        Indexed by ``job``; columns ``devices`` (list), ``share`` (fraction per device),
        ``memory`` (requested bytes per device), ``memory_used`` (resident bytes, all devices),
        ``bottleneck``, ``co_runners``, ``predicted_slowdown`` (worst over its devices),
        ``measured_slowdown``.
    """
    import pandas as pd

    measured = measured or {}
    rows = []
    for name in ledger.jobs:
        req = ledger.request(name)
        devs = ledger.devices_of(name)
        co = sorted({o for d in devs for o in ledger.jobs_on(d) if o != name})
        pred = math.nan
        if model is not None:
            pred = max(model.predict(ledger.profile(name, d), [ledger.profile(o, d) for o in ledger.jobs_on(d)
                                                                 if o != name]) for d in devs)
        rows.append({
            "job": name, "devices": devs, "share": req.gpu, "memory": req.memory,
            "memory_used": sum(ledger.used(name).values()), "bottleneck": ledger.profile(name).bottleneck,
            "co_runners": co, "predicted_slowdown": pred,
            "measured_slowdown": float(measured.get(name, math.nan)),
        })
    columns = ["job", "devices", "share", "memory", "memory_used", "bottleneck", "co_runners",
               "predicted_slowdown", "measured_slowdown"]
    return pd.DataFrame(rows, columns=columns).set_index("job")
