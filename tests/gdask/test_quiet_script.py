"""A plain user script (a LocalGPUCluster, KMeans and LogisticRegression fits, a device-load plot)
prints what it prints and nothing else: no warnings, no tracebacks, no log lines."""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import numpy as np
    from distributed import Client
    import gdask
    from gdask.ml import KMeans, LogisticRegression

    if __name__ == "__main__":
        rng = np.random.default_rng(1)
        X = rng.standard_normal((40_000, 12)).astype("float32")
        y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype("int64")
        with gdask.LocalGPUCluster(n_devices=2, backend="emulated", dashboard_address=":0") as cluster, \\
                Client(cluster) as client:
            # fitted at once: the workers may still be compiling their kernels
            km = KMeans(5, random_state=0).fit(X)
            lr = LogisticRegression(max_iter=100).fit(X, y)
            fig = gdask.plot.device_load(client)
            print("fitted", km.n_iter_ > 0, lr.score(X, y) > 0.95, len(fig.axes[0].get_lines()))
""")


@pytest.mark.timeout(600)
def test_a_plain_script_prints_only_its_own_output(tmp_path):
    pytest.importorskip("matplotlib")
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines() == ["fitted True True 2"], proc.stdout[-3000:]
    assert proc.stderr.strip() == "", proc.stderr[-3000:]


def test_a_heartbeat_failing_while_the_workers_close_is_not_logged(monkeypatch):
    import logging
    from types import SimpleNamespace

    from distributed.core import Status

    from gdask.scheduling import _worker

    def record(msg):
        return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, msg, None, None)

    beat = record("Failed to communicate with scheduler during heartbeat.")
    f = _worker.HeartbeatAtClose()
    monkeypatch.setattr(_worker, "process_workers", lambda: [SimpleNamespace(status=Status.closing)])
    assert not f.filter(beat)  # the worker closes its own connections: nothing to report
    assert f.filter(record("something else"))
    assert not f.filter(record("Unexpected exception during heartbeat. Closing worker."))
    tornado = logging.LogRecord("tornado.application", logging.ERROR, __file__, 1, "Exception in callback %r", (
        "<bound method Worker.heartbeat of <Worker 'tcp://127.0.0.1:1', status: closed>>",), None)
    assert not f.filter(tornado)
    other = logging.LogRecord("tornado.application", logging.ERROR, __file__, 1, "Exception in callback %r",
                              ("<function f>",), None)
    assert f.filter(other)
    monkeypatch.setattr(_worker, "process_workers", lambda: [SimpleNamespace(status=Status.running),
                                                             SimpleNamespace(status=Status.closed)])
    assert f.filter(beat)  # a running worker lost its scheduler: reported
