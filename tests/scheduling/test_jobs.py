"""gdask.job on a real LocalGPUCluster: grants, queueing, placement on the job's devices, memory
requests, job-private keys, measured interference and the jobs table."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import gdask
from gdask.scheduling import JobProfile, ShareError, current_job, jobs


def emulated_kernel(i, work, compute, bandwidth):
    from gdask.devices import current_device

    current_device().kernel(work, compute, bandwidth, job=current_job())
    return current_job()


def chunk(blk, it, work, compute, bandwidth):
    from gdask.devices import current_device

    current_device().kernel(work, compute, bandwidth, job=current_job())
    return np.array([float(blk.shape[0])])


def combine(parts):
    return sum(parts[1:], parts[0])


def _who(client, futures):
    return {a for addrs in client.who_has(futures).values() for a in addrs}


@pytest.fixture(scope="module")
def jc():
    from distributed import Client

    with gdask.LocalGPUCluster(n_devices=3, backend="emulated", device_memory="64MiB", streams=4,
                               dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


def _policy(client, policy):
    def set_(dask_scheduler=None, policy=policy):
        plugin = dask_scheduler.plugins["gdask-jobs"]
        old, plugin.policy = plugin.policy, policy
        return old

    return client.run_on_scheduler(set_)


def test_tasks_and_blocks_of_a_job_stay_on_its_device_and_keys_are_private(jc):
    data = np.arange(4000, dtype="f4").reshape(1000, 4)
    outside = gdask.from_array(data, block_rows=250)
    with gdask.job(jc, gpu=0.5, memory="8MiB", name="t-place") as j:
        assert j.status == "running" and len(j.devices) == 1
        assert current_job() == "t-place"
        futs = jc.map(emulated_kernel, range(12), work=0.001, compute=0.1, bandwidth=0.1, pure=False)
        assert jc.gather(futs) == ["t-place"] * 12  # workers see the job of the running task
        assert _who(jc, futs) == set(j.devices)
        X = gdask.from_array(data, block_rows=250)
        assert X.name != outside.name  # job-private keys: another job cannot read these blocks
        Xp = jc.persist(X)
        from distributed import futures_of, wait

        wait(futures_of(Xp))
        assert _who(jc, futures_of(Xp)) == set(j.devices)
        assert float(Xp.sum().compute()) == float(data.sum())
        del Xp
    assert j.status == "done" and current_job() is None
    table = jobs(jc)
    assert table.loc["t-place", "status"] == "done"
    assert list(table.loc["t-place", "devices"]) == j.devices


def test_queueing_timeout_and_requests_that_never_fit(jc):
    old = _policy(jc, "whole-device")
    try:
        held = [gdask.job(jc, gpu=0.25, memory="1MiB", name=f"t-hold-{i}").open() for i in range(3)]
        assert len({d for h in held for d in h.devices}) == 3  # one job per device
        with pytest.raises(TimeoutError, match="t-late"):
            gdask.job(jc, gpu=0.25, memory="1MiB", name="t-late", timeout=0.5).open()
        late = gdask.job(jc, gpu=0.25, memory="1MiB", name="t-late-2")
        opened = threading.Event()

        def enter():
            late.open()
            opened.set()

        t = threading.Thread(target=enter, daemon=True)
        t.start()
        time.sleep(0.5)
        assert not opened.is_set() and jobs(jc).loc["t-late-2", "status"] == "waiting"
        held[1].close()
        assert opened.wait(10)
        assert late.devices == held[1].devices  # it got the device that was released
        late.close()
        for h in held:
            h.close()
    finally:
        _policy(jc, old)
    with pytest.raises(ShareError, match="memory"):
        gdask.job(jc, gpu=0.1, memory="1TiB", name="t-huge").open()
    with pytest.raises(ValueError, match="gpu"):
        gdask.job(jc, gpu=1.5, name="t-bad")
    with pytest.raises(ValueError, match="devices"):
        gdask.job(jc, gpu=0.5, devices=0)
    with gdask.job(jc, gpu=0.5, memory="1MiB", name="t-dup"):
        with pytest.raises(ShareError, match="unique"):
            gdask.job(jc, gpu=0.1, memory="1MiB", name="t-dup").open()
        with gdask.job(jc, gpu=0.5, memory="1MiB", name="t-two", devices=2) as two:
            assert len(set(two.devices)) == 2


def test_a_job_over_its_memory_request_spills_only_its_own_blocks(jc):
    from distributed import futures_of, wait

    def usage(job, workers):
        return sum(jc.run(lambda dask_worker: dask_worker.plugins["gdask-job-monitor"].usage(job),
                          workers=workers).values())

    rows = 2 ** 20 // 16  # 1 MiB blocks of 4 float32 columns
    data = np.ones((8 * rows, 4), dtype="f4")
    old = _policy(jc, "first-fit")  # both jobs on the first device
    try:
        with gdask.job(jc, gpu=0.5, memory="16MiB", name="t-big") as big:
            X = jc.persist(gdask.from_array(data, block_rows=rows))
            wait(futures_of(X))
            with gdask.job(jc, gpu=0.5, memory="3MiB", name="t-small") as small:  # inner block: its tasks
                assert small.devices == big.devices
                Y = jc.persist(gdask.from_array(data * 2, block_rows=rows))
                wait(futures_of(Y))
                assert 0 < usage("t-small", small.devices) <= 3 * 2 ** 20
                assert float(Y.sum().compute()) == float(data.sum() * 2)  # spilled blocks still read right
                assert usage("t-big", big.devices) == 8 * 2 ** 20  # untouched by the other job's spilling
    finally:
        _policy(jc, old)
    table = jobs(jc)
    assert table.loc["t-small", "spilled_bytes"] >= 5 * 2 ** 20
    assert table.loc["t-big", "spilled_bytes"] == 0


def test_measured_profiles_and_interference_are_learned(jc):
    data = np.ones((512, 4), dtype="f4")

    def run(name, kind, c, b, iters, work):
        with gdask.job(jc, gpu=0.5, memory="2MiB", name=name, kind=kind):
            X = jc.persist(gdask.from_array(data, block_rows=256))
            for it in range(iters):
                jc.compute(X.reduce_blocks(chunk, combine, it, work, c, b)).result()

    run("t-solo-a", "ka", 0.7, 0.2, 3, 0.15)  # alone: profiles and solo times
    run("t-solo-b", "kb", 0.6, 0.1, 3, 0.15)
    old = _policy(jc, "first-fit")  # pack the next two onto one device
    try:
        threads = [threading.Thread(target=run, args=(f"t-co-{k}", k, c, b, 6, 0.15))
                   for k, c, b in (("ka", 0.7, 0.2), ("kb", 0.6, 0.1))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        _policy(jc, old)
    table = jobs(jc)
    prof = table.attrs["profiles"]
    assert prof["ka"]["compute"] == pytest.approx(2 * 0.7 / (1 + 0.04 + 0.4), rel=0.25)  # 2 kernels at once
    assert prof["ka"]["compute"] > prof["ka"]["bandwidth"]
    assert table.loc["t-co-ka", "measured_slowdown"] > 1.2  # compute over-subscribed: C = 2.6
    assert table.attrs["observations"] > 0 and table.attrs["model_error"] is not None


def test_job_profile_given_and_repr(jc):
    j = gdask.job(jc, gpu=0.25, memory="1MiB", name="t-given", profile=JobProfile(0.2, 0.7))
    assert "t-given" in repr(j) and j.status == "new"
    with j:
        assert jobs(jc).loc["t-given", "bottleneck"] == "bandwidth"
    with pytest.raises(RuntimeError, match="runs once"):
        j.open()


def test_estimators_take_a_share_with_gpu_and_memory_keywords(jc):
    from gdask.ml import KMeans, LogisticRegression

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 5)).astype("f8")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int)
    plain = LogisticRegression().fit(x, y)
    shared = LogisticRegression(gpu=0.5, memory="8MiB", job_name="t-lr").fit(x, y)
    np.testing.assert_allclose(shared.coef_, plain.coef_, rtol=1e-6, atol=1e-8)
    row = jobs(jc).loc["t-lr"]
    assert row["status"] == "done" and row["kind"] == "LogisticRegression" and len(row["devices"]) == 1
    assert shared.get_params()["gpu"] == 0.5
    A = gdask.ml.powerlaw_graph(2000, seed=0)
    np.testing.assert_allclose(gdask.ml.pagerank(A, gpu=0.25, memory="4MiB", job_name="t-pr"),
                               gdask.ml.pagerank(A), atol=1e-9)
    assert jobs(jc).loc["t-pr", "kind"] == "pagerank"
    km_plain = KMeans(n_clusters=3, random_state=0).fit(x)
    km = KMeans(n_clusters=3, random_state=0, gpu=0.25, memory="8MiB", job_name="t-km").fit(x)
    np.testing.assert_allclose(km.cluster_centers_, km_plain.cluster_centers_, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(km.labels_, km_plain.labels_)
    row = jobs(jc).loc["t-km"]
    assert row["status"] == "done" and row["kind"] == "KMeans" and len(row["devices"]) == 1


def test_a_plain_dask_cluster_gets_the_job_plugins_on_first_use():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        with gdask.job(c, gpu=0.5, memory="1MiB", name="t-plain", timeout=30) as j:
            futs = c.map(emulated_kernel, range(6), work=0.001, compute=0.1, bandwidth=0.1, pure=False)
            assert c.gather(futs) == ["t-plain"] * 6
            assert _who(c, futs) == set(j.devices)
        assert jobs(c).loc["t-plain", "status"] == "done"


def test_a_job_on_two_devices_gets_the_best_linked_pair(jc):
    import dask

    names = jc.run(lambda dask_worker: str(dask_worker.name))  # address -> worker name
    by_name = {n: a for a, n in names.items()}
    with dask.config.set({"gdask.scheduling.sharing.links": {"0-2": "nvlink", "1-2": "socket"}}):
        with gdask.job(jc, gpu=0.5, memory="1MiB", name="t-linked", devices=2) as j:
            assert set(j.devices) == {by_name["0"], by_name["2"]}


def test_jobs_opened_without_with_may_close_in_any_order(jc):
    a = gdask.job(jc, gpu=0.1, memory="1MiB", name="t-order-a").open()
    b = gdask.job(jc, gpu=0.1, memory="1MiB", name="t-order-b").open()
    assert current_job() == "t-order-b"
    b_futs = jc.map(emulated_kernel, range(2), work=0.0, compute=0.1, bandwidth=0.1, pure=False)
    a.close()
    assert current_job() == "t-order-b"
    b.close()
    assert current_job() is None
    assert jc.gather(b_futs) == ["t-order-b"] * 2
