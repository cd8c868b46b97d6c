"""HTML repr of a GDataSet for Jupyter: shape, layout, and where each block lives."""

from __future__ import annotations

import html
from typing import Any

from dask.utils import format_bytes


def block_locations(x) -> dict[int, str]:
    """Block index -> worker name for blocks held in cluster memory (empty if not persisted)."""
    try:
        from distributed import Future, default_client

        client = default_client()
    except (ImportError, ValueError):
        return {}
    futures = {}
    for i, k in enumerate(x.__dask_keys__()):
        node = x.dask.get(k) if hasattr(x.dask, "get") else None
        fut = getattr(node, "value", node)
        if isinstance(fut, Future):
            futures[k] = i
    if not futures:
        return {}
    try:
        who = client.who_has(list(futures))
        info = client.scheduler_info(n_workers=-1)["workers"]
    except Exception:  # noqa: BLE001 - a repr must never raise
        return {}
    names = {addr: str(w.get("name", addr)) for addr, w in info.items()}
    return {futures[k]: ", ".join(names.get(a, a) for a in addrs) for k, addrs in who.items()
            if k in futures}


def gdataset_html(x: Any) -> str:
    where = block_locations(x)
    rows = []
    offs = x.block_offsets
    show = list(range(x.nblocks)) if x.nblocks <= 12 else list(range(6)) + [None] + list(range(x.nblocks - 3, x.nblocks))
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
