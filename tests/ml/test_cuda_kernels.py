"""numba.cuda kernels (gdask.ml.kernels._*_cuda) against the CPU kernels they stand in for.

Every test is marked ``cudasim``: they run in numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, as
CI runs the suite), on small blocks and small thread blocks, or on a GPU with CuPy arrays. Without
either the module is skipped.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
from numba.core import config

from gdask.devices import context
from gdask.ml import kernels
from gdask.ml import kernels as lk
from gdask.ml.kernels import _dispatch, _hamerly_cpu, _hamerly_xp


def _mode() -> str | None:
    if config.ENABLE_CUDASIM:
        return "sim"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:  # noqa: BLE001 - no CuPy or no usable driver/GPU: nothing to run on
        return None
    return "gpu"


MODE = _mode()
pytestmark = [pytest.mark.cudasim,
              pytest.mark.skipif(MODE is None, reason="needs NUMBA_ENABLE_CUDASIM=1 or a CUDA GPU with CuPy")]

if MODE is not None:
    from gdask.ml.kernels import _cuda_common as cuc
    from gdask.ml.kernels import _hamerly_cuda as hmc
    from gdask.ml.kernels import _kmeans_cuda as kmc
    from gdask.ml.kernels import _logistic_cuda as lgc


@pytest.fixture(autouse=True, scope="module")
def _quick_thread_switches():
    """The simulator runs each GPU thread as a Python thread and polls them at every
    ``syncthreads``: switching between them often makes the kernels' barriers cheap."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(2e-4)
    yield
    sys.setswitchinterval(old)


def dev(x):
    """A device array: NumPy in the simulator, CuPy on a GPU (2-D blocks feature-major)."""
    x = np.asarray(x)
    if x.ndim == 2:
        x = np.asfortranarray(x)
    if MODE == "gpu":
        import cupy

        return cupy.asfortranarray(x) if x.ndim == 2 else cupy.asarray(x)
    return x


def dev_c(x):
    """A C-contiguous device array (a state's per-cluster sums are updated through a flat view)."""
    x = np.ascontiguousarray(x)
    if MODE == "gpu":
        import cupy

        return cupy.asarray(x)
    return x


def host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _blobs(n=300, d=5, k=4, dtype=np.float32, seed=0, spread=1.0):
    """Rows around k centers, and centers near those (a first iteration of a fit)."""
    rng = np.random.default_rng(seed)
    true = rng.uniform(-6, 6, (k, d))
    X = true[rng.integers(0, k, n)] + spread * rng.standard_normal((n, d))
    init = true + 0.7 * rng.standard_normal((k, d))
    return np.asfortranarray(X.astype(dtype)), init


def _sqdist(X, C):
    X = np.asarray(X, np.float64)
    return ((X[:, None, :] - np.asarray(C, np.float64)[None, :, :]) ** 2).sum(-1)


def _assert_clear(X, C):
    """No row is within rounding of a tie between its two nearest centers, and the farthest rows
    are distinct: the CPU and GPU kernels must then agree exactly on labels and farthest rows."""
    d2 = np.sort(_sqdist(X, C), axis=1)
    assert (d2[:, 1] - d2[:, 0] > 1e-3 * (1 + d2[:, 0])).all(), "test data has near ties: pick another seed"
    far = np.sort(d2[:, 0])[::-1]
    q = min(kernels.N_FARTHEST, len(far))
    if len(far) > q:
        assert far[q - 1] - far[q] > 1e-4 * far[q], "test data has a near tie among the farthest rows"


def _tol(dtype):
    return {"rtol": 1e-4, "atol": 1e-3} if np.dtype(dtype) == np.float32 else {"rtol": 1e-10, "atol": 1e-9}


def _by_distance(p):
    o = np.argsort(-np.asarray(p["far_d"]), kind="stable")
    return {key: np.asarray(p[key])[o] for key in ("far_d", "far_label", "far_rows", "far_w")}


