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


def _overlapping_fit(max_iter=60):
    """gdask's float32 K-means (no Client) on blobs that overlap so much that float32 Lloyd fits part ways
    (scikit-learn's float32 centers end ~1e-2 from its float64 ones here), from given centers."""
    import numpy as np

    from gdask._cli import _blobs
    from gdask.ml import KMeans

    X = _blobs(50_000, 8, 16, 1.0)
    init = X[np.random.default_rng(0).choice(len(X), 16, replace=False)].copy()
    return X, init, KMeans(16, init=init, n_init=1, max_iter=max_iter, tol=0).fit(X)


def test_demo_agreement_is_judged_against_float64_within_float32s_own_drift(capsys):
    import numpy as np

    from gdask._cli import _agreement

    X, init, km = _overlapping_fit()
    assert _agreement(X, 16, init, km, np.asarray(km.labels_)) == 0
    out = capsys.readouterr().out
    assert "in float64" in out and "scikit-learn's own float32 fit" in out and out.rstrip().endswith("-> OK")
    # the same fit with its centers moved is no longer scikit-learn's answer, whatever the drift
    km.cluster_centers_ = km.cluster_centers_ + np.float32(0.05)
    assert _agreement(X, 16, init, km, np.asarray(km.labels_)) == 1
    assert capsys.readouterr().out.rstrip().endswith("-> MISMATCH")
    # a fit as far from float64's answer as scikit-learn's own float32 fit (its own, here) passes; further does not
    from types import SimpleNamespace

    from sklearn.cluster import KMeans as SKKMeans

    sk = SKKMeans(16, init=init, n_init=1, max_iter=60, tol=0, algorithm="lloyd").fit(X)
    fit = SimpleNamespace(n_iter_=60, cluster_centers_=sk.cluster_centers_, inertia_=sk.inertia_)
    assert _agreement(X, 16, init, fit, sk.labels_) == 0
    assert "labels equal 99." in capsys.readouterr().out  # its labels differ from float64's: the drift is there
    fit.cluster_centers_ = sk.cluster_centers_ + np.float32(0.02)
    assert _agreement(X, 16, init, fit, sk.labels_) == 1
    capsys.readouterr()
    # float64 data: compared with float64 alone, at the bars
    X64 = X.astype(np.float64)
    from gdask.ml import KMeans

    km64 = KMeans(16, init=init.astype(np.float64), n_init=1, max_iter=20, tol=0).fit(X64)
    assert _agreement(X64, 16, init, km64, np.asarray(km64.labels_)) == 0
    assert "scikit-learn's own" not in capsys.readouterr().out
