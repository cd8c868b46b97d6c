"""Where a loop runs: the engine's mode choice, as a pure function of what it found out.

:func:`plan` takes a :class:`Situation` (a Client or not, data larger than the devices or not,
where the blocks are) and the algorithm's allowed modes, and returns a :class:`Plan`. Finding the
situation out (persisting, asking the scheduler) is the caller's job
(:func:`gdask.gdataset.engine._client.survey`); nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from gdask.gdataset.engine._api import MODES
from gdask.gdataset.locality import BlockPlaces

__all__ = ["Plan", "Situation", "plan"]


@dataclass(frozen=True)
class Situation:
    """What the engine found out before choosing a mode.

    Attributes
    ----------
    has_client : bool
        A Client is there (the blocks are persisted on its cluster).
    has_data : bool
        The loop has a GDataSet (client-mode algorithms may build their own graphs).
    nblocks : int
        Blocks of each dataset (0 without data).
    streaming : bool
        The datasets take more than the devices can hold (they stream through the window cache).
    places : BlockPlaces or None
        Where the reference dataset's blocks are; None when not asked (no Client, no data, or
        data larger than the devices for an algorithm that can leave the workers) or not persisted.
    worker_loop : bool
        Config ``gdask.ml.worker-loop``: loops may run on the workers.
    """

    has_client: bool
    has_data: bool
    nblocks: int = 0
    streaming: bool = False
    places: BlockPlaces | None = None
    worker_loop: bool = True

    @property
    def groups(self) -> list[list[int]] | None:
        """The blocks grouped by the worker thread that holds them, or None (not all held)."""
        return None if self.places is None else self.places.groups(self.nblocks)


@dataclass(frozen=True)
class Plan:
    """Where a loop runs first, and over which blocks.

    Attributes
    ----------
    mode : str
        ``"workers"``, ``"client"``, ``"stream"``, or ``"local"`` (a workers-only driver in this
        process, without a Client).
    workers_only : bool
        The algorithm runs on the workers only (a failed loop runs there again, never from the client).
    streaming : bool
        Data larger than the devices: a loop on the workers reads its blocks from the workers' stores.
    places : BlockPlaces or None
        Where the reference dataset's blocks are (None when unknown or not needed).
    groups : list of list of int or None
        The blocks grouped by the worker thread that holds them (the tasks of a client pass; the
        ranks of a loop on the workers), or None.
    """

    mode: str
    workers_only: bool
    streaming: bool
    places: BlockPlaces | None
    groups: list[list[int]] | None


def _choose(modes: Sequence[str], situation: Situation, workers_only: bool) -> str:
    """The first of :data:`MODES` that ``modes`` allows and the situation permits; else the
    algorithm's client mode, else its first mode."""
    s = situation
    allowed = {
        "workers": (s.has_client and (not s.streaming or workers_only) and s.groups is not None
                    and (workers_only or s.worker_loop)),
        "stream": s.streaming,
        "client": not s.streaming or "stream" not in modes,
    }
    chosen = next((m for m in MODES if m in modes and allowed[m]), None)
    if chosen is not None:
        return chosen
    return "client" if "client" in modes else modes[0]


def plan(name: str, modes: Sequence[str], situation: Situation, mode: str | None = None) -> Plan:
    """The mode a loop runs in first, from the algorithm's ``modes`` and the ``situation``.

    Parameters
    ----------
    name : str
        The algorithm's name (for errors).
    modes : sequence of str
        Where the algorithm's driver may run.
    situation : Situation
    mode : str, optional
        A mode the caller forces (checked against ``modes`` before).

    Returns
    -------
    Plan

    Raises
    ------
    ValueError
        A loop that must run on the workers without data, or whose blocks are not all in the
        cluster's memory.
    """
    modes = tuple(modes)
    workers_only = modes == ("workers",)
    chosen = mode if mode is not None else _choose(modes, situation, workers_only)
    groups = situation.groups
    if chosen != "workers":
        return Plan(chosen, workers_only, situation.streaming, situation.places, groups)
    if not situation.has_client:  # the driver runs here, as the only rank over every block
        if not situation.has_data:
            raise ValueError(f"{name} runs on the workers and needs a GDataSet in data")
        return Plan("local", workers_only, situation.streaming, situation.places, groups)
    if groups is None:
        raise ValueError(f"{name} runs on the workers and needs its blocks in cluster memory; they are not "
                         "(persist them with the same Client)")
    return Plan("workers", workers_only, situation.streaming, situation.places, groups)
