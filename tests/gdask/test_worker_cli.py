"""A cluster as separate processes, as on separate hosts: ``dask scheduler`` + ``gdask worker`` processes
(and ``dask worker --preload gdask.scheduling``), a Client connecting by address."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import gdask
from gdask._compat import scheduler_workers

pytestmark = pytest.mark.timeout(240)


def _wait_for(path, seconds=60):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no scheduler file {path} after {seconds} s")
        time.sleep(0.2)


def _start(cmd, log):
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(procs, seconds=30):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + seconds
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            codes.append(None)
    return codes


def _workload(client, n_workers):
    from distributed import wait

    deadline = time.monotonic() + 60
    while len(scheduler_workers(client)) < n_workers:
        assert time.monotonic() < deadline, "device workers did not connect"
        time.sleep(0.2)
    table = gdask.scheduling.device_table(client)
    assert len(table) == n_workers and (table["backend"] == "emulated").all()
    stores = client.run(lambda dask_worker: type(dask_worker.data).__name__)
    assert set(stores.values()) == {"WindowStore"}
    x = np.random.default_rng(0).random((40_000, 8), dtype=np.float32)
    X = gdask.from_array(x, block_rows=5_000).persist()
    wait(X)
    km = gdask.ml.KMeans(4, random_state=0, max_iter=20).fit(X)
    ref = gdask.ml.KMeans(4, random_state=0, max_iter=20).fit(x)
    np.testing.assert_allclose(np.sort(km.cluster_centers_, 0), np.sort(ref.cluster_centers_, 0), rtol=1e-4)
    stats = gdask.window_cache.stats(client)
    assert len(stats["workers"]) == n_workers and stats["reads"] > 0
    return km


@pytest.mark.parametrize("layout", ["two-hosts", "one-host-two-devices"])
def test_scheduler_and_gdask_worker_processes(tmp_path, layout):
    from distributed import Client

    sched_file = str(tmp_path / "scheduler.json")
    log = open(tmp_path / "log.txt", "w")
    procs = [_start([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", sched_file,
                     "--port", "0", "--dashboard-address", ":0"], log)]
    # two "hosts" with one emulated device each, or one gdask worker command for a node with two devices
    nodes = [("node-a", "1"), ("node-b", "1")] if layout == "two-hosts" else [("node", "2")]
    try:
        _wait_for(sched_file)
        for name, n in nodes:
            procs.append(_start([sys.executable, "-m", "gdask", "worker", "--scheduler-file", sched_file,
                                 "--backend", "emulated", "--n-devices", n, "--device-memory", "256MiB",
                                 "--name", name], log))
        with Client(scheduler_file=sched_file, timeout=60) as client:
            km = _workload(client, 2)
            assert km.fit_mode_ == "workers"
            names = sorted(str(w["name"]) for w in scheduler_workers(client).values())
            assert names == (["node-a-0", "node-b-0"] if layout == "two-hosts" else ["node-0", "node-1"])
    finally:
        codes = _stop(procs[1:]) + _stop(procs[:1])
        log.close()
    text = (tmp_path / "log.txt").read_text(errors="replace")
    assert codes == [0] * len(procs), text[-3000:]  # every process closed cleanly on SIGTERM
    assert text.count("owns emulated device") == 2  # each worker names its device in its log
    assert "dictionary changed size" not in text and "heartbeat-error" not in text.lower()


def test_plain_dask_processes_with_the_preload(tmp_path):
    from distributed import Client

    sched_file = str(tmp_path / "scheduler.json")
    log = open(tmp_path / "log.txt", "w")
    env_cmd = [sys.executable, "-m"]
    procs = [_start(env_cmd + ["distributed.cli.dask_scheduler", "--scheduler-file", sched_file, "--port", "0",
                               "--dashboard-address", ":0", "--preload", "gdask.scheduling"], log)]
    try:
        _wait_for(sched_file)
        procs.append(_start(env_cmd + ["distributed.cli.dask_worker", "--scheduler-file", sched_file,
                                       "--nworkers", "2", "--nthreads", "2", "--preload", "gdask.scheduling"], log))
        with Client(scheduler_file=sched_file, timeout=60) as client:
            plugins = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.plugins))
            assert {"gdask-placement", "gdask-jobs"} <= set(plugins)
            _workload(client, 2)
    finally:
        _stop(procs[1:])
        _stop(procs[:1])
        log.close()
