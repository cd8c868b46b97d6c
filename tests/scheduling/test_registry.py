"""Device registry: flat rows from worker metrics (pure) and device_table on real clusters."""

from __future__ import annotations

import numpy as np
import pytest

from gdask.scheduling import device_table
from gdask.scheduling._registry import device_rows, flatten_metrics


def test_flatten_metrics_device_and_helpers():
    row = flatten_metrics({
        "gdask_device": {"index": 1, "backend": "emulated", "name": "emulated", "memory": 100, "memory_used": 30,
                         "speed": 0.5, "busy_time": 2.0, "tasks": 7, "extra": {"nested": 1}},
        "gdask_streams": {"k": 3, "max_streams": 4, "history": [1, 2]},
        "gdask_window": {"hits": 10, "misses": 2, "bytes": 1 << 20},
        "gdask_nvml": {"sm_count": 132, "topology": "GPU1:NV18"},
        "executing": 2,  # not gdask's: left out
        "gdask_scalar": 5,  # not a dict: left out
    })
    assert row["device"] == 1 and row["memory_total"] == 100 and row["speed_configured"] == 0.5
    assert row["busy_time"] == 2.0 and row["tasks"] == 7
    assert row["streams.k"] == 3 and row["streams.max_streams"] == 4 and "streams.history" not in row
    assert row["window.hits"] == 10 and row["window.bytes"] == 1 << 20
    assert row["sm_count"] == 132 and row["topology"] == "GPU1:NV18"
    assert "extra" not in row and "executing" not in row and not any(k.startswith("scalar") for k in row)


def test_device_rows_sorted_with_free_memory_and_placement():
    workers = {
        "tcp://b": {"name": 1, "nthreads": 2,
                    "metrics": {"gdask_device": {"index": 1, "memory": 10, "memory_used": 4}}},
        "tcp://a": {"name": 0, "nthreads": 2,
                    "metrics": {"gdask_device": {"index": 0, "memory": 10, "memory_used": 1}}},
        "tcp://c": {"name": "cpu", "nthreads": 1, "metrics": {}},
    }
    rows = device_rows(workers, {"tcp://a": {"speed_measured": 1.0, "placed": 5}})
    assert [r["worker"] for r in rows] == ["tcp://a", "tcp://b", "tcp://c"]
    assert rows[0]["memory_free"] == 9 and rows[1]["memory_free"] == 6
    assert rows[0]["speed_measured"] == 1.0 and rows[0]["placed"] == 5 and "placed" not in rows[1]
    assert rows[2]["streams"] == 1 and "memory_free" not in rows[2]


def test_device_table_on_gpu_cluster(client):
    import gdask

    X = gdask.from_array(np.arange(8000.0).reshape(4000, 2), block_rows=500).persist()
    assert float(X.sum().compute()) == pytest.approx(np.arange(8000.0).sum())
    import time

    deadline = time.monotonic() + 10
    while True:  # device metrics arrive with worker heartbeats
        df = device_table(client)
        if (df["memory_used"] > 0).all() or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(df) == 2
    assert list(df["device"]) == [0, 1]
    assert (df["memory_total"] == 512 * 2**20).all()
    assert (df["memory_free"] == df["memory_total"] - df["memory_used"]).all()
    assert (df["memory_used"] > 0).all()  # the persisted blocks live in both devices' pools
    assert set(df["backend"]) == {"emulated"}
    assert df["placed"].sum() > 0  # placement plugin columns
    assert "speed_measured" in df.columns and "busy_time" in df.columns
    assert "<table" in df._repr_html_()


def test_device_table_of_a_plain_dask_cluster_installs_gdask():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as c:
        df = device_table(c)  # the first gdask call on a plain cluster gives its workers a device
        assert c.run_on_scheduler(lambda dask_scheduler: "gdask-placement" in dask_scheduler.plugins)
    assert len(df) == 1 and df["streams"].iloc[0] >= 1
    assert df["backend"].iloc[0] == "emulated" and "speed_measured" in df.columns
