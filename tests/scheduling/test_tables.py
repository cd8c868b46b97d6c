"""Device and jobs tables: raw values in the frame, human units and worker names on display."""

import pandas as pd

from gdask.scheduling._registry import COMPACT, TableFrame, device_rows, frame, human


def _rows():
    workers = {
        "tcp://a:1": {"name": 0, "nthreads": 2, "metrics": {
            "gdask_device": {"index": 0, "backend": "emulated", "name": "emulated", "memory": 4 * 2**30,
                             "memory_used": 3 * 2**20, "busy_time": 12.5, "tasks": 7, "speed": 1.0},
            "gdask_window": {"hit_rate": 0.5, "window_bytes": 2**20, "host_bytes": 0, "reads": 10}}},
    }
    return device_rows(workers, {"tcp://a:1": {"placed": 3, "speed_measured": 0.9, "backlog_s": 0.25}})


def test_human_units():
    assert human(3 * 2**20, "bytes") == "3.00 MiB"
    assert human(12.5, "seconds") == "12.5 s"
    assert human(0.456, "ratio") == "46%"
    assert human(1.5, "times") == "1.50x"
    assert human(float("nan"), "bytes") == "–"
    assert human(["tcp://a:1", "tcp://b:2"], None, {"tcp://a:1": "0"}) == "0, tcp://b:2"


def test_device_table_keeps_raw_values_and_displays_compact_human_units():
    t = frame(_rows(), all_columns=False)
    assert isinstance(t, pd.DataFrame)
    assert t["memory_total"].iloc[0] == 4 * 2**30 and t["busy_time"].iloc[0] == 12.5  # raw, for code
    assert "memory_free" in t.columns and "worker" in t.columns  # every column is kept ...
    shown = t.display_frame()
    assert set(shown.columns) <= set(COMPACT) and "worker" not in shown.columns  # ... the view is compact
    assert shown["memory_total"].iloc[0] == "4.00 GiB" and shown["memory_used"].iloc[0] == "3.00 MiB"
    assert shown["busy_time"].iloc[0] == "12.5 s" and shown["window.hit_rate"].iloc[0] == "50%"
    html = t._repr_html_()
    assert "4.00 GiB" in html and "more columns: all_columns=True" in html and "4294967296" not in html
    assert "4.00 GiB" in repr(t)
    full = frame(_rows(), all_columns=True).display_frame()
    assert "worker" in full.columns and "memory_free" in full.columns
    assert type(t[["memory_total"]]) is pd.DataFrame  # derived frames are plain


def test_jobs_style_table_shows_worker_names():
    df = pd.DataFrame([{"job": "j", "devices": ["tcp://a:1"], "memory": 2**30, "share": 0.25,
                        "measured_slowdown": 1.25}]).set_index("job")
    t = TableFrame(df, names={"tcp://a:1": "0"}, title="gdask jobs: 1")
    shown = t.display_frame()
    assert shown.loc["j", "devices"] == "0" and shown.loc["j", "memory"] == "1.00 GiB"
    assert shown.loc["j", "share"] == "25%" and shown.loc["j", "measured_slowdown"] == "1.25x"
    assert t.loc["j", "devices"] == ["tcp://a:1"]  # raw
