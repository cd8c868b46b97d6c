"""Worker side of device sharing: the ``gdask-job-monitor`` plugin (:class:`JobMonitor`).

It measures every job task (duration, which other jobs ran on the device meanwhile and for how
long, the device's per-job usage where the device reports it) and reports it to the scheduler as a
``gdask-job-task`` event. It also enforces memory requests: when a job's blocks on the device exceed
its request, *that job's* blocks are moved to the host tier of the window cache, and while a job
is within its request no other job's allocations evict its blocks (the window store does both,
told the job of each block and the jobs' requests by this plugin). A task that names a job without
the secret the scheduler granted it is not that job's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any

from dask.utils import key_split
from distributed import WorkerPlugin

from gdask import protocol

logger = logging.getLogger("gdask.scheduling")

__all__ = ["JobMonitor", "set_limit"]


class JobMonitor(WorkerPlugin):
    """Measures job tasks on a worker and enforces the jobs' memory requests there.

    For every finished task of a job (annotated ``gdask_job``) it sends a ``gdask-job-task`` event:
    its duration, the fraction of that time each other job had tasks running on this worker, the
    device's usage counters for the job over the task (emulated devices report them) and the
    bytes of the job's blocks spilled so far. A job whose blocks on the device exceed its memory
    request has its own oldest blocks moved to the host tier (``worker.data.spill``).
    """

    name = protocol.PLUGIN_JOB_MONITOR
    idempotent = True

    def __init__(self) -> None:
        self.limits: dict[str, int] = {}
        self.secrets: dict[str, str] = {}  # jobs with a request on this worker -> their secret
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
        if hasattr(worker.data, "job_of"):  # the window store: it enforces requests and protects jobs' blocks
            worker.data.job_of = self.job_name

    def _job_of(self, key: Any) -> tuple[str | None, str | None]:
        ts = self.worker.state.tasks.get(key) if self.worker is not None else None
        ann = (ts.annotations or {}) if ts is not None else {}
        job = ann.get(protocol.ANN_JOB)
        if job is not None and job in self.secrets and ann.get(protocol.ANN_JOB_SECRET) != self.secrets[job]:
            return None, None  # names the job without its secret: not the job's
        return job, ann.get(protocol.ANN_JOB_KIND)

    def job_name(self, key: Any) -> str | None:
        """The job of the task (or block) ``key`` on this worker, or None."""
        return self._job_of(key)[0]

    def _store(self) -> Any:
        """The worker's data store when it enforces job requests itself (the window store)."""
        data = getattr(self.worker, "data", None)
        return data if hasattr(data, "set_job_limit") else None

    def _usage(self, job: str) -> dict[str, float] | None:
        plugin = self.worker.plugins.get(protocol.PLUGIN_DEVICE) if self.worker is not None else None
        dev = getattr(plugin, "device", None)
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
               "spilled": self.spilled_bytes(job), "resident": self.usage(job)}
        usage1 = self._usage(job) if usage0 is not None else None
        if usage0 is not None and usage1 is not None:
            msg["usage"] = {k: usage1[k] - usage0[k] for k in ("active", "compute", "bandwidth")}
        try:
            self.worker.log_event(protocol.EVENT_JOB_TASK, msg)
        except Exception:  # pragma: no cover - reporting is best effort
            logger.debug("gdask-jobs: could not report %r", key, exc_info=True)

    def spilled_bytes(self, job: str) -> int:
        """Bytes of ``job``'s blocks moved to the host to keep it within its request so far."""
        store = self._store()
        return self.spilled.get(job, 0) + (store.job_spilled.get(job, 0) if store is not None else 0)

    def _enforce(self, job: str) -> None:
        if self._store() is not None:
            return  # the window store enforces the request as the job's blocks arrive
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
        store = self._store()
        if store is not None:
            return store.job_usage(job)
        size = getattr(getattr(self.worker, "data", None), "device_bytes", None)
        return sum(size(k) for k in self._keys.get(job, ())) if size is not None else 0


def set_limit(name: str, nbytes: int | None, secret: str | None = None, dask_worker: Any = None) -> bool:
    """(on a worker, through ``client.run``) Set or clear (``None``) the device memory request of
    job ``name`` (and the secret its tasks carry); whether the worker can enforce it (its data store
    can spill)."""
    mon = dask_worker.plugins.get(JobMonitor.name)
    if mon is None:
        return False
    store = mon._store()
    if nbytes is None:
        mon.limits.pop(name, None)
        mon._keys.pop(name, None)
        mon.secrets.pop(name, None)
    else:
        mon.limits[name] = int(nbytes)
        if secret is not None:
            mon.secrets[name] = secret
    if store is not None:
        store.set_job_limit(name, None if nbytes is None else int(nbytes))
    return getattr(getattr(dask_worker, "data", None), "spill", None) is not None


