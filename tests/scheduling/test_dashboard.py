"""gdask's page on the Dask dashboard (``/gdask``): served by a real LocalGPUCluster, rendered by Chromium."""

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
    for addr in client.scheduler_info()["workers"]:
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
                 f"--user-data-dir={profile}", "--window-size=1200,900", "--virtual-time-budget=2500"]
        dom = subprocess.run([_chromium(), *flags, "--dump-dom", base + "/gdask"], capture_output=True, text=True,
                             timeout=90)
        subprocess.run([_chromium(), *flags, f"--screenshot={shot}", base + "/gdask"], capture_output=True,
                       timeout=90, check=True)
    assert "device 0" in dom.stdout and "device 1" in dom.stdout and "Placement" in dom.stdout
    if os.environ.get("GDASK_SCREENSHOTS"):  # keep the picture (for the docs / a person to look at)
        shutil.copy(shot, os.environ["GDASK_SCREENSHOTS"])
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 900)
    colors = img.getcolors(maxcolors=1 << 20)
    count = {c: n for n, c in colors}
    # the placement chart's bars are drawn from the data: tasks placed (#f58518), speeds (#54a24b); the
    # legend's 10 x 10 swatches alone would be 100 pixels each
    assert count.get((0xF5, 0x85, 0x18), 0) > 1000
    assert count.get((0x54, 0xA2, 0x4B), 0) > 1000
