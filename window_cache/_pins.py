"""Who reads a block, and which blocks are in use: the window store's explicit protocol.

Two facts change what the store does, and it is told both; it never guesses them:

* **Who reads.** gdask's hooks on the worker (:mod:`gdask.window_cache._hooks`) mark the reads they
  make, with a context variable that holds for the asyncio task (or thread) that set it and nothing
  else:

  - the transfer handler (gdask's wrapper of the worker's ``get_data``) marks reads that send blocks
    to another worker or to a client (:func:`reading_for_transfer`): a block not on the device is
    sent from its host copy, without loading it onto the device;
  - the task wrapper (gdask's wrapper of the worker's ``execute``) marks the reads that assemble a
    task's inputs (:func:`reading_inputs_of`): a task whose input blocks cannot all be on the device
    at once gets an error naming the sizes.

  Any other read (``store[key]`` from code that holds the store) is a plain read: it loads the block
  onto the device.

* **Which blocks are in use.** A running task holds a *pin* on each of its inputs (:class:`Pins`),
  taken by the task wrapper before the inputs are read and released when the task ends (the wrapper,
  and a worker plugin's ``transition`` hook when the task leaves its running states, so a missed
  release cannot pin a block for ever). Evicting a pinned block frees no memory until its task ends:
  requests for room that must be met at once skip pinned blocks.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Iterator

__all__ = ["Pins", "Reader", "current_reader", "reading_for_transfer", "reading_inputs_of"]

Key = Hashable


@dataclass(frozen=True)
class Reader:
    """Who reads: ``kind`` is ``"transfer"`` (sending to another worker, ``to_worker``, or to a
    client) or ``"task"`` (assembling the inputs of task ``task``)."""

    kind: str
    task: Any = None
    to_worker: bool = False

#: the reader of the current asyncio task or thread (None: a plain read). A context variable is
#: per context, not shared state: it must be made once, at module level, for contexts to find it.
_READER: ContextVar[Reader | None] = ContextVar("gdask_window_reader", default=None)


def current_reader() -> Reader | None:
    """The reader that marked the current context, or None (a plain read)."""
    return _READER.get()


@contextlib.contextmanager
def _reading(reader: Reader) -> Iterator[None]:
    token = _READER.set(reader)
    try:
        yield
    finally:
        _READER.reset(token)


def reading_for_transfer(who: Any = None):
    """Reads inside this context send blocks elsewhere (gdask's transfer handler): to the worker at
    address ``who``, or to a client (or the scheduler) when it is None."""
    return _reading(Reader("transfer", to_worker=who is not None))


def reading_inputs_of(task: Key):
    """Reads inside this context assemble the inputs of ``task`` (gdask's task wrapper)."""
    return _reading(Reader("task", task))


class Pins:
    """Pin counts held by running tasks: which blocks are in use.

    Pure bookkeeping (no lock: the store keeps it under its own). Pins are counted by key, not by
    stored value, so a block stored again under the same key stays pinned while a task holds it.

    Examples
    --------
    >>> p = Pins()
    >>> p.take("t1", ["a", "b"]), p.take("t2", ["b"])
    (True, True)
    >>> p.count("b"), p.release("t1"), p.count("b"), p.count("a")
    (2, ('a', 'b'), 1, 0)
    >>> p.release("t1")  # a second release changes nothing
    ()
    """

    def __init__(self) -> None:
        self._inputs: dict[Key, tuple[Key, ...]] = {}  # task -> the keys it pinned
        self._count: dict[Key, int] = {}

    def take(self, task: Key, keys: Iterable[Key]) -> bool:
        """``task`` starts and pins ``keys``; False (nothing changes) when it already holds pins."""
        if task in self._inputs:
            return False
        keys = tuple(dict.fromkeys(keys))
        self._inputs[task] = keys
        for k in keys:
            self._count[k] = self._count.get(k, 0) + 1
        return True

    def release(self, task: Key) -> tuple[Key, ...]:
        """``task`` ended: drop its pins; returns the keys it had pinned (``()`` when none)."""
        keys = self._inputs.pop(task, ())
        for k in keys:
            left = self._count.get(k, 0) - 1
            if left > 0:
                self._count[k] = left
            else:
                self._count.pop(k, None)
        return keys

    def count(self, key: Key) -> int:
        """Running tasks that hold ``key``."""
        return self._count.get(key, 0)

    def inputs(self, task: Key) -> tuple[Key, ...] | None:
        """The keys ``task`` pinned (None when it holds no pins)."""
        return self._inputs.get(task)

    def tasks(self) -> list[Key]:
        """The tasks that hold pins now."""
        return list(self._inputs)

    def __len__(self) -> int:
        return len(self._inputs)