def _assert_lloyd_equal(g, c, dtype):
    tol = _tol(dtype)
    assert g["sums"].shape == c["sums"].shape and g["sums"].dtype == np.float64
    np.testing.assert_allclose(g["sums"], c["sums"], **tol)
    np.testing.assert_allclose(g["counts"], c["counts"], rtol=1e-12)
    assert isinstance(g["inertia"], float)
    assert g["inertia"] == pytest.approx(c["inertia"], rel=tol["rtol"])
    gf, cf = _by_distance(g), _by_distance(c)
    np.testing.assert_allclose(gf["far_d"], cf["far_d"], **tol)
    np.testing.assert_array_equal(gf["far_label"], cf["far_label"])
    np.testing.assert_array_equal(gf["far_rows"], cf["far_rows"])  # the same rows, bit for bit
    np.testing.assert_allclose(gf["far_w"], cf["far_w"], rtol=1e-15)
    assert gf["far_rows"].dtype == cf["far_rows"].dtype


# -- K-means pass ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_lloyd_partial_matches_cpu(dtype, weighted):
    X, C = _blobs(dtype=dtype, seed=1)
    _assert_clear(X, C.astype(dtype))
    w = np.random.default_rng(2).uniform(0.1, 3.0, len(X)) if weighted else None
    g = kmc.lloyd_partial(dev(X), C, None if w is None else dev(w))
    c = kernels.lloyd_partial(X, C, w)
    _assert_lloyd_equal(g, c, dtype)
    assert len(g["far_d"]) == kernels.N_FARTHEST


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_assign_matches_cpu(dtype):
    X, C = _blobs(n=257, d=3, k=5, dtype=dtype, seed=3)
    _assert_clear(X, C.astype(dtype))
    labels, mind = kmc.assign(dev(X), C)
    assert type(labels) is type(dev(X)) and labels.dtype == np.int32 and mind.dtype == np.float64
    cl, cm = kernels.assign(X, C)
    np.testing.assert_array_equal(host(labels), cl)
    np.testing.assert_allclose(host(mind), cm, **_tol(dtype))
    np.testing.assert_allclose(host(mind), _sqdist(X, C.astype(dtype)).min(1), rtol=1e-12, atol=1e-12)


def test_empty_clusters_and_ties():
    """Integer data: exact ties go to the lower center index (as on the CPU); a center far away and
    a duplicate center get no rows."""
    rng = np.random.default_rng(4)
    X = rng.integers(-3, 4, (150, 2)).astype(np.float32)
    C = np.array([[0.0, 0.0], [2.0, 0.0], [2.0, 0.0], [100.0, 100.0]])  # rows at x = 1 tie 0 and 1
    X[:10] = [1.0, 0.0]
    # more rows at the largest distance than are kept, spread so that, in the simulator's grid (4
    # blocks of 32 threads), one thread block meets later rows on lower threads, and one thread
    # holds two of them (rows 12 and 140)
    X[10:20:2] = X[128:138:2] = [-3.0, -3.0]
    X[11:20:2] = X[129:138:2] = [-3.0, 3.0]
    X[140] = [-3.0, -3.0]
    labels, mind = kmc.assign(dev(X), C)
    cl, cm = kernels.assign(X, C)
    np.testing.assert_array_equal(host(labels), cl)
    assert (host(labels)[:10] == 0).all()
    np.testing.assert_array_equal(host(mind), cm)
    g = kmc.lloyd_partial(dev(X), C)
    c = kernels.lloyd_partial(X, C)
    np.testing.assert_array_equal(g["counts"], c["counts"])
    assert g["counts"][2] == 0 and g["counts"][3] == 0
    np.testing.assert_array_equal(g["sums"], c["sums"])
    assert g["inertia"] == c["inertia"]
    # many rows are equally far: the same distances, and each row is one of the block's with that
    # distance to its (nearest) center
    np.testing.assert_array_equal(np.sort(g["far_d"]), np.sort(c["far_d"]))
    d2 = _sqdist(g["far_rows"], C)
    np.testing.assert_array_equal(d2[np.arange(len(d2)), g["far_label"]], g["far_d"])
    np.testing.assert_array_equal(d2.argmin(1), g["far_label"])
    assert all((X == row).all(1).any() for row in g["far_rows"])
    # among rows equally far, the lower row index wins (in each thread block and across them)
    own = _sqdist(X, C)[np.arange(len(X)), cl]
    expect = np.lexsort((np.arange(len(X)), -own))[:kernels.N_FARTHEST]
    np.testing.assert_array_equal(_by_distance(g)["far_rows"], X[expect])


