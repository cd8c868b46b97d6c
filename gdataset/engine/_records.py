"""A fit's checkpoint records on the client: its history, its progress, and where it resumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gdask.gdataset._progress import Progress
from gdask.gdataset.engine._interrupt import Interrupts

__all__ = ["Records", "Resume"]


@dataclass(frozen=True)
class Resume:
    """Where a fit resumes after a failure: the last checkpoint recorded.

    Attributes
    ----------
    iteration : int
        Iterations finished (0: none, the fit starts from its initial state).
    state : any
        The driver's state after that iteration.
    """

    iteration: int
    state: Any


class Records:
    """Every checkpoint record of one fit, in iteration order, once each, and where it resumes.

    A driver's context calls the object with each checkpoint (``records(state, record)``), in the
    thread that called the fit; a record not seen before goes to :attr:`history` and to the fit's
    :class:`~gdask.gdataset.Progress`, and :attr:`resume` moves to the state. A loop on the workers
    sends its records back every iteration but its states only now and then (:meth:`newer` with
    ``state=None``: progress only), so the history may run ahead of :attr:`resume`; a loop resumed
    from an older state repeats iterations whose records are already in the history (not again).

    Parameters
    ----------
    state : any
        The driver's initial state (where the fit resumes before any checkpoint).
    progress : Progress
    interrupts : Interrupts, optional
        Checked at every checkpoint: a Ctrl-C whose exception was lost ends the fit there.
    """

    def __init__(self, state: Any, progress: Progress, interrupts: Interrupts | None = None) -> None:
        self.resume = Resume(0, state)
        self.history: list[dict] = []
        self.progress = progress
        self.interrupts = interrupts if interrupts is not None else Interrupts()

    @property
    def recorded(self) -> int:
        """The last iteration in :attr:`history` (0: none)."""
        return self.history[-1]["iteration"] if self.history else 0

    def __call__(self, state: Any, record: dict) -> None:
        self.resume = Resume(record["iteration"], state)
        self._record(record)
        self.interrupts.check()

    def _record(self, record: dict) -> None:
        if record["iteration"] > self.recorded:
            self.history.append(record)
            self.progress.update(record)

    def poll(self) -> None:
        """Between checkpoints (while the fit waits for its workers): a lost Ctrl-C ends it here."""
        self.interrupts.check()

    def newer(self, iteration: int, state: Any, record: dict) -> None:
        """A checkpoint that came back from the workers (as an event, or asked from a survivor): its
        record if it is not in the history yet, and its state if it is newer than :attr:`resume`
        (events may repeat). ``state=None``: a record without its state (progress only)."""
        self._record(record)
        if state is not None and iteration > self.resume.iteration:
            self.resume = Resume(iteration, state)
        self.interrupts.check()

    def fill_history(self, iteration: int) -> None:
        """Records, with the mode only, for the iterations up to ``iteration`` whose own never came
        back from the workers (lost with a worker, or not arrived yet)."""
        for it in range(self.recorded + 1, iteration + 1):
            self._record({"iteration": it, "mode": "workers"})

    def fill(self, iteration: int, state: Any) -> None:
        """The end of a loop on the workers: :meth:`fill_history` up to ``iteration`` (the driver's
        own count is authoritative), and ``state`` is where the fit stands after it."""
        self.fill_history(iteration)
        if iteration >= self.resume.iteration:
            self.resume = Resume(iteration, state)
