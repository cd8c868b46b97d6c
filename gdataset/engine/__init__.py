"""The iteration engine: how every iterative algorithm over GDataSet blocks runs.

An algorithm (K-means, logistic regression, an LSTM trainer, ...) supplies only its mathematics, as
an :class:`IterativeAlgorithm`: a *driver* ``run(state, ctx)`` that loops over iterations and asks
the :class:`LoopContext` for passes over the blocks (``ctx.map`` / ``ctx.reduce``: a per-block
function, its results in block order), and an optional final pass. The engine decides where the
driver runs and owns everything else:

* ``"workers"``: the driver runs in one task per worker that holds blocks (the same code on every
  worker, to the same result); a pass computes the worker's own blocks and all-gathers the
  per-block results worker to worker (:mod:`gdask.gdataset.collective`): no client or scheduler
  round trip per iteration. Needs a Client, persisted data that fits on the devices and config
  ``gdask.ml.worker-loop``.
* ``"client"``: the driver runs here; a pass is one graph, one task per group of blocks held by a
  worker thread (one small result per block comes back).
* ``"stream"``: data larger than the devices' memory: one task per block, alternating scan order
  and the window cache told the order, so the blocks left on the device are the next needed.

An algorithm that can only run on the workers (``modes = ("workers",)``, e.g. data-parallel training
that keeps a model replica per worker) also runs there when its data is larger than the devices: its
blocks are then read from each worker's store when the driver asks for them (``ctx.streaming``;
``ctx.hint(blocks)`` tells the window cache the order of the next reads), not held by its task.
Without a Client, such an algorithm runs in this process as the only rank over all blocks (mode
``"local"``, the same driver code). If its loop fails because a worker or a peer was lost, the
engine runs it on the workers again from the last checkpoint, after the lost blocks came back from
lineage, at most config ``gdask.engine.max-restarts`` times; an exception raised by the driver
itself ends the fit at once.

Per-block results are always combined in block order, never in the order of placement, so a
seeded fit gives the same bits however the blocks are placed, moved or recomputed. After every
finished iteration the driver calls ``ctx.checkpoint(state, **record)``: the record feeds progress
(:class:`gdask.gdataset.Progress`: bar, lines, ``callback``), the state is where the fit resumes if
the loop on the workers fails (a worker lost, busy or failing): the engine then runs the driver
from the client, from that state, not from the start. Per-worker state of a fit (K-means bounds)
lives in the workers' state spaces under the fit's token (:func:`gdask.devices.worker_state`) and is
dropped at the end. The durations of the passes on the workers are reported to the placement plugin
(device speeds, rebalancing), as the tasks of the client loop report themselves. A Ctrl-C ends the
fit: Python drops the exception of a signal that arrives while a finaliser runs, so the engine notes
the signal and raises at the next checkpoint if its own exception was lost.

The package, by process role:

* ``_api``: what algorithms and the engine agree on (:class:`IterativeAlgorithm`,
  :class:`LoopContext`, :class:`Blocks`, :class:`EngineResult`);
* ``_plan``: the mode choice, a pure function of the situation (a ``Plan``);
* ``_run``: :func:`run_loop` and its one retry loop over attempts;
* ``_client``: the client side (the client and stream contexts, starting a loop on the workers and
  relaying its checkpoints, dropping the fit's state);
* ``_worker``: a rank's task on a worker (its context, its checkpoint, blocks read from its store);
* ``_local``: the no-Client mode;
* ``_interrupt``: a Ctrl-C during a fit is never lost (:class:`Interrupts`).
"""

from __future__ import annotations

from gdask.gdataset.engine._api import MODES, BlockIndex, Blocks, EngineResult, IterativeAlgorithm, LoopContext
from gdask.gdataset.engine._client import device_memories, drop_state, exceeds_devices
from gdask.gdataset.engine._interrupt import Interrupts
from gdask.gdataset.engine._run import run_loop

__all__ = ["BlockIndex", "Blocks", "EngineResult", "Interrupts", "IterativeAlgorithm", "LoopContext", "MODES",
           "device_memories", "drop_state", "exceeds_devices", "run_loop"]
