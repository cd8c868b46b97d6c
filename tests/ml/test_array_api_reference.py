"""The array API reference of the block kernels (what strict blocks run, and what CuPy blocks run where
the CUDA kernels cannot) against the numba CPU kernels of the same contract, on random blocks: both
float dtypes, weights, empty clusters. The reference runs on ``array_api_strict`` arrays on a non-CPU
device, so a host array reaching it unconverted would raise."""

from __future__ import annotations

import numpy as np
import pytest

from gdask.devices import to_numpy
from gdask.ml import kernels
from gdask.ml import kernels as lk
from gdask.ml.kernels import _hamerly_cpu, _hamerly_xp

xps = pytest.importorskip("array_api_strict")
DEV = xps.Device("device1")


def strict(x):
    """A strict device array of host data (the explicit host -> device move)."""
    return xps.asarray(np.asarray(x), device=DEV)


def _blobs(n, d, k, dtype, seed):
    rng = np.random.default_rng(seed)
    true = rng.uniform(-8, 8, (k, d))
    X = true[rng.integers(0, k, n)] + rng.standard_normal((n, d))
    C = true + 0.3 * rng.standard_normal((k, d))
    # a center far from every row: its cluster is empty
    C[-1] = 500.0
    return np.asfortranarray(X.astype(dtype)), C.astype(dtype)


def _clear(X, C):
    d2 = np.sort(((X[:, None, :].astype(np.float64) - C[None].astype(np.float64)) ** 2).sum(-1), axis=1)
    return d2[:, 1] - d2[:, 0] > 1e-3 * (1 + d2[:, 0])


