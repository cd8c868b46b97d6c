"""window_cache.stats(client) is a dict that shows itself as a summary."""

from gdask.window_cache import WindowStats


def _stats():
    w = {"reads": 10, "hits": 4, "prefetch_hits": 3, "misses": 3, "bytes_h2d": 3 * 2**20, "bytes_d2h": 0,
         "window_bytes": 2**20, "capacity_bytes": 2 * 2**20, "device_blocks": 1, "host_blocks": 2, "disk_blocks": 0,
         "window": [(0.0, 2 * 2**20, 0, 0), (0.5, 2 * 2**20, 2**20, 1), (1.0, 2 * 2**20, 2 * 2**20, 2)]}
    return WindowStats({"reads": 10, "hits": 4, "prefetch_hits": 3, "misses": 3, "hit_rate": 0.4,
                        "bytes_h2d": 3 * 2**20, "bytes_d2h": 0, "stall_time": 0.125, "workers": {"tcp://w:1": w}})


def test_still_a_dict():
    s = _stats()
    assert isinstance(s, dict) and s["hits"] == 4 and s["workers"]["tcp://w:1"]["reads"] == 10
    assert s.hit_rate == 0.4


def test_text_repr_is_a_summary_with_a_sparkline():
    text = repr(_stats())
    first, worker = text.splitlines()
    assert first.startswith("WindowStats: hit rate 40.0% of 10 reads (4 hits, 3 prefetch hits, 3 misses)")
    assert "moved 3.00 MiB to" in first and "0.125 s" in first
    assert worker.startswith("  tcp://w:1: hit rate 40.0%, window 1.00 MiB of 2.00 MiB")
    assert worker.endswith("▁▄█")  # the window filling up over time
    assert "(0.0," not in text  # no tuples of the timeline


def test_html_repr_has_a_bar_a_table_and_a_plot():
    h = _stats()._repr_html_()
    assert "hit rate" in h and "40.0%" in h and "<table>" in h and "<svg" in h and "polyline" in h
    assert "1 / 2 / 0" in h  # blocks per tier
