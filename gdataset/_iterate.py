"""Delta iterations: ``gdask.iterate(step, state, data=X, max_iter=, tol=)``.

Step protocol
-------------
``step(data, state, ctx) -> new_state`` builds its graph from ``data`` (GDataSet operations, or
tasks over ``data``'s blocks) and the state *references* ``ctx.refs`` (see
:class:`IterationContext`), computes it (``.compute()`` / ``dask.compute``: the tracker rewrites the
graph) and returns the new state, arrays of the same structure. The new state comes back in the array
types of the initial one (config ``gdask.output-type``, "input": NumPy state stays NumPy when the step's
tasks computed device arrays), and the tasks of a step that read device blocks get the state's host
arrays on the block's device (``dask.delayed(f)(data.block(i), ctx.refs[i])``: ``f`` sees device arrays
only; see :func:`gdask.gdataset._blocks.user_task`).

* Per-block state (a list with one array per block of ``data``, i.e. ``len(state) ==
  data.nblocks``; force with ``per_block``): block ``i``'s change is the L1 norm of its update. A
  block whose change is at most ``block_tol`` (default ``tol / nblocks``) has converged: it KEEPS its
  previous value exactly, so its channel token, and every task downstream of it, are unchanged and
  reused; only the work that reads changed blocks runs. It becomes active again as soon as its
  inputs move it by more than ``block_tol``. This is the delta iteration of Flink / differential
  dataflow at block granularity.
* Any other state (array, tuple or dict of arrays): whole-state convergence.

The loop stops when the total L1 change (of all candidate updates, converged blocks included) is at
most ``tol``, or after ``max_iter`` steps. It runs on the iteration engine from the client
(:func:`gdask.gdataset.run_loop`, mode ``"client"``): the step builds its own graphs.
"""

from __future__ import annotations

import html
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from gdask.devices import to_numpy
from gdask.gdataset._channel import IterationChannel
from gdask.gdataset._output import array_type, as_type, output_type
from gdask.gdataset._progress import Progress
from gdask.gdataset._tracker import GTracker
from gdask.gdataset.engine import IterativeAlgorithm, run_loop

__all__ = ["iterate", "IterationContext", "IterateResult"]


@dataclass
class IterationContext:
    """What a step gets besides ``data`` and ``state``.

    Attributes
    ----------
    iteration : int
        0 for the first step.
    refs : list or dict or Future
        The current state as published on the iteration channel: per-block state -> one future
        per block; dict state -> ``{name: future}``; other state -> one future. Pass these to
        tasks instead of the arrays: they are small tokens, and an unchanged block keeps its
        token, so the tasks that read only unchanged blocks are reused by the tracker.
    active : numpy.ndarray of bool or None
        Per-block state: blocks not converged (``False`` = its value was kept last step).
    tracker : GTracker
    channel : IterationChannel
    """

    iteration: int
    refs: Any
    active: np.ndarray | None
    tracker: GTracker
    channel: IterationChannel


@dataclass
class IterateResult:
    """Result of :func:`iterate`: final ``state``, ``n_iter``, ``converged`` and one ``history`` dict
    per iteration (``iteration`` (1-based), ``change``, ``active_blocks``, ``submitted``, ``executed``,
    ``reused``, ``bytes_reused``, ``executed_by_prefix``, ``channel_bytes``, ``seconds``)."""

    state: Any
    n_iter: int
    converged: bool
    history: list[dict] = field(default_factory=list)

    def _totals(self) -> dict[str, Any]:
        h = self.history
        tot = {k: sum(int(r.get(k) or 0) for r in h) for k in ("submitted", "executed", "reused", "channel_bytes")}
        tot["seconds"] = sum(float(r.get("seconds") or 0.0) for r in h)
        tot["change"] = h[-1].get("change") if h else None
        return tot

    def __repr__(self) -> str:
        t = self._totals()
        change = "" if t["change"] is None else f", last change {t['change']:.3g}"
        share = f" ({100 * t['reused'] / t['submitted']:.0f}%)" if t["submitted"] else ""
        return (f"IterateResult({'converged' if self.converged else 'not converged'} after {self.n_iter} "
                f"iteration(s) in {t['seconds']:.3g} s{change}; tasks: {t['executed']} executed, {t['reused']} "
                f"reused of {t['submitted']} submitted{share}; state: {_describe(self.state)}; "
                f"history: {len(self.history)} records)")

    def _repr_html_(self) -> str:
        t = self._totals()
        rows = []
        hist = self.history
        show = hist if len(hist) <= 10 else hist[:5] + [None] + hist[-4:]
        for r in show:
            if r is None:
                rows.append("<tr><td colspan=6>...</td></tr>")
                continue
            ch = r.get("change")
            rows.append(f"<tr><td>{r.get('iteration')}</td><td>{'' if ch is None else f'{ch:.3g}'}</td>"
                        f"<td>{r.get('executed', '')}</td><td>{r.get('reused', '')}</td>"
                        f"<td>{'' if r.get('active_blocks') is None else r['active_blocks']}</td>"
                        f"<td>{1e3 * float(r.get('seconds') or 0):.1f}</td></tr>")
        return (f"<div><strong>IterateResult</strong>: {'converged' if self.converged else 'not converged'} after "
                f"{self.n_iter} iteration(s) in {t['seconds']:.3g} s; {t['executed']} tasks executed, {t['reused']} "
                f"reused of {t['submitted']}; state {html.escape(_describe(self.state))}</div>"
                "<table><tr><th>iteration</th><th>change</th><th>executed</th><th>reused</th><th>active blocks</th>"
                "<th>ms</th></tr>" + "".join(rows) + "</table>")


