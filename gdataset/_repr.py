"""HTML repr of a GDataSet for Jupyter: shape, layout, and where each block lives (asked through
:func:`gdask.gdataset.locality.block_status`)."""

from __future__ import annotations

import html
from typing import Any

import numpy as np
from dask.utils import format_bytes

from gdask import config
from gdask.gdataset.locality import block_status

__all__ = ["gdataset_html"]



#: one colour per device (worker), in worker-name order
_PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
            "#bab0ac")


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
    """The HTML repr of ``x`` (its blocks' places asked once, waiting at most config
    ``gdask.timeouts.repr`` seconds for blocks ``persist()`` is still computing)."""
    where = block_status(x, wait=float(config.get("timeouts.repr", 5)))
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
