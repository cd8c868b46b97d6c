"""What an iterative algorithm and the iteration engine agree on: the algorithm's side
(:class:`IterativeAlgorithm`), what its driver uses (:class:`LoopContext`, :class:`Blocks`) and
what a run returns (:class:`EngineResult`). See :mod:`gdask.gdataset.engine` for how a loop runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["BlockIndex", "Blocks", "EngineResult", "IterativeAlgorithm", "LoopContext", "MODES", "block_arg",
           "pass_name"]

#: where a driver may run, in the order the engine prefers them
MODES = ("workers", "client", "stream")


@dataclass(frozen=True)
class Blocks:
    """A handle to one dataset of a loop, ``ctx.data[name]``: passed to ``ctx.map`` in place of the
    dataset, it is replaced by each block of that dataset (``None`` datasets give ``None``)."""

    name: str


@dataclass(frozen=True)
class BlockIndex:
    """Passed to ``ctx.map``, it is replaced by the index of each block the call is for (e.g. to draw
    a block's random numbers from its own seed, the same wherever the block is)."""


def block_arg(a: Any, block: int, arrays: Any = None) -> Any:
    """``a`` as the argument of the call for ``block``: a :class:`BlockIndex` is the block's index, a
    :class:`Blocks` handle that block of its dataset (from ``arrays``, by name), anything else itself."""
    if isinstance(a, BlockIndex):
        return block
    if isinstance(a, Blocks) and arrays is not None:
        return arrays.get(a.name)
    return a


class IterativeAlgorithm:
    """What an iterative algorithm supplies to :func:`run_loop`. Subclass and override.

    The object is sent to the workers with the loop: keep it small (parameters, not data).

    Attributes
    ----------
    name : str
        Shown in progress and used in task names.
    modes : tuple of str
        Where its driver may run (``"workers"``, ``"client"``, ``"stream"``); the engine picks the
        first that the situation allows, in the order of :data:`MODES`.
    checkpoint_copies : bool
        The driver gives ``ctx.checkpoint`` a state it never changes afterwards (a fresh copy each
        iteration): a rank on the workers then keeps it as it is and pickles it only when it is sent
        or asked for, instead of every iteration. Default False: each checkpoint is pickled at once,
        so a state the driver goes on changing is still recorded as it was.
    """

    name = "loop"
    modes: tuple[str, ...] = MODES
    checkpoint_copies = False

    def run(self, state: Any, ctx: LoopContext) -> Any:
        """The driver: iterate from ``state`` (``ctx.iteration`` iterations are already done) and
        return the final state. Call ``ctx.checkpoint(state, ...)`` after every iteration. Must
        take the same decisions from the same inputs wherever it runs (no unseeded randomness)."""
        raise NotImplementedError

    def final(self, state: Any) -> tuple[Callable, tuple, dict] | None:
        """An optional last pass ``(func, args, kwargs)``, run where the blocks are; its per-block
        results come back to the client (:attr:`EngineResult.finals`, in block order)."""
        return None


@dataclass
class EngineResult:
    """What :func:`run_loop` returns.

    Attributes
    ----------
    state : the driver's final state
    finals : list or None
        The final pass's per-block results, in block order.
    mode : str
        Where the driver ran last (``"workers"``, ``"client"``, ``"stream"``, or ``"local"``: a
        workers-only driver run in this process without a Client).
    history : list of dict
        The checkpoint records, one per iteration.
    restarts : int
        Times the loop failed and the fit resumed from its last checkpoint (from the client, or on
        the workers again for a workers-only algorithm).
    iterations : int
        Iterations done (``ctx.iteration`` at the end).
    """

    state: Any
    finals: list | None
    mode: str
    history: list[dict] = field(default_factory=list)
    restarts: int = 0
    iterations: int = 0

    def __repr__(self) -> str:
        finals = "None" if self.finals is None else f"{len(self.finals)} blocks"
        return (f"EngineResult(mode={self.mode!r}, iterations={self.iterations}, restarts={self.restarts}, "
                f"state={type(self.state).__name__}, finals={finals}, history={len(self.history)} records)")


class LoopContext:
    """What a driver uses: passes over the blocks, checkpoints, collective exchange.

    Attributes
    ----------
    mode : str
    token : str
        The fit's token: the key of its per-worker state (:func:`gdask.devices.worker_state`).
    nblocks : int
    iteration : int
        Iterations finished (counted by :meth:`checkpoint`).
    data : dict
        ``{name: Blocks}``: the loop's datasets, to pass to :meth:`map`.
    rank, size : int
        This driver's rank among the drivers that run at once (one per worker; 0 / 1 from the client).
    """

    mode = "client"
    #: the blocks of :meth:`local` are read from the worker's store on use (data larger than the devices)
    streaming = False

    def __init__(self, names: Sequence[str], nblocks: int, token: str, iteration: int) -> None:
        self.data = {n: Blocks(n) for n in names}
        self.nblocks = nblocks
        self.token = token
        self.iteration = iteration
        self.rank = 0
        self.size = 1

    def map(self, func: Callable, *args: Any, blocks: Sequence[int] | None = None, name: str | None = None,
            **kwargs: Any) -> list:
        """``func(*args_b, **kwargs)`` for every block ``b`` (or the ``blocks`` given), where each
        :class:`Blocks` argument is replaced by its dataset's block ``b`` and a :class:`BlockIndex`
        by ``b``; the results, as host data, in block order (every rank gets all of them)."""
        raise NotImplementedError

    def reduce(self, chunk: Callable, combine: Callable[[list], Any], *args: Any, name: str | None = None,
               **kwargs: Any) -> Any:
        """``combine`` of the per-block results of :meth:`map`, in block order."""
        return combine(self.map(chunk, *args, name=name, **kwargs))

    def allgather(self, value: Any) -> list:
        """Every driver's ``value``, in rank order (``[value]`` from the client)."""
        return [value]

    def hint(self, blocks: Sequence[int]) -> None:
        """The driver's next reads of its own blocks follow ``blocks`` (block indices, in order): the
        window cache prefetches them in that order. Only does something when :attr:`streaming`."""

    def capacity(self) -> int | None:
        """Bytes of blocks this rank's device can keep resident at once (its window cache's room: the
        device's memory less its reserve and other use), or None where unknown. A driver that reads
        its blocks itself (:attr:`streaming`) sizes its windows of blocks by it."""
        return None

    def observe(self, kind: str, nbytes: int, seconds: float) -> None:
        """Device work the driver did itself (not through :meth:`map`) on ``nbytes`` of its blocks, for
        the placement plugin's speed model (reported when the loop on the workers ends)."""

    def checkpoint(self, state: Any, **record: Any) -> None:
        """End of an iteration: ``state`` is where the fit resumes after a failure; ``record``
        (e.g. ``inertia=``, ``loss=``, ``line=`` for verbose output) goes to progress."""
        raise NotImplementedError

    def _record(self, record: dict, seconds: float) -> dict:
        self.iteration += 1
        return {"iteration": self.iteration, "seconds": seconds, "mode": self.mode, **record}



def pass_name(func: Callable) -> str:
    """The name of a pass over the blocks by ``func`` (task names, observed durations)."""
    n = getattr(func, "__name__", None) or type(func).__name__
    return n.strip("_").replace("<", "").replace(">", "") or "pass"
