"""Estimator inputs and interrupts (issue #17, item 8): float16 blocks, NaN in lazy predictions,
non-finite initial centers, Ctrl-C during a fit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gdask
from gdask.ml import KMeans, LogisticRegression


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 3))
    return X, (X[:, 0] + X[:, 1] > 0).astype(int)


def test_float16_blocks_are_fitted_in_float32(data):
    X, y = data
    G = gdask.from_array(X.astype(np.float16), block_rows=100)
    km = KMeans(3, init=X[:3].astype(np.float16), max_iter=5, tol=0).fit(G)
    assert km.cluster_centers_.dtype == np.float32  # before: numba's NotImplementedError
    ref = KMeans(3, init=X[:3].astype(np.float16).astype(np.float32), max_iter=5, tol=0).fit(
        X.astype(np.float16).astype(np.float32))
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=1e-5)
    lr = LogisticRegression(max_iter=20).fit(G, gdask.from_array(y, block_rows=100))
    assert lr.coef_.dtype == np.float32 and lr.score(X.astype(np.float32), y) > 0.9


def test_predicting_on_blocks_with_nan_raises_like_numpy_input(data):
    X, y = data
    Xn = X.copy()
    Xn[150, 1] = np.nan
    G = gdask.from_array(Xn, block_rows=100)
    km = KMeans(3, random_state=0, max_iter=5).fit(X)
    with pytest.raises(ValueError, match="NaN"):
        km.predict(Xn)  # NumPy input: scikit-learn's check
    with pytest.raises(ValueError, match="Input X contains NaN or infinity"):
        km.predict(G).compute()  # before: labels came back
    with pytest.raises(ValueError, match="Input X contains NaN or infinity"):
        km.transform(G).compute()
    lr = LogisticRegression(max_iter=20).fit(X, y)
    with pytest.raises(ValueError, match="Input X contains NaN or infinity"):
        lr.predict(G).compute()  # lazy for a GDataSet: each block's task checks its rows
    with pytest.raises(ValueError, match="Input X contains NaN or infinity"):
        lr.predict_proba(G).compute()
    assert (km.predict(gdask.from_array(X, block_rows=100)).compute() == km.predict(X)).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_initial_centers_with_nan_or_inf_are_refused(data, bad):
    X, _ = data
    init = X[:3].copy()
    init[1, 2] = bad
    with pytest.raises(ValueError, match="init array contains NaN or infinity"):
        KMeans(3, init=init).fit(X)
    with pytest.raises(ValueError, match="init array contains NaN or infinity"):
        KMeans(3, init=init).fit(gdask.from_array(X, block_rows=100))


@pytest.mark.timeout(240)
def test_ctrl_c_during_a_fit_interrupts_it(tmp_path):
    script = tmp_path / "interrupt.py"
    script.write_text(textwrap.dedent("""
        import os, signal, threading, time
        import dask, numpy as np, gdask, gdask.ml
        from distributed import Client

        if __name__ == "__main__":
            # Ctrl-C as in a terminal, also when this runs where SIGINT is ignored (a background job)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="128MiB",
                                       dashboard_address=":0") as cluster, Client(cluster):
                X = np.random.default_rng(0).random((100_000, 8), dtype=np.float32)
                G = gdask.from_array(X, block_rows=12_500).persist()
                fit = lambda: gdask.ml.KMeans(8, init=X[:8], max_iter=400, tol=0, algorithm="lloyd").fit(G)
                gdask.ml.KMeans(8, init=X[:8], max_iter=2, tol=0).fit(G)  # compile the kernels
                # interrupt at a fraction of the whole fit's time here, so it is always under way
                # (the fit ends by strict convergence, at the same iteration on any machine)
                whole = {True: [], False: []}
                for worker_loop in (True, True, False):
                    with dask.config.set({"gdask.ml.worker-loop": worker_loop}):
                        t0 = time.monotonic()
                        fit()
                        whole[worker_loop].append(time.monotonic() - t0)
                for worker_loop, fraction in ((True, 0.2), (False, 0.1), (True, 0.4), (False, 0.04)):
                    delay = fraction * min(whole[worker_loop])
                    with dask.config.set({"gdask.ml.worker-loop": worker_loop}):
                        timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
                        timer.start()
                        t0 = time.monotonic()
                        try:
                            fit()
                            timer.cancel()
                            print("IGNORED", worker_loop, round(delay, 2), round(time.monotonic() - t0, 2), flush=True)
                        except KeyboardInterrupt:
                            print("INTERRUPTED", round(time.monotonic() - t0 - delay, 2), flush=True)
                    time.sleep(0.3)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=200)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("IGNORED", "INTERRUPTED"))]
    assert len(lines) == 4, proc.stdout + proc.stderr[-3000:]
    assert all(ln.startswith("INTERRUPTED") for ln in lines), lines
    assert all(float(ln.split()[1]) < 5 for ln in lines), lines  # at once, not at the end of the fit
