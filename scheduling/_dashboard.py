"""gdask's page on the Dask dashboard: ``/gdask`` on the scheduler's HTTP server.

Registered by gdask's scheduler plugins when they start (:func:`register`), so every cluster with
gdask's placement or jobs plugin (``LocalGPUCluster``, the preload, :func:`ensure_plugins`) serves it,
with or without bokeh. Distributed's own extension mechanism for extra routes (the config list
``distributed.scheduler.http.routes``) is read once, when the scheduler is created, before any plugin
exists; the page is therefore added to the running server's tornado application, and, where bokeh
runs the dashboard, linked from the dashboard's navigation bar as "Gdask".

Routes (under the dashboard's prefix):

* ``/gdask``: the page; it re-reads ``/gdask/fragment`` every second (no bokeh, no JS library);
* ``/gdask/fragment``: the live part of the page (HTML);
* ``/gdask/data.json``: the same data as JSON (:func:`dashboard_data`).

Per device: busy share (device busy time over wall time, last seconds, and its history), memory
budget / used / window-resident / spilled to host, streams K, tasks placed by gdask against the
measured relative speed, window hit rate; for the cluster: reuse of submitted work (tasks already
in memory when a graph arrives: what GTracker's rewrites and persisted blocks save) and the jobs
with their shares.
"""

from __future__ import annotations

import html
import logging
import math
import time
from collections import deque
from typing import Any

from distributed import SchedulerPlugin

from gdask import protocol

logger = logging.getLogger("gdask.scheduling")

__all__ = ["DashboardPlugin", "dashboard_data", "register", "render_fragment", "render_page"]

#: seconds between samples, and samples kept per device (5 minutes)
_INTERVAL = 1.0
_KEEP = 300
#: seconds over which the busy share shown as "now" is measured
_RECENT = 5.0


def _num(v: Any, default: float = 0.0) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else default


class DashboardPlugin(SchedulerPlugin):
    """Samples the devices every second for the ``/gdask`` page and counts reused work.

    Added to the scheduler by :func:`register`; its HTTP handlers read :meth:`data`.
    """

    name = protocol.PLUGIN_DASHBOARD
    idempotent = True

    def __init__(self) -> None:
        self.scheduler: Any = None
        self.history: dict[str, deque] = {}
        self.submitted = 0  # tasks of submitted graphs (new or already in memory)
        self.reused = 0  # ... of which were already in memory: not computed again
        self.graphs = 0
        self._pc: Any = None
        self.t0 = time.time()

    # -- lifecycle ------------------------------------------------------------------------------
    def attach(self, scheduler: Any) -> None:
        """Start sampling and serve the page on ``scheduler``'s HTTP server."""
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        _add_routes(scheduler, self)
        self.sample()
        self._pc = PeriodicCallback(self.sample, _INTERVAL * 1000)
        self._pc.start()

    async def close(self) -> None:
        if self._pc is not None:
            self._pc.stop()
            self._pc = None

    def update_graph(self, scheduler: Any, *, tasks: Any = (), **kwargs: Any) -> None:
        stasks = scheduler.tasks
        n = reused = 0
        for key in tasks:
            ts = stasks.get(key)
            if ts is None:
                continue
            n += 1
            if ts.state == "memory":
                reused += 1
        self.submitted += n
        self.reused += reused
        self.graphs += 1

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self.history.pop(worker, None)

    # -- data -----------------------------------------------------------------------------------
    def sample(self, fresh: dict[str, dict] | None = None) -> None:
        """Record every device worker's cumulative counters (busy time, transfers, window reads).

        Parameters
        ----------
        fresh : dict, optional
            ``{worker address: its gdask metrics}`` read from the workers just now (for a sample
            that includes work their last heartbeat did not report); other workers: their
            heartbeat's metrics.
        """
        s = self.scheduler
        if s is None:
            return
        now = time.time()
        for addr, ws in list(s.workers.items()):
            m = (fresh or {}).get(addr) or ws.metrics or {}
            dev = m.get(protocol.METRIC_DEVICE) or {}
            if not dev:
                continue
            win = m.get(protocol.METRIC_WINDOW) or {}
            h = self.history.setdefault(addr, deque(maxlen=_KEEP))
            busy = _num(dev.get("busy_time"))
            if h:  # a heartbeat read before a fresh sample may arrive after it: busy time never goes back
                busy = max(busy, h[-1][1])
            h.append((now, busy, _num(dev.get("memory_used")), _num(win.get("hits")), _num(win.get("reads"))))

    def busy_share(self, addr: str, streams: float, since: float | None = None) -> float | None:
        """Device busy time over wall time (divided by the streams running at once) since ``since``
        (default: the last few seconds), or None with fewer than two samples."""
        h = self.history.get(addr)
        if not h or len(h) < 2:
            return None
        t1, b1 = h[-1][0], h[-1][1]
        since = t1 - _RECENT if since is None else since
        first = next((p for p in h if p[0] >= since), h[0])
        if first is h[-1]:
            first = h[-2]
        dt = t1 - first[0]
        if dt <= 0:
            return None
        return max(0.0, min(1.0, (b1 - first[1]) / dt / max(streams, 1.0)))

    def busy_series(self, addr: str, streams: float, span: int = 3) -> list[float]:
        """Busy share over ``span`` sample intervals ending at each sample (oldest first): the
        workers' counters arrive with their heartbeats, so single intervals are jagged."""
        h = list(self.history.get(addr) or ())
        out = []
        for i in range(1, len(h)):
            (t0, b0, *_), (t1, b1, *_) = h[max(0, i - span)], h[i]
            out.append(max(0.0, min(1.0, (b1 - b0) / (t1 - t0) / max(streams, 1.0))) if t1 > t0 else 0.0)
        return out

    def data(self) -> dict[str, Any]:
        return dashboard_data(self.scheduler, self)


