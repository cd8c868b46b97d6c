"""Blocks sent from one worker's window store to another worker arrive as blocks, not plain values.

On an emulated device a block is a NumPy array charged to the device's pool (on ``emulated-strict``
a strict array): sent to another worker it arrives as a plain NumPy array, which the receiving store
cannot tell from any other host value (a task's small result, a plain dask array's chunk), so it
used to keep it outside its tiers, and its device figures counted the block nowhere. (CuPy arrays
arrive as CuPy arrays, on the receiving device, and are managed as any device block.)

So the sender says what it sends. When gdask's transfer handler reads a managed block for another
*worker* (distributed's ``get_data`` with ``who`` set: a dependency fetch, a replica, a placement
move; never for a client), the store hands out a :class:`SentBlock` holding the block's host data.
It pickles as that host array; unpickling returns the plain array and notes it, weakly, as
:func:`arrived`. A receiving :class:`~gdask.window_cache.WindowStore` takes a noted array as a
managed block (on the device when it fits, else on the host until a task reads it); any other
receiver (a worker without a window store) simply keeps the array, and the note dies with it.

The note is a per-process weak table keyed by the array object: it holds nothing alive and is only
read by the store that receives the very same object.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

__all__ = ["SentBlock", "arrived", "for_worker"]

#: arrays unpickled from a :class:`SentBlock` and not yet taken by a store (weak: id -> array)
_ARRIVED: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def _unpickle(value: np.ndarray) -> np.ndarray:
    if isinstance(value, np.ndarray):
        _ARRIVED[id(value)] = value
    return value


class SentBlock:
    """A managed block's host data on its way to another worker (see the module)."""

    __slots__ = ("value",)

    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def __reduce__(self) -> tuple:
        return _unpickle, (self.value,)

    def __sizeof__(self) -> int:
        return int(self.value.nbytes) + 64


def arrived(value: Any) -> bool:
    """Whether ``value`` is an array that arrived as a block from another worker's window store (the
    note is taken: a second call answers False)."""
    if not isinstance(value, np.ndarray):
        return False
    noted = _ARRIVED.get(id(value))
    if noted is not value:
        return False
    del _ARRIVED[id(value)]
    return True


def for_worker(tier: Any, value: Any) -> Any:
    """What a store sends another worker for managed block ``value`` (its device array or host copy):
    host data wrapped as a :class:`SentBlock`; a device array the receiving device takes as it is
    (CuPy) unchanged; a strict device array copied to the host first."""
    if isinstance(value, np.ndarray):
        return SentBlock(value)
    if tier is not None and tier.backend == "emulated-strict" and tier.owns(value):
        return SentBlock(tier.to_host(value))
    return value
