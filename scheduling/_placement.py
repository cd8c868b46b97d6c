"""Placement policies: a learned task-duration model and earliest-finish-time device choice.

Pure objects: events (measured durations, assignments, finished tasks, devices joining or leaving)
in, decisions (a device, a predicted duration) out. No clocks, no I/O, no Dask: the scheduler plugin
(:mod:`gdask.scheduling._plugin`) is a thin adapter that feeds them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping

__all__ = ["DurationModel", "EarliestFinish", "size_bucket"]


def _units(nbytes: float) -> float:
    """What cells and work are per: the input bytes, or the task for a task without input."""
    return float(nbytes) if nbytes > 0 else 1.0


def size_bucket(nbytes: float) -> int:
    """Power-of-two size class of a task's input (0 for no input): tasks within 2x share estimates."""
    n = int(nbytes)
    return n.bit_length() if n > 0 else 0


class _Ewma:
    """Running mean for the first ``1 / alpha`` samples, exponential moving average afterwards."""

    __slots__ = ("value", "n")

    def __init__(self) -> None:
        self.value = 0.0
        self.n = 0

    def add(self, x: float, alpha: float) -> float:
        self.n += 1
        a = max(alpha, 1.0 / self.n)
        self.value += a * (x - self.value)
        return self.value


class _Ratio:
    """Ratio of two moving averages (work done / time taken): heavy tasks weigh more than light ones."""

    __slots__ = ("num", "den", "n")

    def __init__(self) -> None:
        self.num = self.den = 0.0
        self.n = 0

    def add(self, num: float, den: float, alpha: float) -> None:
        self.n += 1
        a = max(alpha, 1.0 / self.n)
        self.num += a * (num - self.num)
        self.den += a * (den - self.den)

    @property
    def value(self) -> float:
        return self.num / self.den if self.den > 0 else 0.0


