""":func:`run_loop`: a fit's one retry loop over attempts.

An :class:`Attempt` runs the driver in one mode from the fit's last checkpoint
(:attr:`Records.resume <gdask.gdataset.engine._records.Records>`). When it fails, :func:`_after_failure`
decides, in one place, what comes next: the fit ends (the error goes to the caller), or a new
attempt starts from the last checkpoint:

========================  ========================================  =======================================
attempt                   failure                                   next
========================  ========================================  =======================================
``workers``               CollectiveError, ``"client"`` in the      ``client``, where the blocks are now
                          algorithm's modes
``workers``, no client    CollectiveError caused by a lost worker,  ``workers`` again, where the blocks are
mode                      peer or block (at most                    now (their lost blocks back from
                          ``gdask.engine.max-restarts`` times)      lineage)
``workers``, no client    the driver's own exception                the fit ends with that exception
mode
``client`` / ``stream``   a worker died under a pass (at most       the same mode (``client``: regrouped
                          ``gdask.engine.max-restarts`` restarts)   where the blocks are now)
========================  ========================================  =======================================

Every other exception ends the fit at once.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from distributed.client import FutureCancelledError
from distributed.comm.core import CommClosedError
from distributed.scheduler import KilledWorker

from gdask import config
from gdask.gdataset._core import GDataSet
from gdask.gdataset._progress import Progress
from gdask.gdataset._share import DeviceShare, device_share
from gdask.gdataset.collective import CollectiveError
from gdask.gdataset.engine._api import MODES, EngineResult, IterativeAlgorithm
from gdask.gdataset.engine._client import ClientContext, drop_state, run_workers_loop, survey
from gdask.gdataset.engine._local import run_here
from gdask.gdataset.engine._plan import Plan, plan
from gdask.gdataset.engine._records import Records
from gdask.gdataset.locality import BlockPlaces, block_places, default_client_or_none

logger = logging.getLogger("gdask.gdataset")

__all__ = ["Attempt", "run_loop"]

#: errors of a computation whose worker died under it (its inputs come back from lineage)
LOST_WORK = (KilledWorker, FutureCancelledError, CommClosedError)


@dataclass(frozen=True)
class Attempt:
    """One run of the driver, from the fit's last checkpoint.

    Attributes
    ----------
    mode : str
        ``"workers"``, ``"client"`` or ``"stream"``.
    places : BlockPlaces or None
        Where the reference dataset's blocks were when the attempt started.
    groups : list of list of int or None
        The blocks grouped by the worker thread that holds them (the tasks of a client pass, the
        ranks of a loop on the workers).
    restarts : int
        Failed attempts before this one.
    """

    mode: str
    places: BlockPlaces | None
    groups: list[list[int]] | None
    restarts: int = 0


@dataclass(frozen=True)
class _Fit:
    """What every attempt of one fit shares."""

    algorithm: IterativeAlgorithm
    datasets: dict[str, GDataSet | None]
    client: Any
    token: str
    records: Records
    plan: Plan
    max_restarts: int

    @property
    def ref(self) -> GDataSet | None:
        return next((g for g in self.datasets.values() if g is not None), None)

    def where_now(self) -> tuple[BlockPlaces | None, list[list[int]] | None]:
        """Where the reference dataset's blocks are now (waiting for blocks that come back from lineage)."""
        ref = self.ref
        places = block_places(ref, self.client, wait_ready=True)
        return places, None if places is None else places.groups(ref.nblocks)


def _run_attempt(fit: _Fit, attempt: Attempt) -> EngineResult:
    """Run the driver once, in the attempt's mode, from the fit's last checkpoint."""
    algorithm, records = fit.algorithm, fit.records
    if attempt.mode == "workers":
        out = run_workers_loop(algorithm, fit.datasets, attempt.groups, attempt.places.workers, fit.client,
                               fit.token, records, lazy=fit.plan.streaming)
        return EngineResult(out.state, out.finals, "workers", records.history, attempt.restarts, out.iteration)
    ctx = ClientContext(fit.datasets, attempt.groups, fit.token, records.resume.iteration, records,
                        stream=attempt.mode == "stream")
    try:
        state = algorithm.run(records.resume.state, ctx)
        finals = None
        spec = algorithm.final(state)
        if spec is not None:
            func, args, kwargs = spec
            finals = ctx.map(func, *args, name=f"{algorithm.name}-final", **kwargs)
    finally:
        ctx.close()
    return EngineResult(state, finals, attempt.mode, records.history, attempt.restarts, ctx.iteration)


def _retryable(e: CollectiveError) -> bool:
    """Whether a failed loop on the workers lost a worker or a peer (worth running again where the
    blocks are now), rather than stopped on an exception of the driver itself."""
    cause = e.__cause__
    return cause is None or isinstance(cause, (CollectiveError, *LOST_WORK))


def _workers_again(fit: _Fit, attempt: Attempt, e: CollectiveError) -> Attempt:
    """A workers-only loop failed: run it on the workers again, or end the fit."""
    name, resume = fit.algorithm.name, fit.records.resume
    if not _retryable(e):  # the driver's own error: running it again would repeat it
        raise e.__cause__ from None
    if attempt.restarts >= fit.max_restarts:
        raise CollectiveError(
            f"{name}: the loop on the workers failed {attempt.restarts + 1} times, the last time with: {e}. The "
            f"last finished iteration is {resume.iteration}; check the workers' logs, or raise "
            "gdask.engine.max-restarts") from e
    restarts = attempt.restarts + 1
    logger.warning("%s: the loop on the workers did not run to its end (%s); running it on the workers again "
                   "from iteration %d (restart %d of %d)", name, e, resume.iteration, restarts, fit.max_restarts)
    places, groups = fit.where_now()  # the lost blocks come back from lineage: start where they are then
    if groups is None:
        raise CollectiveError(f"{name}: after a failed loop on the workers its blocks are not all in cluster "
                              "memory any more") from e
    return Attempt("workers", places, groups, restarts)


