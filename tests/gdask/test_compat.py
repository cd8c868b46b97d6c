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
    # wrap_execute / wrap_transfer_handler: the state machine awaits ``execute(key, stimulus_id=...)``;
    # the get_data handler takes the comm first and the keys, who and serializers by name
    assert inspect.iscoroutinefunction(Worker.execute)
    assert list(inspect.signature(Worker.execute).parameters) == ["self", "key", "stimulus_id"]
    assert inspect.iscoroutinefunction(Worker.get_data)
    assert list(inspect.signature(Worker.get_data).parameters)[:5] == ["self", "comm", "keys", "who", "serializers"]


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


@pytest.mark.timeout(60)
def test_execute_and_transfer_wrappers_on_a_real_worker():
    import contextlib

    from distributed import Client, LocalCluster

    seen = []

    @contextlib.contextmanager
    def around(who):
        seen.append(("transfer", who))
        yield

    async def wrapper(execute, key, *, stimulus_id):
        seen.append(("task", key))
        return await execute(key, stimulus_id=stimulus_id)

    with LocalCluster(n_workers=2, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        a, b = cluster.workers.values()
        undo = [_compat.wrap_execute(a, wrapper), _compat.wrap_transfer_handler(a, around)]
        x = client.submit(lambda: 41, key="x", workers=[a.address])
        assert client.submit(lambda v: v + 1, x, key="y", workers=[b.address]).result(timeout=30) == 42
        # b fetched x from a: the handler is told b asks (the window store sends blocks to workers as blocks)
        assert ("task", "x") in seen and ("transfer", b.address) in seen and ("task", "y") not in seen
        for u in undo:
            u()
        seen.clear()
        assert client.submit(lambda: 1, key="z", workers=[a.address]).result(timeout=30) == 1
        assert client.gather(x) == 41 and seen == []
        w = client.submit(lambda: 7, key="w", workers=[a.address])  # only a holds it (x has a copy on b too)
        assert w.result(timeout=30) == 7
        seen.clear()
        undo = [_compat.wrap_transfer_handler(a, around)]
        assert client.gather(w) == 7 and seen == [("transfer", None)]  # a client asks: no worker address
        for u in undo:
            u()


@pytest.mark.timeout(60)
def test_scheduler_workers_does_not_depend_on_the_clients_cached_identity():
    # Client.scheduler_info() returns the client's cached identity after fetching it; the client's
    # periodic refresh (no workers asked) may overwrite it in between. The cache is set here as
    # that refresh sets it: scheduler_workers still lists the workers, scheduler_info does not
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        assert not client.scheduler_info(n_workers=0)["workers"]  # the identity the periodic refresh caches
        found = _compat.scheduler_workers(client)
        assert sorted(found) == sorted(w.address for w in cluster.workers.values())
        assert all("nthreads" in info for info in found.values())
        with pytest.raises(TimeoutError, match="gdask.timeouts.scheduler-info"):
            _compat.scheduler_workers(client, timeout=1e-9)
