"""Every wait inside gdask is bounded (config ``gdask.timeouts.*``) and says what it waited for
(issue #17): a hang fails with an error instead of stalling."""

from __future__ import annotations

import time

import dask
import numpy as np
import pytest

import gdask
from gdask.gdataset import IterativeAlgorithm, run_loop

pytestmark = pytest.mark.timeout(120)


def slow_block(b):
    time.sleep(5)
    return float(b.sum())


def held_block(b, release="bw-release", finished="bw-finished"):
    """A block task that runs until the test releases it (at most 60 s), then says it finished."""
    from distributed import Event

    Event(release).wait(timeout=60)
    Event(finished).set()
    return float(b.sum())


class _Slow(IterativeAlgorithm):
    name = "slow"
    modes = ("client",)

    def run(self, state, ctx):
        ctx.map(held_block, ctx.data["X"], name="slow-pass")
        ctx.checkpoint(state)
        return state


def test_a_pass_that_does_not_finish_in_time_raises(client):
    """The pass's wait ends at gdask.timeouts.pass with a TimeoutError while its tasks still run: the
    tasks are held until after the error arrived (no timing assumption about the machine's load)."""
    from distributed import Event

    release, finished = Event("bw-release", client=client), Event("bw-finished", client=client)
    X = gdask.from_array(np.ones((8, 2)), block_rows=4).persist()
    try:
        with dask.config.set({"gdask.timeouts.pass": 0.5}):
            with pytest.raises(TimeoutError, match=r"pass 0 \(slow-pass\) of a client loop did not finish within "
                                                   r"0.5 s \(gdask.timeouts.pass\)"):
                run_loop(_Slow(), {"X": X}, {}, client=client)
        assert not finished.is_set(), "the pass's wait lasted until its tasks finished"
    finally:
        release.set()


def test_a_tracked_computation_that_does_not_finish_in_time_raises(client):
    X = gdask.from_array(np.ones((8, 2)), block_rows=4)
    with dask.config.set({"gdask.timeouts.pass": 0.5}), gdask.incremental(client):
        with pytest.raises(TimeoutError, match=r"tracked computation .* 0.5 s \(gdask.timeouts.pass\)"):
            X.reduce_blocks(slow_block, sum, name="slow").compute()


def test_a_job_waits_for_a_share_at_most_the_configured_time(client):
    with gdask.job(client, gpu=1.0, memory="1MiB", devices=2, name="bw-holder"):
        with dask.config.set({"gdask.timeouts.job-open": 0.5}):
            with pytest.raises(TimeoutError, match=r"job 'bw-late' waited 0.5 s .*gdask.timeouts.job-open"):
                gdask.job(client, gpu=1.0, memory="1MiB", name="bw-late").open()


def test_waiting_for_persisted_blocks_is_bounded(client):
    from gdask.gdataset import block_workers

    X = gdask.from_array(np.ones((8, 2)), block_rows=4).map_blocks(_sleepy, dtype=float, ncols=2).persist()
    with dask.config.set({"gdask.timeouts.blocks": 0.3}):
        with pytest.raises(TimeoutError, match=r"persisted blocks of .* 0.3 s \(gdask.timeouts.blocks\)"):
            block_workers(X, client, wait_ready=True)


def _sleepy(b):
    time.sleep(3)
    return b
