"""Jobs sharing one device (issue #17, item 4): a job over its memory request spills its own blocks
only, another job within its request keeps all of its blocks on the device, and a job's blocks and
devices cannot be read or claimed by naming the job."""

from __future__ import annotations

import concurrent.futures

import dask
import numpy as np
import pytest
from distributed import futures_of, wait

import gdask

MiB = 2**20


@pytest.fixture(scope="module")
def one_device():
    from distributed import Client

    with gdask.LocalGPUCluster(n_devices=1, backend="emulated", device_memory="64MiB",
                               dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


def _usage(client, job):
    return sum(client.run(lambda dask_worker: dask_worker.plugins["gdask-job-monitor"].usage(job)).values())


def test_an_over_limit_job_does_not_evict_a_job_within_its_request(one_device):
    c = one_device
    rows = int(4.5 * MiB) // 32  # 4.5 MiB blocks of 4 float64 columns
    b_data = np.random.default_rng(0).random((8 * rows, 4))  # 36 MiB
    a_data = np.random.default_rng(1).random((21 * rows, 4))  # ~96 MiB
    with gdask.job(c, gpu=0.5, memory="40MiB", name="iso-B"):
        B = gdask.from_array(b_data, block_rows=rows).persist()
        wait(futures_of(B))
        assert _usage(c, "iso-B") == 36 * MiB
        with gdask.job(c, gpu=0.5, memory="24MiB", name="iso-A"):
            A = gdask.from_array(a_data, block_rows=rows).persist()
            wait(futures_of(A))
            # before: 3-4 of B's 8 blocks went to the host
            assert _usage(c, "iso-B") == 36 * MiB
            assert 0 < _usage(c, "iso-A") <= 24 * MiB
            np.testing.assert_allclose(A.sum(axis=0).compute(), a_data.sum(axis=0))  # A's spilled blocks read right
            assert _usage(c, "iso-B") == 36 * MiB  # A's reads brought its blocks back at its own expense
        np.testing.assert_allclose(B.sum(axis=0).compute(), b_data.sum(axis=0))
    table = gdask.scheduling.jobs(c)
    assert table.loc["iso-A", "spilled_bytes"] >= 70 * MiB
    assert table.loc["iso-B", "spilled_bytes"] == 0


def _devices_for(client, key):
    def ask(dask_scheduler=None, key=key):
        devices = dask_scheduler.plugins["gdask-jobs"].devices_for(dask_scheduler.tasks[key])
        return None if devices is None else sorted(devices)

    return client.run_on_scheduler(ask)


def test_a_job_cannot_be_read_or_claimed_by_its_name(one_device):
    c = one_device
    data = np.arange(4000, dtype="f8").reshape(1000, 4)
    with gdask.job(c, gpu=0.25, memory="4MiB", name="iso-owner") as owner:
        X = c.persist(gdask.from_array(data, block_rows=250))
        wait(futures_of(X))
        own_key = futures_of(X)[0].key
        assert _devices_for(c, own_key) == sorted(owner.devices)
        used = _usage(c, "iso-owner")

        def forger():  # another thread (or client) that knows the job's name, not its secret
            assert dask.get_annotations().get("gdask_job") is None
            with dask.annotate(gdask_job="iso-owner"):
                Y = gdask.from_array(data, block_rows=250)
                Yp = c.persist(Y)
                wait(futures_of(Yp))
                return Y.name, futures_of(Yp)[0].key, Yp

        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            name, forged_key, Yp = ex.submit(forger).result()
        assert name != X.name  # its keys are not the job's: it cannot read the job's blocks by key
        assert _devices_for(c, forged_key) is None  # nor claim the job's devices
        assert _usage(c, "iso-owner") == used  # nor be counted (and spilled) as the job's memory
        np.testing.assert_array_equal(Yp.compute(), data)
