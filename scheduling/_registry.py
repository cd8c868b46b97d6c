"""The device registry: one row per device (worker) with memory, speed, load and what helpers report.

Workers publish their device through ``worker.metrics`` (``gdask_device`` from the device plugin,
``gdask_nvml`` on CUDA, and any other ``gdask_*`` dict of scalars, e.g. ``gdask_streams`` or
``gdask_window``); the scheduler receives them with every heartbeat. :func:`device_rows` turns
those metrics plus the placement plugin's measurements into flat rows (pure, no I/O);
:func:`gdask.scheduling.device_table` asks the scheduler for them (a pandas DataFrame).
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping

from gdask import protocol

__all__ = ["COMPACT", "TableFrame", "device_rows", "flatten_metrics", "frame", "human"]

#: columns first in the table, in this order (others follow alphabetically)
COLUMNS = (
    "worker", "name", "device", "backend", "device_name", "memory_total", "memory_used", "memory_free",
    "memory_peak", "pool", "streams", "speed_configured", "speed_measured", "tasks", "busy_time",
    "placed", "backlog_s", "gpu_util", "mem_util", "sm_count", "topology",
)

#: the device table's default view (``device_table(client, all_columns=True)`` shows every column)
COMPACT = (
    "name", "device", "backend", "device_name", "memory_total", "memory_used", "streams", "speed_configured",
    "speed_measured", "placed", "tasks", "busy_time", "window.hit_rate", "window.window_bytes", "window.host_bytes",
    "gpu_util",
)

_DEVICE_FIELDS = {
    "index": "device", "backend": "backend", "name": "device_name", "memory": "memory_total",
    "memory_used": "memory_used", "memory_peak": "memory_peak", "speed": "speed_configured",
    "streams": "streams", "tasks": "tasks", "busy_time": "busy_time", "bytes_h2d": "bytes_h2d",
    "bytes_d2h": "bytes_d2h", "allocator": "pool", "gpu_util": "gpu_util", "mem_util": "mem_util",
    "memory_total": "memory_total",
}


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, bool, numbers.Number))


def flatten_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten a worker's ``gdask_*`` metrics into one row.

    ``gdask_device`` (and ``gdask_nvml``) fields get the table's column names; every other
    ``gdask_<part>`` entry whose value is a dict of scalars contributes ``<part>.<field>`` columns
    (``gdask_streams: {"k": 3}`` -> ``streams.k``). Non-scalar values are left out.
    """
    row: dict[str, Any] = {}
    for name in sorted(metrics):
        value = metrics[name]
        if not name.startswith("gdask_") or not isinstance(value, Mapping):
            continue
        if name in (protocol.METRIC_DEVICE, protocol.METRIC_NVML):
            for k, v in value.items():
                if _scalar(v):
                    col = _DEVICE_FIELDS.get(k, k)
                    if name == protocol.METRIC_NVML or col not in row:
                        row[col] = v
            continue
        part = name[len("gdask_"):]
        for k, v in value.items():
            if _scalar(v):
                row[f"{part}.{k}"] = v
    return row


