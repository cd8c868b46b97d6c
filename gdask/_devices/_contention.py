"""Emulated contention between kernels that share one emulated device.

A real GPU shared by several jobs slows each job's kernels down by how much compute (SMs) and
memory bandwidth the co-running kernels want. Emulated devices have no SMs, so the benchmarks of
device sharing run *emulated kernels*: a kernel is an amount of device time (``work`` seconds at
full speed, alone) and its demand ``(compute, bandwidth)``, the fractions of the device it keeps
busy alone. :class:`SharedClock` runs such kernels as GIL-free waits whose progress rate follows
the stated :class:`ContentionModel` while the set of running kernels changes (processor sharing).

It also keeps, per job, what NVML reports per process on a real GPU: time active, and compute and
bandwidth used (:meth:`SharedClock.usage`), from which jobs' profiles are measured. The
scheduler's interference model never sees :class:`ContentionModel`: it learns from measured
slowdowns.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Hashable, Sequence

__all__ = ["ContentionModel", "SharedClock"]

#: work (seconds) left at which a kernel counts as finished (rounding in its progress sums)
_DONE = 1e-12


def _demand(value: float, name: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"kernel {name} must be a number, got {value!r}") from e
    if not (math.isfinite(x) and 0 <= x <= 1):
        raise ValueError(f"kernel {name} must be a fraction of the device in [0, 1], got {value!r}")
    return x


@dataclass(frozen=True)
class ContentionModel:
    """How co-running kernels slow each other down on one emulated device (the stated model).

    Kernel ``k`` with demand ``(c_k, b_k)`` among kernels with total demand ``(C, B)`` (itself
    included) progresses at ``speed / s_k`` with::

        s_k = 1 + w_c * max(0, C - 1) + w_b * max(0, B - 1) + overhead * (n - 1)

    where ``w_c = c_k / (c_k + b_k)`` and ``w_b = b_k / (c_k + b_k)`` (how much the kernel depends
    on each resource) and ``n`` is the number of running kernels: over-subscribing a resource
    slows kernels in proportion to how much they need it, and every co-runner costs a little
    (caches, scheduling).

    Parameters
    ----------
    overhead : float
        Slowdown added per co-running kernel (default 0.04).
    """

    overhead: float = 0.04

    def __post_init__(self) -> None:
        if not (math.isfinite(self.overhead) and self.overhead >= 0):
            raise ValueError(f"overhead must be a finite number >= 0, got {self.overhead!r}")

    def slowdown(self, own: tuple[float, float], running: Sequence[tuple[float, float]]) -> float:
        """``s_k`` of a kernel with demand ``own`` while ``running`` (which includes it) run."""
        c, b = own
        cc = sum(d[0] for d in running)
        bb = sum(d[1] for d in running)
        s = c + b
        wc, wb = (c / s, b / s) if s > 0 else (0.5, 0.5)
        return 1.0 + wc * max(0.0, cc - 1.0) + wb * max(0.0, bb - 1.0) + self.overhead * max(0, len(running) - 1)


@dataclass
class _Kernel:
    job: Hashable
    compute: float
    bandwidth: float
    remaining: float
    slowdown: float = 1.0
    finished: float | None = None  # clock time the device finished it (its thread may wake up later)


@dataclass
class _Usage:
    active: float = 0.0  # seconds with at least one kernel of the job running
    kernel_seconds: float = 0.0  # sum over its kernels of their running time
    compute: float = 0.0  # device compute it got (fraction x seconds)
    bandwidth: float = 0.0  # device bandwidth it got (fraction x seconds)
    kernels: int = 0
    work: float = 0.0  # seconds of work done (full speed, alone)
    running: int = field(default=0, repr=False)


class SharedClock:
    """Runs emulated kernels on one device, slowed down by each other per a :class:`ContentionModel`.

    Thread-safe: kernels from different threads (streams, jobs) share the device.

    Parameters
    ----------
    model : ContentionModel, optional
    speed : float
        Relative speed of the device (work progresses at ``speed / slowdown``).

    Examples
    --------
    >>> clock = SharedClock()
    >>> round(clock.kernel(0.01, compute=0.5, bandwidth=0.2, job="a"), 2) >= 0.01
    True
    """

    def __init__(self, model: ContentionModel | None = None, speed: float = 1.0) -> None:
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be a finite number > 0, got {speed!r}")
        self.model = model or ContentionModel()
        self.speed = float(speed)
        self._cv = threading.Condition()
        self._running: dict[int, _Kernel] = {}
        self._ids = itertools.count()
        self._last = time.perf_counter()
        self._usage: dict[Hashable, _Usage] = {}
        self.busy = 0.0  # seconds with at least one kernel running

    # -- internals (hold self._cv) ----------------------------------------------------------------
    def _live(self) -> list[_Kernel]:
        return [k for k in self._running.values() if k.finished is None]

    def _advance(self, now: float) -> None:
        """Move the device's time to ``now``, event by event: a kernel finishes the moment its work is
        done (from then on it neither contends nor counts), not when its thread wakes up, so a busy
        host that wakes threads late changes no kernel's duration or usage."""
        while now > self._last:
            live = self._live()
            if not live:
                self._last = now
                return
            to_end = min(k.remaining * k.slowdown / self.speed for k in live)
            dt, at = (now - self._last, now) if now - self._last <= to_end else (to_end, self._last + to_end)
            self.busy += dt
            jobs = set()
            for k in live:
                done = dt * self.speed / k.slowdown
                k.remaining -= done
                u = self._usage[k.job]
                u.kernel_seconds += dt
                u.compute += dt * k.compute / k.slowdown
                u.bandwidth += dt * k.bandwidth / k.slowdown
                u.work += done
                jobs.add(k.job)
            for j in jobs:
                self._usage[j].active += dt
            self._last = at
            ended = [k for k in live if k.remaining <= _DONE]
            for k in ended:
                k.remaining = 0.0
                k.finished = self._last
            if ended:
                self._rates()  # the others speed up from here
            elif dt <= 0:
                return

    def _rates(self) -> None:
        live = self._live()
        demands = [(k.compute, k.bandwidth) for k in live]
        for k in live:
            k.slowdown = self.model.slowdown((k.compute, k.bandwidth), demands)

    # -- public -----------------------------------------------------------------------------------
    def kernel(self, work: float, compute: float, bandwidth: float, job: Hashable = None) -> float:
        """Run one kernel of ``work`` seconds (alone, at speed 1); returns the seconds it took on the
        device (the calling thread returns when it wakes up after that: later on a busy host).

        Parameters
        ----------
        work : float
            Device seconds the kernel needs alone on a speed-1 device.
        compute, bandwidth : float
            Fractions of the device's compute and memory bandwidth it keeps busy alone, in [0, 1].
        job : hashable, optional
            Whom its usage is counted for (:meth:`usage`).
        """
        work = float(work)
        if not (math.isfinite(work) and work >= 0):
            raise ValueError(f"kernel work must be a finite number of seconds >= 0, got {work!r}")
        k = _Kernel(job, _demand(compute, "compute"), _demand(bandwidth, "bandwidth"), work)
        with self._cv:
            self._advance(time.perf_counter())
            t0 = self._last  # the kernel starts on the device now
            kid = next(self._ids)
            self._running[kid] = k
            u = self._usage.setdefault(job, _Usage())
            u.kernels += 1
            self._rates()
            self._cv.notify_all()  # the others slow down: let them recompute their wake-up time
            try:
                while True:
                    self._advance(time.perf_counter())
                    if k.finished is not None:
                        break
                    self._cv.wait(timeout=k.remaining * k.slowdown / self.speed)
            finally:
                self._advance(time.perf_counter())
                del self._running[kid]
                self._rates()
                self._cv.notify_all()
        # the device's duration of the kernel (the thread returns when it wakes up, maybe later); a
        # kernel interrupted before its end (an exception in the wait) took until now
        return (k.finished if k.finished is not None else self._last) - t0

    def usage(self, job: Hashable = None) -> dict[str, float]:
        """What ``job`` used so far: ``active`` seconds (any of its kernels running),
        ``kernel_seconds``, ``compute`` and ``bandwidth`` (fraction of the device x seconds it
        got), ``work`` (seconds of full-speed work done) and ``kernels`` (count)."""
        with self._cv:
            self._advance(time.perf_counter())
            u = self._usage.get(job) or _Usage()
            return {"active": u.active, "kernel_seconds": u.kernel_seconds, "compute": u.compute,
                    "bandwidth": u.bandwidth, "work": u.work, "kernels": float(u.kernels)}

    @property
    def running(self) -> int:
        """Kernels running now (not finished on the device)."""
        with self._cv:
            self._advance(time.perf_counter())
            return len(self._live())