def _held(win: dict[str, Any]) -> dict[str, Any]:
    """The blocks a worker's window store holds, per tier, from its ``gdask_window`` metric.

    ``window_bytes`` / ``device_count``: the blocks on the device, and those being copied there
    (in flight). ``blocks``: every block the store manages (device, in flight, host, disk).
    ``other_keys``: values the store keeps outside its tiers (small results, host arrays, Python
    objects), in host memory; blocks received from another worker are blocks here too.
    ``host_bytes``: host memory of the blocks (those only on the host, and the host copies kept of
    blocks on the device). A worker
    whose data store is not gdask's window store reports none of these (``window_store`` False)."""
    device = int(_num(win.get("device_blocks"))) + int(_num(win.get("in_flight_blocks")))
    host, disk = int(_num(win.get("host_blocks"))), int(_num(win.get("disk_blocks")))
    return {"window_bytes": _num(win.get("window_bytes")), "host_bytes": _num(win.get("host_bytes")),
            "device_count": device, "host_count": host, "disk_count": disk, "blocks": device + host + disk,
            "other_keys": int(_num(win.get("plain_keys"))), "window_store": bool(win)}


def dashboard_data(scheduler: Any, plugin: DashboardPlugin | None = None) -> dict[str, Any]:
    """What the page shows, from the scheduler's state (JSON-able).

    Returns
    -------
    dict
        ``devices``: one dict per device worker (``name``, ``address``, ``backend``, ``device_name``,
        ``memory``, ``memory_used``, ``window_bytes`` (bytes of the blocks on the device or being
        copied there), ``host_bytes``, ``device_count``, ``host_count``, ``disk_count`` (blocks per
        tier), ``blocks`` (all of them), ``other_keys`` (values kept outside the window's tiers),
        ``window_store`` (whether the worker stores its data in gdask's window store: without it
        no block figures), ``streams``,
        ``max_streams``, ``placed``, ``speed_measured``, ``speed_configured``, ``hit_rate``,
        ``busy``, ``busy_series``, ``tasks``, ``bytes_h2d``); ``jobs``: the jobs table's rows;
        ``reuse``: ``{"submitted", "reused", "graphs"}``; ``policy``, ``moves``, ``time``.
    """
    placement = scheduler.plugins.get(protocol.PLUGIN_PLACEMENT)
    jobs = scheduler.plugins.get(protocol.PLUGIN_JOBS)
    pstats = placement.placement_stats() if placement is not None and placement.placer is not None else {}
    devices = []
    for addr, ws in scheduler.workers.items():
        m = ws.metrics or {}
        dev = m.get(protocol.METRIC_DEVICE) or {}
        if not dev:
            continue
        win = m.get(protocol.METRIC_WINDOW) or {}
        st = m.get(protocol.METRIC_STREAMS) or {}
        ps = pstats.get(addr, {})
        streams = _num(st.get("streams") or dev.get("streams"), 1.0)
        devices.append({
            "name": str(ws.name), "address": addr, "backend": dev.get("backend"),
            "device_name": dev.get("name"), "index": dev.get("index"),
            "memory": _num(dev.get("memory")), "memory_used": _num(dev.get("memory_used")),
            **_held(win),
            "hit_rate": win.get("hit_rate") if win.get("reads") else None, "reads": int(_num(win.get("reads"))),
            "streams": int(streams), "max_streams": int(_num(st.get("max_streams") or streams, streams)),
            "placed": int(_num(ps.get("placed"))), "speed_measured": ps.get("speed_measured"),
            "speed_configured": _num(dev.get("speed"), 1.0), "backlog_s": _num(ps.get("backlog_s")),
            "tasks": int(_num(dev.get("tasks"))), "busy_time": _num(dev.get("busy_time")),
            "bytes_h2d": _num(dev.get("bytes_h2d")),  # every copy to the device, the window's included
            "busy": plugin.busy_share(addr, streams) if plugin is not None else None,
            "busy_series": plugin.busy_series(addr, streams)[-120:] if plugin is not None else [],
        })
    devices.sort(key=lambda d: (d["index"] if isinstance(d["index"], int) else 1 << 30, d["name"]))
    job_rows: list[dict[str, Any]] = []
    policy = None
    if jobs is not None:
        policy = jobs.policy
        names = {a: str(ws.name) for a, ws in scheduler.workers.items()}
        for r in jobs.table_rows():
            job_rows.append({
                "job": r["job"], "kind": r.get("kind"), "status": r.get("status"),
                "devices": [names.get(a, a) for a in r.get("devices") or ()],
                "share": _num(r.get("share")), "memory": _num(r.get("memory")),
                "memory_used": _num(r.get("memory_used")), "spilled_bytes": _num(r.get("spilled_bytes")),
                "predicted_slowdown": _num(r.get("predicted_slowdown"), math.nan),
                "measured_slowdown": _num(r.get("measured_slowdown"), math.nan),
                "bottleneck": r.get("bottleneck"),
            })
    reuse = ({"submitted": plugin.submitted, "reused": plugin.reused, "graphs": plugin.graphs}
             if plugin is not None else {"submitted": 0, "reused": 0, "graphs": 0})
    return {"time": time.time(), "devices": devices, "jobs": job_rows, "reuse": reuse, "policy": policy,
            "moves": getattr(placement, "moves", 0), "replaced": getattr(placement, "replaced", 0),
            "placement": placement is not None}


