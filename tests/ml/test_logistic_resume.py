"""L-BFGS resumes exactly: a fit resumed from any checkpoint replays the iterations already made from
its memo of evaluations (no passes over the data for them) and ends with the same bits as a fit that
never stopped (issue 26: scipy's solver restarted from the last parameters lost its curvature pairs)."""

from __future__ import annotations

import numpy as np
import pytest

from gdask.ml._logistic._loop import Layout, LogisticLoop, SolverState


class _Ctx:
    """A loop context over in-memory blocks that records checkpoints and counts passes."""

    def __init__(self, blocks, iteration=0):
        self.data = {"X": [b[0] for b in blocks], "Y": [b[1] for b in blocks], "W": None}
        self.iteration = iteration
        self.checkpoints = []
        self.passes = 0

    def map(self, func, X, Y, *args, name=None):
        self.passes += 1
        return [func(x, y, *args) for x, y in zip(X, Y)]

    def checkpoint(self, state, **record):
        self.iteration += 1
        self.checkpoints.append((self.iteration, state))


def _blocks(K, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3000, 5))
    logits = x @ rng.standard_normal((5, max(K, 1)))
    y = (logits[:, 0] > 0) if K == 1 else logits.argmax(1)
    y = y.astype(np.int32)
    return [(x[i:i + 1000], y[i:i + 1000]) for i in range(0, 3000, 1000)]


@pytest.mark.parametrize("K", [1, 3])
def test_lbfgs_resumed_from_every_checkpoint_gives_the_same_bits(K):
    layout = Layout(K, 5, True)

    def loop(max_iter):
        return LogisticLoop(layout, False, None, 3000.0, 1.0, "lbfgs", max_iter, 1e-6, 4096)

    blocks = _blocks(K)
    x0 = np.zeros(K * 6)
    ctx = _Ctx(blocks)
    ref = loop(30).run(SolverState(x0), ctx)
    assert ctx.iteration >= 4 and ref.status == 0
    for it, saved in ctx.checkpoints:
        again = _Ctx(blocks, iteration=it)
        out = loop(30).run(saved, again)
        np.testing.assert_array_equal(out.x, ref.x)
        assert again.iteration == ctx.iteration  # the replayed iterations are not checkpointed again
        assert again.passes == ctx.passes - len(saved.memo)  # the memo answers what was evaluated before
    # capped: the resumed fit stops at the same max_iter with the same bits
    capped = _Ctx(blocks)
    ref3 = loop(3).run(SolverState(x0), capped)
    assert ref3.status == 1
    again = _Ctx(blocks, iteration=2)
    np.testing.assert_array_equal(loop(3).run(capped.checkpoints[1][1], again).x, ref3.x)


def test_lbfgs_off_the_recorded_path_computes_fresh():
    """A memo that does not match the solver's points (not expected) is dropped, not trusted."""
    layout = Layout(1, 5, True)
    blocks = _blocks(1)
    algo = LogisticLoop(layout, False, None, 3000.0, 1.0, "lbfgs", 30, 1e-6, 4096)
    ctx = _Ctx(blocks)
    ref = algo.run(SolverState(np.zeros(6)), ctx)
    it, saved = ctx.checkpoints[2]
    bad = [(b"x" * 16, f, g) for _, f, g in saved.memo]
    again = _Ctx(blocks, iteration=it)
    out = algo.run(SolverState(saved.x, x0=saved.x0, memo=bad), again)
    np.testing.assert_array_equal(out.x, ref.x)
    assert again.passes == ctx.passes
