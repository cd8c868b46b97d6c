"""LocalGPUCluster raises when a worker does not start (issue #17, item 6) and refuses settings that
cannot be meant (item 8): nothing is started for those."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import gdask
from gdask import WorkerStartError


def test_a_worker_that_cannot_start_raises_with_its_own_error():
    # before: the cluster came up with 0 workers and the next compute waited forever
    with pytest.raises(WorkerStartError, match="No module named 'no_such_module'"):
        gdask.LocalGPUCluster(n_devices=1, backend="emulated", preload=["no_such_module"], dashboard_address=":0")


def test_a_script_without_the_main_guard_is_told_about_it(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent("""
        import gdask
        cluster = gdask.LocalGPUCluster(n_devices=1, backend="emulated", dashboard_address=":0")
        cluster.close()
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gdask._errors.WorkerStartError") and 'if __name__ == "__main__":' in last
    # the worker's own error says what happened, where the user sees it
    assert "LocalGPUCluster was created while a worker process was starting" in proc.stderr


@pytest.mark.parametrize("kw, match", [
    (dict(device_memory=1.5), "not a whole number of bytes"),
    (dict(device_memory=1000), "less than the 1.00 kiB"),
    (dict(device_memory="1.5"), "did you mean '1.5GiB'"),
    (dict(device_memory="100PiB"), "more than this machine's memory"),
    (dict(device_speeds=[float("inf"), 1.0]), "finite numbers > 0"),
    (dict(device_speeds=[float("nan"), 1.0]), "finite numbers > 0"),
    (dict(rmm_pool_size="abc"), "rmm_pool_size must be a number of bytes"),
    (dict(rmm_pool_size=[1]), "rmm_pool_size must be bytes"),
    (dict(rmm_pool_size=-1.0), "rmm_pool_size must be bytes"),
])
def test_settings_that_cannot_be_meant_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        gdask.LocalGPUCluster(n_devices=2, backend="emulated", dashboard_address=":0", **kw)


def test_devices_larger_than_the_machine_together_warn():
    from distributed.system import MEMORY_LIMIT

    from gdask._cluster import _check_host_memory
    from gdask.devices import DeviceSpec

    per = MEMORY_LIMIT // 2 + 2**20
    with pytest.warns(gdask.GDaskWarning, match="more than this machine's memory"):
        _check_host_memory([DeviceSpec(i, "emulated", per) for i in range(2)])
