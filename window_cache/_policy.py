"""Pure policies of the window cache: scan order, eviction, window size.

No I/O, no threads, no devices: feed them events (insert, read, remove), read their decisions
(which block to evict, which blocks to prefetch, how many bytes the window may hold). The store in
:mod:`gdask.window_cache._store` is the thin adapter that moves the data.

How the order of a pass is learnt
---------------------------------
:class:`ScanOrder` watches the reads of managed blocks. A *pass* ends when a block that was already
read in the current pass is read again (cyclic access, as in every iteration of an ML loop over a
GDataSet). The next pass is predicted to read the blocks in the order of the last pass, or in the
reverse order when the last two passes were reverses of each other (alternating scans). Before any
pass has been seen, the predicted order is the order in which the blocks were stored (GDataSet
blocks are created in the order they are read). A loop that knows its order says so with
:meth:`ScanOrder.hint` (``gdask.window_cache.hint_order(client, keys)``), which also marks the start
of a pass; the hint wins over the observed order.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import Callable, Hashable, Iterable, Mapping, Sequence

__all__ = ["FurthestInFuture", "LRU", "ScanOrder", "WindowSize", "scan_order"]

Key = Hashable


def scan_order(keys: Sequence[Key], iteration: int) -> list[Key]:
    """The block order a loop should use in pass ``iteration``: forward on even passes, reversed
    on odd ones, so the blocks a pass leaves on the device are the first ones the next pass needs.

    Examples
    --------
    >>> scan_order(["a", "b", "c"], 0), scan_order(["a", "b", "c"], 1)
    (['a', 'b', 'c'], ['c', 'b', 'a'])
    """
    keys = list(keys)
    return keys if iteration % 2 == 0 else keys[::-1]


class ScanOrder:
    """Learns the order in which passes read blocks and predicts the reads to come.

    Parameters
    ----------
    history : int
        Completed passes remembered (2 are enough to detect alternating scans).

    Examples
    --------
    >>> o = ScanOrder()
    >>> for k in "abc":
    ...     o.insert(k)
    >>> for k in "abcab":
    ...     _ = o.observe(k)
    >>> o.future()  # rest of this pass, then the next pass
    ['c', 'a', 'b', 'c']
    """

    def __init__(self, history: int = 3) -> None:
        if history < 2:
            raise ValueError(f"history must be >= 2 to detect alternating scans, got {history}")
        self._known: dict[Key, None] = {}  # ordered set: insertion order
        self._passes: deque[list[Key]] = deque(maxlen=history)
        self._current: list[Key] = []
        self._seen: set[Key] = set()
        self._hint: list[Key] | None = None
        self.passes_completed = 0
        self._cache: tuple | None = None  # (pass order, its positions, next pass order, positions)
        self._scan = 0

    # -- events ------------------------------------------------------------------------------
    def insert(self, key: Key) -> None:
        """A block was stored."""
        self._known[key] = None
        self._invalidate()

    def remove(self, key: Key) -> None:
        """A block was deleted: it is never read again."""
        self._known.pop(key, None)
        self._invalidate()

    def observe(self, key: Key) -> bool:
        """A block was read; returns True when this read started a new pass."""
        new_pass = key in self._seen
        if new_pass:
            self._complete_pass()
        self._current.append(key)
        self._seen.add(key)
        return new_pass

    def hint(self, keys: Iterable[Key]) -> None:
        """The next pass reads ``keys`` in this order (keys this store does not hold are ignored).

        Ends the current pass if it has begun, so a loop calls it once before each pass.
        """
        if self._current:
            self._complete_pass()
        self._hint = list(keys)
        self._invalidate()

    # -- predictions -------------------------------------------------------------------------
    @property
    def alternating(self) -> bool:
        """Whether the last two passes read the same blocks in opposite orders."""
        if len(self._passes) < 2:
            return False
        a, b = self._passes[-2], self._passes[-1]
        return len(a) > 1 and a == b[::-1]

    def predicted_pass(self) -> list[Key]:
        """The full predicted order of the current pass (held blocks only)."""
        if self._hint is not None:
            base = self._hint
        elif not self._passes:
            base = list(self._known)
        else:
            last = self._passes[-1]
            base = last[::-1] if self.alternating else last
        out = [k for k in base if k in self._known]
        # held blocks the prediction does not mention are read at the end, in insertion order
        mentioned = set(out)
        out.extend(k for k in self._known if k not in mentioned)
        return out

    def future(self) -> list[Key]:
        """Predicted reads from now on: the rest of this pass, then the whole next pass."""
        pred, _, nxt, _ = self._plan()
        return [k for k in pred if k not in self._seen] + nxt

    def next_use(self, key: Key) -> float:
        """Predicted reads from now until ``key`` is read (0 = next read); ``inf`` if never.

        O(1): positions are computed once per pass (reads that deviate a little from the
        predicted order shift distances by that deviation only).
        """
        return self.next_uses((key,))[0]

    def next_uses(self, keys: Iterable[Key]) -> list[float]:
        """:meth:`next_use` of each of ``keys`` (one plan lookup for all: eviction asks for every
        block on the device at once)."""
        pred, pred_pos, _, next_pos = self._plan()
        cursor = len(self._current)
        rest = len(pred) - cursor
        seen, in_next, in_pred, inf = self._seen, next_pos.get, pred_pos.get, math.inf
        # read this pass: its place in the next one; not yet: its distance ahead (0: overdue)
        return [rest + in_next(key, inf) if key in seen
                else inf if (p := in_pred(key)) is None else float(p - cursor if p > cursor else 0)
                for key in keys]

    def upcoming(self, n: int) -> list[Key]:
        """The next ``n`` predicted reads (amortised O(n))."""
        pred, _, nxt, _ = self._plan()
        out: list[Key] = []
        i = self._scan
        while i < len(pred) and pred[i] in self._seen:
            i += 1
        self._scan = i
        while i < len(pred) and len(out) < n:
            if pred[i] not in self._seen:
                out.append(pred[i])
            i += 1
        if len(out) < n:
            out.extend(nxt[:n - len(out)])
        return out

    def _plan(self):
        if self._cache is None:
            pred = self.predicted_pass()
            nxt_base = [k for k in self._current if k in self._known]
            nxt_base += [k for k in pred if k not in self._seen]
            nxt = nxt_base[::-1] if self._next_reversed() else nxt_base
            self._cache = (pred, {k: i for i, k in enumerate(pred)}, nxt, {k: i for i, k in enumerate(nxt)})
            self._scan = 0
        return self._cache

    @property
    def current_pass(self) -> list[Key]:
        return list(self._current)

    @property
    def last_pass(self) -> list[Key] | None:
        return list(self._passes[-1]) if self._passes else None

    # -- internals ---------------------------------------------------------------------------
    def _next_reversed(self) -> bool:
        if self._hint is not None:
            # a hinted loop that alternates (hint == reverse of the pass before) keeps alternating
            return bool(self._passes) and [k for k in self._passes[-1] if k in self._known] == \
                [k for k in self._hint if k in self._known][::-1]
        return self.alternating

    def _complete_pass(self) -> None:
        self._passes.append(self._current)
        self.passes_completed += 1
        self._current = []
        self._seen = set()
        self._hint = None
        self._invalidate()

    def _invalidate(self) -> None:
        self._cache = None


class FurthestInFuture:
    """Belady's rule on the predicted reads: evict the block needed furthest in the future, and
    prefetch the blocks of the next ``lookahead`` predicted reads.

    Parameters
    ----------
    order : ScanOrder, optional
        Where predictions come from; a new one by default.
    lookahead : int
        Predicted reads ahead of the current one that are prefetched (0 = no prefetch).
    cost : callable, optional
        ``cost(key, nbytes) -> float``: among blocks needed equally far ahead (e.g. never), the
        cheapest to bring back is evicted first. Default: the size.
    """

    prefetches = True

    def __init__(self, order: ScanOrder | None = None, lookahead: int = 2,
                 cost: Callable[[Key, int], float] | None = None) -> None:
        if lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {lookahead}")
        self.order = order if order is not None else ScanOrder()
        self.lookahead = int(lookahead)
        self.cost = cost or (lambda key, nbytes: float(nbytes))

    def on_insert(self, key: Key) -> None:
        self.order.insert(key)

    def on_read(self, key: Key) -> bool:
        return self.order.observe(key)

    def on_remove(self, key: Key) -> None:
        self.order.remove(key)

    def hint(self, keys: Iterable[Key]) -> None:
        self.order.hint(keys)

    def victims(self, resident: Mapping[Key, int], need: int, *, before: float | None = None) -> list[Key]:
        """Blocks to evict, furthest next use first, until ``need`` bytes are covered.

        With ``before``, only blocks whose next use is strictly later qualify (a prefetch never
        evicts a block needed sooner than the one it loads). May cover less than ``need``.
        """
        if need <= 0 or not resident:
            return []
        keys = list(resident)
        uses = self.order.next_uses(keys)
        cost = self.cost
        # candidates' next uses; -inf marks a block that does not qualify or was taken
        left = uses if before is None else [u if u > before else -math.inf for u in uses]
        out, got = [], 0
        for _ in range(8):  # usually one or two victims: the furthest, without sorting them all
            if got >= need:
                return out
            top = max(left)
            if top == -math.inf:
                return out
            i = left.index(top)  # the first stored among equally far ones...
            if left.count(top) > 1:  # ...unless their costs differ: the cheapest to bring back
                i = min((j for j, u in enumerate(left) if u == top),
                        key=lambda j: (cost(keys[j], resident[keys[j]]), j))
            left[i] = -math.inf
            out.append(keys[i])
            got += resident[keys[i]]
        rest = sorted((j for j, u in enumerate(left) if u != -math.inf),
                      key=lambda j: (-left[j], cost(keys[j], resident[keys[j]]), j))
        for j in rest:
            if got >= need:
                break
            out.append(keys[j])
            got += resident[keys[j]]
        return out

    def prefetch(self, is_on_device: Callable[[Key], bool]) -> list[tuple[Key, float]]:
        """``(key, next use)`` of the blocks among the next ``lookahead`` predicted reads that are
        not on the device, soonest first."""
        out = []
        for i, k in enumerate(self.order.upcoming(self.lookahead)):
            if not is_on_device(k):
                out.append((k, float(i)))
        return out


class LRU:
    """Least recently used eviction, no prefetch: the baseline (and dask-cuda's spill order)."""

    prefetches = False

    def __init__(self) -> None:
        self._order: OrderedDict[Key, None] = OrderedDict()

    def on_insert(self, key: Key) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def on_read(self, key: Key) -> bool:
        if key in self._order:
            self._order.move_to_end(key)
        return False

    def on_remove(self, key: Key) -> None:
        self._order.pop(key, None)

    def hint(self, keys: Iterable[Key]) -> None:
        """LRU ignores hints."""

    def victims(self, resident: Mapping[Key, int], need: int, *, before: float | None = None) -> list[Key]:
        out, got = [], 0
        for k in self._order:
            if got >= need:
                break
            if k in resident:
                out.append(k)
                got += resident[k]
        return out

    def prefetch(self, is_on_device: Callable[[Key], bool]) -> list[tuple[Key, float]]:
        return []


class WindowSize:
    """How many bytes the window may keep on the device: free device memory minus a reserve.

    The window follows free memory: whatever else is allocated on the device (task temporaries,
    results, other stores) shrinks it; when that memory is freed the window grows back.

    Parameters
    ----------
    reserve : int or float
        Device memory left free for computations: bytes, or a fraction (< 1) of the budget. At
        least one block (the largest stored) is always kept free, so the next block a task
        allocates fits.
    """

    def __init__(self, reserve: int | float = 0.05) -> None:
        if reserve < 0:
            raise ValueError(f"reserve must be >= 0 (bytes or a fraction of device memory), got {reserve!r}")
        self.reserve = reserve

    def reserve_bytes(self, budget: int, largest: int = 0) -> int:
        r = self.reserve * budget if isinstance(self.reserve, float) and self.reserve < 1 else self.reserve
        return int(max(r, largest))

    def capacity(self, *, budget: int, used: int, held: int, largest: int = 0) -> int:
        """Bytes the window may hold.

        Parameters
        ----------
        budget : int
            Device memory budget (bytes).
        used : int
            Device memory in use now, including the window's own blocks (bytes).
        held : int
            Device bytes held by the window (resident, in flight, and evicted blocks still
            referenced by running tasks).
        largest : int
            Largest block size (bytes), kept free on top of the reserve.
        """
        other = max(0, used - held)
        return max(0, budget - self.reserve_bytes(budget, largest) - other)
