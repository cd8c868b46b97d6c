"""Residency (issue 26, item 6): distributed's active memory manager (``ReduceReplicas`` every 2 s)
never drops a device block's original in favour of a copy another worker fetched, and the stores'
device memory figures equal the bytes of the blocks they hold on the device."""

from __future__ import annotations

import time

import dask
import numpy as np
import pytest
from distributed import futures_of, wait
from distributed.utils_test import gen_cluster

import gdask
from gdask.scheduling import GPUPlacement
from gdask.window_cache import KeepDeviceReplicas, Residency, State

pytestmark = pytest.mark.timeout(180)


def _nbytes(block):
    return int(block.nbytes)


def _blocks_here(keys, dask_worker=None):
    """(on a worker) Per key of ``keys`` held here: its state and device bytes; and the store's figures."""
    store = dask_worker.data
    here = {k: (store.state(k), store.device_bytes(k)) for k in keys if k in store}
    m = store.metrics()
    return {"blocks": here, "device_bytes": m["device_bytes"], "window_bytes": m["window_bytes"],
            "held": sum(store.device_bytes(k) for k in store), "sent": dask_worker.transfer_outgoing_count_total}


def _amm_policies(dask_scheduler=None):
    return sorted(type(p).__name__ for p in dask_scheduler.extensions["amm"].policies)


def test_device_blocks_stay_on_their_worker_after_fetches_and_amm_cycles():
    from distributed import Client

    x = np.random.default_rng(0).standard_normal((40_000, 8)).astype("float32")
    # placement's rebalancing may move blocks on purpose when measured speeds drift: off, so that
    # every move left is the active memory manager's
    with dask.config.set({"gdask.scheduling.rebalance": False}), \
            gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="64MiB",
                                  dashboard_address=":0") as cluster, Client(cluster) as client:
        assert "KeepDeviceReplicas" in client.run_on_scheduler(_amm_policies)
        assert "ReduceReplicas" not in client.run_on_scheduler(_amm_policies)
        X = gdask.from_array(x, block_rows=5_000).persist()
        futures = futures_of(X)
        wait(futures)
        home = {f.key: list(client.who_has([f])[f.key]) for f in futures}
        assert all(len(h) == 1 for h in home.values()) and len({h[0] for h in home.values()}) == 2
        nbytes = dict(zip([f.key for f in futures], client.gather([client.submit(_nbytes, f) for f in futures])))
        gdask.ml.KMeans(4, random_state=0, max_iter=4).fit(X)
        # every block is read by a task on the other worker: that worker fetches a copy of each
        workers = sorted({h[0] for h in home.values()})
        other = {k: [w for w in workers if w != h[0]] for k, h in home.items()}
        reads = [client.submit(_nbytes, f, workers=other[f.key], allow_other_workers=False, pure=False)
                 for f in futures]
        assert client.gather(reads) == [nbytes[f.key] for f in futures]
        keys = list(home)
        sent = client.run(_blocks_here, keys)
        assert all(s["sent"] > 0 for s in sent.values()), sent  # both workers sent blocks to the other
        time.sleep(5.0)  # two cycles of the active memory manager (every 2 s) and then some
        now = client.who_has(futures)
        moved = {k: (home[k], list(now[k])) for k in keys if list(now[k]) != home[k]}
        assert not moved, f"blocks left (or stayed duplicated beyond) their worker: {moved}"
        report = client.run(_blocks_here, keys)
        for w in workers:
            mine = [k for k in keys if home[k] == [w]]
            blocks = report[w]["blocks"]
            assert set(blocks) == set(mine)
            assert all(state is State.DEVICE for state, _ in blocks.values()), blocks
            on_device = sum(n for _, n in blocks.values())
            assert on_device == sum(nbytes[k] for k in mine)
            # the store's device figures are the bytes of the blocks it holds on the device
            assert report[w]["device_bytes"] == report[w]["held"] >= on_device
            assert report[w]["window_bytes"] >= report[w]["device_bytes"]


def test_keep_device_replicas_never_offers_the_home_worker():
    """The policy alone: ``ReduceReplicas``'s drops, with the home worker taken out of the candidates."""
    from types import SimpleNamespace

    from distributed.active_memory_manager import ReduceReplicas, Suggestion

    a, b, c = "worker-a", "worker-b", "worker-c"  # stand-ins for WorkerStates
    tasks = {k: SimpleNamespace(key=k, who_has={a, b, c}, waiters=None) for k in ("home-a", "unknown")}

    class Homes:
        def home_of(self, ts):
            return a if ts.key == "home-a" else None

    class Stock(ReduceReplicas):  # two drops per task, as ReduceReplicas suggests for 3 replicas
        def run(self):
            for ts in tasks.values():
                yield Suggestion("drop", ts)
                yield Suggestion("drop", ts)

    class Policy(KeepDeviceReplicas, Stock):
        pass

    got = list(Policy(Homes()).run())
    assert [(s.ts.key, s.candidates) for s in got] == [("home-a", {b, c}), ("home-a", {b, c}),
                                                       ("unknown", None), ("unknown", None)]


@gen_cluster(client=True, nthreads=[("", 1)] * 2,
             config={"distributed.scheduler.active-memory-manager.start": False})
async def test_placement_counts_a_replicated_block_on_its_home(c, s, a, b):
    """gdask's rebalancing counts a block that another worker fetched on its home worker: without a
    plan that pays for a move, the fetched copy is the one dropped."""
    await c.register_plugin(Residency())
    await c.register_plugin(GPUPlacement(rebalance=False, min_gain=0.9))
    plugin = s.plugins[GPUPlacement.name]
    futs = [c.submit(np.full, 1000, float(i), key=("blk", i), workers=[(a if i < 2 else b).address])
            for i in range(4)]
    await wait(futs)
    assert await c.submit(np.sum, futs[0], workers=[b.address], key="reader") == 0.0  # b fetches block 0
    assert {ws.address for ws in s.tasks[("blk", 0)].who_has} == {a.address, b.address}
    assert s.plugins[Residency.name].home_of(s.tasks[("blk", 0)]).address == a.address
    plugin._families["blk"] = {f.key for f in futs}  # blocks a later graph reused: rebalancing candidates
    for _ in range(3):  # b is 3x as fast: counted by balance alone, block 0 would go to b
        plugin.model.observe("k", 8000, a.address, 0.3)
        plugin.model.observe("k", 8000, b.address, 0.1)
    moves = plugin.plan_moves()
    assert moves == [(("blk", 0), sorted([a.address, b.address], key=[a.address, b.address].index), a.address)]
