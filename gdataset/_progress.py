"""Progress of iterative fits: one mechanism for every loop of gdask.

The iteration engine hands every finished iteration's record to a :class:`Progress` in the thread
that called the fit (also when the loop runs on the workers: their records travel back as events
and are shown from the calling thread, so output lands in the notebook cell running the fit).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

__all__ = ["Progress"]

logger = logging.getLogger("gdask.progress")


class Progress:
    """Shows and forwards per-iteration records.

    Parameters
    ----------
    verbose : bool or int
        0: nothing shown; 1 or more: one line per iteration (the record's ``line``, or its fields).
    callback : callable, optional
        ``callback(record)`` for every record (a dict: ``iteration``, ``seconds``, ``mode`` and what
        the algorithm reports, e.g. ``inertia``, ``loss``, ``changed``). An exception it raises
        stops the fit.
    total : int, optional
        Iterations at most (for a bar).
    desc : str
        What is being fitted.
    """

    def __init__(self, verbose: bool | int = 0, callback: Callable[[dict], Any] | None = None,
                 total: int | None = None, desc: str = "fit") -> None:
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self.verbose = int(verbose)
        self.callback = callback
        self.total = total
        self.desc = desc
        self.records: list[dict] = []

    def update(self, record: dict) -> None:
        self.records.append(record)
        if self.verbose:
            line = record.get("line")
            if line is None:
                fields = ", ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in record.items() if k not in ("iteration", "mode"))
                line = f"{self.desc} iteration {record['iteration']}: {fields}"
            print(line, flush=True)
        if self.callback is not None:
            self.callback(record)

    def close(self) -> None:
        """The fit ended (also on error)."""