def device_rows(workers: Mapping[str, Mapping[str, Any]],
                placement: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Rows of the device table from worker identities and placement statistics (pure).

    Parameters
    ----------
    workers : mapping
        Worker address -> ``{"name", "nthreads", "metrics", ...}`` (the scheduler's identity of
        each worker, as in ``client.scheduler_info()["workers"]``).
    placement : mapping, optional
        Worker address -> the placement plugin's statistics (``speed_measured``, ``placed``,
        ``backlog_s``, ...), where the plugin runs.

    Returns
    -------
    list of dict
        One row per worker, sorted by device index then address.
    """
    rows = []
    for addr, w in workers.items():
        row: dict[str, Any] = {"worker": addr, "name": w.get("name")}
        row.update(flatten_metrics(w.get("metrics") or {}))
        row.setdefault("streams", w.get("nthreads"))
        if "memory_total" in row and "memory_used" in row:
            try:
                row["memory_free"] = row["memory_total"] - row["memory_used"]
            except TypeError:
                pass
        for k, v in ((placement or {}).get(addr) or {}).items():
            if _scalar(v):
                row[k] = v
        rows.append(row)

    def order(r):
        d = r.get("device")
        return (0, d, r["worker"]) if isinstance(d, numbers.Number) else (1, 0, r["worker"])

    return sorted(rows, key=order)


# -- display --------------------------------------------------------------------------------------
_SECONDS = ("busy_time", "backlog_s", "gpu_busy_s", "stall_time", "waited", "runtime", "throughput_s")
_RATIOS = ("hit_rate", "share", "gpu_util", "mem_util")


def _kind(col: str) -> str | None:
    base = col.rsplit(".", 1)[-1]
    if base in _RATIOS:
        return "ratio"
    if base in _SECONDS or base.endswith("_s") or base.endswith("_time"):
        return "seconds"
    if "bytes" in base or (base.startswith("memory") and base != "mem_util") or base == "pool":
        return "bytes"
    if "slowdown" in base:
        return "times"
    return None


def human(value: Any, kind: str | None, names: Mapping[str, str] | None = None) -> Any:
    """One cell for display: bytes as ``1.5 GiB``, seconds as ``12.3 s``, ratios as ``45%``, worker
    addresses (also in lists) as worker names; anything else unchanged."""
    import math

    from dask.utils import format_bytes

    if isinstance(value, (list, tuple, set)):
        return ", ".join(str(human(v, kind, names)) for v in value) or "–"
    if isinstance(value, str):
        return (names or {}).get(value, value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        return value
    if kind == "bytes":
        return format_bytes(int(value))
    if kind == "seconds":
        return f"{value:.3g} s" if value < 100 else f"{value:,.0f} s"
    if kind == "ratio":
        return f"{100 * value:.0f}%"
    if kind == "times":
        return f"{value:.2f}x"
    return value


def _table_class():
    import pandas as pd

    class TableFrame(pd.DataFrame):
        """A pandas DataFrame of gdask's raw values (bytes, seconds, addresses) that DISPLAYS in
        human units, with a compact choice of columns unless ``all_columns``. Derived frames
        (selections, arithmetic) are plain DataFrames; ``pd.DataFrame(t)`` gives a plain copy."""

        _metadata = ["gdask_view", "gdask_names", "gdask_title"]

        @property
        def _constructor(self):
            return pd.DataFrame

        def display_frame(self) -> pd.DataFrame:
            """What is shown: the chosen columns, formatted (strings)."""
            view = getattr(self, "gdask_view", None)
            cols = [c for c in self.columns if view is None or c in view]
            plain = pd.DataFrame(self)[cols]
            names = getattr(self, "gdask_names", None) or {}
            out = pd.DataFrame(index=plain.index)
            for c in cols:
                k = _kind(str(c))
                out[c] = [human(v, k, names) for v in plain[c]]
            return out

        def _caption(self) -> str:
            view = getattr(self, "gdask_view", None)
            hidden = 0 if view is None else sum(c not in view for c in self.columns)
            title = getattr(self, "gdask_title", None) or ""
            more = f" ({hidden} more columns: all_columns=True)" if hidden else ""
            return f"{title}{more}"

        def __repr__(self) -> str:
            cap = self._caption()
            shown = self.display_frame()
            text = shown.to_string() if len(shown) <= 60 else repr(shown)  # a terminal shows every column
            return (cap + "\n" if cap else "") + text

        def _repr_html_(self) -> str:
            import html

            cap = self._caption()
            head = f"<div style='font-size:12px;color:#666'>{html.escape(cap)}</div>" if cap else ""
            return head + self.display_frame()._repr_html_()

    return TableFrame


_TABLE: Any = None


def TableFrame(*args: Any, view: Any = None, names: Mapping[str, str] | None = None, title: str | None = None,
               **kwargs: Any):
    """A :class:`pandas.DataFrame` (raw values) displayed in human units; see :func:`frame`."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _table_class()
    t = _TABLE(*args, **kwargs)
    t.gdask_view = None if view is None else tuple(view)
    t.gdask_names = dict(names or {})
    t.gdask_title = title
    return t


def frame(rows: list[dict[str, Any]], all_columns: bool = True):
    """The device table: a pandas DataFrame of raw values (bytes, seconds), the known columns first,
    displayed in human units; ``all_columns=False`` displays the compact view (:data:`COMPACT`)."""
    import pandas as pd

    cols = [c for c in COLUMNS if any(c in r for r in rows)]
    cols += sorted({c for r in rows for c in r} - set(cols))
    plain = pd.DataFrame(rows, columns=cols if rows else list(COLUMNS[:2]))
    return TableFrame(plain, view=None if all_columns else COMPACT,
                      title=f"gdask devices: {len(plain)}")
