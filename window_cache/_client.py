"""Client side of the window cache: statistics and scan-order hints for every worker."""

from __future__ import annotations

from typing import Any, Iterable

from gdask.window_cache._hooks import worker_store

__all__ = ["WindowStats", "hint_order", "stats"]

#: counters summed over workers in ``stats(client)["totals"]``
_SUMMED = ("reads", "hits", "misses", "prefetch_hits", "host_reads", "prefetches", "prefetch_dropped", "evictions",
           "bytes_h2d", "bytes_d2h", "bytes_to_disk", "bytes_from_disk", "stall_time", "window_bytes",
           "window_blocks", "capacity_bytes", "device_blocks", "host_blocks", "disk_blocks")


def _worker_stats(dask_worker=None, reset: bool = False) -> dict[str, Any] | None:
    store = worker_store(dask_worker)
    if store is None:
        return None
    out = store.stats()
    if reset:
        store.reset_stats()
    return out


def _worker_hint(keys, dask_worker=None) -> int:
    store = worker_store(dask_worker)
    if store is None:
        return 0
    store.hint([tuple(k) if isinstance(k, list) else k for k in keys])
    return 1


def _bytes(n: float) -> str:
    from dask.utils import format_bytes

    return format_bytes(int(n))


def _sparkline(points: list[tuple[float, float]], width: int = 160, height: int = 24, top: float | None = None) -> str:
    """An inline SVG line of ``(t, value)`` points (value scaled to ``top``, default the maximum)."""
    if len(points) < 2:
        return ""
    t0, t1 = points[0][0], points[-1][0]
    top = top or max(v for _, v in points) or 1.0
    span = (t1 - t0) or 1.0
    pts = " ".join(f"{(t - t0) / span * (width - 2) + 1:.1f},{height - 1 - min(v / top, 1.0) * (height - 2):.1f}"
                   for t, v in points)
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" style="vertical-align:middle">'
            f'<polyline fill="none" stroke="#4c78a8" stroke-width="1.5" points="{pts}"/></svg>')


def _text_spark(values: list[float], width: int = 24) -> str:
    """A sparkline in block characters (for the text repr)."""
    if not values:
        return ""
    if len(values) > width:  # keep the last value of each of ``width`` buckets
        step = len(values) / width
        values = [values[min(len(values) - 1, int((i + 1) * step) - 1)] for i in range(width)]
    top = max(values) or 1.0
    bars = "▁▂▃▄▅▆▇█"
    return "".join(bars[min(7, int(v / top * 7.999))] for v in values)


