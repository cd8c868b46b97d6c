"""The window store's protocol on real workers (issue 26, item 5): who reads a block and which blocks
are in use come from gdask's worker hooks, never from frames or reference counts.

* a transfer to another worker is served from the host copy, without loading the device;
* a block pinned by a running task is not evicted, and is unpinned when the task ends;
* the same on distributed's own thread pool (no gdask stream executor);
* no pin is left after a task errs or is cancelled, nor when the wrapper's release is missed;
* a task whose inputs cannot all be on the device at once gets the sizes.
"""

from __future__ import annotations

import asyncio
import time

import dask
import numpy as np
import pytest
from distributed import wait

from gdask.testing import gen_gpu_cluster
from gdask.window_cache import State, WindowCacheMemoryError

pytestmark = pytest.mark.timeout(120)

ROWS = 1024
NB = ROWS * 64 * 4  # one block: 256 KiB of float32
MEMORY = 5 * NB  # 4 blocks stay on the device (one block's room is kept free)


@pytest.fixture(params=["stream-executor", "plain-executor"])
def executor(request):
    """gdask's stream executor, or distributed's own thread pool."""
    with dask.config.set({"gdask.device.stream-executor": request.param == "stream-executor",
                          "gdask.window-cache.policy": "lru"}):
        yield request.param


@pytest.fixture
def lru():
    with dask.config.set({"gdask.window-cache.policy": "lru"}):
        yield


def make_block(i):
    from gdask.devices import current_device

    return current_device().asarray(np.full((ROWS, 64), i, np.float32))


async def blocks_on(client, worker, n, name="blk"):
    futures = [client.submit(make_block, i, key=f"{name}-{i}", workers=[worker.address], pure=False)
               for i in range(n)]
    await wait(futures)
    return futures


def hold_and_press(block, key, seconds=0.0):
    """A task that reads block ``key`` and, while it runs, asks its device for all its memory back."""
    from distributed import get_worker

    from gdask.devices import current_device

    store = get_worker().data
    pins = store.pins(key)
    current_device().reclaim(10 * NB)  # an allocation that wants everything: blocks no task holds go
    time.sleep(seconds)
    return pins, store.state(key), float(block[0, 0])


@gen_gpu_cluster(n_devices=2, device_memory=MEMORY)
async def test_a_transfer_is_served_from_the_host_copy(client, scheduler, workers, lru):
    a, b = workers
    futures = await blocks_on(client, a, 8)
    on_host = [f for f in futures if a.data.state(f.key) is State.HOST]
    assert on_host, "some blocks must be on the host for this test"
    before = a.data.metrics()
    f = on_host[0]
    total = await client.submit(np.sum, f, workers=[b.address], pure=False)  # b fetches the block from a
    assert total == float(int(f.key.split("-")[1]) * ROWS * 64)
    after = a.data.metrics()
    assert a.data.state(f.key) is State.HOST  # the device was not loaded to send it
    assert after["host_reads"] == before["host_reads"] + 1 and after["bytes_h2d"] == before["bytes_h2d"]
    # a plain read of the same block (code that holds the store) loads it onto the device
    a.data[f.key]
    assert a.data.state(f.key) is State.DEVICE


@gen_gpu_cluster(n_devices=1, device_memory=MEMORY)
async def test_a_pinned_block_is_not_evicted_and_is_unpinned_after_its_task(client, scheduler, workers, executor):
    (a,) = workers
    futures = await blocks_on(client, a, 3)
    uses_stream_executor = type(a.executors["default"]).__name__ == "StreamThreadPoolExecutor"
    assert uses_stream_executor == (executor == "stream-executor")
    held = futures[1]
    pins, state, value = await client.submit(hold_and_press, held, held.key, pure=False)
    assert pins == 1 and state is State.DEVICE and value == 1.0  # held while its task ran
    assert all(a.data.state(f.key) is State.HOST for f in futures if f is not held)  # the others went
    assert a.data.pins(held.key) == 0 and a.data.pinned_tasks() == []
    assert a.data.metrics()["pinned_tasks"] == 0


def fail_holding(block):
    from distributed import get_worker

    assert get_worker().data.pinned_tasks(), "the task's input is pinned while it runs"
    raise ValueError("the task fails")


@gen_gpu_cluster(n_devices=1, device_memory=MEMORY)
async def test_no_pin_is_left_after_a_task_errs_or_is_cancelled(client, scheduler, workers, executor):
    (a,) = workers
    futures = await blocks_on(client, a, 3)
    with pytest.raises(ValueError, match="the task fails"):
        await client.submit(fail_holding, futures[0], pure=False)
    assert a.data.pinned_tasks() == []
    slow = client.submit(hold_and_press, futures[2], futures[2].key, 1.0, pure=False)
    deadline = time.monotonic() + 30
    while not a.data.pinned_tasks():  # the task runs and holds its input
        assert time.monotonic() < deadline, "the task did not start"
        await asyncio.sleep(0.01)
    assert a.data.pins(futures[2].key) == 1
    await slow.cancel()
    while a.data.pinned_tasks():  # released when the cancelled task's code returns
        assert time.monotonic() < deadline, f"pins left after a cancelled task: {a.data.pinned_tasks()}"
        await asyncio.sleep(0.01)
    assert a.data.pins(futures[2].key) == 0


@gen_gpu_cluster(n_devices=1, device_memory=MEMORY)
async def test_a_missed_release_is_made_when_the_task_leaves_executing(client, scheduler, workers, lru):
    from gdask import protocol
    from gdask._compat import wrap_execute

    (a,) = workers
    futures = await blocks_on(client, a, 2)
    plugin = a.plugins[protocol.PLUGIN_WINDOW_CACHE]
    plugin.teardown(a)  # gdask's wrapper off; a wrapper that pins and never releases instead
    store = a.data

    async def leaky(execute, key, *, stimulus_id):
        store.task_started(key, [d.key for d in a.state.tasks[key].dependencies])
        return await execute(key, stimulus_id=stimulus_id)

    undo = wrap_execute(a, leaky)
    try:
        assert await client.submit(np.sum, futures[1], pure=False) == float(ROWS * 64)
        assert store.pinned_tasks() == []  # the plugin's transition hook released them
    finally:
        undo()


def sum_all(*blocks):
    return sum(float(b.sum()) for b in blocks)


@gen_gpu_cluster(n_devices=1, device_memory=MEMORY)
async def test_a_task_whose_inputs_cannot_all_fit_gets_the_sizes(client, scheduler, workers, lru):
    (a,) = workers
    futures = await blocks_on(client, a, 8)
    with pytest.raises(WindowCacheMemoryError, match=r"task 'sum_all-.*' reads 8 device blocks of 2.00 MiB in all"):
        await client.submit(sum_all, *futures, key="sum_all-everything", pure=False)
    assert a.data.pinned_tasks() == []
    assert await client.submit(sum_all, futures[0], futures[7], pure=False) == float(7 * ROWS * 64)