class DurationModel:
    """Task durations learned per (task kind, input size class, device).

    The model is ``duration = work(kind, size) / speed(device)``, plus an exact per-cell moving
    average once a (kind, size class, device) cell has been measured. ``speed`` is each device's
    throughput relative to the others (learned from the same measurements, seeded by an optional
    prior such as a configured speed); ``work`` is the duration of a kind at speed 1. The factorised
    part predicts cells never measured (a kind seen only on a fast device, a new block size).

    Parameters
    ----------
    alpha : float
        Weight of the newest measurement in the moving averages, in (0, 1].
    default : float
        Predicted seconds for a kind never measured at all.
    warmup : int
        Measurements of each (kind, device) pair to ignore first: the first run of a kind in a
        worker pays imports and JIT compilation, which is not the device's speed.
    min_speed_seconds : float
        Tasks shorter than this, or of a kind expected to be shorter than this on the fastest
        device, do not update device speeds: their time is scheduling overhead and noise more than
        device work.

    Examples
    --------
    >>> m = DurationModel()
    >>> m.observe("kernel", 1 << 20, "a", 1.0)
    >>> m.observe("kernel", 1 << 20, "b", 4.0)
    >>> round(m.predict("kernel", 1 << 20, "b"), 3)
    4.0
    >>> round(m.relative_speeds()["b"], 2)
    0.25
    """

    def __init__(self, alpha: float = 0.3, default: float = 0.01, warmup: int = 0,
                 min_speed_seconds: float = 0.0) -> None:
        self.min_speed_seconds = float(min_speed_seconds)
        if not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
        self.warmup = warmup
        self._warm: dict[tuple[Hashable, Hashable], int] = {}
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if not default >= 0:
            raise ValueError(f"default must be >= 0 seconds, got {default!r}")
        self.alpha = float(alpha)
        self.default = float(default)
        self._cells: dict[tuple[Hashable, int, Hashable], _Ewma] = {}
        self._work: dict[tuple[Hashable, int], _Ewma] = {}
        self._kind_buckets: dict[Hashable, set[int]] = {}
        self._speed: dict[Hashable, _Ratio] = {}
        self._prior: dict[Hashable, float] = {}
        self._out_bytes: dict[Hashable, _Ewma] = {}
        self._spb = _Ewma()  # seconds per input byte at speed 1, over all kinds
        self._seen: dict[Hashable, None] = {}  # devices in order of appearance

    # -- events ---------------------------------------------------------------------------------
    def set_prior(self, device: Hashable, speed: float) -> None:
        """Speed to assume for ``device`` before it has been measured (e.g. its configured speed)."""
        if not speed > 0:
            raise ValueError(f"prior speed must be > 0, got {speed!r}")
        self._prior[device] = float(speed)
        self._seen.setdefault(device, None)

    def forget_device(self, device: Hashable) -> None:
        """Drop what was learned about a device that left."""
        self._speed.pop(device, None)
        self._prior.pop(device, None)
        self._seen.pop(device, None)
        for cell in [c for c in self._cells if c[2] == device]:
            del self._cells[cell]
        for pair in [p for p in self._warm if p[1] == device]:
            del self._warm[pair]

    def observe(self, kind: Hashable, nbytes: float, device: Hashable, seconds: float,
                out_nbytes: float | None = None) -> None:
        """Record that a task of ``kind`` with ``nbytes`` of input ran ``seconds`` on ``device``."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
        b = size_bucket(nbytes)
        u = _units(nbytes)  # cells hold seconds per input byte
        self._seen.setdefault(device, None)
        if self.warmup:
            seen = self._warm.get((kind, device), 0)
            if seen < self.warmup:
                self._warm[(kind, device)] = seen + 1
                return
        cell = self._cells.get((kind, b, device))
        if cell is None:
            cell = self._cells[(kind, b, device)] = _Ewma()
            self._kind_buckets.setdefault(kind, set()).add(b)
        cell.add(seconds / u, self.alpha)
        if out_nbytes is not None:
            self._out_bytes.setdefault(kind, _Ewma()).add(float(out_nbytes), self.alpha)
        if seconds <= 0:
            return
        work = self._work.get((kind, b))
        if work is None:
            work = self._work[(kind, b)] = _Ewma()
        elif work.value > 0 and seconds >= self.min_speed_seconds and self._heavy(work.value * u):
            # speed = work done / time taken, with work as learned so far for this kind and size
            sp = self._speed.get(device)
            if sp is None:
                sp = self._speed[device] = _Ratio()
            sp.add(work.value * u, seconds, self.alpha)
        w = work.add(seconds * self.speed(device) / u, self.alpha)
        if nbytes > 0:
            self._spb.add(w, self.alpha)

    def _heavy(self, work: float) -> bool:
        """Whether a task of ``work`` (seconds at speed 1) is expected to take ``min_speed_seconds``
        even on the fastest device: only such tasks measure speeds. A light task that happened to
        take long (the process was preempted, a garbage collection ran) is an outlier, not a slow
        device, and one outlier would otherwise move the device's speed by ``alpha``."""
        if not self.min_speed_seconds:
            return True
        top = max((self.speed(d) for d in self._seen), default=1.0)
        return work >= self.min_speed_seconds * top

    # -- decisions ------------------------------------------------------------------------------
    def speed(self, device: Hashable) -> float:
        """Learned relative speed of ``device`` (its prior, or 1.0, until measured)."""
        sp = self._speed.get(device)
        if sp is not None and sp.value > 0:
            return sp.value
        return self._prior.get(device, 1.0)

    def relative_speeds(self, devices: Iterable[Hashable] | None = None) -> dict[Hashable, float]:
        """Speeds normalised so that the fastest of ``devices`` (default: all known) is 1.0."""
        devs = list(devices) if devices is not None else list(self._seen)
        raw = {d: self.speed(d) for d in devs}
        top = max(raw.values(), default=1.0) or 1.0
        return {d: s / top for d, s in raw.items()}

    def known(self, kind: Hashable) -> bool:
        """Whether tasks of ``kind`` have been measured (on any device)."""
        return kind in self._kind_buckets

    def measured(self, device: Hashable) -> bool:
        """Whether ``device``'s speed comes from measurements (not only a prior)."""
        sp = self._speed.get(device)
        return sp is not None and sp.value > 0

    def work(self, kind: Hashable, nbytes: float) -> float:
        """Seconds a task of ``kind`` takes at speed 1 (nearest size class scaled by size)."""
        b = size_bucket(nbytes)
        u = _units(nbytes)
        w = self._work.get((kind, b))
        if w is not None:
            return w.value * u
        buckets = self._kind_buckets.get(kind)
        if buckets:
            near = min(buckets, key=lambda x: (abs(x - b), x))
            w = self._work.get((kind, near))
            if w is not None:
                if near == 0:  # measured only without input bytes: seconds per task
                    return w.value
                return w.value * (u if b else 2.0 ** (near - 1))
            # measured, but only with zero duration
            return 0.0
        return self.default

    def predict(self, kind: Hashable, nbytes: float, device: Hashable) -> float:
        """Predicted seconds for a task of ``kind`` with ``nbytes`` of input on ``device``."""
        cell = self._cells.get((kind, size_bucket(nbytes), device))
        if cell is not None:
            return cell.value * _units(nbytes)
        return self.work(kind, nbytes) / self.speed(device)

    def output_nbytes(self, kind: Hashable, default: float = 0.0) -> float:
        """Average result size measured for ``kind``."""
        e = self._out_bytes.get(kind)
        return e.value if e is not None else default

    def seconds_per_byte(self) -> float | None:
        """Average compute seconds per input byte at speed 1 over every kind measured (None: none)."""
        return self._spb.value if self._spb.n else None


@dataclass
class _Device:
    streams: int = 1
    backlog: float = 0.0  # predicted seconds of work assigned and not finished
    memory_free: float = math.inf
    tasks: int = 0


