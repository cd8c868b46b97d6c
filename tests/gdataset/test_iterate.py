"""gdask.iterate: delta iterations with per-block convergence, over the iteration channel."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import gdask
from gdask._compat import scheduler_workers
from gdask.gdataset import device_call


def jacobi_block(b, x):
    return 0.5 * x + b


def _step(data, state, ctx):
    # device_call: the host state reaches the block's device, the result comes back to the host
    outs = [dask.delayed(device_call)(jacobi_block, data.block(i), ctx.refs[i]) for i in range(data.nblocks)]
    return list(dask.compute(*outs))


def test_per_block_convergence_skips_converged_blocks(bclient):
    client = bclient
    # x_i = 0.5 x_i + b_i: blocks with b = 0 start at their fixed point, the others converge to 2b
    bh = np.r_[np.ones(4), np.zeros(4), np.full(4, 3.0), np.zeros(4)]
    b = gdask.from_array(bh, block_rows=4)
    res = gdask.iterate(_step, [np.zeros(4) for _ in range(4)], data=b, max_iter=100, tol=1e-9, client=client)
    assert res.converged and res.n_iter < 100
    np.testing.assert_allclose(np.concatenate(res.state), 2 * bh, atol=1e-9)
    h = res.history
    assert h[0]["active_blocks"] == 2  # the zero blocks did not move: converged at once
    for rec in h[1:]:
        # only the two moving blocks' tasks run; the converged blocks' tasks are reused
        assert rec["executed"] <= 2 + 1, rec
        assert rec["reused"] >= 2
        # the channel sends only blocks that changed (2 of 4 at most)
        assert rec["channel_bytes"] <= 2 * 32 * len(scheduler_workers(client))
    assert h[0]["executed"] >= 4 + 4  # first iteration: every block and its source


def test_whole_state_and_callable_tol(client):
    X = gdask.from_array(np.arange(8.0), block_rows=4)

    def step(data, state, ctx):
        # Newton iteration for sqrt(sum(X)) with the state as one published value
        s = data.sum().compute()
        return 0.5 * (state + s / state)

    res = gdask.iterate(step, np.array([1.0]), data=X, max_iter=50, tol=lambda s: 1e-12 * abs(s).sum(),
                        client=client)
    assert res.converged
    np.testing.assert_allclose(res.state, np.sqrt(28.0))
    assert res.history[-1]["reused"] >= 1  # X's sum is reused from the first iteration on


def test_dict_state_refs(client):
    X = gdask.from_array(np.ones((6, 2)), block_rows=3)
    seen = []

    def step(data, state, ctx):
        seen.append(sorted(ctx.refs))
        return {"a": state["a"] * 0.5, "b": state["b"]}

    res = gdask.iterate(step, {"a": np.ones(2), "b": np.zeros(3)}, data=X, max_iter=60, tol=1e-10,
                        client=client)
    assert res.converged and seen[0] == ["a", "b"]
    # "b" never changes: after the first iteration the channel sends only "a"
    assert all(h["channel_bytes"] <= 16 * len(scheduler_workers(client)) for h in res.history[1:])


def test_iterate_errors(client):
    with pytest.raises(ValueError, match="max_iter"):
        gdask.iterate(_step, [np.zeros(1)], max_iter=0, client=client)
    with pytest.raises(ValueError, match="tol"):
        gdask.iterate(_step, [np.zeros(1)], tol=-1, client=client)
    b = gdask.from_array(np.zeros(8), block_rows=4)
    with pytest.raises(ValueError, match="expected 2"):
        gdask.iterate(lambda d, s, c: s[:1], [np.zeros(4), np.zeros(4)], data=b, client=client)
