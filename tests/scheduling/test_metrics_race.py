"""Worker metrics are registered once, at setup: nothing in gdask adds a key to ``worker.metrics`` while
distributed's heartbeat may iterate it (with RMM importable distributed adds an async ``rmm`` metric,
awaited in the middle of ``for k, metric in self.metrics.items()``: a key added then ends the worker
with "dictionary changed size during iteration")."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import gdask
from gdask._compat import scheduler_workers

pytestmark = pytest.mark.timeout(240)


class FrozenMetrics(dict):
    """A metrics dict that records (and refuses) every change made to it in place."""

    mutations: list = []

    def _refuse(self, *args, **kwargs):
        FrozenMetrics.mutations.append(args[:1])
        raise RuntimeError(f"worker.metrics mutated in place after setup: {args[:1]}")

    __setitem__ = __delitem__ = update = pop = setdefault = clear = popitem = _refuse  # type: ignore[assignment]


async def _slow_metric(worker):  # what distributed adds for RMM: the heartbeat awaits it mid-iteration
    await asyncio.sleep(0.01)
    return {"slow": 1}


def _freeze(dask_worker=None):
    dask_worker.metrics = FrozenMetrics({**dask_worker.metrics, "slow": _slow_metric})
    return sorted(dask_worker.metrics)


def _mutations(dask_worker=None):
    return list(FrozenMetrics.mutations), type(dask_worker.metrics).__name__


def test_no_metric_is_added_after_setup():
    from distributed import Client

    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="64MiB", dashboard_address=":0",
                               worker_dashboard_address=":0") as cluster, Client(cluster) as client:
        names = next(iter(client.run(_freeze).values()))
        assert {"gdask_device", "gdask_streams", "gdask_window", "gdask_nvml"} <= set(names)
        # everything that used to register a metric on first use: window store blocks (also beyond
        # device memory), the placement feed, jobs, the loop on the workers, the device table
        x = np.random.default_rng(0).random((60_000, 64), dtype=np.float32)  # 15 MiB: spills past 64 MiB x 2
        X = gdask.from_array(x, block_rows=4_000).persist()
        ((X - X.mean(0)) / X.std(0)).sum(0).compute()
        gdask.ml.KMeans(4, random_state=0, max_iter=5).fit(X)
        with gdask.job(client, gpu=0.5, memory="16MiB", name="race"):
            gdask.ml.KMeans(4, random_state=0, max_iter=3).fit(x[:8000])
        gdask.scheduling.device_table(client)
        gdask.window_cache.stats(client)
        client.sync(asyncio.sleep, 2.5)  # heartbeats run meanwhile
        for mutations, kind in client.run(_mutations).values():
            assert mutations == [] and kind == "FrozenMetrics"
        assert len(scheduler_workers(client)) == 2  # no worker died