class EarliestFinish:
    """Choose the device on which a task is predicted to finish first.

    ``finish(d) = max(backlog(d) / streams(d), ready + latency + missing_input_bytes(d) / bandwidth)
    + duration(d)`` (``latency`` only when something must be fetched),
    where ``backlog`` is the predicted work already assigned to ``d`` and not finished, and
    ``duration`` comes from the :class:`DurationModel`. Devices whose free memory cannot hold the
    task's missing inputs are skipped (unless none can, then the one with most free memory wins).
    Ties go to the device holding most of the inputs, then to the earliest-added device.

    Parameters
    ----------
    model : DurationModel
    bandwidth : float
        Bytes per second for moving an input between devices (> 0).
    latency : float
        Seconds a task pays to fetch any input from another device (round trips, serialisation).
    """

    def __init__(self, model: DurationModel, bandwidth: float, latency: float = 0.0) -> None:
        if not bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
        if not latency >= 0:
            raise ValueError(f"latency must be >= 0 seconds, got {latency!r}")
        self.model = model
        self.bandwidth = float(bandwidth)
        self.latency = float(latency)
        self.devices: dict[Hashable, _Device] = {}
        self._assigned: dict[Hashable, tuple[Hashable, float]] = {}

    # -- events ---------------------------------------------------------------------------------
    def add_device(self, device: Hashable, streams: int = 1, memory_free: float | None = None) -> None:
        if streams < 1:
            raise ValueError(f"streams must be >= 1, got {streams!r}")
        d = self.devices.setdefault(device, _Device())
        d.streams = int(streams)
        if memory_free is not None:
            d.memory_free = float(memory_free)

    def set_memory_free(self, device: Hashable, nbytes: float) -> None:
        if device in self.devices:
            self.devices[device].memory_free = float(nbytes)

    def remove_device(self, device: Hashable) -> list[Hashable]:
        """Forget a device; returns the tasks that were assigned to it and not finished."""
        self.devices.pop(device, None)
        lost = [k for k, (d, _) in self._assigned.items() if d == device]
        for k in lost:
            del self._assigned[k]
        return lost

    def assign(self, task: Hashable, device: Hashable, predicted: float) -> None:
        """Record that ``task`` was put on ``device`` with ``predicted`` seconds of work."""
        self.finished(task)
        dev = self.devices.get(device)
        if dev is None:
            return
        dev.backlog += predicted
        dev.tasks += 1
        self._assigned[task] = (device, predicted)

    def finished(self, task: Hashable) -> Hashable | None:
        """``task`` left its device (done, failed or released); returns that device."""
        rec = self._assigned.pop(task, None)
        if rec is None:
            return None
        device, predicted = rec
        dev = self.devices.get(device)
        if dev is not None:
            dev.backlog = max(0.0, dev.backlog - predicted)
            dev.tasks -= 1
        return device

    def outstanding(self) -> int:
        """Number of assigned tasks not finished."""
        return len(self._assigned)

    def assigned_device(self, task: Hashable) -> Hashable | None:
        rec = self._assigned.get(task)
        return None if rec is None else rec[0]

    # -- decisions ------------------------------------------------------------------------------
    def finish_time(self, device: Hashable, kind: Hashable, nbytes: float,
                    local_bytes: Mapping[Hashable, float] | None = None, ready: float = 0.0) -> float:
        """Predicted finish time (seconds from now) of the task on ``device``.

        The task starts when the device has worked off its backlog and its inputs have arrived
        (``ready``, when the last input is predicted to exist, plus the transfer of what is missing).
        """
        dev = self.devices[device]
        missing = max(0.0, nbytes - (local_bytes or {}).get(device, 0.0))
        fetch = self.latency + missing / self.bandwidth if missing > 0 else 0.0
        start = max(dev.backlog / dev.streams, ready + fetch)
        return start + self.model.predict(kind, nbytes, device)

    def choose(self, kind: Hashable, nbytes: float, local_bytes: Mapping[Hashable, float] | None = None,
               candidates: Iterable[Hashable] | None = None, ready: float = 0.0) -> tuple[Hashable, float]:
        """Device with the earliest predicted finish; returns ``(device, predicted duration)``.

        Parameters
        ----------
        kind : hashable
            Task kind (e.g. the key prefix).
        nbytes : float
            Total input bytes of the task.
        local_bytes : mapping, optional
            Device -> input bytes already held there.
        candidates : iterable, optional
            Devices allowed (default: all).
        ready : float
            Seconds from now until the task's last input is predicted to exist.

        Raises
        ------
        ValueError
            No device is known (or none of ``candidates`` is).
        """
        local = local_bytes or {}
        devs = [d for d in (self.devices if candidates is None else candidates) if d in self.devices]
        if not devs:
            raise ValueError("EarliestFinish has no device to place on; add_device() first")
        fits = [d for d in devs if self.devices[d].memory_free >= nbytes - local.get(d, 0.0)]
        if not fits:
            fits = [max(devs, key=lambda d: self.devices[d].memory_free)]
        order = {d: i for i, d in enumerate(self.devices)}
        best = min(fits, key=lambda d: (self.finish_time(d, kind, nbytes, local, ready), -local.get(d, 0.0), order[d]))
        return best, self.model.predict(kind, nbytes, best)

    def snapshot(self) -> dict[Hashable, dict[str, Any]]:
        """Per device: backlog seconds, outstanding tasks, streams, free memory."""
        return {d: {"backlog": v.backlog, "queued": v.tasks, "streams": v.streams,
                    "memory_free": v.memory_free} for d, v in self.devices.items()}
