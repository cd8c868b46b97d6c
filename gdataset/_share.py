"""A fit's share of the cluster's devices, for code above the engine.

Estimators take ``gpu=`` / ``memory=`` / ``job_name=`` and reach device sharing (``gdask.job``,
placement) only through the engine: they describe the share as a :class:`DeviceShare` and run
their fit inside :func:`device_share` (or pass it to :func:`gdask.gdataset.run_loop`).
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from distributed import get_client

from gdask.scheduling import current_job, job

__all__ = ["DeviceShare", "device_share"]


@dataclass(frozen=True)
class DeviceShare:
    """What a fit asks of the devices.

    Parameters
    ----------
    gpu : float, optional
        Fraction of a device, in (0, 1]; None with ``memory`` given means a whole device.
    memory : int or str, optional
        Device memory (bytes or a string such as ``"1GiB"``).
    name : str, optional
        The job's name in :func:`gdask.scheduling.jobs` (default: ``kind`` and a random suffix).
    kind : str
        What runs (an estimator's class name): the job's kind in the interference model.
    """

    gpu: float | None = None
    memory: Any = None
    name: str | None = None
    kind: str = "fit"

    @property
    def requested(self) -> bool:
        """Whether a share is asked for at all (``gpu`` or ``memory`` given)."""
        return self.gpu is not None or self.memory is not None


@contextlib.contextmanager
def device_share(share: DeviceShare | None) -> Iterator[Any]:
    """Run the block inside ``gdask.job(...)`` when ``share`` asks for a device share, a Client
    exists and no enclosing job runs already; yields the job (else None). Without a Client the fit
    has this process's device to itself, and the share is not needed."""
    if share is None or not share.requested:
        yield None
        return
    client = None
    if current_job() is None:
        try:
            client = get_client()
        except ValueError:
            client = None
    if client is None:
        yield None
        return
    name = share.name or f"{share.kind.lower()}-{uuid.uuid4().hex[:6]}"
    with job(client, gpu=1.0 if share.gpu is None else share.gpu, memory=share.memory, name=name,
             kind=share.kind) as j:
        yield j
