"""Algorithms that run on the workers only (``modes = ("workers",)``, e.g. data-parallel training):
run in this process without a Client, run again on the workers from the last checkpoint after a lost
peer, and end at once on an error of their own."""

import logging

import dask
import numpy as np
import pytest

import gdask
from gdask.devices import worker_state
from gdask.gdataset import CollectiveError, IterativeAlgorithm, run_loop


class BlockSums(IterativeAlgorithm):
    """Each iteration: the sum of every block (from each rank's own blocks), all-gathered; ``fail``
    makes a rank raise at iteration 2 (``"peer"``: a lost peer, the first time on each worker only;
    ``"bug"``: an error of the driver; ``"always"``: a lost peer at the start of every run)."""

    name = "block-sums"
    modes = ("workers",)

    def __init__(self, iterations=4, fail=None):
        self.iterations = iterations
        self.fail = fail

    def run(self, state, ctx):
        if self.fail == "always" and ctx.rank == 0:
            raise CollectiveError("peer lost (simulated)")
        while ctx.iteration < self.iterations:
            mine = [(b, float(arrays["X"].sum())) for b, arrays in ctx.local()]
            total = sum(s for part in ctx.allgather(mine) for _, s in part)
            if ctx.iteration == 2 and ctx.rank == 0 and self.fail:
                space = worker_state(ctx.token)
                if self.fail == "bug":
                    raise ValueError("a bug in the driver")
                if not space.get("failed"):
                    space["failed"] = True
                    raise CollectiveError("peer lost (simulated)")
            state = {"total": state["total"] + total, "ranks": ctx.size}
            ctx.checkpoint(state, total=total)
        return state


@pytest.fixture(scope="module")
def data():
    x = np.arange(4000, dtype=np.float64).reshape(1000, 4)
    return x, float(x.sum())


def test_without_a_client_it_runs_here_as_the_only_rank(data):
    x, s = data
    res = run_loop(BlockSums(), {"X": gdask.from_array(x, block_rows=100)}, {"total": 0.0})
    assert res.mode == "local" and res.iterations == 4 and res.state == {"total": 4 * s, "ranks": 1}
    assert [r["iteration"] for r in res.history] == [1, 2, 3, 4] and all(r["mode"] == "local" for r in res.history)


def test_on_the_workers(client, data):
    x, s = data
    res = run_loop(BlockSums(), {"X": gdask.from_array(x, block_rows=100)}, {"total": 0.0})
    assert res.mode == "workers" and res.state == {"total": 4 * s, "ranks": 2} and res.restarts == 0


def test_a_lost_peer_runs_the_loop_on_the_workers_again_from_its_checkpoint(client, data, caplog):
    x, s = data
    with caplog.at_level(logging.WARNING, logger="gdask.gdataset"):
        res = run_loop(BlockSums(fail="peer"), {"X": gdask.from_array(x, block_rows=100)}, {"total": 0.0})
    # rank 0 failed in iteration 3 after the all-gather: rank 1's checkpoint of iteration 3 may be the last
    assert "running it on the workers again from iteration " in caplog.text and "(restart 1 of" in caplog.text
    assert res.mode == "workers" and res.restarts == 1 and res.state["total"] == 4 * s
    assert [r["iteration"] for r in res.history] == [1, 2, 3, 4]


def test_an_error_of_the_driver_ends_the_fit_at_once(client, data, caplog):
    x, _ = data
    with caplog.at_level(logging.WARNING, logger="gdask.gdataset"), pytest.raises(ValueError, match="a bug"):
        run_loop(BlockSums(fail="bug"), {"X": gdask.from_array(x, block_rows=100)}, {"total": 0.0})
    assert "again" not in caplog.text


def test_restarts_are_bounded(client, data):
    x, _ = data
    with dask.config.set({"gdask.engine.max-restarts": 1}), \
            pytest.raises(CollectiveError, match="failed 2 times.*last finished iteration is 0"):
        run_loop(BlockSums(fail="always"), {"X": gdask.from_array(x, block_rows=100)}, {"total": 0.0})


def _first_row_and_index(blk, b):
    return (b, float(blk[0, 0]))


class BlockIndexes(IterativeAlgorithm):
    """One pass that gets each block's index next to the block (``BlockIndex``)."""

    name = "block-indexes"

    def run(self, state, ctx):
        from gdask.gdataset import BlockIndex

        got = ctx.map(_first_row_and_index, ctx.data["X"], BlockIndex())
        ctx.checkpoint(got)
        return got


@pytest.mark.parametrize("where", ["here", "workers"])
def test_block_index_is_each_blocks_index(data, where, request):
    x, _ = data
    if where == "workers":
        request.getfixturevalue("client")
    G = gdask.from_array(x, block_rows=100).persist()
    res = run_loop(BlockIndexes(), {"X": G}, None)
    assert res.mode == ("workers" if where == "workers" else "client")
    assert res.state == [(b, float(x[100 * b, 0])) for b in range(10)]


class _Comm:
    """The part of a communicator a rank's context reads when it checkpoints (no peers, no worker)."""

    rank, size, worker = 0, 1, None


@pytest.mark.parametrize("keep", [False, True])
def test_a_rank_keeps_its_last_checkpoint_for_the_survivors(keep):
    """What a survivor gives back is the pickle of the last (iteration, state, record): pickled at once,
    or (a driver that checkpoints copies) kept as it is and pickled when asked for."""
    import asyncio
    import pickle

    from gdask.gdataset.engine import _worker

    token = f"keep-{keep}"
    ctx = _worker.WorkersContext(_Comm(), [], ["X"], 1, token, 0, None, keep_states=keep)
    try:
        ctx.checkpoint({"x": np.arange(3.0)}, loss=1.0)
        state = {"x": np.arange(3.0) + 10}
        ctx.checkpoint(state, loss=0.5)
        kept = _worker.checkpoint_space(None, token)[_worker._CHECKPOINT]
        assert isinstance(kept, tuple) == keep
        if not keep:
            state["x"][:] = -1  # a driver changing its state after the checkpoint: recorded as it was
        payload, recent = asyncio.run(_worker.last_checkpoint(token))
        iteration, got, rec = pickle.loads(payload)
        assert iteration == 2 and rec["loss"] == 0.5
        np.testing.assert_array_equal(got["x"], [10.0, 11.0, 12.0])
        assert [it for it, _ in pickle.loads(recent)] == [1, 2]
    finally:
        _worker.drop_on_worker(token)

