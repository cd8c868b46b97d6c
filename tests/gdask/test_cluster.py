import numpy as np
import pytest
from distributed import Client

import gdask
from gdask.scheduling import device_info


def test_cluster_one_worker_per_device_and_clean_shutdown():
    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="64MiB", device_speeds=[1.0, 0.5],
                               dashboard_address=":0") as cluster, Client(cluster) as c:
        infos = c.run(device_info)
        assert sorted(i["index"] for i in infos.values()) == [0, 1]
        assert sorted(i["speed"] for i in infos.values()) == [0.5, 1.0]
        assert all(i["memory"] == 64 * 2**20 for i in infos.values())
        assert "LocalGPUCluster" in cluster._repr_html_()
    assert cluster.status.name == "closed"


def test_cluster_rejects_conflicting_kwargs():
    with pytest.raises(TypeError, match="n_devices"):
        gdask.LocalGPUCluster(n_workers=3, backend="emulated")


def test_block_larger_than_device_memory_is_a_clear_error():
    with gdask.LocalGPUCluster(n_devices=1, backend="emulated", device_memory="1MiB",
                               dashboard_address=":0") as cluster, Client(cluster):
        x = np.ones((100_000, 4), np.float32)  # 1.6 MB in one block
        with pytest.raises(gdask.DeviceMemoryError, match="larger than the whole device budget"):
            gdask.from_array(x, block_rows=100_000).persist().compute()
        # the cluster survives: smaller blocks fit
        y = gdask.from_array(x[:40_000], block_rows=5_000)
        np.testing.assert_array_equal(y.sum(axis=0).compute(), x[:40_000].sum(0))