def _tol(dtype):
    return {"rtol": 2e-5, "atol": 1e-3} if np.dtype(dtype) == np.float32 else {"rtol": 1e-10, "atol": 1e-8}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_lloyd_and_assign_reference_match_numba(dtype, weighted):
    X, C = _blobs(1500, 6, 5, dtype, seed=1)
    X = np.asfortranarray(X[_clear(X, C)])  # no near ties: both must pick the same centers
    w = np.random.default_rng(2).uniform(0.1, 3.0, len(X)) if weighted else None
    ref = kernels.lloyd_partial(X, C, w)
    got = kernels.host(kernels.lloyd_partial(strict(X), strict(C), None if w is None else strict(w)))
    tol = _tol(dtype)
    np.testing.assert_allclose(got["sums"], ref["sums"], **tol)
    np.testing.assert_allclose(got["counts"], ref["counts"], rtol=1e-12)
    assert got["counts"][-1] == ref["counts"][-1] == 0  # the empty cluster
    assert float(got["inertia"]) == pytest.approx(ref["inertia"], rel=tol["rtol"])
    o = np.argsort(-ref["far_d"], kind="stable")
    np.testing.assert_allclose(got["far_d"], ref["far_d"][o], **tol)
    np.testing.assert_array_equal(got["far_label"], ref["far_label"][o])
    np.testing.assert_array_equal(got["far_rows"], ref["far_rows"][o])
    np.testing.assert_allclose(got["far_w"], ref["far_w"][o])
    labels, mind = kernels.assign(strict(X), strict(C))
    rl, rm = kernels.assign(X, C)
    np.testing.assert_array_equal(to_numpy(labels), rl)
    np.testing.assert_allclose(to_numpy(mind), rm, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_bounds_reference_matches_numba(dtype, weighted):
    """First pass, then steps whose centers move (rows change cluster): the same labels, changes and
    sums, and bounds that hold."""
    X, C = _blobs(1200, 4, 4, dtype, seed=3)
    X = np.asfortranarray(X + np.random.default_rng(4).normal(0, 2.0, X.shape).astype(dtype))  # overlapping
    w = np.random.default_rng(5).uniform(0.1, 3.0, len(X)) if weighted else None
    path = [C.astype(np.float64)]
    for s in range(4):
        nxt = path[-1] + np.random.default_rng(10 + s).normal(0, 0.4, path[-1].shape)
        nxt[-1] = 500.0 - 100 * s  # the far center comes closer: its cluster fills at some point
        path.append(nxt)
    keep = np.logical_and.reduce([_clear(X, c) for c in path])  # no near ties: the same labels
    X = np.asfortranarray(X[keep])
    w = None if w is None else w[keep]
    blk = strict(X)
    ws = None if w is None else strict(w)
    ref = _hamerly_cpu.first_pass(X, path[0], w)
    got = _hamerly_xp.first_pass(blk, path[0], ws)
    np.testing.assert_array_equal(to_numpy(got.labels), ref.labels)
    np.testing.assert_allclose(to_numpy(got.sums), ref.sums, **_tol(dtype))
    np.testing.assert_allclose(to_numpy(got.counts), ref.counts, rtol=1e-12)
    assert got.sxx == pytest.approx(ref.sxx, rel=1e-6)
    total = 0
    for old, new in zip(path, path[1:]):
        assert np.array_equal(ref.centers, old)
        changed = _hamerly_cpu.step(X, new, ref, w, len(X))
        ref.centers = new
        assert _hamerly_xp.step(blk, new, got, ws) == changed
        total += changed
        got.centers = strict(new)
        np.testing.assert_array_equal(to_numpy(got.labels), ref.labels)
        np.testing.assert_allclose(to_numpy(got.sums), ref.sums, rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(to_numpy(got.counts), ref.counts, rtol=1e-12, atol=1e-9)
    assert total > 0  # rows changed cluster (and moved between the sums)
    exact = np.sqrt(((X[:, None, :].astype(np.float64) - path[-1][None]) ** 2).sum(-1))
    lab = to_numpy(got.labels)
    own = exact[np.arange(len(X)), lab]
    assert (to_numpy(got.upper) >= own - 1e-9).all()  # the bounds hold
    exact[np.arange(len(X)), lab] = np.inf
    assert (to_numpy(got.lower) <= exact.min(1) + 1e-9).all()


def test_expand_scatters_to_the_positions_of_a_mask():
    old = strict(np.arange(6.0))
    mask = strict(np.array([False, True, False, True, True, False]))
    out = _hamerly_xp.expand(mask, strict(np.array([10.0, 11.0, 12.0])), old)
    np.testing.assert_array_equal(to_numpy(out), [0, 10, 2, 11, 12, 5])


def test_cluster_sums_adds_repeated_labels():
    """The one-hot scatter-add adds every row (array_api_extra.at(x)[i].add(v) would add once per label)."""
    labels = strict(np.array([0, 2, 2, 2, 0]))
    rows = strict(np.arange(10.0).reshape(5, 2))
    sums, counts = kernels.cluster_sums(labels, rows, strict(np.array([1.0, 1.0, 2.0, 1.0, 0.5])), 3)
    np.testing.assert_array_equal(to_numpy(sums), [[0 + 4, 1 + 4.5], [0, 0], [2 + 8 + 6, 3 + 10 + 7]])
    np.testing.assert_array_equal(to_numpy(counts), [1.5, 0, 4])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("weights", ["none", "sample+class"])
def test_logistic_reference_matches_numpy(dtype, k, weights):
    rng = np.random.default_rng(20 + k)
    X = np.asfortranarray(rng.standard_normal((400, 5)).astype(dtype))
    y = rng.integers(0, max(k, 2), len(X)).astype(np.int32)
    coef, b = rng.standard_normal((k, 5)), rng.standard_normal(k)
    w = rng.uniform(0.1, 2, len(X)) if weights != "none" else None
    cw = rng.uniform(0.5, 2, max(k, 2)) if weights != "none" else None
    ref = lk.loss_grad(X, y, coef, b, w, cw)
    got = lk.loss_grad(strict(X), strict(y), strict(coef), strict(b), None if w is None else strict(w),
                       None if cw is None else strict(cw))
    rtol = 1e-5 if dtype == np.float32 else 1e-11
    assert isinstance(got[0], float) and got[1].dtype == np.float64 and isinstance(got[1], np.ndarray)
    assert got[0] == pytest.approx(ref[0], rel=rtol)
    np.testing.assert_allclose(got[1], ref[1], rtol=rtol, atol=rtol * (1 + np.abs(ref[1]).max()))
    np.testing.assert_allclose(got[2], ref[2], rtol=rtol, atol=rtol * (1 + np.abs(ref[2]).max()))
    np.testing.assert_allclose(lk.gram(strict(X), None if w is None else strict(w), None if cw is None else strict(cw),
                                       strict(y)), lk.gram(X, w, cw, y), rtol=rtol)
    assert lk.sq_norms(strict(X)) == pytest.approx(lk.sq_norms(X), rel=rtol)
    np.testing.assert_allclose(to_numpy(lk.decision(strict(X), strict(coef), strict(b))), lk.decision(X, coef, b),
                               rtol=rtol, atol=rtol)


def test_label_helpers_on_device_blocks():
    y = np.array([3.0, 1.0, 3.0, 7.0])
    vals, counts, nan = lk.label_counts(strict(y), strict(np.array([1.0, 2.0, 0.5, 1.0])))
    np.testing.assert_array_equal(vals, [1.0, 3.0, 7.0])
    np.testing.assert_array_equal(counts, [2.0, 1.5, 1.0])
    assert nan == 0
    assert lk.label_counts(strict(np.array([1.0, np.nan])))[2] == 1
    np.testing.assert_array_equal(to_numpy(lk.encode_labels(strict(y), strict(np.array([1.0, 3.0, 7.0])))),
                                  [1, 0, 1, 2])


def test_host_operands_are_refused_by_strict_blocks():
    """What the strict backend is for: a host array meeting a device block raises (as with CuPy)."""
    X, C = _blobs(50, 3, 2, np.float64, seed=7)
    with pytest.raises((TypeError, ValueError)):
        kernels.lloyd_partial(strict(X), C)  # centers left on the host
