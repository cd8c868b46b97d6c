"""HTML repr of a GDataSet for Jupyter: shape, layout, and where each block lives."""

from __future__ import annotations

import html
from typing import Any

from dask.utils import format_bytes


def persisted_futures(x) -> list | None:
    """The futures of ``x``'s blocks when every block is held in cluster memory, else ``None``."""
    try:
        from distributed import futures_of
    except ImportError:
        return None
    futures = futures_of(x)
    keys = set(x.__dask_keys__())
    if len(futures) < len(keys) or not all(f.key in keys for f in futures):
        return None  # not (only) persisted blocks
    return futures


def groups_of(where: tuple[dict[int, str], dict[str, int]] | None, nblocks: int) -> list[list[int]] | None:
    """:meth:`GDataSet.block_groups` from :func:`block_workers`'s answer ``where``."""
    if where is None or len(where[0]) != nblocks:
        return None
    workers, nthreads = where
    groups: list[list[int]] = []
    for addr in sorted(set(workers.values())):
        mine = sorted(i for i, w in workers.items() if w == addr)
        t = max(1, min(nthreads.get(addr, 1), len(mine)))
        groups.extend(mine[j::t] for j in range(t))
    return groups


def block_workers(x, client=None, wait_ready: bool = False) -> tuple[dict[int, str], dict[str, int]] | None:
    """``({block index: worker address}, {worker address: nthreads})`` for the blocks of ``x`` held
    in cluster memory (first holder of each), or ``None`` without a client or persisted blocks.
    ``wait_ready`` waits for blocks still being computed by ``persist``."""
    if client is None:
        try:
            from distributed import default_client

            client = default_client()
        except (ImportError, ValueError):
            return None
    from distributed import wait

    futures = persisted_futures(x)
    if futures is None:
        return None
    index = {k: i for i, k in enumerate(x.__dask_keys__())}
    keys = [f.key for f in futures]

    async def ask():  # both questions in one round trip
        import asyncio

        return await asyncio.gather(client.scheduler.who_has(keys=keys), client.scheduler.ncores())

    if wait_ready:
        from gdask import config

        limit = float(config.get("timeouts.blocks", 600))
        try:
            wait(futures, timeout=limit)
        except TimeoutError:
            raise TimeoutError(f"the persisted blocks of {x.name} were not all computed within {limit:g} s "
                               "(gdask.timeouts.blocks)") from None
    try:
        who, nthreads = client.sync(ask)
    except Exception:  # noqa: BLE001 - no scheduler: treat as not persisted
        return None
    workers = {index[k]: sorted(addrs)[0] for k, addrs in who.items() if k in index and addrs}
    return workers, {addr: int(n) for addr, n in nthreads.items()}


def block_locations(x) -> dict[int, str]:
    """Block index -> worker name for blocks held in cluster memory (empty if not persisted)."""
    where = block_workers(x)
    if where is None:
        return {}
    try:
        from distributed import default_client

        info = default_client().scheduler_info(n_workers=-1)["workers"]
    except Exception:  # noqa: BLE001 - a repr must never raise
        return {}
    names = {addr: str(w.get("name", addr)) for addr, w in info.items()}
    return {i: names.get(a, a) for i, a in where[0].items()}


def gdataset_html(x: Any) -> str:
    where = block_locations(x)
    rows = []
    offs = x.block_offsets
    show = (list(range(x.nblocks)) if x.nblocks <= 12
            else list(range(6)) + [None] + list(range(x.nblocks - 3, x.nblocks)))
    for i in show:
        if i is None:
            rows.append("<tr><td colspan=4>...</td></tr>")
            continue
        nb = x.row_blocks[i] * (x.ncols or 1) * x.dtype.itemsize
        loc = where.get(i, "not persisted" if not where else "?")
        rows.append(f"<tr><td>{i}</td><td>{offs[i]}:{offs[i] + x.row_blocks[i]}</td><td>{format_bytes(nb)}</td>"
                    f"<td>{html.escape(loc)}</td></tr>")
    layout = "feature-major (Fortran order)" if x.ndim == 2 else "contiguous"
    return (
        "<div><strong>GDataSet</strong> "
        f"<code>{html.escape(x.name)}</code><br>shape {x.shape}, dtype {x.dtype}, {format_bytes(x.nbytes)} in "
        f"{x.nblocks} blocks, backend {x.backend}, layout {layout}</div>"
        "<table><tr><th>block</th><th>rows</th><th>bytes</th><th>device (worker)</th></tr>"
        + "".join(rows) + "</table>"
    )