@pytest.mark.parametrize("n", [1, 5])
def test_block_smaller_than_farthest_rows(n):
    X, C = _blobs(n=n, d=4, k=3, dtype=np.float64, seed=5)
    w = np.linspace(0.5, 2.0, n)
    g = kmc.lloyd_partial(dev(X), C, dev(w))
    c = kernels.lloyd_partial(X, C, w)
    assert len(g["far_d"]) == n
    _assert_lloyd_equal(g, c, np.float64)


@pytest.mark.parametrize("threads,blocks", [(16, 1), (64, 3), (32, 8)])
def test_thread_block_and_grid_shapes(threads, blocks, monkeypatch):
    """n not a multiple of the thread block; one block striding over all rows; more blocks than rows
    need (the grid shrinks)."""
    monkeypatch.setattr(cuc, "SIM_THREADS", threads)
    monkeypatch.setattr(cuc, "THREADS", threads)
    monkeypatch.setattr(cuc, "SIM_MAX_BLOCKS", blocks)
    X, C = _blobs(n=77, d=3, k=3, dtype=np.float32, seed=6)
    _assert_clear(X, C.astype(np.float32))
    _assert_lloyd_equal(kmc.lloyd_partial(dev(X), C), kernels.lloyd_partial(X, C), np.float32)


@pytest.mark.parametrize("budget", ["sums-only", "nothing"])
def test_without_shared_memory_for_sums_or_centers(budget, monkeypatch):
    """Centers read from global memory, sums kept in the thread block's row of the partials in global
    memory: the same answers."""
    tpb, k, d = cuc.threads(), 4, 5
    base = 8 * kmc._base_words(tpb, k)
    monkeypatch.setattr(cuc, "SHARED_BUDGET", base + (8 * k * d if budget == "sums-only" else 0))
    sh_sums, sh_c, _ = kmc._layout(k, d, tpb, 4)
    assert (sh_sums, sh_c) == ((True, False) if budget == "sums-only" else (False, False))
    X, C = _blobs(n=120, d=d, k=k, dtype=np.float32, seed=7)
    _assert_clear(X, C.astype(np.float32))
    w = np.random.default_rng(8).uniform(0.5, 2.0, len(X))
    _assert_lloyd_equal(kmc.lloyd_partial(dev(X), C, dev(w)), kernels.lloyd_partial(X, C, w), np.float32)


def test_bad_inputs_are_named():
    X, C = _blobs(n=10, d=3, k=2, seed=9)
    with pytest.raises(cuc.CudaKernelError, match="float32 or float64"):
        kmc.lloyd_partial(dev(X.astype(np.int32)), C)
    with pytest.raises(cuc.CudaKernelError, match=r"centers must be a \(k, 3\)"):
        kmc.assign(dev(X), C[:, :2])
    with pytest.raises(cuc.CudaKernelError, match="one entry per row"):
        kmc.lloyd_partial(dev(X), C, dev(np.ones(3)))
    with pytest.raises(cuc.CudaKernelError, match="integer class codes"):
        lgc.loss_grad(dev(X), dev(np.zeros(10)), np.zeros((1, 3)), np.zeros(1))
    if MODE == "sim":
        with pytest.raises(cuc.CudaKernelError, match="NumPy arrays"):
            kmc.assign(X.tolist(), C)


# -- Hamerly bounds ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_first_pass_matches_cpu(dtype, weighted):
    X, C = _blobs(n=200, d=4, k=4, dtype=dtype, seed=10)
    _assert_clear(X, C.astype(dtype))
    w = np.random.default_rng(11).uniform(0.1, 3.0, len(X)) if weighted else None
    blk = dev(X)
    st = hmc.first_pass(blk, C, None if w is None else dev(w))
    ref = _hamerly_cpu.first_pass(X, C, w)
    assert st.ref() is blk and type(st.labels) is type(blk) and st.labels.dtype == np.int32
    np.testing.assert_array_equal(host(st.labels), ref.labels)
    np.testing.assert_allclose(host(st.sums), ref.sums, **_tol(dtype))
    np.testing.assert_allclose(host(st.counts), ref.counts, rtol=1e-12)
    assert st.sxx == pytest.approx(ref.sxx, rel=1e-12)
    np.testing.assert_allclose(np.sort(st.far[0]), np.sort(ref.far[0]), **_tol(dtype))
    np.testing.assert_array_equal(np.sort(st.far[1]), np.sort(ref.far[1]))
    # the bounds hold for the float64 centers, and are tight
    d2 = _sqdist(X, C)
    own = np.sqrt(d2[np.arange(len(X)), ref.labels])
    d2[np.arange(len(X)), ref.labels] = np.inf
    other = np.sqrt(d2.min(1))
    np.testing.assert_allclose(host(st.upper), own, rtol=1e-12)
    assert (host(st.lower) <= other).all()
    assert (host(st.lower) >= other * (1 - 1e-3)).all()


