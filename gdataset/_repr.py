"""HTML repr of a GDataSet for Jupyter: shape, layout, and where each block lives."""

from __future__ import annotations

import html
import logging
from typing import Any

import numpy as np
from dask.utils import format_bytes

from gdask import config
from gdask._compat import run_async

logger = logging.getLogger("gdask.gdataset")


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


def default_client_or_none() -> Any:
    """The current Dask client, or None (no client, or distributed not installed)."""
    try:
        from distributed import default_client

        return default_client()
    except (ImportError, ValueError):
        return None


def block_workers(x, client=None, wait_ready: bool = False) -> tuple[dict[int, str], dict[str, int]] | None:
    """``({block index: worker address}, {worker address: nthreads})`` for the blocks of ``x`` held
    in cluster memory (first holder of each), or ``None`` without a client or persisted blocks.
    ``wait_ready`` waits for blocks still being computed by ``persist``."""
    client = client if client is not None else default_client_or_none()
    if client is None:
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
        limit = float(config.get("timeouts.blocks", 600))
        try:
            wait(futures, timeout=limit)
        except TimeoutError:
            raise TimeoutError(f"the persisted blocks of {x.name} were not all computed within {limit:g} s "
                               "(gdask.timeouts.blocks)") from None
        failed = next((f for f in futures if f.status == "error"), None)
        if failed is not None:  # a block could not be made: say why, rather than "not persisted"
            raise failed.exception()
    try:
        who, nthreads = client.sync(ask)
    except OSError:  # the scheduler is gone: treat as not persisted
        return None
    workers = {index[k]: sorted(addrs)[0] for k, addrs in who.items() if k in index and addrs}
    return workers, {addr: int(n) for addr, n in nthreads.items()}


#: seconds a repr waits for blocks that ``persist()`` is still computing (then shows them as computing)
REPR_WAIT = 5.0

#: one colour per device (worker), in worker-name order
_PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
            "#bab0ac")


def _tiers_on_worker(keys: list, dask_worker: Any = None) -> list[str | None]:
    """(on a worker) The window-store tier of each key it holds (``device``, ``host``, ``disk``,
    ``in-flight``), or None for a plain store / a plain value."""
    from gdask.window_cache import worker_store

    store = worker_store(dask_worker)
    out = []
    for k in keys:
        k = tuple(k) if isinstance(k, list) else k
        st = store.state(k) if store is not None else None
        out.append(None if st is None else str(getattr(st, "value", st)))
    return out


def block_status(x: Any, wait: float = REPR_WAIT) -> dict[int, dict[str, Any]] | None:
    """Where each block of ``x`` is: ``{index: {"worker", "name", "tier"}}``, blocks still being
    computed as ``{"worker": None, "tier": "computing"}``; None when ``x`` is not persisted or there
    is no client. Waits at most ``wait`` seconds for blocks still landing after ``persist()``, and
    asks the scheduler and the holding workers once each (a repr must not block a notebook)."""
    client = default_client_or_none()
    if client is None:
        return None
    from distributed import wait as dwait
    from distributed.utils import TimeoutError as DTimeout

    futures = persisted_futures(x)
    if futures is None:
        return None
    try:
        dwait(futures, timeout=wait)
    except (DTimeout, TimeoutError):
        pass  # some blocks are still computing: shown as such
    index = {k: i for i, k in enumerate(x.__dask_keys__())}
    try:
        who = client.who_has(futures)
        info = client.scheduler_info(n_workers=-1)["workers"]
    except Exception as e:  # noqa: BLE001 - a repr must never raise: no scheduler, shown as not persisted
        logger.debug("GDataSet repr: could not ask where the blocks are: %r", e)
        return None
    names = {addr: str(w.get("name", addr)) for addr, w in info.items()}
    out: dict[int, dict[str, Any]] = {i: {"worker": None, "name": None, "tier": "computing"} for i in index.values()}
    by_worker: dict[str, list] = {}
    for k, addrs in who.items():
        if k in index and addrs:
            addr = sorted(addrs)[0]
            out[index[k]] = {"worker": addr, "name": names.get(addr, addr), "tier": None}
            by_worker.setdefault(addr, []).append(k)
    try:  # the tier of each block in its worker's window store (one round trip, all workers at once)
        async def ask():
            import asyncio

            return await asyncio.wait_for(asyncio.gather(*[
                run_async(client, _tiers_on_worker, ks, workers=[a], on_error="return")
                for a, ks in by_worker.items()]),
                timeout=wait)

        for (addr, ks), res in zip(by_worker.items(), client.sync(ask) if by_worker else []):
            tiers = res.get(addr) if isinstance(res, dict) else None
            if isinstance(tiers, list):
                for k, t in zip(ks, tiers):
                    out[index[k]]["tier"] = t
    except Exception as e:  # noqa: BLE001 - tiers are a nicety: the diagram shows devices without them
        logger.debug("GDataSet repr: could not ask the workers for the blocks' tiers: %r", e)
    return out


def block_locations(x) -> dict[int, str]:
    """Block index -> worker name for blocks held in cluster memory (empty if not persisted)."""
    where = block_status(x)
    if not where:
        return {}
    return {i: w["name"] for i, w in where.items() if w["name"] is not None}