class WindowStats(dict):
    """What :func:`stats` returns: a dict (``stats["hits"]``, ``stats["workers"]``, ...) that shows
    itself as a summary: hit rate, bytes moved, and the window size over time per worker."""

    @property
    def hit_rate(self) -> float:
        return float(self.get("hit_rate", 0.0))

    def _worker_rows(self) -> list[tuple[str, dict[str, Any], list[tuple[float, float]]]]:
        out = []
        for addr, s in sorted((self.get("workers") or {}).items()):
            timeline = [(float(p[0]), float(p[2])) for p in (s.get("window") or ()) if len(p) >= 3]
            out.append((addr, s, timeline))
        return out

    def __repr__(self) -> str:
        lines = [f"WindowStats: hit rate {100 * self.hit_rate:.1f}% of {self.get('reads', 0)} reads "
                 f"({self.get('hits', 0)} hits, {self.get('prefetch_hits', 0)} prefetch hits, "
                 f"{self.get('misses', 0)} misses); moved {_bytes(self.get('bytes_h2d', 0))} to and "
                 f"{_bytes(self.get('bytes_d2h', 0))} from the devices; readers waited "
                 f"{float(self.get('stall_time', 0.0)):.3g} s"]
        for addr, s, timeline in self._worker_rows():
            reads = s.get("reads", 0)
            rate = s.get("hits", 0) / reads if reads else 0.0
            lines.append(f"  {addr}: hit rate {100 * rate:.1f}%, window {_bytes(s.get('window_bytes', 0))} of "
                         f"{_bytes(s.get('capacity_bytes', 0))}, moved {_bytes(s.get('bytes_h2d', 0))} "
                         f"{_text_spark([v for _, v in timeline])}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        rows = []
        for addr, s, timeline in self._worker_rows():
            reads = s.get("reads", 0)
            rate = s.get("hits", 0) / reads if reads else 0.0
            cap = max([float(p[1]) for p in (s.get("window") or ()) if len(p) >= 2] or [0.0]) or None
            rows.append(
                f"<tr><td>{html.escape(str(addr))}</td><td>{100 * rate:.1f}%</td><td>{reads}</td>"
                f"<td>{_bytes(s.get('bytes_h2d', 0))}</td><td>{_bytes(s.get('bytes_d2h', 0))}</td>"
                f"<td>{_bytes(s.get('window_bytes', 0))} / {_bytes(s.get('capacity_bytes', 0))}</td>"
                f"<td>{s.get('device_blocks', 0)} / {s.get('host_blocks', 0)} / {s.get('disk_blocks', 0)}</td>"
                f"<td>{_sparkline(timeline, top=cap)}</td></tr>")
        rate = self.hit_rate
        bar = ('<span style="display:inline-block;width:120px;height:10px;background:#e8e8e8;'
               'vertical-align:middle"><span style="display:block;height:100%;'
               f'width:{100 * rate:.1f}%;background:#4c78a8"></span></span>')
        return (
            "<div><strong>gdask window cache</strong> &nbsp; hit rate "
            f"{bar} {100 * rate:.1f}% of {self.get('reads', 0)} reads ({self.get('prefetch_hits', 0)} prefetched)"
            f" · moved {_bytes(self.get('bytes_h2d', 0))} to / {_bytes(self.get('bytes_d2h', 0))} from the devices"
            f" · stalls {float(self.get('stall_time', 0.0)):.3g} s</div>"
            "<table><tr><th>worker</th><th>hit rate</th><th>reads</th><th>to device</th><th>from device</th>"
            "<th>window / capacity</th><th>blocks device / host / disk</th><th>window over time</th></tr>"
            + "".join(rows) + "</table>"
        )


def stats(client: Any = None, *, reset: bool = False) -> WindowStats:
    """Window cache statistics of every worker and in total.

    Parameters
    ----------
    client : distributed.Client, optional
        Default: the current client.
    reset : bool
        Reset the workers' counters after reading them (to measure one phase of a loop).

    Returns
    -------
    WindowStats
        A dict (shown as a summary in Jupyter and terminals): ``hits``, ``misses``,
        ``prefetch_hits``, ``reads``, ``hit_rate`` (hits / reads: reads served
        by blocks kept on the device, no copy), ``bytes_h2d``, ``bytes_d2h``, ``stall_time``
        (seconds readers waited for copies), ... summed over workers, and ``workers``:
        ``{address: per-worker metrics, with "window": [(t, capacity, window bytes, blocks), ...]}``.
        Workers whose data store is not a :class:`WindowStore` are left out.
    """
    if client is None:
        from distributed import default_client

        client = default_client()
    per = {w: s for w, s in client.run(_worker_stats, reset=reset).items() if s is not None}
    totals: dict[str, Any] = {k: 0 for k in _SUMMED}
    for s in per.values():
        for k in _SUMMED:
            totals[k] += s.get(k, 0)
    totals["hit_rate"] = totals["hits"] / totals["reads"] if totals["reads"] else 0.0
    totals["workers"] = per
    return WindowStats(totals)


def hint_order(client: Any, keys: Iterable[Any]) -> int:
    """Tell every worker's store the order the next pass reads ``keys`` in (each worker keeps the
    keys it holds). Call it before submitting each pass; it also marks the start of the pass.

    Returns the number of workers with a window store.
    """
    keys = list(keys)
    return sum(v for v in client.run(_worker_hint, keys).values())