def _client_instead(fit: _Fit, attempt: Attempt, e: CollectiveError) -> Attempt:
    """A loop on the workers failed: resume the fit from the client."""
    logger.warning("%s: the loop on the workers did not run to its end (%s); resuming from the client at "
                   "iteration %d", fit.algorithm.name, e, fit.records.resume.iteration)
    places, groups = fit.where_now()
    return Attempt("client", places, groups, attempt.restarts + 1)


def _pass_again(fit: _Fit, attempt: Attempt, e: BaseException) -> Attempt:
    """A worker died under a pass from the client: resume in the same mode, or end the fit."""
    if fit.client is None or attempt.restarts >= fit.max_restarts:
        raise e
    restarts = attempt.restarts + 1
    logger.warning("%s: a pass lost its work (%r); resuming at iteration %d (restart %d of %d)", fit.algorithm.name,
                   e, fit.records.resume.iteration, restarts, fit.max_restarts)
    if fit.ref is not None and attempt.mode == "client":  # the blocks came back from lineage: group them anew
        places, groups = fit.where_now()
        return Attempt("client", places, groups, restarts)
    return dataclasses.replace(attempt, restarts=restarts)


def _after_failure(fit: _Fit, attempt: Attempt, e: BaseException) -> Attempt:
    """The attempt after ``attempt`` failed with ``e``; raises when the fit ends instead."""
    if attempt.mode == "workers" and isinstance(e, CollectiveError):
        if "client" not in fit.algorithm.modes:  # workers-only (or workers and stream): never from the client
            return _workers_again(fit, attempt, e)
        return _client_instead(fit, attempt, e)
    if attempt.mode in ("client", "stream") and isinstance(e, LOST_WORK):
        return _pass_again(fit, attempt, e)
    raise e


def _attempts(fit: _Fit) -> EngineResult:
    """The fit's one retry loop: attempts until one runs to its end or a failure ends the fit."""
    p = fit.plan
    if p.mode == "local":
        return run_here(fit.algorithm, fit.datasets, fit.token, fit.records)
    attempt = Attempt(p.mode, p.places, p.groups)
    while True:
        try:
            return _run_attempt(fit, attempt)
        except (CollectiveError, *LOST_WORK) as e:
            attempt = _after_failure(fit, attempt, e)


def _checked(algorithm: IterativeAlgorithm, data: dict[str, GDataSet | None] | None,
             mode: str | None) -> dict[str, GDataSet | None]:
    """``data`` as a dict, after checking it and ``mode`` against the algorithm."""
    datasets = {n: g for n, g in (data or {}).items()}
    ref = next((g for g in datasets.values() if g is not None), None)
    if ref is None and tuple(algorithm.modes) != ("client",):
        raise ValueError("run_loop needs at least one GDataSet in data (only client-mode algorithms, which "
                         "build their own graphs, run without)")
    for n, g in datasets.items():
        if g is not None and g.row_blocks != ref.row_blocks:
            raise ValueError(f"dataset {n!r} is blocked differently from the others; block it with "
                             f"block_rows=X.row_blocks")
    if mode is not None and (mode not in MODES or mode not in algorithm.modes):
        raise ValueError(f"mode must be one of {algorithm.modes} for {algorithm.name}, got {mode!r}")
    return datasets


def run_loop(algorithm: IterativeAlgorithm, data: dict[str, GDataSet | None], state: Any, *,
             client: Any = None, mode: str | None = None, progress: Progress | None = None,
             share: DeviceShare | None = None) -> EngineResult:
    """Run ``algorithm`` over ``data`` from ``state``; see :mod:`gdask.gdataset.engine`.

    Parameters
    ----------
    algorithm : IterativeAlgorithm
    data : dict
        ``{name: GDataSet or None}``, all blocked alike (the first is the reference). Persisted here
        when a Client exists and they are not yet.
    state : any
        The driver's initial state (small host data).
    client : distributed.Client, optional
        Default: the current client; without one the loop runs with Dask's local scheduler.
    mode : {"workers", "client", "stream"}, optional
        Force a mode (default: the first of ``algorithm.modes`` the situation allows).
    progress : Progress, optional
        Receives every checkpoint record (in the calling thread); default: nothing shown.
    share : DeviceShare, optional
        The fit's share of the devices: the loop (persisting its data included) runs inside
        ``gdask.job(...)`` (see :func:`~gdask.gdataset.device_share`; nothing when a job is open
        already or without a Client).

    Returns
    -------
    EngineResult

    Raises
    ------
    ValueError
        No dataset, datasets blocked differently, or a mode the algorithm does not allow.
    """
    datasets = _checked(algorithm, data, mode)
    client = client if client is not None else default_client_or_none()
    records = Records(state, progress or Progress(verbose=0))
    token = uuid.uuid4().hex
    try:
        with records.interrupts, device_share(share):
            workers_only = tuple(algorithm.modes) == ("workers",)
            datasets, situation = survey(datasets, client, workers_only)
            first = plan(algorithm.name, algorithm.modes, situation, mode)
            max_restarts = int(config.get("engine.max-restarts", 3))
            return _attempts(_Fit(algorithm, datasets, client, token, records, first, max_restarts))
    finally:
        records.progress.close()
        drop_state(client, token)