def _diagram(x: Any, where: dict[int, dict[str, Any]] | None, colors: dict[str, str], width: int = 560) -> str:
    """An SVG row of the blocks, widths by rows, coloured by device; host / disk blocks hatched /
    grey-edged, blocks not persisted grey, blocks still computing dashed."""
    n = x.nblocks
    rows = list(x.row_blocks)
    total = sum(rows) or 1
    gap = 1 if n <= 200 else 0
    usable = width - gap * (n - 1)
    parts = ['<defs><pattern id="gd-hatch" width="4" height="4" patternUnits="userSpaceOnUse" '
             'patternTransform="rotate(45)"><rect width="4" height="4" fill="white" fill-opacity="0.55"/>'
             '<line x1="0" y1="0" x2="0" y2="4" stroke="white" stroke-width="2"/></pattern></defs>']
    xpos = 0.0
    for i, r in enumerate(rows):
        w = max(usable * r / total, 0.5)
        st = (where or {}).get(i)
        title = f"block {i}: {r} rows, {_fmt_bytes(r * _row_bytes(x))}"
        if st is None:
            fill, extra, what = "#d9d9d9", "", " (not persisted)"
        elif st["worker"] is None:
            fill, extra, what = "#ffffff", ' stroke="#888" stroke-dasharray="2,2"', " (computing)"
        else:
            fill, extra = colors.get(st["worker"], "#999"), ""
            what = f" on device {st['name']}" + (f", {st['tier']} tier" if st.get("tier") else "")
        parts.append(f'<rect x="{xpos:.2f}" y="0" width="{w:.2f}" height="22" fill="{fill}"{extra}>'
                     f"<title>{html.escape(title + what)}</title></rect>")
        if st is not None and st.get("tier") in ("host", "disk"):
            parts.append(f'<rect x="{xpos:.2f}" y="0" width="{w:.2f}" height="22" fill="url(#gd-hatch)"'
                         + (' stroke="#333" stroke-width="1"' if st["tier"] == "disk" else "") + "/>")
        xpos += w + gap
    return f'<svg width="{width}" height="24" style="display:block;margin:4px 0">' + "".join(parts) + "</svg>"


def _row_bytes(x: Any) -> int:
    return int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize if x.ndim > 1 else x.dtype.itemsize


def _fmt_bytes(n: int) -> str:
    return format_bytes(int(n))


def _persisted_state(where: dict[int, dict[str, Any]] | None, n: int) -> str:
    if where is None:
        return "not persisted (lazy: computed when used)"
    done = sum(1 for w in where.values() if w["worker"] is not None)
    tiers: dict[str, int] = {}
    for w in where.values():
        if w["worker"] is not None and w.get("tier"):
            tiers[w["tier"]] = tiers.get(w["tier"], 0) + 1
    tier = "" if not tiers else " (" + ", ".join(f"{c} on {t}" for t, c in sorted(tiers.items())) + ")"
    if done == n:
        return f"persisted: all {n} blocks in cluster memory{tier}"
    return f"persisting: {done} of {n} blocks in cluster memory{tier}, {n - done} computing"


def gdataset_html(x: Any) -> str:
    where = block_status(x)
    workers = sorted({w["worker"] for w in (where or {}).values() if w["worker"] is not None},
                     key=lambda a: next((w["name"] for w in where.values() if w["worker"] == a), a))
    colors = {a: _PALETTE[i % len(_PALETTE)] for i, a in enumerate(workers)}
    names = {a: next(w["name"] for w in where.values() if w["worker"] == a) for a in workers}
    per_dev = {a: [i for i, w in where.items() if w["worker"] == a] for a in workers}
    legend = "".join(
        f'<span style="margin-right:12px"><span style="display:inline-block;width:10px;height:10px;'
        f'background:{colors[a]};margin-right:4px"></span>device {html.escape(str(names[a]))}: '
        f"{len(per_dev[a])} blocks, {sum(x.row_blocks[i] for i in per_dev[a]):,} rows, "
        f"{_fmt_bytes(sum(x.row_blocks[i] for i in per_dev[a]) * _row_bytes(x))}</span>" for a in workers)
    rows = []
    offs = x.block_offsets
    show = (list(range(x.nblocks)) if x.nblocks <= 8
            else list(range(4)) + [None] + list(range(x.nblocks - 2, x.nblocks)))
    for i in show:
        if i is None:
            rows.append("<tr><td colspan=5>...</td></tr>")
            continue
        st = (where or {}).get(i)
        loc = ("–" if st is None else "computing" if st["worker"] is None else f"device {st['name']}")
        tier = "–" if st is None or not st.get("tier") else st["tier"]
        rows.append(f"<tr><td>{i}</td><td>{offs[i]:,}:{offs[i] + x.row_blocks[i]:,}</td>"
                    f"<td>{_fmt_bytes(x.row_blocks[i] * _row_bytes(x))}</td><td>{html.escape(loc)}</td>"
                    f"<td>{html.escape(tier)}</td></tr>")
    layout = {2: "feature-major (Fortran order)", 3: "time-major (T, rows, f)"}.get(x.ndim, "contiguous")
    td = "padding:1px 8px;text-align:right"
    return (
        '<div style="font-family:var(--jp-ui-font-family,sans-serif);font-size:13px">'
        f"<div><strong>GDataSet</strong> <code>{html.escape(x.name)}</code></div>"
        f"<div>shape {x.shape}, dtype {x.dtype}, {_fmt_bytes(x.nbytes)} in {x.nblocks} blocks "
        f"({min(x.row_blocks):,}–{max(x.row_blocks):,} rows), backend {x.backend}, layout {layout}</div>"
        f"<div><em>{html.escape(_persisted_state(where, x.nblocks))}</em></div>"
        + _diagram(x, where, colors)
        + (f'<div style="font-size:12px">{legend}</div>' if legend else "")
        + f'<details><summary style="font-size:12px">blocks</summary><table style="font-size:12px">'
        f'<tr><th style="{td}">block</th><th style="{td}">rows</th><th style="{td}">bytes</th>'
        f'<th style="{td}">device</th><th style="{td}">tier</th></tr>'
        + "".join(rows) + "</table></details></div>"
    )
