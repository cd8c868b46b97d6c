"""gdask.plot: figures of fits, devices and benchmarks (matplotlib, Agg)."""

import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from gdask import plot  # noqa: E402


def _lines(ax):
    return [line.get_ydata() for line in ax.get_lines()]


def test_history_of_a_kmeans_fit(tmp_path):
    import gdask

    x = np.random.default_rng(0).standard_normal((2_000, 3)).astype(np.float32)
    km = gdask.ml.KMeans(3, random_state=0, max_iter=5, tol=0, algorithm="lloyd").fit(x)
    fig = plot.history(km)
    top, inertia, shift = fig.axes  # the time, then a panel per figure the fit recorded
    assert len(top.patches) == km.n_iter_  # one bar per iteration
    assert inertia.get_ylabel() == "inertia" and shift.get_ylabel() == "center_shift"
    assert np.allclose(_lines(inertia)[0], [r["inertia"] for r in km.history_])
    path = plot.save(fig, str(tmp_path / "h.png"))
    assert open(path, "rb").read(4) == b"\x89PNG"


def test_history_has_a_panel_for_every_figure_a_bounds_fit_records():
    """K-means on the bounds records ``inertia`` on its Lloyd passes and ``changed`` after: both drawn."""
    import gdask

    rng = np.random.default_rng(3)
    c = rng.uniform(-3, 3, (6, 10))
    x = (c[rng.integers(0, 6, 6_000)] + rng.standard_normal((6_000, 10))).astype(np.float32)
    km = gdask.ml.KMeans(6, random_state=0, max_iter=40, algorithm="elkan").fit(x)
    recorded = {k for r in km.history_ for k in ("inertia", "changed") if k in r}
    assert recorded == {"inertia", "changed"}, km.history_  # the fit recorded both (else this tests nothing)
    fig = plot.history(km)
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels[0] == "ms per iteration" and {"inertia", "changed", "center_shift"} <= set(labels)
    changed = fig.axes[labels.index("changed")]
    xs = list(changed.get_lines()[0].get_xdata())
    assert xs == [r["iteration"] for r in km.history_ if "changed" in r] and max(xs) == km.n_iter_


def test_history_of_records_with_loss_uses_a_log_scale():
    recs = [{"iteration": i, "seconds": 0.01, "loss": 1.0 / i, "mode": "client", "bytes_h2d": 2**20 * i,
             "converged": i == 5} for i in range(1, 6)]
    fig = plot.history(recs)
    assert [ax.get_ylabel() for ax in fig.axes] == ["ms per iteration", "loss", "bytes_h2d (MiB)"]
    assert fig.axes[1].get_yscale() == "log" and "client" in fig.axes[0].get_title()
    assert list(_lines(fig.axes[2])[0]) == [1.0, 2.0, 3.0, 4.0, 5.0]
    with pytest.raises(ValueError, match="needs 3 axes"):
        plot.history(recs, axes=fig.axes[:2])
    with pytest.raises(ValueError, match="no per-iteration records"):
        plot.history([])
    with pytest.raises(TypeError, match="fitted gdask estimator"):
        plot.history(3)


def test_device_load_from_samples_and_from_a_cluster(client):
    fig = plot.device_load({"0": [(10.0, 0.5), (11.0, 1.0)], "1": [(10.0, 0.0), (11.0, 0.25)]})
    ax = fig.axes[0]
    assert [list(y) for y in _lines(ax)] == [[50.0, 100.0], [0.0, 25.0]]
    import time

    from gdask.plot import _load_history

    deadline = time.monotonic() + 20  # the scheduler samples the workers' heartbeats every second
    while len([s for s in client.run_on_scheduler(_load_history).values() if s]) < 2:
        assert time.monotonic() < deadline, "the dashboard sampled no load of both devices"
        time.sleep(0.5)
    fig = plot.device_load(client)  # the dashboard's samples on the scheduler
    names = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert names == ["device 0", "device 1"]


def test_device_load_right_after_a_fit_draws_the_fit(client):
    """The workers' counters reach the scheduler with their heartbeats; device_load samples them when
    called, so the fit that just ended shows as busy time on both devices."""
    import gdask

    x = np.random.default_rng(0).standard_normal((200_000, 16)).astype(np.float32)
    X = gdask.from_array(x, block_rows=25_000).persist()
    before = client.run_on_scheduler(_busy_times)
    gdask.ml.KMeans(8, random_state=0, max_iter=6, tol=0, algorithm="lloyd").fit(X)
    fig = plot.device_load(client)
    after = client.run_on_scheduler(_busy_times)
    assert all(after[a] > before.get(a, 0.0) for a in after)  # the sample taken has the fit's busy time
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2
    for line in lines:
        assert max(line.get_ydata()) > 0, "a device shows no busy time right after the fit"


def _busy_times(dask_scheduler=None):
    from gdask import protocol

    plugin = dask_scheduler.plugins[protocol.PLUGIN_DASHBOARD]
    return {a: h[-1][1] for a, h in plugin.history.items() if h}


def test_window_passes():
    fig = plot.window([{"hit_rate": 0.0, "bytes_h2d": 2**21}, {"hit_rate": 0.5, "bytes_h2d": 2**20}])
    assert list(_lines(fig.axes[0])[0]) == [0.0, 50.0]
    assert [p.get_height() for p in fig.axes[1].patches] == [2.0, 1.0]


def test_benchmark_figures():
    it = [{"ratio": 1.5}, {"ratio": 1.05}]
    lb = {"args": {"speeds": "1,0.5"}, "device": "emulated",
          "gdask": {"worker_threads": [1], "synthetic": {"iterations": it, "blocks_end": {0: 6, 1: 3}}},
          "stock": {"worker_threads": [1], "synthetic": {"iterations": it, "blocks_start": {0: 5, 1: 4}}}}
    fig = plot.load_balance(lb)
    assert len(fig.axes) == 2 and [p.get_height() for p in fig.axes[1].patches] == [6, 3, 5, 4]
    win = {"results": [{"name": "(a) window", "hit_rate": 0.5, "moved_per_pass": 0.5, "ms_per_iter": 10.0},
                       {"name": "(c) LRU", "hit_rate": 0.0, "moved_per_pass": 1.0, "ms_per_iter": 20.0}],
           "data_bytes": 2**26, "devices": 2, "backend": "emulated", "device_memory": 2**24}
    fig = plot.window_benchmark(win)
    assert [p.get_width() for p in fig.axes[0].patches] == [50.0, 0.0]
    sh = {"jobs": [1, 2], "results": [{"policy": p, "mean_jct": j, "makespan": 2 * j, "utilisation": 0.5}
                                      for p, j in (("whole-device", 3.0), ("gdask", 2.0))]}
    fig = plot.sharing(sh)
    assert [p.get_height() for p in fig.axes[0].patches] == [3.0, 2.0]


def test_without_matplotlib_the_error_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'gdask\[plot\]'"):
        plot.window([{"hit_rate": 1.0}])
