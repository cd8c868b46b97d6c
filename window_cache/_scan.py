"""Loop side of the window: run a pass over the blocks in the window's scan order."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Hashable, Iterator, Sequence

from gdask.window_cache._policy import scan_order

__all__ = ["scan", "scan_priority"]


def scan_priority(order: Sequence[int]) -> Callable[[Hashable], int]:
    """A ``dask.annotate(priority=...)`` function that runs block tasks in ``order``.

    Block tasks are the keys ``(name, i)`` of row-blocked collections (GDataSet, 1-D chunked
    dask arrays): block ``order[0]`` gets the highest priority. Other keys (reduction combines)
    run after the block tasks they wait for.
    """
    pos = {int(b): p for p, b in enumerate(order)}
    last = len(pos) + 1

    def priority(key: Hashable) -> int:
        if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], int) and key[1] in pos:
            return -pos[key[1]]
        return -last

    return priority


@contextlib.contextmanager
def scan(keys: Sequence[Hashable], iteration: int, client: Any = None, hint: bool = True) -> Iterator[list[int]]:
    """Build the tasks of pass ``iteration`` inside this context: they read the blocks forward on
    even passes and backward on odd ones, so the blocks a pass leaves on the device are the first
    ones the next pass reads; with ``hint`` the workers' window stores are told the order.

    Parameters
    ----------
    keys : sequence
        The block keys in block order (``G.__dask_keys__()`` of a GDataSet ``G``).
    iteration : int
        Pass number (0, 1, ...).
    client : distributed.Client, optional
        For the hint; default the current client (no hint without one).

    Yields
    ------
    list of int
        The block order of this pass.

    Examples
    --------
    >>> for it in range(10):  # doctest: +SKIP
    ...     with gdask.window_cache.scan(G.__dask_keys__(), it):
    ...         part = G.reduce_blocks(lloyd_partial, lloyd_combine, centers)
    ...     r = part.compute()
    """
    import dask

    keys = list(keys)
    order = scan_order(range(len(keys)), iteration)
    if hint:
        if client is None:
            try:
                from distributed import default_client

                client = default_client()
            except (ImportError, ValueError):
                client = None
        if client is not None:
            from gdask.window_cache._client import hint_order

            hint_order(client, [keys[i] for i in order])
    with dask.annotate(priority=scan_priority(order)):
        yield order
