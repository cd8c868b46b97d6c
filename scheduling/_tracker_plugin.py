"""Which tasks actually ran (computed, not reused), recorded on the scheduler.

:class:`ExecutionLogPlugin` records every task that went processing -> memory (it was computed, not
reused) with its size. A client reads and clears the records through the scheduler handler
:data:`gdask.protocol.HANDLER_EXECUTION_LOG`, together with the sizes of keys it keeps, in one
round trip. Nothing here knows what the client does with them.
"""

from __future__ import annotations

from typing import Any, Iterable

from distributed.diagnostics.plugin import SchedulerPlugin

from gdask import protocol

__all__ = ["ExecutionLogPlugin"]


class ExecutionLogPlugin(SchedulerPlugin):
    """Records keys that went processing -> memory (i.e. were computed) with their sizes.

    Parameters
    ----------
    limit : int
        Records kept at most; beyond it the oldest half is forgotten.

    Attributes
    ----------
    executed : dict
        ``{key: nbytes}`` of the tasks computed since the records were last popped, oldest first.
    """

    name = protocol.PLUGIN_EXECUTION_LOG
    idempotent = True

    def __init__(self, limit: int = 500_000) -> None:
        if limit < 2:
            raise ValueError(f"the execution log keeps at least 2 records, got limit={limit!r}")
        self.limit = int(limit)
        self.executed: dict[Any, int] = {}
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        scheduler.handlers[protocol.HANDLER_EXECUTION_LOG] = self._handle_pop

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if start == "processing" and finish == "memory":
            self.executed[key] = int(kwargs.get("nbytes") or 0)
            if len(self.executed) > self.limit:  # bounded: forget the oldest records
                for k in list(self.executed)[: self.limit // 2]:
                    del self.executed[k]

    def pop(self, keys: Iterable[Any] | None = None) -> dict[Any, int]:
        """``{key: nbytes}`` of the recorded executions of ``keys`` (all of them when None), forgotten."""
        if keys is None:
            done, self.executed = self.executed, {}
            return done
        return {k: self.executed.pop(k) for k in keys if k in self.executed}

    def in_memory(self, keys: Iterable[Any]) -> dict[Any, int]:
        """``{key: nbytes}`` of those of ``keys`` the scheduler holds in memory now (0: size unknown)."""
        tasks = self.scheduler.tasks
        out = {}
        for k in keys:
            ts = tasks.get(k)
            if ts is not None and ts.state == "memory":
                out[k] = int(ts.nbytes) if ts.nbytes and ts.nbytes > 0 else 0
        return out

    def _handle_pop(self, keys: Iterable[Any] | None = None, sizes: Iterable[Any] = (),
                    **kwargs: Any) -> tuple[list, list]:
        """``([(key, nbytes)] popped for ``keys``, [(key, nbytes)] of ``sizes`` in memory)``; pairs, not
        dicts: keys are tuples, and messages keep them as tuples only outside mapping keys."""
        return list(self.pop(keys).items()), list(self.in_memory(sizes or ()).items())
