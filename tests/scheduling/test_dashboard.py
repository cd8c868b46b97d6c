"""gdask's page on the Dask dashboard (``/gdask``): served by a real LocalGPUCluster, rendered by Chromium."""

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import numpy as np
import pytest

import gdask
from gdask._compat import scheduler_workers
from gdask.scheduling._dashboard import render_fragment, render_page


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=20) as r:
        return r.status, r.read().decode()


@pytest.fixture(scope="module")
def dashboard():
    """A LocalGPUCluster on the loopback interface after a K-means fit: ``(base url, client)``."""
    from distributed import Client, wait

    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="256MiB", device_speeds=[1.0, 0.5],
                               dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        x = np.random.default_rng(0).standard_normal((40_000, 8)).astype("float32")
        X = gdask.from_array(x, block_rows=5_000).persist()
        gdask.ml.KMeans(4, random_state=0, max_iter=4).fit(X)
        # the fit's tasks may fetch X's blocks across workers, and distributed's active memory manager then
        # drops one of the two copies (it may leave a device without blocks): a fresh dataset is placed by
        # speed (1 : 0.5), so both devices hold blocks for the page to show
        Y = gdask.from_array(x[::-1].copy(), block_rows=5_000).persist()
        wait(Y)
        base = client.dashboard_link.rsplit("/", 1)[0]
        deadline = time.monotonic() + 60  # the workers' counters arrive with their heartbeats
        while True:
            devs = json.loads(_get(base + "/gdask/data.json")[1])["devices"]
            if len(devs) == 2 and all(d["tasks"] > 0 and d["reads"] > 0 and d["window_bytes"] > 0
                                      and d["memory_used"] > 0 for d in devs):
                break
            assert time.monotonic() < deadline, f"the workers did not report their work: {devs}"
            time.sleep(0.3)
        yield base, client, X


def test_the_page_is_served_with_the_devices(dashboard):
    base, client, _ = dashboard
    status, page = _get(base + "/gdask")
    assert status == 200
    assert "device 0" in page and "device 1" in page  # worker (device) names
    assert page.count("emulated") >= 2
    for addr in scheduler_workers(client):
        assert addr in page
    assert "window hit rate" in page and "streams K" in page and "tasks placed" in page


def test_data_json_has_live_device_figures(dashboard):
    base, _, _ = dashboard
    data = json.loads(_get(base + "/gdask/data.json")[1])
    devs = data["devices"]
    assert [d["name"] for d in devs] == ["0", "1"]
    assert [d["speed_configured"] for d in devs] == [1.0, 0.5]
    assert all(d["memory"] == 256 * 2**20 for d in devs)
    # blocks on the devices (the pool's use and the window's bytes are read at slightly different moments)
    assert all(0 < d["window_bytes"] <= d["memory"] and 0 < d["memory_used"] <= d["memory"] for d in devs)
    assert all(d["tasks"] > 0 and d["placed"] > 0 and d["streams"] >= 1 for d in devs)
    assert all(d["hit_rate"] is not None and 0 <= d["hit_rate"] <= 1 for d in devs)
    assert data["placement"] and data["policy"] == "gdask"
    assert 0 < data["reuse"]["reused"] <= data["reuse"]["submitted"]  # the persisted blocks were reused


def test_jobs_appear_with_their_shares(dashboard):
    base, client, _ = dashboard
    with gdask.job(client, gpu=0.25, memory="16MiB", name="dash-job"):
        data = json.loads(_get(base + "/gdask/data.json")[1])
        page = _get(base + "/gdask/fragment")[1]
    (row,) = [r for r in data["jobs"] if r["job"] == "dash-job"]
    assert row["share"] == 0.25 and row["memory"] == 16 * 2**20 and row["status"] == "running"
    assert row["devices"] and set(row["devices"]) <= {"0", "1"}
    assert "dash-job" in page and "25%" in page


def test_the_bokeh_dashboard_links_to_the_page(dashboard):
    pytest.importorskip("bokeh")
    base, _, _ = dashboard
    status, page = _get(base + "/status")
    assert status == 200 and 'href="gdask"' in page


