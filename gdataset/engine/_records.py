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
    """Every checkpoint record of one fit, in iteration order, once each.

    A driver's context calls the object with each checkpoint (``records(state, record)``), in the
    thread that called the fit; the record goes to :attr:`history` and to the fit's
    :class:`~gdask.gdataset.Progress`, and :attr:`resume` moves to it.

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

    def __call__(self, state: Any, record: dict) -> None:
        self.resume = Resume(record["iteration"], state)
        self.history.append(record)
        self.progress.update(record)
        self.interrupts.check()

    def poll(self) -> None:
        """Between checkpoints (while the fit waits for its workers): a lost Ctrl-C ends it here."""
        self.interrupts.check()

    def newer(self, iteration: int, state: Any, record: dict) -> None:
        """A checkpoint that came back from the workers (as an event, or asked from a survivor):
        recorded if it is newer than the last one, dropped otherwise (events may repeat)."""
        if iteration > self.resume.iteration:
            self(state, record)

    def fill(self, iteration: int, state: Any) -> None:
        """Records for the iterations up to ``iteration`` that never came back from the workers (the
        driver's own count is authoritative), each with ``state`` and the mode only."""
        for it in range(self.resume.iteration + 1, iteration + 1):
            self(state, {"iteration": it, "mode": "workers"})