def _describe(state: Any) -> str:
    """A short description of a loop state (not its values)."""
    if isinstance(state, dict):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in list(state.items())[:4]) + (
            ", ..." if len(state) > 4 else "") + "}"
    if isinstance(state, (list, tuple)):
        inner = _describe(state[0]) if state else ""
        return f"{type(state).__name__} of {len(state)}" + (f" x {inner}" if inner else "")
    shape, dtype = getattr(state, "shape", None), getattr(state, "dtype", None)
    if shape is not None:
        return f"array{tuple(shape)} {dtype}"
    return type(state).__name__


def _l1(a: Any, b: Any) -> float:
    """L1 distance of two states' parts, on the host (explicit copies of device arrays: the state is small)."""
    a, b = to_numpy(a), to_numpy(b)
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).sum())


def _like(new: Any, old: Any) -> Any:
    """The step's ``new`` state in the array types of the ``old`` one (config ``gdask.output-type``:
    "input" follows the initial state, so NumPy state stays NumPy when the step computed device arrays)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {k: _like(v, old.get(k)) for k, v in new.items()}
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)) and len(old) == len(new):
        return type(new)(_like(n, o) for n, o in zip(new, old))
    return as_type(new, output_type(array_type(old)))


def _change(old: Any, new: Any) -> float:
    if isinstance(old, dict):
        return sum(_l1(old[k], new[k]) for k in old)
    if isinstance(old, (list, tuple)):
        return sum(_l1(o, n) for o, n in zip(old, new))
    return _l1(old, new)


def iterate(step: Callable[..., Any], state: Any, data: Any = None, *, max_iter: int = 100, tol: float = 1e-6,
            block_tol: float | None = None, client: Any = None, tracker: GTracker | None = None,
            per_block: bool | None = None, verbose: bool | int = 0, callback: Callable[[dict], Any] | None = None,
            progress: Progress | None = None) -> IterateResult:
    """Run ``state = step(data, state, ctx)`` until the L1 change is at most ``tol``, reusing work.

    The step protocol and per-block convergence: see :mod:`gdask.gdataset._iterate`.

    Parameters
    ----------
    step : callable
        ``step(data, state, ctx)``.
    state : list of arrays, array, tuple or dict of arrays
        Initial loop state (NumPy, or CuPy); the state keeps these array types.
    data : GDataSet or object with ``nblocks``, optional
        Passed to ``step`` unchanged.
    max_iter : int
    tol : float or callable
        Stop when the L1 change of an iteration is at most ``tol``; a callable ``tol(state)``
        is evaluated every iteration (e.g. a tolerance relative to the state's norm).
    block_tol : float, optional
        Per-block convergence threshold (per-block state only; default ``tol / nblocks``).
    client : distributed.Client, optional
    per_block : bool, optional
        Treat ``state`` as one array per block (default: when it is a list of ``data.nblocks``).
    tracker : GTracker, optional
        Reuse an existing tracker (default: a new one, closed at the end).
    verbose : bool or int
        1: a progress bar and a summary line; 2: also one line per iteration (its change, tasks
        executed and reused).
    callback : callable, optional
        ``callback(record)`` after every iteration (see :class:`IterateResult` for the fields).
    progress : Progress, optional
        Where the per-iteration records go (default: from ``verbose`` and ``callback``).

    Returns
    -------
    IterateResult

    Examples
    --------
    Jacobi iterations for ``x = 0.5 * x + b`` with one state block per data block; the blocks of
    ``b`` that are zero converge at once and their work is skipped afterwards:

    >>> import dask, numpy as np, gdask
    >>> def jacobi_block(b, x):
    ...     return 0.5 * x + b
    >>> def step(data, state, ctx):
    ...     outs = [dask.delayed(jacobi_block)(data.block(i), ctx.refs[i]) for i in range(data.nblocks)]
    ...     return list(dask.compute(*outs))
    >>> b = gdask.from_array(np.r_[np.ones(4), np.zeros(4)], block_rows=4)   # doctest: +SKIP
    >>> res = gdask.iterate(step, [np.zeros(4), np.zeros(4)], data=b, tol=1e-9)  # doctest: +SKIP
    >>> np.allclose(res.state[0], 2.0), res.converged                          # doctest: +SKIP
    (True, True)
    """
    _check_limits(max_iter, tol)
    per_block = _is_per_block(state, data, per_block)
    own = tracker is None
    tracker = GTracker(client) if own else tracker
    channel = IterationChannel(tracker.client)
    algo = _DeltaIteration(step, data, tol, block_tol, per_block, int(max_iter), tracker, channel)
    start = _DeltaState(list(state) if per_block else state, np.ones(len(state), dtype=bool) if per_block else None)
    try:
        tracker.activate()
        res = run_loop(algo, {}, start, client=tracker.client, mode="client",
                       progress=progress or Progress(verbose=verbose, callback=callback, total=max_iter,
                                                     desc="iterate"))
    finally:
        channel.close()
        if own:
            tracker.close()
    return IterateResult(state=res.state.state, n_iter=res.iterations, converged=res.state.converged,
                         history=res.history)


def _check_limits(max_iter: int, tol: Any) -> None:
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    if not callable(tol) and tol < 0:
        raise ValueError(f"tol must be >= 0, got {tol}")


def _is_per_block(state: Any, data: Any, per_block: bool | None) -> bool:
    """Whether ``state`` is one array per block of ``data`` (``per_block``, else guessed)."""
    nblocks = getattr(data, "nblocks", None)
    if per_block is None:
        per_block = isinstance(state, list) and nblocks is not None and len(state) == nblocks
    if per_block and not isinstance(state, list):
        raise TypeError("per-block state must be a list with one array per block of data")
    return per_block


@dataclass(frozen=True)
class _DeltaState:
    """The delta iteration's loop state: the user's ``state``, which blocks are ``active`` (per-block
    state; None otherwise) and whether the loop ``converged``."""

    state: Any
    active: np.ndarray | None
    converged: bool = False


class _DeltaIteration(IterativeAlgorithm):
    """:func:`iterate`'s loop on the iteration engine (from the client: the step builds its own
    graphs, which the tracker rewrites)."""

    name = "iterate"
    modes = ("client",)

    def __init__(self, step: Callable, data: Any, tol: Any, block_tol: float | None, per_block: bool,
                 max_iter: int, tracker: GTracker, channel: IterationChannel) -> None:
        self.step, self.data, self.per_block, self.max_iter = step, data, per_block, max_iter
        self.tol_of = tol if callable(tol) else (lambda _s: tol)
        self.block_tol = block_tol
        self.tracker, self.channel = tracker, channel

    def _publish(self, state: Any) -> Any:
        """The state's references on the channel (one per block, per key, or one)."""
        if self.per_block:
            return self.channel.publish_blocks("state", state)
        if isinstance(state, dict):
            return {k: self.channel.publish(str(k), v) for k, v in state.items()}
        return self.channel.publish("state", state)

    def _update(self, state: Any, new: Any, tol_now: float) -> tuple[Any, np.ndarray | None, float]:
        """``(next state, active blocks or None, total L1 change)``: per-block state keeps the previous
        value of every block that moved by at most the block tolerance."""
        if not self.per_block:
            return new, None, _change(state, new)
        btol = tol_now / max(len(state), 1) if self.block_tol is None else float(self.block_tol)
        if len(new) != len(state):
            raise ValueError(f"step returned {len(new)} blocks of state, expected {len(state)}")
        changes = np.array([_l1(o, n) for o, n in zip(state, new)])
        active = changes > btol
        return [n if a else o for o, n, a in zip(state, new, active)], active, float(changes.sum())

    def _record(self, runs: list[dict], v0: int, t0: float, change: float, active: np.ndarray | None) -> dict:
        """An iteration's record fields: its change and what the tracker and the channel did."""
        return dict(change=change, active_blocks=None if active is None else int(active.sum()),
                    **{k: sum(r[k] for r in runs) for k in ("submitted", "executed", "reused", "bytes_reused")},
                    executed_by_prefix=dict(sum((Counter(r["executed_by_prefix"]) for r in runs), Counter())),
                    channel_bytes=self.channel.bytes_sent(v0), step_seconds=time.perf_counter() - t0)

    def run(self, st: _DeltaState, ctx: Any) -> _DeltaState:
        tracker = self.tracker
        state, active = st.state, st.active
        while ctx.iteration < self.max_iter:
            t0 = time.perf_counter()
            v0 = self.channel.version
            h0 = len(tracker.history)
            refs = self._publish(state)
            ictx = IterationContext(ctx.iteration, refs, None if active is None else active.copy(), tracker,
                                    self.channel)
            new = _like(self.step(self.data, state, ictx), state)
            tol_now = float(self.tol_of(state))
            state, active, change = self._update(state, new, tol_now)
            converged = change <= tol_now
            ctx.checkpoint(_DeltaState(state, active, converged),
                           **self._record(tracker.history[h0:], v0, t0, change, active))
            if converged:
                return _DeltaState(state, active, True)
        return _DeltaState(state, active, False)