def _held_by_worker(dask_scheduler=None):
    """(on the scheduler) Per worker name: the GDataSet blocks (``from-array`` keys) it holds and their bytes."""
    out = {}
    for ws in dask_scheduler.workers.values():
        blocks = [ts for ts in ws.has_what if str(ts.key[0] if isinstance(ts.key, tuple) else ts.key).startswith(
            "from-array")]
        out[str(ws.name)] = (len(blocks), sum(ts.nbytes for ts in blocks))
    return out


def _shown(dask_scheduler=None):
    """(on the scheduler) Per device: the page's blocks on the device, their bytes, and blocks held in all."""
    from gdask import protocol
    from gdask.scheduling._dashboard import dashboard_data

    data = dashboard_data(dask_scheduler, dask_scheduler.plugins.get(protocol.PLUGIN_DASHBOARD))
    return {d["name"]: (d["device_count"], int(d["window_bytes"]), d["blocks"]) for d in data["devices"]}


def _page_matches_the_blocks_held(client, timeout=30):
    deadline = time.monotonic() + timeout  # the workers' store metrics arrive with their heartbeats
    while True:
        held, shown = client.run_on_scheduler(_held_by_worker), client.run_on_scheduler(_shown)
        if {n: v[:2] for n, v in shown.items()} == held and all(v[0] == v[2] for v in shown.values()):
            return held
        assert time.monotonic() < deadline, f"the page shows (device blocks, bytes, all blocks) {shown}, the " \
            f"workers hold (blocks, bytes) {held}"
        time.sleep(0.2)


@contextlib.contextmanager
def _two_devices_with_blocks():
    """An in-process 2-device cluster (no replica dropped behind the test's back) holding 8 blocks of 312.5 kB."""
    import dask
    from distributed import Client, wait

    from gdask.testing import InProcessGPUCluster

    with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}), \
            InProcessGPUCluster(2, device_memory="64MiB") as cluster, Client(cluster) as client:
        Z = client.persist(gdask.from_array(np.ones((80_000, 8), dtype="f4"), block_rows=10_000))
        wait(Z)
        yield client, Z


@pytest.mark.timeout(180)
def test_memory_figures_are_the_blocks_each_device_holds():
    """8 persisted blocks split between two devices: per device, the page's block count and bytes are the
    blocks the scheduler says the worker holds, all on its device (they fit)."""
    with _two_devices_with_blocks() as (client, _):
        held = _page_matches_the_blocks_held(client)
        assert sum(n for n, _ in held.values()) == 8 and all(n > 0 for n, _ in held.values())
        assert sum(b for _, b in held.values()) == 8 * 10_000 * 8 * 4


@pytest.mark.timeout(180)
def test_memory_figures_count_a_block_received_from_another_worker():
    from distributed import futures_of

    with _two_devices_with_blocks() as (client, Z):
        _page_matches_the_blocks_held(client)
        client.replicate(futures_of(Z)[:1], n=2)  # block 0 now also on the other device
        held = _page_matches_the_blocks_held(client, timeout=10)
        assert sum(n for n, _ in held.values()) == 9


def _device(name="0", memory=4 * 2**30, used=48 * 2**20, window=48 * 2**20, device_count=4, **kw):
    d = {"name": name, "address": f"tcp://w{name}", "backend": "emulated", "device_name": "emulated", "index": 0,
         "memory": float(memory), "memory_used": float(used), "window_bytes": float(window), "host_bytes": 0.0,
         "device_count": device_count, "host_count": 0, "disk_count": 0, "blocks": device_count,
         "window_store": True, "other_keys": 0, "hit_rate": None, "reads": 0, "streams": 1, "max_streams": 1,
         "placed": 3,
         "speed_measured": None, "speed_configured": 1.0, "backlog_s": 0.0, "tasks": 1, "busy_time": 0.0,
         "bytes_h2d": 0.0, "busy": 0.5, "busy_series": [0.1, 0.5]}
    d.update(kw)
    return d


