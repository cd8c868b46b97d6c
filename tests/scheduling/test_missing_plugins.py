"""A plain ``dask scheduler`` (no ``--preload gdask.scheduling``): gdask says so once, then installs its plugins."""

import warnings

import dask.array as da
import pytest

import gdask
from gdask import protocol
from gdask.scheduling import ensure_plugins, job


def _plugins(dask_scheduler=None):
    return sorted(dask_scheduler.plugins)


@pytest.mark.timeout(180)
def test_a_scheduler_without_gdask_plugins_warns_once_then_has_them():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        assert protocol.PLUGIN_PLACEMENT not in client.run_on_scheduler(_plugins)
        # work placed without gdask's placement (what a fit on a plain `dask scheduler` does first)
        held = client.compute(da.ones((64, 4), chunks=(16, 4)).sum())
        assert held.result() == 256
        with pytest.warns(gdask.GDaskWarning, match=r"ran work without gdask's scheduler plugins .*--preload "
                                                     r"gdask.scheduling"):
            ensure_plugins(client)
        have = client.run_on_scheduler(_plugins)
        assert protocol.PLUGIN_PLACEMENT in have and protocol.PLUGIN_JOBS in have
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # installed: no second warning, for this client or another
            ensure_plugins(client)
            with job(client, gpu=0.5, memory="16MiB", name="after") as j:
                assert j.status == "running"
            with Client(cluster, set_as_default=False) as other:
                ensure_plugins(other)


@pytest.mark.timeout(180)
def test_installing_the_plugins_before_any_work_says_nothing():
    """Nothing was placed without them: nothing for the user to act on, no warning."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client, warnings.catch_warnings():
        warnings.simplefilter("error")
        ensure_plugins(client)
        assert protocol.PLUGIN_PLACEMENT in client.run_on_scheduler(_plugins)


def test_a_job_repr_uses_the_units_of_the_tables():
    from gdask.scheduling import Job

    class _FakeClient:  # the repr needs no cluster (only a client's shape)
        scheduler = None

    j = Job(_FakeClient(), gpu=0.25, memory="64MiB", name="small")
    assert repr(j) == "<gdask.job 'small' gpu=0.25 memory=64.00 MiB new on []>"