# -- rendering --------------------------------------------------------------------------------------
def _bytes(n: float) -> str:
    from dask.utils import format_bytes

    return format_bytes(int(n))


def _pct(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def _e(x: Any) -> str:
    return html.escape(str(x))


def _sparkline(values: list[float], width: int = 220, height: int = 28) -> str:
    if len(values) < 2:
        return f'<svg class="spark" viewBox="0 0 {width} {height}"></svg>'
    n = len(values)
    pts = " ".join(f"{i * (width - 2) / (n - 1) + 1:.1f},{height - 1 - v * (height - 2):.1f}"
                   for i, v in enumerate(values))
    return (f'<svg class="spark" viewBox="0 0 {width} {height}" preserveAspectRatio="none">'
            f'<polyline fill="none" stroke="#e45756" stroke-width="1.5" vector-effect="non-scaling-stroke" '
            f'points="{pts}"/></svg>')


def _scale(used: float, total: float) -> float:
    """The gauge's full scale: ``total``, or where ``used`` would be a sliver of it (under 5%), the
    smallest power of two at least 1.25 times ``used`` (so 48 MiB of 4 GiB reads on a 64 MiB scale)."""
    if total <= 0:
        return max(used, 1.0)
    if used <= 0 or used >= 0.05 * total:
        return total
    return float(min(total, 2 ** math.ceil(math.log2(1.25 * used))))


def _gauge(segs: list[tuple[float, str, str]], total: float) -> str:
    """A bar of byte segments ``(bytes, colour, what)`` against ``total`` bytes; a gauge whose
    segments would be invisible on that scale is drawn on a smaller one, said under the bar."""
    used = sum(v for v, _, _ in segs)
    scale = _scale(used, total)
    inner = "".join(f'<div class="seg" title="{_e(t)}: {_bytes(v)}" style="width:{min(100.0, 100 * v / scale):.2f}%;'
                    f'background:{c}"></div>' for v, c, t in segs if v > 0)
    if scale < total:
        return (f'<div class="gauge"><div class="bar zoom">{inner}</div><div class="scale">scale 0 – {_bytes(scale)}'
                f' (the budget, {_bytes(total)}, is {total / scale:.0f}x longer)</div></div>')
    return f'<div class="gauge"><div class="bar">{inner}</div></div>'


def _memory_bar(d: dict[str, Any]) -> str:
    total = d["memory"] or 1.0
    used = min(d["memory_used"], total)
    window = min(d["window_bytes"], used) if used else min(d["window_bytes"], total)
    other = max(used - window, 0.0)
    return _gauge([(window, "#4c78a8", "window-resident blocks"), (other, "#9ecae9", "other device allocations")],
                  total)


def _busy_bar(x: float | None) -> str:
    w = 0.0 if x is None else 100 * x
    return f'<div class="gauge"><div class="bar"><div class="seg" style="width:{w:.1f}%;background:#e45756"></div>' \
           f'</div></div>'


def _n_blocks(n: int) -> str:
    return f"{n} block{'' if n == 1 else 's'}"


def _held_text(d: dict[str, Any]) -> str:
    if not d.get("window_store", True):
        return ("not known: this worker's data store is not gdask's window store (start workers with "
                "<code>gdask worker</code> or <code>--preload gdask.scheduling</code>)")
    disk = f", {_n_blocks(d['disk_count'])} on disk" if d["disk_count"] else ""
    other = d.get("other_keys", 0)
    other = f"; {other} other value{'' if other == 1 else 's'} in host memory, outside the window" if other else ""
    # host_bytes: the host memory of the store's blocks, also the copies kept of blocks on the device
    return (f"{_n_blocks(d['blocks'])}: {_n_blocks(d['device_count'])} on the device ({_bytes(d['window_bytes'])}), "
            f"{_n_blocks(d['host_count'])} only on the host{disk}; {_bytes(d['host_bytes'])} in host memory{other}")


def _device_card(d: dict[str, Any]) -> str:
    speed = d["speed_measured"]
    speed_s = "not measured yet" if speed is None else f"{speed:.2f}"
    label = d["backend"] if d["device_name"] in (None, d["backend"]) else f"{d['device_name']} ({d['backend']})"
    used_pct = f" ({100 * d['memory_used'] / d['memory']:.1f}%)" if d["memory"] else ""
    return f"""
<div class="card" data-device="{_e(d['name'])}">
  <h3>device {_e(d['name'])} <span class="sub">{_e(label)} · {_e(d['address'])}</span></h3>
  <div class="row"><span class="k">busy</span>{_busy_bar(d['busy'])}<span class="v">{_pct(d['busy'])}</span></div>
  <div class="row"><span class="k">busy (history)</span>{_sparkline(d['busy_series'])}</div>
  <div class="row"><span class="k">memory</span>{_memory_bar(d)}
    <span class="v">{_bytes(d['memory_used'])} of {_bytes(d['memory'])}{used_pct}</span></div>
  <table class="kv">
    <tr><td>blocks held</td><td colspan="3" class="held">{_held_text(d)}</td></tr>
    <tr><td>streams K</td><td>{d['streams']} of {d['max_streams']}</td>
        <td>window hit rate</td><td>{_pct(d['hit_rate'])} of {d['reads']} reads</td></tr>
    <tr><td>tasks placed</td><td>{d['placed']}</td>
        <td>measured speed</td><td>{speed_s} (configured {d['speed_configured']:g})</td></tr>
    <tr><td>device tasks run</td><td>{d['tasks']}</td>
        <td>copied to device</td><td>{_bytes(d['bytes_h2d'])}</td></tr>
  </table>
</div>"""


def _placement_chart(devices: list[dict[str, Any]]) -> str:
    """Per device, the share of the tasks gdask placed there next to its share of the devices'
    speed (measured where known, else configured): balanced placement makes the two bars equal."""
    if not devices:
        return ""
    placed = sum(d["placed"] for d in devices) or 1
    speeds = [d["speed_measured"] if d["speed_measured"] is not None else d["speed_configured"] for d in devices]
    total = sum(speeds) or 1.0
    rows = "".join(
        f'<div class="row"><span class="k">device {_e(d["name"])}</span><div class="gauge">'
        f'<div class="bar"><div class="seg" style="width:{100 * d["placed"] / placed:.1f}%;background:#f58518">'
        f'</div></div><div class="bar"><div class="seg" style="width:{100 * sp / total:.1f}%;background:#54a24b">'
        f'</div></div></div><span class="v">{100 * d["placed"] / placed:.0f}% of tasks · {100 * sp / total:.0f}% of '
        f'speed</span></div>' for d, sp in zip(devices, speeds))
    return (rows + '<div class="legend"><i style="background:#f58518"></i>tasks placed<i style="background:#54a24b">'
            '</i>relative speed</div>')


def _times(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.2f}x"


def _jobs_table(rows: list[dict[str, Any]], policy: Any) -> str:
    if not rows:
        return f'<p class="sub">No jobs (sharing policy {_e(policy)}): <code>gdask.job(client, gpu=0.25)</code>.</p>'
    body = "".join(
        f"<tr><td>{_e(r['job'])}</td><td>{_e(r['status'])}</td><td>{_e(', '.join(r['devices']))}</td>"
        f"<td>{_pct(r['share'])}</td><td>{_bytes(r['memory'])}</td><td>{_bytes(r['memory_used'])}</td>"
        f"<td>{_bytes(r['spilled_bytes'])}</td><td>{_e(r['bottleneck'] or '–')}</td>"
        f"<td>{_times(r['predicted_slowdown'])}</td><td>{_times(r['measured_slowdown'])}</td></tr>"
        for r in rows)
    return ("<table class='jobs'><tr><th>job</th><th>status</th><th>devices</th><th>share</th><th>memory</th>"
            "<th>used</th><th>spilled</th><th>bottleneck</th><th>predicted slowdown</th>"
            f"<th>measured slowdown</th></tr>{body}</table><p class='sub'>sharing policy {_e(policy)}</p>")


def render_fragment(data: dict[str, Any]) -> str:
    """The live part of the page (devices, reuse, jobs) as HTML."""
    reuse = data["reuse"]
    share = reuse["reused"] / reuse["submitted"] if reuse["submitted"] else None
    cards = "".join(_device_card(d) for d in data["devices"]) or (
        "<p>No gdask device worker has reported yet (workers report with their heartbeat).</p>")
    stamp = time.strftime("%H:%M:%S", time.localtime(data["time"]))
    return f"""
<div class="summary">{len(data['devices'])} device(s) · placement {'on' if data['placement'] else 'off'} ·
  {data['moves']} blocks rebalanced · reuse: {reuse['reused']} of {reuse['submitted']} submitted tasks were already
  in memory ({_pct(share)}, {reuse['graphs']} graphs) · updated {stamp}</div>
<div class="legend">memory:<i style="background:#4c78a8"></i>window-resident blocks<i style="background:#9ecae9">
</i>other allocations<i style="background:#e8e8e8"></i>free budget</div>
<div class="cards">{cards}</div>
<h2>Placement: share of tasks placed vs share of speed</h2>
{_placement_chart(data['devices'])}
<h2>Jobs</h2>
{_jobs_table(data['jobs'], data['policy'])}"""


_STYLE = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;color:#222}
header{background:#2c2c2c;color:#eee;padding:8px 16px;font-size:15px}
header a{color:#ffa600;margin-right:14px;text-decoration:none}
main{padding:12px 16px;box-sizing:border-box;width:100%}
h2{font-size:16px;margin:16px 0 6px}
.summary{font-size:13px;color:#444;margin-bottom:10px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(440px,1fr));gap:12px}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;background:#fafafa;min-width:0}
.card h3{margin:0 0 6px;font-size:15px}
.sub{color:#777;font-size:12px;font-weight:normal}
.row{display:flex;align-items:center;gap:8px;margin:3px 0;font-size:13px}
.k{flex:0 0 110px;color:#555}
.v{flex:0 0 auto;font-variant-numeric:tabular-nums;color:#333;white-space:nowrap}
.legend{font-size:11px;color:#666}.legend i{display:inline-block;width:10px;height:10px;margin:0 3px 0 8px}
.gauge{flex:1 1 auto;min-width:120px}
.bar{display:flex;width:100%;height:14px;background:#e8e8e8;border-radius:3px;overflow:hidden;margin:1px 0}
.bar.zoom{border-right:3px dashed #888;box-sizing:border-box}
.scale{font-size:10px;color:#777}
.seg{height:100%}
.spark{flex:1 1 auto;min-width:120px;height:28px}
table.kv{font-size:12px;border-collapse:collapse;margin-top:4px;width:100%}
table.kv td{padding:1px 8px 1px 0;white-space:nowrap}
table.kv td:nth-child(odd){color:#666}
table.kv td.held{color:#222;white-space:normal}
table.jobs{border-collapse:collapse;font-size:13px;width:100%}
table.jobs th,table.jobs td{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left}
"""


def render_page(data: dict[str, Any], prefix: str = "/") -> str:
    """The whole ``/gdask`` page; its script refreshes the live part every second."""
    p = "/" + (prefix or "").strip("/")
    p = p if p.endswith("/") else p + "/"
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>gdask · Dask dashboard</title><style>{_STYLE}</style></head>
<body><header><b>gdask</b> &nbsp; <a href="{p}status">Dask status</a><a href="{p}workers">Workers</a>
<a href="{p}gdask/data.json">data.json</a></header>
<main><div id="live">{render_fragment(data)}</div></main>
<script>
(function(){{
  const url = "{p}gdask/fragment";
  async function tick(){{
    try {{ const r = await fetch(url, {{cache: "no-store"}}); if (r.ok) document.getElementById("live").innerHTML =
      await r.text(); }} catch (e) {{ /* the scheduler went away: keep the last view */ }}
  }}
  setInterval(tick, 1000);
}})();
</script></body></html>"""


# -- serving ----------------------------------------------------------------------------------------
def _handlers(plugin: DashboardPlugin, prefix: str) -> list[tuple]:
    import json

    from tornado import web

    class _Base(web.RequestHandler):
        def set_default_headers(self) -> None:
            self.set_header("Cache-Control", "no-store")

    class Page(_Base):
        def get(self) -> None:
            self.set_header("Content-Type", "text/html; charset=UTF-8")
            self.write(render_page(plugin.data(), prefix))

    class Fragment(_Base):
        def get(self) -> None:
            self.set_header("Content-Type", "text/html; charset=UTF-8")
            self.write(render_fragment(plugin.data()))

    class Data(_Base):
        def get(self) -> None:
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(_json_safe(plugin.data()), default=str))

    p = "/" + (prefix or "").strip("/")
    p = p if p.endswith("/") else p + "/"
    return [(rf"{p}gdask/?", Page), (rf"{p}gdask/fragment", Fragment), (rf"{p}gdask/data\.json", Data)]


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _add_routes(scheduler: Any, plugin: DashboardPlugin) -> None:
    app = getattr(scheduler, "http_application", None)
    if app is None:
        logger.info("gdask: the scheduler has no HTTP server; no /gdask page")
        return
    prefix = next((getattr(a, "prefix", None) for a in getattr(app, "applications", ()) if getattr(a, "prefix", None)),
                  "/")  # the bokeh dashboard's prefix (``dask scheduler --dashboard-prefix``)
    app.add_handlers(r".*", _handlers(plugin, prefix))
    try:  # a link in the bokeh dashboard's navigation bar, where bokeh serves the dashboard
        from distributed.dashboard.scheduler import template_variables

        pages = template_variables(scheduler).get("pages")
        if isinstance(pages, list) and "gdask" not in pages:
            pages.append("gdask")
    except ImportError:  # no bokeh: the page is still served
        pass


def register(scheduler: Any) -> DashboardPlugin:
    """Serve the ``/gdask`` page on ``scheduler`` (once; called by gdask's scheduler plugins' ``start``)."""
    plugin = scheduler.plugins.get(protocol.PLUGIN_DASHBOARD)
    if plugin is None:
        plugin = DashboardPlugin()
        scheduler.add_plugin(plugin)
        plugin.attach(scheduler)
    return plugin
