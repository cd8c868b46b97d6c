"""``gdask demo``: progress while it starts, compile time apart from the iteration times."""

import subprocess
import sys

from gdask.ml import WarmKernels, wait_for_warm_kernels, warm_kernels


def test_warm_kernels_runs_here_without_a_cluster():
    assert warm_kernels(("float32",)) > 0


def test_local_gpu_cluster_workers_compile_ahead(client):
    done = wait_for_warm_kernels(client, timeout=120)
    assert len(done) == 2 and all(s > 0 for s in done.values())
    status = client.run(lambda dask_worker: dask_worker.plugins[WarmKernels.name].status())
    assert all(s["done"] and s["error"] is None for s in status.values())


def test_demo_reports_compile_time_apart_from_iterations():
    proc = subprocess.run([sys.executable, "-m", "gdask._cli", "demo", "--rows", "20000", "--features", "8",
                           "--clusters", "4", "--iterations", "4", "--backend", "emulated", "--devices", "2"],
                          capture_output=True, text=True, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert "starting a LocalGPUCluster (emulated backend) ... " in out  # progress while it starts
    assert "compiling the kernels on the workers" in out
    assert "kernel compilation:" in out and "not in the iteration times" in out
    assert "median of the others" in out and "-> OK" in out
    assert "KMeans: " in out  # the fit's summary line (verbose=1)
