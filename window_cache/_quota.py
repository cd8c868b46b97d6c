"""Per-job device memory accounting of a window store: pure bookkeeping, no I/O, no lock.

A ``gdask.job`` may ask for a share of a device's memory (its *request*). The store tells this
object which job's blocks land on and leave the device; it answers how far a job is over its
request and which jobs are protected (within their request: their blocks are never evicted for
another job's room). The store itself moves the blocks.
"""

from __future__ import annotations

from dask.utils import format_bytes

__all__ = ["JobQuota"]


class JobQuota:
    """Requests, device bytes and spilled bytes of the jobs on one device.

    Examples
    --------
    >>> q = JobQuota()
    >>> q.set_limit("A", 100)
    >>> q.add("A", 80); q.add("A", 40); q.add("B", 10)
    >>> q.usage("A"), q.over("A"), q.over("B"), sorted(q.protected("B"))
    (120, 20, 0, [])
    >>> q.remove("A", 40); sorted(q.protected("B"))
    ['A']
    """

    def __init__(self) -> None:
        #: device memory request of each job that made one (bytes)
        self.limits: dict[str, int] = {}
        #: bytes of each job's blocks on the device now
        self.resident: dict[str, int] = {}
        #: bytes of each job's blocks moved to the host to keep it within its request, so far
        self.spilled: dict[str, int] = {}

    def set_limit(self, job: str, nbytes: int | None) -> None:
        """Set (or clear, ``None``) the request of ``job``."""
        if nbytes is None:
            self.limits.pop(job, None)
        else:
            self.limits[job] = int(nbytes)

    def add(self, job: str | None, nbytes: int) -> None:
        """A block of ``job`` (None: no job) landed on the device."""
        if job is not None:
            self.resident[job] = self.resident.get(job, 0) + nbytes

    def remove(self, job: str | None, nbytes: int) -> None:
        """A block of ``job`` left the device."""
        if job is None:
            return
        left = self.resident.get(job, 0) - nbytes
        if left > 0:
            self.resident[job] = left
        else:
            self.resident.pop(job, None)

    def usage(self, job: str) -> int:
        """Bytes of ``job``'s blocks on the device."""
        return self.resident.get(job, 0)

    def over(self, job: str | None) -> int:
        """Bytes ``job`` holds beyond its request (0 within it, or without a request)."""
        if job is None or job not in self.limits:
            return 0
        return max(0, self.usage(job) - self.limits[job])

    def protected(self, asking: str | None) -> set[str]:
        """Jobs within their request, other than ``asking``: their blocks are not evicted for it."""
        return {j for j, limit in self.limits.items() if j != asking and self.usage(j) <= limit}

    def record_spill(self, job: str | None, nbytes: int) -> None:
        """``nbytes`` of ``job``'s blocks were moved to the host for its request."""
        if job is not None:
            self.spilled[job] = self.spilled.get(job, 0) + nbytes

    def describe(self) -> str:
        """``job 'A' 1.00 MiB (request 2.00 MiB), ...`` for the jobs with a request and blocks on the device."""
        return ", ".join(f"job {j!r} {format_bytes(n)} (request {format_bytes(self.limits[j])})"
                         for j, n in self.resident.items() if n and j in self.limits)
