"""The numba CPU kernels against NumPy references: the fused binomial logistic pass (several tiles
and a remainder, features not a multiple of its 4-feature passes), the K-means tile argmin (centers
in pairs and one left over, ties, NaN rows) and the bounds step that gives up before moving anything."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from gdask.ml import kernels
from gdask.ml.kernels import _hamerly_cpu, _kmeans_cpu, _logistic_cpu


def _logistic_reference(X, y, coef, b, s):
    """Loss, gradient and intercept gradient in float64 from the rows' float64 values."""
    z = X.astype(np.float64) @ coef + b
    p = 1.0 / (1.0 + np.exp(-z))
    s = np.ones(len(X)) if s is None else s
    loss = float((s * (np.logaddexp(0.0, z) - y * z)).sum())
    r = s * (p - y)
    return loss, X.astype(np.float64).T @ r, r.sum()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("scale", [1.0, 80.0])  # 80: margins of hundreds, exp(-|z|) underflows to 0
def test_binomial_pass_matches_float64_reference(dtype, weighted, scale):
    rng = np.random.default_rng(3)
    n, d = 5003, 7  # tiles of 2048 / 1024 rows and a remainder; 7 = one 4-feature pass and 3 single ones
    X = np.asfortranarray(rng.standard_normal((n, d)).astype(dtype))
    y = rng.integers(0, 2, n).astype(np.int32)
    coef = scale * rng.standard_normal((1, d)) / np.sqrt(d)
    b = np.array([0.3])
    w = rng.uniform(0.1, 2.0, n) if weighted else None
    loss, gc, gi = _logistic_cpu.loss_grad(X, y, coef, b, w)
    # the reference from the coefficients as the kernel sees them (rounded to the block's dtype)
    ref = _logistic_reference(X, y, coef[0].astype(dtype).astype(np.float64), float(np.asarray(b, dtype)[0]), w)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    assert loss == pytest.approx(ref[0], rel=rtol)
    assert gc.shape == (1, d) and gc.dtype == np.float64 and gi.shape == (1,)
    np.testing.assert_allclose(gc[0], ref[1], rtol=rtol, atol=rtol * np.abs(ref[1]).max())
    assert gi[0] == pytest.approx(ref[2], rel=rtol, abs=rtol * n)


def test_binomial_pass_shows_nan_rows():
    rng = np.random.default_rng(4)
    X = np.asfortranarray(rng.standard_normal((3000, 5)))
    X[2500, 1] = np.nan
    loss, gc, gi = _logistic_cpu.loss_grad(X, rng.integers(0, 2, 3000).astype(np.int32), np.ones((1, 5)),
                                           np.zeros(1))
    assert np.isnan(loss) and np.isnan(gc).all() and np.isnan(gi).all()


