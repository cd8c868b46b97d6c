"""Ctrl-C during a fit is never lost.

Python drops an exception raised inside a ``__del__`` method or a weakref callback (it prints
"Exception ignored in ..." and goes on), a ``KeyboardInterrupt`` too: a SIGINT that arrives while
the garbage collector finalises one of distributed's futures in the fit's thread would be lost,
and the fit would run to its end. :class:`Interrupts` notes every SIGINT while a fit runs, so the
fit raises ``KeyboardInterrupt`` at its next checkpoint (or when it ends) if the first one was
swallowed.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, Callable

__all__ = ["Interrupts"]


class Interrupts:
    """While entered: SIGINT's handler notes the signal, then calls the handler it replaced
    (Python's default raises ``KeyboardInterrupt``); :meth:`check` raises ``KeyboardInterrupt``
    for a signal noted and not raised through yet. Only in the main thread and when SIGINT's handler
    is a Python callable (elsewhere signals do not reach Python code, and an ignored or default
    SIGINT stays so); otherwise :meth:`check` never raises."""

    def __init__(self) -> None:
        self.pending = False
        self._previous: Callable[[int, FrameType | None], Any] | None = None

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):
                self._previous = previous
                signal.signal(signal.SIGINT, self._noted)
        return self

    def _noted(self, signum: int, frame: FrameType | None) -> Any:
        self.pending = True
        return self._previous(signum, frame)

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if a SIGINT came since the last check and its own exception
        was swallowed (else it is on its way up already and this is never reached)."""
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt("interrupted during the fit (the signal's own exception was lost "
                                    "in a finaliser)")

    def __exit__(self, typ: type | None, exc: BaseException | None, tb: Any) -> None:
        if self._previous is not None:
            if signal.getsignal(signal.SIGINT) == self._noted:  # untouched while the fit ran
                signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        if typ is None:
            self.check()