def _data(*devices):
    return {"time": 0.0, "devices": list(devices), "jobs": [], "reuse": {"submitted": 0, "reused": 0, "graphs": 0},
            "policy": "gdask", "moves": 0, "replaced": 0, "placement": True}


def test_a_small_gauge_is_drawn_on_a_scale_that_shows_it():
    """48 MiB of a 4 GiB budget would be a 1% sliver: the gauge says its value and draws it on a 64 MiB scale."""
    frag = render_fragment(_data(_device()))
    assert "48.00 MiB of 4.00 GiB (1.2%)" in frag
    assert "scale 0 – 64.00 MiB" in frag and "is 64x longer" in frag
    assert "width:75.00%" in frag  # 48 of 64 MiB
    big = render_fragment(_data(_device(used=2 * 2**30, window=2 * 2**30)))  # half the budget: the budget's scale
    assert "scale 0" not in big and "width:50.00%" in big
    assert "4 blocks: 4 blocks on the device (48.00 MiB), 0 blocks only on the host; 0 B in host memory" in frag
    copies = render_fragment(_data(_device(host_bytes=48.0 * 2**20)))  # host copies kept of the device's blocks
    assert "0 blocks only on the host; 48.00 MiB in host memory" in copies


def test_a_worker_without_the_window_store_says_so():
    frag = render_fragment(_data(_device(window_store=False, window=0.0, device_count=0)))
    assert "not known: this worker's data store is not gdask's window store" in frag
    frag = render_fragment(_data(_device(other_keys=3)))
    assert "; 3 other values in host memory, outside the window" in frag


def test_render_without_workers_or_jobs():
    data = {"time": 0.0, "devices": [], "jobs": [], "reuse": {"submitted": 0, "reused": 0, "graphs": 0},
            "policy": "gdask", "moves": 0, "replaced": 0, "placement": True}
    frag = render_fragment(data)
    assert "No gdask device worker has reported yet" in frag and "No jobs" in frag
    page = render_page(data, prefix="/dash")
    assert '"/dash/gdask/fragment"' in page and 'href="/dash/status"' in page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="needs Debian's chromium (apt-get install chromium); CI installs it")
def test_headless_chromium_renders_the_page_with_data(dashboard, tmp_path):
    """A screenshot of the live page: the scripts ran (the live part refreshed) and the bars have data."""
    Image = pytest.importorskip("PIL.Image")
    base, _, _ = dashboard
    shot = tmp_path / "gdask-dashboard.png"
    with tempfile.TemporaryDirectory() as profile:
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1400,900", "--virtual-time-budget=2500"]
        dom = subprocess.run([_chromium(), *flags, "--dump-dom", base + "/gdask"], capture_output=True, text=True,
                             timeout=90)
        subprocess.run([_chromium(), *flags, f"--screenshot={shot}", base + "/gdask"], capture_output=True,
                       timeout=90, check=True)
    assert "device 0" in dom.stdout and "device 1" in dom.stdout and "Placement" in dom.stdout
    if os.environ.get("GDASK_SCREENSHOTS"):  # keep the picture (for the docs / a person to look at)
        shutil.copy(shot, os.environ["GDASK_SCREENSHOTS"])
    img = Image.open(shot).convert("RGB")
    assert img.size == (1400, 900)
    # the device cards use the page's width: their background (#fafafa) reaches the right quarter
    card = (0xFA, 0xFA, 0xFA)
    cards = [x for x in range(0, 1400, 10) if any(img.getpixel((x, y)) == card for y in range(40, 600, 4))]
    assert cards and max(cards) > 1200, f"the cards end at x={max(cards, default=0)} of 1400"
    colors = img.getcolors(maxcolors=1 << 20)
    count = {c: n for n, c in colors}
    # the placement chart's bars are drawn from the data: tasks placed (#f58518), speeds (#54a24b); the
    # legend's 10 x 10 swatches alone would be 100 pixels each
    assert count.get((0xF5, 0x85, 0x18), 0) > 1000
    assert count.get((0x54, 0xA2, 0x4B), 0) > 1000
    assert count.get((0x4C, 0x78, 0xA8), 0) > 1000  # the memory gauges' window-resident blocks are visible
