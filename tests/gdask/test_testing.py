"""gdask.testing: in-process device workers, each with its own device, state and window store."""

from __future__ import annotations

import numpy as np
import pytest

import gdask
from gdask.testing import InProcessGPUCluster, gen_gpu_cluster

pytestmark = pytest.mark.timeout(120)


@gen_gpu_cluster(n_devices=2, device_memory="64MiB")
async def test_async_cluster_each_worker_its_own_device(client, scheduler, workers):
    from gdask.devices import context

    devices = [context(w).device for w in workers]
    assert devices[0] is not devices[1] and [d.spec.index for d in devices] == [0, 1]
    X = client.persist(gdask.from_array(np.arange(4000.0).reshape(1000, 4), block_rows=250))
    total = await client.compute(X.sum(0))
    np.testing.assert_allclose(total, np.arange(4000.0).reshape(1000, 4).sum(0))
    used = [d.pool.used for d in devices]
    assert all(u > 0 for u in used) and sum(used) >= X.nbytes  # each block in its own worker's pool


def test_in_process_cluster_gives_the_same_fit_as_worker_processes():
    from distributed import Client

    x = np.random.default_rng(0).random((20_000, 8), dtype=np.float32)
    with InProcessGPUCluster(2, device_memory="64MiB") as cluster, Client(cluster) as c:
        G = gdask.from_array(x, block_rows=2500).persist()
        a = gdask.ml.KMeans(4, init=x[:4], max_iter=10, tol=0).fit(G)
        table = gdask.scheduling.device_table(c)
        assert list(table["device"]) == [0, 1] and a.fit_mode_ == "workers"
    b = gdask.ml.KMeans(4, init=x[:4], max_iter=10, tol=0).fit(x)  # no client: the same bits
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
