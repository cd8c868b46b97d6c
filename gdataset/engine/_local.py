"""The no-Client mode: a workers-only driver (``modes = ("workers",)``) run in this process as the
only rank over every block, its blocks computed onto this process's device with Dask's local
scheduler (mode ``"local"``: the same driver code as on the workers)."""

from __future__ import annotations

import time
from typing import Any, Sequence

import dask

from gdask.gdataset.engine._api import EngineResult, IterativeAlgorithm
from gdask.gdataset.engine._records import Records
from gdask.gdataset.engine._worker import WorkersContext

__all__ = ["LocalContext", "SelfComm", "run_here"]


class SelfComm:
    """The communicator of the only rank: nothing to exchange."""

    rank = 0
    size = 1
    worker = None

    def allgather(self, value: Any, timeout: float | None = None) -> list:
        return [value]


class LocalContext(WorkersContext):
    """A workers-mode driver run here, without a Client: the only rank, holding every block."""

    mode = "local"
    address = "local"
    host = "127.0.0.1"

    def __init__(self, owned: list, names: Sequence[str], nblocks: int, token: str, iteration: int,
                 records: Records) -> None:
        super().__init__(SelfComm(), owned, names, nblocks, token, iteration, None)
        self._records = records

    def checkpoint(self, state, **record):
        now = time.perf_counter()
        rec = self._record(record, now - self._t0)
        self._t0 = now
        self._records(state, rec)


def run_here(algorithm: IterativeAlgorithm, datasets: dict, token: str, records: Records) -> EngineResult:
    """Run a workers-only algorithm without a Client, from ``records.resume``; its records go to
    ``records``."""
    names = list(datasets)
    nblocks = next(g for g in datasets.values() if g is not None).nblocks
    per_block = dask.compute(*[[None if datasets[n] is None else datasets[n].block(b) for n in names]
                               for b in range(nblocks)])
    owned = [(b, dict(zip(names, arrays))) for b, arrays in enumerate(per_block)]
    ctx = LocalContext(owned, names, nblocks, token, records.resume.iteration, records)
    state = algorithm.run(records.resume.state, ctx)
    finals = None
    spec = algorithm.final(state)
    if spec is not None:
        func, args, kwargs = spec
        finals = [r for _, r in ctx.each_block(func, args, kwargs)]
    return EngineResult(state, finals, "local", records.history, 0, ctx.iteration)
