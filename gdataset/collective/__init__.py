"""Loops that run on the workers: one long task per worker, small results exchanged worker to worker.

An iterative fit driven from the client pays, every iteration, for a graph sent to the scheduler,
tasks sent to the workers, results reported back and gathered by the client: on a small cluster
that round trip is tens of milliseconds, which late in a K-means fit is longer than the
iteration's own work. When the data is persisted and fits on the devices, the loop can instead
run inside one task per worker (the workers that hold the blocks) that exchange their partial
results directly, as cuML's multi-GPU estimators do with NCCL and xgboost's Dask interface with
its allreduce: :meth:`Communicator.allgather` is one message from each worker to each other one.
Every worker then combines the same partials in the same order, so all of them compute the same
next iterate without the client.

The messages go through a handler that the ``gdask-collective`` worker plugin adds to each worker
(:func:`gdask.scheduling.ensure_plugins`, once per client); when every task has its own worker
process on one host, the tasks connect to each other over Unix sockets when the loop starts and
all-gather values up to 64 MiB over them (:mod:`._direct`, config ``gdask.collective.direct``).
A loop that cannot run this way, because a worker is busy with other tasks when it starts, leaves,
or raises, ends with :class:`CollectiveError` on the client after every task of the loop was told to
stop: the caller then runs its ordinary graph-per-iteration loop, with the same result.
"""

from __future__ import annotations

from gdask.gdataset.collective._client import run_on_workers
from gdask.gdataset.collective._worker import CollectiveError, CollectivePlugin, Communicator, Mailbox

__all__ = ["CollectiveError", "CollectivePlugin", "Communicator", "Mailbox", "run_on_workers"]
