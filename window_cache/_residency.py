"""Residency (the scheduler side of the window cache): a block's replica on the worker whose device
holds it is never the one dropped.

distributed's active memory manager runs ``ReduceReplicas`` every 2 s: when a task on another worker
fetched a copy of a block, it drops one of the two replicas, from the worker with more memory in use,
which may be the original. The block then lives on as the host copy the other worker fetched, and the
devices' memory figures no longer count it. :class:`Residency` records where each task's result was
made (the worker that computed it keeps it in its window store, on its device as far as memory
allows), or where gdask's placement moved it on purpose (:meth:`Residency.rehome`), and puts
:class:`KeepDeviceReplicas` in place of ``ReduceReplicas``: the same rule, except that the replica on
that worker is never a candidate for dropping, so fetched copies are the ones dropped. gdask's
placement asks it too (:meth:`Residency.home_of`) when it counts a replicated block for rebalancing.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Hashable, Iterator

from distributed import SchedulerPlugin
from distributed.active_memory_manager import ReduceReplicas, Suggestion

from gdask import protocol

__all__ = ["KeepDeviceReplicas", "Residency"]

Key = Hashable


class KeepDeviceReplicas(ReduceReplicas):
    """``ReduceReplicas`` that never drops a block's replica on its home worker (the worker that
    computed it: its window store, and so its device, holds it).

    Parameters
    ----------
    residency : Residency
        Where each block was made.
    """

    def __init__(self, residency: Residency) -> None:
        self.residency = residency

    def run(self) -> Iterator[Suggestion]:
        for suggestion in super().run():
            if suggestion.op == "drop":
                home = self.residency.home_of(suggestion.ts)
                if home is not None:
                    holders = suggestion.ts.who_has if suggestion.candidates is None else suggestion.candidates
                    suggestion = Suggestion("drop", suggestion.ts, set(holders) - {home})
            yield suggestion

    def __repr__(self) -> str:
        return "KeepDeviceReplicas()"


class Residency(SchedulerPlugin):
    """Records the home worker of every result in memory and keeps its replica (see the module).

    Installed with gdask's other scheduler plugins (``gdask.scheduling.scheduler_plugins``). It
    replaces the active memory manager's ``ReduceReplicas`` policy when that policy runs; with the
    active memory manager configured without it, it changes nothing.
    """

    name = protocol.PLUGIN_RESIDENCY
    idempotent = True

    def __init__(self) -> None:
        self.scheduler: Any = None
        self.policy: KeepDeviceReplicas | None = None
        self.homes: dict[Key, str] = {}
        self._by_worker: dict[str, set[Key]] = defaultdict(set)

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        amm = scheduler.extensions.get("amm")
        if amm is None:
            return
        stock = [p for p in amm.policies if type(p) is ReduceReplicas]
        if not stock:
            return
        for p in stock:
            amm.policies.discard(p)
        self.policy = KeepDeviceReplicas(self)
        amm.add_policy(self.policy)

    def transition(self, key: Key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if start == "processing" and finish == "memory":
            worker = kwargs.get("worker")
            if worker is not None:
                self.rehome(key, worker)
        elif start == "memory":
            self._forget(key)

    def rehome(self, key: Key, worker: str) -> None:
        """``key`` was moved to ``worker`` on purpose (gdask's placement rebalancing): its home now."""
        self._forget(key)
        self.homes[key] = worker
        self._by_worker[worker].add(key)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        for key in self._by_worker.pop(worker, ()):
            self.homes.pop(key, None)

    def _forget(self, key: Key) -> None:
        worker = self.homes.pop(key, None)
        if worker is not None:
            keys = self._by_worker.get(worker)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_worker[worker]

    def home_of(self, ts: Any) -> Any:
        """The ``WorkerState`` of ``ts``'s home worker, when it holds a replica; else None."""
        addr = self.homes.get(ts.key)
        ws = self.scheduler.workers.get(addr) if addr is not None and self.scheduler is not None else None
        return ws if ws is not None and ws in (ts.who_has or ()) else None
