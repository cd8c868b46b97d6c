"""LogisticRegression's "l1" and "elasticnet" penalties (issue #25): gdask's proximal gradient descent
(FISTA) reaches scikit-learn's saga solution, with the same zero coefficients, with and without a
Client, and refuses the solvers scikit-learn refuses with scikit-learn's messages."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression as SKLogisticRegression

import gdask
import gdask.ml


def _reference(X, y, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn 1.8+: penalty is deprecated (FutureWarning)
        return SKLogisticRegression(solver="saga", tol=1e-10, max_iter=20_000, **kw).fit(X, y)


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("l1_ratio, C", [(1.0, 0.05), (0.5, 0.1)])
def test_l1_penalties_reach_scikit_learns_saga_solution(n_classes, l1_ratio, C):
    # the penalty follows l1_ratio (1: L1, between: elastic net), as scikit-learn 1.8+ reads its default
    X, y = make_classification(1500, 10, n_informative=4, n_classes=n_classes, random_state=0)
    ref = _reference(X, y, l1_ratio=l1_ratio, C=C)
    got = gdask.ml.LogisticRegression(l1_ratio=l1_ratio, C=C, solver="saga", tol=1e-9, max_iter=20_000).fit(X, y)
    assert (ref.coef_ == 0).sum() > 0  # the penalty made some coefficients exactly zero (else this tests little)
    np.testing.assert_array_equal(got.coef_ == 0, ref.coef_ == 0)
    np.testing.assert_allclose(got.coef_, ref.coef_, atol=1e-6)
    np.testing.assert_allclose(got.intercept_, ref.intercept_, atol=1e-6)
    np.testing.assert_array_equal(got.predict(X), ref.predict(X))


def test_l1_on_the_workers_gives_the_local_fits_bits(client):
    X, y = make_classification(4000, 8, n_informative=4, random_state=1)
    G, Y = gdask.from_array(X, block_rows=500).persist(), gdask.from_array(y, block_rows=500).persist()
    kw = dict(l1_ratio=1.0, C=0.1, solver="saga", tol=1e-8, max_iter=5_000)
    on_workers = gdask.ml.LogisticRegression(**kw).fit(G, Y)
    assert on_workers.fit_mode_ == "workers"
    ref = _reference(X, y, l1_ratio=1.0, C=0.1)
    np.testing.assert_allclose(on_workers.coef_, ref.coef_, atol=1e-6)
    again = gdask.ml.LogisticRegression(**kw).fit(G, Y)
    np.testing.assert_array_equal(again.coef_, on_workers.coef_)  # deterministic on the cluster


class _Ctx:
    """A loop context over in-memory blocks (``data`` values are lists of blocks) that records
    checkpoints."""

    def __init__(self, blocks, iteration=0):
        self.data = {"X": [b[0] for b in blocks], "Y": [b[1] for b in blocks], "W": None}
        self.iteration = iteration
        self.checkpoints = []

    def map(self, func, *args, name=None):
        n = len(self.data["X"])
        return [func(*(a[i] if isinstance(a, list) else a for a in args)) for i in range(n)]

    def checkpoint(self, state, **record):
        self.iteration += 1
        self.checkpoints.append((self.iteration, state, record))


@pytest.mark.parametrize("K", [1, 3])
def test_the_proximal_solver_resumed_from_every_checkpoint_gives_the_same_bits(K):
    from gdask.ml._logistic._loop import Layout, LogisticLoop, SolverState

    X, y = make_classification(1200, 5, n_informative=3, n_classes=max(K, 2), random_state=4)
    blocks = [(X[i:i + 400], y[i:i + 400].astype(np.int32)) for i in range(0, 1200, 400)]
    layout = Layout(K, 5, True)

    def loop(max_iter):
        return LogisticLoop(layout, False, None, 1200.0, 0.5, "gd", max_iter, 1e-7, 4096, l1_ratio=0.7)

    ctx = _Ctx(blocks)
    ref = loop(400).run(SolverState(np.zeros(K * 6)), ctx)
    assert ref.status == 0 and (ref.x == 0).any() and ctx.iteration > 10
    assert all(np.isfinite(rec["loss"]) for _, _, rec in ctx.checkpoints)
    for it, saved, _ in ctx.checkpoints[:: max(1, len(ctx.checkpoints) // 8)]:
        again = _Ctx(blocks, iteration=it)
        np.testing.assert_array_equal(loop(400).run(saved, again).x, ref.x)
        assert again.iteration == ctx.iteration


@pytest.mark.parametrize("solver", ["lbfgs", "newton-cg", "newton-cholesky", "sag"])
def test_solvers_without_l1_are_refused_as_scikit_learn_does(solver):
    X, y = make_classification(100, 4, random_state=0)
    with pytest.raises(ValueError, match=f"Solver {solver} supports only 'l2' or None penalties, got l1 penalty"):
        gdask.ml.LogisticRegression(penalty="l1", solver=solver).fit(X, y)
    with pytest.raises(ValueError, match="Only 'saga' solver supports elasticnet penalty"):
        gdask.ml.LogisticRegression(penalty="elasticnet", l1_ratio=0.5, solver=solver).fit(X, y)


def test_elasticnet_needs_an_l1_ratio_in_0_1():
    X, y = make_classification(100, 4, random_state=0)
    with pytest.raises(ValueError, match="l1_ratio must be specified when penalty is elasticnet"):
        gdask.ml.LogisticRegression(penalty="elasticnet", l1_ratio=None, solver="saga").fit(X, y)
    with pytest.raises(ValueError, match="l1_ratio must be a float between 0 and 1"):
        gdask.ml.LogisticRegression(penalty="elasticnet", l1_ratio=1.5, solver="saga").fit(X, y)


def test_the_penalty_follows_l1_ratio_or_is_named():
    X, y = make_classification(600, 6, random_state=3)
    kw = dict(C=0.1, solver="saga", tol=1e-8, max_iter=5_000)
    auto = gdask.ml.LogisticRegression(l1_ratio=1.0, **kw).fit(X, y)
    named = gdask.ml.LogisticRegression(penalty="l1", l1_ratio=1.0, **kw).fit(X, y)
    sklearn_name = gdask.ml.LogisticRegression(penalty="deprecated", l1_ratio=1.0, **kw).fit(X, y)
    np.testing.assert_array_equal(auto.coef_, named.coef_)
    np.testing.assert_array_equal(auto.coef_, sklearn_name.coef_)
    assert (auto.coef_ == 0).any()
    with pytest.warns(UserWarning, match="Inconsistent values: penalty=l2 with l1_ratio=1.0"):
        l2 = gdask.ml.LogisticRegression(penalty="l2", l1_ratio=1.0, C=0.1).fit(X, y)
    assert not (l2.coef_ == 0).any()  # the named penalty wins
