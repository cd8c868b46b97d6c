"""gdask._compat holds every use of distributed's private API: pin the range it is tested with and check
that each private name it relies on still exists, so a distributed release that moves one fails here."""

from __future__ import annotations

import inspect

import distributed
import pytest
from packaging.version import Version

from gdask import _compat


def test_installed_distributed_is_in_the_supported_range():
    low, high = (Version(v) for v in _compat.SUPPORTED_DISTRIBUTED)
    assert low <= Version(distributed.__version__) < high, (
        f"distributed {distributed.__version__} is outside gdask's tested range {_compat.SUPPORTED_DISTRIBUTED}: "
        "check gdask/_compat.py against it, then widen the range")


def test_the_private_names_compat_relies_on_exist():
    from distributed import Client, Worker
    from distributed._signals import wait_for_signals

    assert inspect.iscoroutinefunction(Client._run)
    params = inspect.signature(Client._run).parameters
    assert {"workers", "wait", "on_error"} <= set(params)
    assert inspect.iscoroutinefunction(wait_for_signals)
    assert "data" in inspect.signature(Worker).parameters


@pytest.mark.timeout(60)
def test_executor_and_data_replacement_on_a_real_worker():
    from concurrent.futures import ThreadPoolExecutor

    from distributed import Client, LocalCluster

    def swap(dask_worker):
        ex = ThreadPoolExecutor(1)
        old = _compat.set_executor(dask_worker, ("default", "gpu"), ex)
        store = {}
        _compat.set_worker_data(dask_worker, store)
        return (old is not None, _compat.executor(dask_worker, "gpu") is ex, dask_worker.data is store)

    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        (res,) = client.run(swap).values()
        assert res == (True, True, True)
        assert client.submit(lambda: 41 + 1).result(timeout=30) == 42
