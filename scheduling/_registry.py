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

__all__ = ["device_rows", "flatten_metrics", "frame"]

#: columns first in the table, in this order (others follow alphabetically)
COLUMNS = (
    "worker", "name", "device", "backend", "device_name", "memory_total", "memory_used", "memory_free",
    "memory_peak", "pool", "streams", "speed_configured", "speed_measured", "tasks", "busy_time",
    "placed", "backlog_s", "gpu_util", "mem_util", "sm_count", "topology",
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


def frame(rows: list[dict[str, Any]]):
    """The device table as a pandas DataFrame, the known columns first."""
    import pandas as pd

    cols = [c for c in COLUMNS if any(c in r for r in rows)]
    cols += sorted({c for r in rows for c in r} - set(cols))
    return pd.DataFrame(rows, columns=cols if rows else list(COLUMNS[:2]))
