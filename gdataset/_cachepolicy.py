"""Which cached block results GTracker keeps: a pure policy object (no I/O, no Dask)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable

__all__ = ["CacheEntry", "ReusePolicy"]


@dataclass
class CacheEntry:
    """One cached task result: the cluster key that holds it, its size and when it was last used."""

    key: Any
    nbytes: int = 0
    created: int = 0
    last_used: int = 0
    hits: int = 0


class ReusePolicy:
    """LRU by bytes plus idle ageing, over submissions.

    Events in: :meth:`add` (a result was computed), :meth:`hit` (a result was reused),
    :meth:`touch` (a result behind a reused one), :meth:`set_nbytes` (its size became known),
    :meth:`drop` (it was lost). Decision out:
    :meth:`evictions` lists the fingerprints to release. An entry not used during the last
    ``max_idle`` submissions is released (results of the changing part of a loop are never reused
    and must not pile up); beyond that, least recently used entries go until the cache holds at
    most ``max_bytes``.

    Examples
    --------
    >>> p = ReusePolicy(max_bytes=100, max_idle=2)
    >>> p.add("a", key=("x", 0), now=0); p.set_nbytes("a", 80)
    >>> p.add("b", key=("y", 0), now=1); p.set_nbytes("b", 80)
    >>> p.evictions(now=1)
    ['a']
    """

    def __init__(self, max_bytes: int, max_idle: int = 2) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if max_idle < 1:
            raise ValueError(f"max_idle must be >= 1, got {max_idle}")
        self.max_bytes = int(max_bytes)
        self.max_idle = int(max_idle)
        self.entries: OrderedDict[Hashable, CacheEntry] = OrderedDict()

    def __contains__(self, fp: Hashable) -> bool:
        return fp in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, fp: Hashable) -> CacheEntry | None:
        return self.entries.get(fp)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def add(self, fp: Hashable, key: Any, now: int) -> None:
        self.entries[fp] = CacheEntry(key=key, created=now, last_used=now)
        self.entries.move_to_end(fp)

    def hit(self, fp: Hashable, now: int) -> CacheEntry:
        e = self.entries[fp]
        e.last_used = now
        e.hits += 1
        self.entries.move_to_end(fp)
        return e

    def touch(self, fp: Hashable, now: int) -> None:
        """A result that fed one reused in submission ``now`` (not read itself): not idle, but no
        hit and no younger in the LRU order."""
        e = self.entries.get(fp)
        if e is not None:
            e.last_used = max(e.last_used, now)

    def set_nbytes(self, fp: Hashable, nbytes: int) -> None:
        if fp in self.entries:
            self.entries[fp].nbytes = int(nbytes)

    def drop(self, fp: Hashable) -> CacheEntry | None:
        return self.entries.pop(fp, None)

    def evictions(self, now: int) -> list[Hashable]:
        """Fingerprints to release now (and forget): idle ones first, then LRU over the budget."""
        out = [fp for fp, e in self.entries.items() if now - e.last_used >= self.max_idle]
        total = sum(e.nbytes for fp, e in self.entries.items() if fp not in set(out))
        gone = set(out)
        for fp, e in self.entries.items():  # oldest use first
            if total <= self.max_bytes:
                break
            if fp in gone:
                continue
            out.append(fp)
            gone.add(fp)
            total -= e.nbytes
        for fp in out:
            del self.entries[fp]
        return out