@pytest.mark.parametrize("k", [2, 5, 6])  # argmin: centers in pairs after the first, and one left over
def test_tile_argmin_matches_numpy_with_ties_and_nan_rows(k):
    rng = np.random.default_rng(k)
    C = rng.uniform(-4, 4, (k, 6)).astype(np.float32)
    X = (C[rng.integers(0, k, 700)] + rng.standard_normal((700, 6)).astype(np.float32))
    C = np.vstack([C, C[k - 1:k]])  # a duplicate of the last center: ties keep the lower index
    X[[5, 300]] = np.nan
    blk = np.asfortranarray(X)
    labels, dist = _kmeans_cpu.assign(blk, C.astype(np.float64))
    ok = ~np.isnan(X).any(1)
    d2 = ((X[ok, None, :].astype(np.float64) - C[None].astype(np.float64)) ** 2).sum(-1)
    assert (labels[~ok] == 0).all()  # a NaN row goes to the first center (scikit-learn, the CUDA kernels)
    np.testing.assert_array_equal(labels[ok], d2.argmin(1))
    assert (labels != k).all()  # the duplicate never wins
    np.testing.assert_allclose(dist[ok], d2.min(1), rtol=1e-5)
    part = _kmeans_cpu.lloyd_partial(blk, C.astype(np.float64))
    np.testing.assert_array_equal(part["counts"], np.bincount(labels, minlength=k + 1))
    st = _hamerly_cpu.first_pass(blk, C.astype(np.float64))
    np.testing.assert_array_equal(st.labels, labels)
    np.testing.assert_array_equal(st.counts, part["counts"])
    np.testing.assert_array_equal(st.sums, part["sums"])
    d2[np.arange(ok.sum()), labels[ok]] = np.inf  # the lower bound is below the second nearest distance
    assert (st.lower[ok] <= np.sqrt(d2.min(1)) + 1e-4).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nearest_update_is_assign_then_the_strictly_nearer(dtype):
    """k-means||'s in-place update: the bits of assign on each new group then taking the strictly
    nearer candidate, with rows far from the origin (the skipped rows' screen widens with |x|^2),
    rows on a candidate (distance 0), duplicated candidates (ties keep the lower index) and groups
    that leave most rows where they were."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((3000, 7)).astype(dtype)
    X[:500] += dtype(300.0)
    blk = np.asfortranarray(X)
    groups = [X[[10]], X[rng.choice(3000, 9)], np.vstack([X[[42, 42]], X[rng.choice(3000, 6)]]),
              X[rng.choice(3000, 3)] + dtype(0.5), X[rng.choice(3000, 12)]]
    groups[4][3] = groups[1][2]  # a later duplicate of an earlier candidate never wins
    cands = np.concatenate(groups)
    mind = label = ref_mind = ref_label = None
    seen = 0
    for g in groups:
        n_label, n_mind = _kmeans_cpu.assign(blk, g.astype(np.float64))
        if ref_mind is None:
            ref_mind, ref_label = n_mind, n_label
        else:
            nearer = n_mind < ref_mind
            ref_mind, ref_label = np.where(nearer, n_mind, ref_mind), np.where(nearer, n_label + seen, ref_label)
        mind, label = kernels.nearest_update(blk, cands[:seen + len(g)].astype(np.float64), seen, mind, label)
        seen += len(g)
        np.testing.assert_array_equal(mind, ref_mind)
        np.testing.assert_array_equal(label, ref_label)
    assert mind[42] == 0.0 and label[42] == 10  # the first of the two copies of row 42
    assert not (label == 1 + 9 + 8 + 3 + 3).any() and (label == 3).any()
    d2 = ((X[:, None, :].astype(np.float64) - cands[None].astype(np.float64)) ** 2).sum(-1)
    np.testing.assert_allclose(mind, d2.min(1), rtol=1e-5, atol=1e-3)


def test_step_that_gives_up_leaves_the_state_untouched():
    rng = np.random.default_rng(7)
    C = rng.uniform(-5, 5, (8, 4))
    blk = np.asfortranarray((C[rng.integers(0, 8, 4000)] + rng.standard_normal((4000, 4))).astype(np.float32))
    st = _hamerly_cpu.first_pass(blk, C)
    before = copy.deepcopy(st)
    assert _hamerly_cpu.step(blk, C[::-1].copy(), st, None, limit=400) == -1  # every row fails its bounds
    for name in ("labels", "upper", "lower", "sums", "counts"):
        np.testing.assert_array_equal(getattr(st, name), getattr(before, name))
    moved = C + rng.normal(0, 1e-3, C.shape)  # a small move: the step goes through
    assert _hamerly_cpu.step(blk, moved, st, None, limit=400) >= 0


def test_same_bits_wherever_the_heap_puts_the_kernels_arrays():
    """The sums of a kernel do not depend on where its scratch arrays land: a loop that both stores and
    sums is vectorised only when LLVM's run-time overlap check passes (its order of summation, the
    bits, then depends on addresses); the kernels sum in loops that only read."""
    rng = np.random.default_rng(8)
    X = np.asfortranarray(rng.standard_normal((5000, 6)))
    y = (X @ rng.standard_normal(6) > 0).astype(np.int32)
    coef, b = rng.standard_normal((1, 6)), np.array([0.2])
    C = rng.standard_normal((5, 6))
    ref = _logistic_cpu.loss_grad(X, y, coef, b), _kmeans_cpu.lloyd_partial(X, C)
    keep = []
    for size in rng.integers(1, 5000, 60):  # move the heap between calls
        keep.append(np.empty(int(size)))
        loss, gc, gi = _logistic_cpu.loss_grad(X, y, coef, b)
        assert loss == ref[0][0] and np.array_equal(gc, ref[0][1]) and np.array_equal(gi, ref[0][2])
        part = _kmeans_cpu.lloyd_partial(X, C)
        assert part["inertia"] == ref[1]["inertia"] and np.array_equal(part["sums"], ref[1]["sums"])