def _centers_path(X, C, steps, w=None):
    """Centers of a few Lloyd iterations from ``C`` (they move, and rows change cluster), with the
    last center pushed far away at the second step (its cluster empties)."""
    out = [np.asarray(C, np.float64)]
    for s in range(steps):
        labels = _sqdist(X, out[-1]).argmin(1)
        ww = np.ones(len(X)) if w is None else w
        new = out[-1].copy()
        for c in range(len(new)):
            m = labels == c
            if m.any():
                new[c] = (X[m] * ww[m, None]).sum(0) / ww[m].sum()
        if s == 1:
            new[-1] = 50.0
        out.append(new)
    return out


def _copy(st):
    return kernels.BlockBounds(st.ref, st.centers.copy(), st.labels.copy(), st.upper.copy(), st.lower.copy(),
                               st.sums.copy(), st.counts.copy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_bounds_step_matches_cpu(dtype, weighted):
    """From the same state, the GPU step and the CPU step give the same labels, sums, counts and
    changed rows, step after step, and each keeps bounds that hold (the CPU step recomputes the rows
    that fail their bounds with the full pass's tiled distances, the GPU step exactly: their bounds
    differ within what each proves); at the end the labels are the nearest centers."""
    X, C = _blobs(n=240, d=3, k=5, dtype=dtype, seed=12, spread=2.5)  # overlapping: rows change
    w = np.random.default_rng(13).uniform(0.1, 3.0, len(X)) if weighted else None
    path = _centers_path(X, C, 4, w)
    cpu = _hamerly_cpu.first_pass(X, path[0], w)
    gpu = _copy(cpu)
    blk = dev(X)
    gpu.labels, gpu.upper, gpu.lower = dev(gpu.labels), dev(gpu.upper), dev(gpu.lower)
    gpu.sums, gpu.counts = dev_c(gpu.sums), dev(gpu.counts)
    total_changed = 0
    for old, new in itertools.pairwise(path):
        assert np.array_equal(cpu.centers, old)
        changed = _hamerly_cpu.step(X, new, cpu, w, len(X))
        cpu.centers = new
        g_changed, g_looked = hmc.sweep(blk, new, old, gpu.labels, gpu.upper, gpu.lower, gpu.sums,
                                        gpu.counts, None if w is None else dev(w))
        assert g_changed == changed and g_looked >= g_changed
        np.testing.assert_array_equal(host(gpu.labels), cpu.labels)
        exact = np.sqrt(_sqdist(X, new))
        for upper, lower in (_hamerly_cpu.bounds(cpu), (host(gpu.upper), host(gpu.lower))):
            own = exact[np.arange(len(X)), cpu.labels]
            assert (upper >= own - 1e-9).all()  # the bounds hold
            others = exact.copy()
            others[np.arange(len(X)), cpu.labels] = np.inf
            assert (lower <= others.min(1) + 1e-9).all()
        np.testing.assert_allclose(host(gpu.sums), cpu.sums, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(host(gpu.counts), cpu.counts, rtol=1e-12, atol=1e-12)
        total_changed += changed
    assert total_changed > 0
    assert host(gpu.counts)[-1] == pytest.approx(0, abs=1e-9)  # the far center's cluster emptied (to rounding)
    d2 = _sqdist(X, path[-1])
    srt = np.sort(d2, 1)
    clear = srt[:, 1] - srt[:, 0] > 1e-9 * (1 + srt[:, 0])
    np.testing.assert_array_equal(host(gpu.labels)[clear], d2.argmin(1)[clear])
    ww = np.ones(len(X)) if w is None else w
    exact = np.array([(X[host(gpu.labels) == c] * ww[host(gpu.labels) == c, None]).sum(0) for c in range(len(C))])
    np.testing.assert_allclose(host(gpu.sums), exact, rtol=1e-9, atol=1e-9)


def test_bounds_step_on_a_block_state():
    """bounds_step_cuda on a state from first_pass_cuda: as _step_xp on a copy (labels, sums,
    counts, changed), and bounds_partial's sums from it."""
    X, C = _blobs(n=150, d=3, k=3, dtype=np.float32, seed=14, spread=2.0)
    path = _centers_path(X, C, 2)
    blk = dev(X)
    st = hmc.first_pass(blk, path[0])
    ref = _hamerly_cpu.first_pass(X, path[0], None)
    changed = hmc.step(blk, path[1], st)
    ref_changed = _hamerly_xp.step(X, path[1], ref, None)
    assert changed == ref_changed > 0
    np.testing.assert_array_equal(host(st.labels), ref.labels)
    np.testing.assert_allclose(host(st.sums), ref.sums, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(host(st.counts), ref.counts)


# -- logistic loss and gradient ----------------------------------------------------------------------
def _logistic_data(n, d, k, dtype, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    X = np.asfortranarray(rng.standard_normal((n, d)).astype(dtype))
    y = rng.integers(0, max(k, 2), n).astype(np.int32)
    coef = scale * rng.standard_normal((k, d))
    b = rng.standard_normal(k)
    return X, y, coef, b


def _assert_loss_grad_equal(g, c, dtype):
    rtol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-11
    assert isinstance(g[0], float) and g[1].dtype == np.float64 and g[2].dtype == np.float64
    assert g[1].shape == c[1].shape and g[2].shape == c[2].shape
    assert g[0] == pytest.approx(c[0], rel=rtol)
    scale = np.abs(c[1]).max() + 1
    np.testing.assert_allclose(g[1], c[1], rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(g[2], c[2], rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weights", ["none", "sample", "sample+class"])
def test_loss_grad_binomial_matches_cpu(dtype, weights):
    X, y, coef, b = _logistic_data(203, 6, 1, dtype, seed=20)
    w = np.random.default_rng(21).uniform(0.1, 2.0, len(X)) if weights != "none" else None
    cw = np.array([0.7, 1.9]) if weights == "sample+class" else None
    g = lgc.loss_grad(dev(X), dev(y), coef, b, None if w is None else dev(w), cw)
    _assert_loss_grad_equal(g, lk.loss_grad(X, y, coef, b, w, cw), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_loss_grad_multinomial_matches_cpu(dtype, weighted):
    X, y, coef, b = _logistic_data(150, 4, 3, dtype, seed=22)
    w = np.random.default_rng(23).uniform(0.1, 2.0, len(X)) if weighted else None
    cw = np.array([1.0, 0.5, 2.0]) if weighted else None
    g = lgc.loss_grad(dev(X), dev(y), coef, b, None if w is None else dev(w), cw)
    _assert_loss_grad_equal(g, lk.loss_grad(X, y, coef, b, w, cw), dtype)


@pytest.mark.parametrize("k", [1, 3])
def test_loss_grad_large_margins_and_global_fallback(k, monkeypatch):
    """Raw predictions of +-hundreds stay finite (no overflow in exp), and with no shared memory
    for the coefficients or the gradient slots the answer is the same."""
    X, y, coef, b = _logistic_data(90, 5, k, np.float64, seed=24, scale=80.0)
    c = lk.loss_grad(X, y, coef, b)
    g = lgc.loss_grad(dev(X), dev(y), coef, b)
    assert np.isfinite(g[0]) and g[0] > 1e3
    _assert_loss_grad_equal(g, c, np.float64)
    tpb = cuc.threads()
    monkeypatch.setattr(cuc, "SHARED_BUDGET", 8 * tpb * (k + 1))
    _assert_loss_grad_equal(lgc.loss_grad(dev(X), dev(y), coef, b), c, np.float64)


# -- dispatch ----------------------------------------------------------------------------------------
def test_block_functions_hand_cupy_blocks_to_the_kernels(monkeypatch):
    """gdask's block functions run these kernels on CuPy blocks: K-means pass and labels, the bounds'
    first pass and step, the logistic loss and gradient. In the simulator NumPy blocks pose as CuPy
    blocks (the kernels take NumPy there); the answers are the CPU kernels'."""
    if MODE != "sim":
        pytest.skip("on a GPU the gpu-marked tests run real CuPy blocks through the block functions")
    X, C = _blobs(n=180, d=4, k=4, dtype=np.float32, seed=50)
    _assert_clear(X, C.astype(np.float32))
    w = np.random.default_rng(51).uniform(0.1, 2.0, len(X))
    Xl, y, coef, b = _logistic_data(150, 4, 1, np.float64, seed=52)
    cpu = {"lloyd": kernels.lloyd_partial(X, C, w), "assign": kernels.assign(X, C),
           "loss": lk.loss_grad(Xl, y, coef, b, w[:150])}
    path = _centers_path(X, C, 2)
    cpu_b = [kernels.bounds_partial(X, path[0], "cpu", history=[]), kernels.bounds_partial(X, path[1], "cpu")]
    calls = []
    for mod, name in ((kmc, "lloyd_partial"), (kmc, "assign"), (hmc, "first_pass"), (hmc, "step"), (lgc, "loss_grad")):
        real = getattr(mod, name)
        label = f"{mod.__name__.rsplit('.', 1)[1]}.{name}"
        monkeypatch.setattr(mod, name, lambda *a, _real=real, _name=label, **k: calls.append(_name) or _real(*a, **k))
    monkeypatch.setattr(cuc, "usable", lambda: True)
    monkeypatch.setattr(_dispatch, "block_kind", lambda x: "cupy")
    _assert_lloyd_equal(kernels.lloyd_partial(X, C, w), cpu["lloyd"], np.float32)
    labels, mind = kernels.assign(X, C)
    np.testing.assert_array_equal(host(labels), cpu["assign"][0])
    _assert_loss_grad_equal(lk.loss_grad(Xl, y, coef, b, w[:150]), cpu["loss"], np.float64)
    gpu_b = [kernels.bounds_partial(X, path[0], "gpu", history=[]), kernels.bounds_partial(X, path[1], "gpu")]
    for g, c in zip(gpu_b, cpu_b):
        np.testing.assert_allclose(g["sums"], c["sums"], rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(g["counts"], c["counts"])
        assert g["changed"] == c["changed"]
    assert sorted(set(calls)) == ["_hamerly_cuda.first_pass", "_hamerly_cuda.step", "_kmeans_cuda.assign",
                                  "_kmeans_cuda.lloyd_partial", "_logistic_cuda.loss_grad"]
    monkeypatch.setattr(cuc, "usable", lambda: False)  # no usable numba.cuda: the array API code instead
    calls.clear()
    _assert_lloyd_equal(kernels.host(kernels.lloyd_partial(X, C, w)), cpu["lloyd"], np.float32)
    assert not calls
    for token in ("cpu", "gpu"):  # this process's state: leave none behind for the next tests
        context().state.drop(token)


# -- determinism -------------------------------------------------------------------------------------
def _bits(x):
    return np.ascontiguousarray(host(x)).view(np.uint8).tobytes() if np.ndim(host(x)) else np.float64(x).tobytes()


def test_kernels_give_the_same_bits_twice(monkeypatch):
    """Every sum of the kernels has a fixed order (per-thread-block partials added in thread-block
    order, no floating-point atomics): the same launch twice gives identical bits, whatever order the
    threads run in (the simulator runs them as Python threads, in no fixed order)."""
    monkeypatch.setattr(cuc, "SIM_MAX_BLOCKS", 3)
    X, C = _blobs(n=211, d=4, k=5, dtype=np.float32, seed=40, spread=2.5)
    w = np.random.default_rng(41).uniform(0.1, 3.0, len(X))
    runs = [kmc.lloyd_partial(dev(X), C, dev(w)) for _ in range(2)]
    for key in ("sums", "counts", "far_d", "far_rows"):
        assert _bits(runs[0][key]) == _bits(runs[1][key]), key
    assert _bits(runs[0]["inertia"]) == _bits(runs[1]["inertia"])
    firsts = [hmc.first_pass(dev(X), C, dev(w)) for _ in range(2)]
    assert _bits(firsts[0].sums) == _bits(firsts[1].sums) and firsts[0].sxx == firsts[1].sxx
    path = _centers_path(X, C, 2, w)
    steps = []
    for _ in range(2):
        st = _copy(_hamerly_cpu.first_pass(X, path[0], w))
        st.labels, st.upper, st.lower = dev(st.labels), dev(st.upper), dev(st.lower)
        st.sums, st.counts = dev_c(st.sums), dev(st.counts)
        changed, _ = hmc.sweep(dev(X), path[2], path[0], st.labels, st.upper, st.lower, st.sums,
                                          st.counts, dev(w))
        steps.append((changed, _bits(st.sums), _bits(st.counts), _bits(st.labels)))
    assert steps[0] == steps[1] and steps[0][0] > 0
    Xl, y, coef, b = _logistic_data(190, 5, 3, np.float32, seed=42)
    grads = [lgc.loss_grad(dev(Xl), dev(y), coef, b, dev(w[:190])) for _ in range(2)]
    assert [_bits(v) for v in grads[0]] == [_bits(v) for v in grads[1]]


# -- the kernels compiled per size (issue #24) --------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_sized_kmeans_pass_same_bits_for_any_grid(dtype, weighted, monkeypatch):
    """The per-size K-means pass adds its partials per segment of SEG rows whatever the grid: 1, 2 or 4
    thread blocks give the same bits; its counts (unweighted) and farthest rows are exactly the
    array API reference's, its sums and inertia within rounding."""
    from gdask.ml.kernels import _kmeans_xp
    from gdask.ml.kernels import _lloyd_cuda as llc

    monkeypatch.setattr(llc, "SEG", 64)  # several segments on a small block
    X, C = _blobs(n=333, d=6, k=5, dtype=dtype, seed=50, spread=1.0)
    _assert_clear(X, C)
    w = np.random.default_rng(51).uniform(0.1, 3.0, len(X)) if weighted else None
    assert llc.fits(5, 6, np.dtype(dtype).itemsize)
    runs = []
    for blocks in (1, 2, 4):
        monkeypatch.setattr(cuc, "SIM_MAX_BLOCKS", blocks)
        runs.append(kmc.lloyd_partial(dev(X), C, None if w is None else dev(w)))
    for key in ("sums", "counts", "far_d", "far_rows", "far_label"):
        assert _bits(runs[0][key]) == _bits(runs[1][key]) == _bits(runs[2][key]), key
    assert _bits(runs[0]["inertia"]) == _bits(runs[1]["inertia"]) == _bits(runs[2]["inertia"])
    ref = _kmeans_xp.lloyd_partial(X, C, w)
    _assert_lloyd_equal(runs[0], {key: host(v) if hasattr(v, "shape") else v for key, v in ref.items()}, dtype)
    if not weighted:
        assert _bits(runs[0]["counts"]) == _bits(np.asarray(ref["counts"], np.float64))


def test_sized_kmeans_pass_nan_row_and_duplicate_centers(monkeypatch):
    """Ties keep the lower center (duplicate centers), a NaN row goes to cluster 0, as on the CPU."""
    X, C = _blobs(n=70, d=4, k=3, dtype=np.float32, seed=52)
    C = np.vstack([C, C[1:2]])  # center 3 duplicates center 1: it gets no row
    X = X.copy()
    X[5] = np.nan
    g = kmc.lloyd_partial(dev(X), C)
    c = kernels.lloyd_partial(X, C)
    assert g["counts"][3] == 0.0
    np.testing.assert_array_equal(g["counts"], c["counts"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sized_logistic_same_bits_for_any_grid(dtype, monkeypatch):
    from gdask.ml.kernels import _logreg_cuda

    monkeypatch.setattr(_logreg_cuda, "SEG", 64)
    X, y, coef, b = _logistic_data(301, 7, 1, dtype, seed=53)
    w = np.random.default_rng(54).uniform(0.1, 3.0, len(X))
    cw = np.array([0.7, 1.9])
    assert _logreg_cuda.fits(1, 7, np.dtype(dtype).itemsize)
    runs = []
    for blocks in (1, 3, 4):
        monkeypatch.setattr(cuc, "SIM_MAX_BLOCKS", blocks)
        runs.append(lgc.loss_grad(dev(X), dev(y), coef, b, dev(w), cw))
    assert [_bits(v) for v in runs[0]] == [_bits(v) for v in runs[1]] == [_bits(v) for v in runs[2]]
    _assert_loss_grad_equal(runs[0], kernels.loss_grad(X, y, coef, b, w, cw), dtype)


# -- packaging ---------------------------------------------------------------------------------------
def test_kernels_compile_once_per_dtype():
    X, C = _blobs(n=40, d=2, k=2, seed=30)
    kmc.assign(dev(X), C)
    first = dict(cuc.KERNELS)
    kmc.assign(dev(X[:17]), C + 1.0)
    assert cuc.KERNELS == first and all(cuc.KERNELS[key] is first[key] for key in first)
    assert ("assign", "float32") in cuc.KERNELS


_PTX_SCRIPT = """
import re, sys, types
from numba import cuda
from numba.core import types as t
try:
    from numba.cuda.cudadrv import nvvm
    nvvm.NVVM()
except Exception as e:  # no CUDA toolkit (libnvvm) here
    print("no-nvvm", repr(e)); sys.exit(0)
import numba.cuda.dispatcher as nd
# device functions ask the current device for its compute capability: there is none here
nd.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
from gdask.ml.kernels import _cuda_common as cuc, _hamerly_cuda, _kmeans_cuda, _logistic_cuda  # registers them
A = lambda dt, nd=1, layout="C": t.Array(dt, nd, layout)
f64, i64, i32, b = t.float64, t.int64, t.int32, t.boolean
for dt in (t.float32, t.float64):
    parts = (i64, A(f64), A(f64), A(f64), A(f64), A(i64), A(i32))  # k, partials, farthest rows
    sigs = {"lloyd-stats": [(A(dt, 2, lay), A(f64), A(dt), *parts, b, b, b) for lay in "CA"],
            "first-pass": [(A(dt, 2, lay), A(f64), A(dt), A(f64), *parts, A(i32), A(f64), A(f64), f64, b, b, b)
                           for lay in "CA"],
            "assign": [(A(dt, 2, lay), A(dt), i64, A(i32), A(f64), b) for lay in "CA"],
            "rowsum": [(A(f64, 2), A(f64))],
            "hamerly": [(A(dt, 2), A(f64), A(i32), A(f64), A(f64), A(f64), A(f64), A(f64), i64, f64, f64, A(i64),
                         A(i64), A(i32), b)],
            "moves": [(A(dt, 2), A(f64), A(i64), A(i32), A(i32), A(f64), A(f64), b)],
            "logistic": [(A(dt, 2), A(i32), A(dt), A(dt), A(f64), A(f64), A(f64), A(f64), b, b, b, b, i64)]}
    for name, sig_list in sigs.items():
        for sig in sig_list:
            ptx, _ = cuda.compile_ptx(cuc.kernel(name, str(dt)).py_func, sig, cc=(9, 0))
            assert ".entry" in ptx, name
            # deterministic sums: no floating-point atomic adds anywhere (integer counters only)
            assert not re.search(r"atom\\.[a-z.]*\\.f(32|64)", ptx), f"{name} has floating-point atomics"
print("compiled")
"""


def test_kernels_compile_for_a_gpu():
    """The simulator runs kernels as Python, so it cannot tell whether numba can type and compile
    them for a GPU: compile each kernel to PTX (sm_90) with the real numba.cuda, in a process
    without the simulator (needs the CUDA toolkit's libnvvm, no GPU)."""
    env = {key: v for key, v in os.environ.items() if key != "NUMBA_ENABLE_CUDASIM"}
    out = subprocess.run([sys.executable, "-c", _PTX_SCRIPT], check=False, capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    if out.stdout.startswith("no-nvvm"):
        pytest.skip(f"no CUDA toolkit to compile kernels with: {out.stdout.strip()}")
    assert out.stdout.strip().endswith("compiled")


def test_import_does_not_load_numba_cuda():
    code = ("import sys; import gdask, gdask.ml.kernels, gdask.ml.kernels._kmeans_cuda, "
            "gdask.ml.kernels._hamerly_cuda, gdask.ml.kernels._logistic_cuda; "
            "assert 'numba.cuda' not in sys.modules, 'numba.cuda imported'")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
