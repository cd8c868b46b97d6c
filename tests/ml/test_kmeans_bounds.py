"""Hamerly bounds (KMeans(algorithm="elkan")): same answers as Lloyd, state kept and freed."""

import time

import numpy as np
import pytest

import gdask
from gdask import DeviceMemoryError
from gdask.devices import StateSpaces, asarray_like, context, current_device, to_numpy
from gdask.ml import KMeans, kernels
from gdask.ml.kernels import _hamerly, _hamerly_cpu, _hamerly_xp


def _fit_states(dask_worker=None) -> list:
    """Tokens of the fit states kept by this process (or worker): none once fits have ended."""
    return [t for t in context(dask_worker).state.tokens() if t != kernels.NORMS_SPACE]


def _drop(token):
    return context().state.drop(token)


def _overlapping(n=6000, d=12, k=5, noise=3.0, seed=0):
    """Overlapping clusters: many rows near boundaries, so bounds fail and rows change often."""
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-10, 10, (k, d))
    X = centers[rng.integers(0, k, n)] + noise * rng.standard_normal((n, d))
    return X.astype(np.float32), X[rng.choice(n, k, replace=False)].astype(np.float32)


def _fit(X, init, algorithm, **kw):
    return KMeans(len(init), init=init, max_iter=25, tol=0, algorithm=algorithm, **kw).fit(
        gdask.from_array(X, block_rows=1000))


@pytest.mark.parametrize("weighted", [False, True])
def test_elkan_equals_lloyd(weighted, monkeypatch, backend):
    X, init = _overlapping()
    w = np.random.default_rng(1).uniform(0.1, 3, len(X)) if weighted else None
    calls = []
    partial = kernels.bounds_partial
    monkeypatch.setattr(kernels, "bounds_partial", lambda *a, **k: calls.append(1) or partial(*a, **k))
    a = KMeans(len(init), init=init, max_iter=25, tol=0, algorithm="elkan").fit(X, sample_weight=w)
    assert len(calls) > 10  # once the centers settle, the iterations run on the bounds
    b = KMeans(len(init), init=init, max_iter=25, tol=0, algorithm="lloyd").fit(X, sample_weight=w)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-5, atol=1e-5)
    assert (a.labels_ != b.labels_).sum() <= 2  # float32 near-ties may go either way
    assert a.inertia_ == pytest.approx(b.inertia_, rel=1e-6)
    assert not _fit_states()  # the engine dropped the fit's state


def test_elkan_with_client_and_relocation(bclient):
    client = bclient
    X, _ = _overlapping(d=10, k=4, noise=1.0)
    init = np.vstack([X[:3], np.full((1, X.shape[1]), 1e4, np.float32)])  # the last center gets no rows
    a = _fit(X, init, "elkan")
    b = _fit(X, init, "lloyd")
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-5, atol=1e-5)
    la, lb = to_numpy(a.labels_.compute()), to_numpy(b.labels_.compute())  # GDataSet input: lazy labels_
    assert (la == lb).mean() > 0.999
    assert len(np.unique(la)) == 4
    deadline = time.monotonic() + 10
    while any(client.run(_fit_states).values()):
        assert time.monotonic() < deadline, "block bounds left on the workers after fit"
        time.sleep(0.05)


def _steps(blk, centers_seq, use_xp):
    st = _hamerly_cpu.first_pass(blk, centers_seq[0], None)
    for c in centers_seq[1:]:
        if use_xp:
            _hamerly_xp.step(blk, c, st, None)
        else:
            assert _hamerly_cpu.step(blk, c, st, None, len(blk)) >= 0
        st.centers = c
    return st


def test_numba_step_matches_array_step_and_exact_distances():
    X, init = _overlapping(n=3000)
    blk = np.asfortranarray(X)
    rng = np.random.default_rng(2)
    seq = [init.astype(np.float64)]
    for _ in range(6):
        seq.append(seq[-1] + rng.normal(0, 0.3, seq[-1].shape))
    a, b = _steps(blk, seq, False), _steps(blk, seq, True)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_allclose(a.sums, b.sums, rtol=1e-12, atol=1e-9)
    exact = np.sqrt(((blk[:, None, :].astype(np.float64) - seq[-1][None]) ** 2).sum(-1))
    best = exact[np.arange(len(blk)), a.labels]
    assert (best <= exact.min(1) + 1e-4).all()  # every label is a nearest center (float32 ties aside)
    upper, lower = _hamerly_cpu.bounds(a)  # kept against the drifts the steps accumulated
    assert a.moved is not None  # (which this checks: the stored arrays alone are not the bounds)
    assert (upper >= best - 1e-9).all()  # the bounds hold
    exact[np.arange(len(blk)), a.labels] = np.inf
    assert (lower <= exact.min(1) + 1e-9).all()
    sums = np.stack([blk[a.labels == c].astype(np.float64).sum(0) for c in range(len(init))])
    np.testing.assert_allclose(a.sums, sums, rtol=1e-9, atol=1e-6)


def test_lost_state_is_rebuilt_from_the_history_to_the_same_bits(backend):
    X, init = _overlapping()
    blk = current_device().asarray(X)  # a block of the backend's device
    c0 = init.astype(np.float64)
    p0 = kernels.bounds_partial(blk, c0, "t", history=[])
    c1 = p0["sums"] / p0["counts"][:, None]
    q1 = kernels.bounds_partial(blk, c1, "t")  # undisturbed: a step on the kept state
    c2 = q1["sums"] / q1["counts"][:, None]
    q2 = kernels.bounds_partial(blk, c2, "t")
    assert _drop("t")  # e.g. the block moved to another worker, or its worker was lost
    assert kernels.bounds_partial(blk, c2, "t") == kernels.MISSING  # no history at hand: asks for it
    p2 = kernels.bounds_partial(blk, c2, "t", history=[c0, c1])  # replayed: the same first pass and steps
    for key in ("sums", "counts", "far_d", "far_label", "far_rows"):
        np.testing.assert_array_equal(p2[key], q2[key])
    assert p2["changed"] == q2["changed"]
    ref = kernels.host(kernels.lloyd_partial(blk, asarray_like(c2, blk)))
    np.testing.assert_allclose(p2["sums"], ref["sums"], rtol=1e-9)
    np.testing.assert_array_equal(p2["counts"], ref["counts"])
    c1 = c2
    labels, inertia = kernels.bounds_labels(blk, c1, "t")
    assert not _hamerly.worker_state("t", create=False)  # the block's state went with the final pass
    _drop("t")
    labels = to_numpy(labels)
    l2, m2 = kernels.host(kernels.assign(blk, asarray_like(c1, blk)))
    assert (labels != l2).sum() <= 1
    exact = ((X.astype(np.float64) - c1[labels]) ** 2).sum()
    assert inertia == pytest.approx(exact, rel=1e-12)


def test_step_gives_up_for_a_full_pass_when_centers_jump():
    X, init = _overlapping()
    blk = np.asfortranarray(X)
    c0 = init.astype(np.float64)
    kernels.bounds_partial(blk, c0, "j", history=[])
    jumped = c0[::-1].copy()  # every row's cluster changes: the step stops early, a full pass rebuilds
    p = kernels.bounds_partial(blk, jumped, "j")
    ref = kernels.lloyd_partial(blk, jumped)
    np.testing.assert_allclose(p["sums"], ref["sums"], rtol=1e-9)
    np.testing.assert_array_equal(p["counts"], ref["counts"])
    assert _hamerly._get("j", blk).far is not None  # the state came from a full pass
    _drop("j")


@pytest.mark.parametrize("offset", [0.0, 300.0])  # 300: the per-cluster sums cancel, an exact pass instead
@pytest.mark.parametrize("weighted", [False, True])
def test_final_labels_and_inertia_from_the_bounds(offset, weighted):
    X, init = _overlapping(n=3000)
    blk = np.asfortranarray(X + np.float32(offset))
    c0 = init.astype(np.float64) + offset
    w = np.random.default_rng(3).uniform(0.1, 3, len(X)) if weighted else None
    p0 = kernels.bounds_partial(blk, c0, "f", w, history=[])
    c1 = p0["sums"] / p0["counts"][:, None]
    st = _hamerly._get("f", blk)
    assert st.sxx == pytest.approx(float((blk.astype(np.float64) ** 2).sum(1) @ (np.ones(len(X)) if w is None else w)),
                                   rel=1e-12)
    kernels.bounds_partial(blk, c1, "f", w)  # a step: sums moved row by row
    c2 = c1 + 0.01
    st = _hamerly._get("f", blk)
    assert (_hamerly._inertia_from_sums(st) is None) == bool(offset)  # offset: more than 3 digits cancel
    labels, inertia = kernels.bounds_labels(blk, c2, "f", w)
    assert not _hamerly.worker_state("f", create=False)
    _drop("f")
    d2 = ((blk[:, None, :].astype(np.float64) - c2[None]) ** 2).sum(-1)
    best = d2[np.arange(len(blk)), labels]
    assert (labels == d2.argmin(1)).mean() > 0.999  # float32 near-ties aside
    exact = float(best @ (np.ones(len(X)) if w is None else w))
    assert inertia == pytest.approx(exact, rel=1e-11)


def test_no_device_memory_for_bounds_falls_back_to_lloyd(monkeypatch):
    def full(st):
        raise DeviceMemoryError("emulated device 0 out of memory")

    monkeypatch.setattr(_hamerly, "_charge", full)
    X, init = _overlapping()
    a = _fit(X, init, "elkan")
    b = _fit(X, init, "lloyd")
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-6)
    assert not _fit_states()


def test_old_fits_are_forgotten():
    spaces = StateSpaces(max_spaces=4)
    for i in range(7):  # interrupted fits never drop their state themselves
        spaces.get(f"fit-{i}")[0] = i
    assert spaces.tokens() == ["fit-3", "fit-4", "fit-5", "fit-6"]
    assert spaces.drop("fit-3") and not spaces.drop("fit-3")
    assert spaces.get("fit-0", create=False) is None


def test_bad_algorithm():
    with pytest.raises(ValueError, match="algorithm must be"):
        KMeans(2, algorithm="full").fit(np.ones((10, 2)))


def test_row_norms_are_kept_while_the_block_lives():
    import gc

    blk = np.asfortranarray(np.random.default_rng(0).normal(size=(1000, 7)).astype("f4"))
    first = kernels.row_norms(blk)
    np.testing.assert_allclose(first, (blk.astype("f8") ** 2).sum(1), rtol=1e-12)
    assert kernels.row_norms(blk) is first  # computed once per block
    other = blk.copy(order="F")
    assert kernels.row_norms(other) is not first  # equal data, another block: its own entry
    key = id(blk)
    del blk
    gc.collect()
    assert key not in _hamerly.worker_state(kernels.NORMS_SPACE)  # freed with the block


def test_a_finished_state_leaves_its_buffer_to_the_next_fit():
    X, init = _overlapping(n=3000)
    blk = np.asfortranarray(X)
    c0 = init.astype(np.float64)
    spares = context().state.spares
    spares.clear()
    kernels.bounds_partial(blk, c0, "a", history=[])
    buf = _hamerly._get("a", blk).buffer
    labels, inertia = kernels.bounds_labels(blk, c0, "a", dtype=np.uint8)  # a copy: the buffer goes back
    assert labels.dtype == np.uint8 and not np.shares_memory(labels, buf)
    kept = labels.copy()
    kernels.bounds_partial(blk, c0[::-1].copy(), "b", history=[])  # the next fit's block takes that buffer
    assert _hamerly._get("b", blk).buffer is buf
    np.testing.assert_array_equal(labels, kept)  # and the labels handed out stay as they were
    l2, _ = kernels.bounds_labels(blk, c0[::-1].copy(), "b")  # default: the state's own labels, kept
    assert np.shares_memory(l2, buf) and spares.nbytes() == 0
    _drop("a"), _drop("b")


def test_spare_buffers_are_bounded_and_fit_their_request():
    from gdask.devices import SpareBuffers

    spares = SpareBuffers(max_bytes=1000)
    a, b = np.empty(100), np.empty(50)
    assert spares.give(a) and not spares.give(b)  # 800 + 400 bytes > 1000: let go
    assert spares.take(100, np.dtype(np.float32)) is None  # another dtype
    assert spares.take(40, np.dtype(np.float64)) is None  # more than twice the request
    assert spares.take(101, np.dtype(np.float64)) is None  # too small
    assert spares.take(60, np.dtype(np.float64)) is a and spares.nbytes() == 0


def test_fits_in_a_row_reuse_buffers_to_the_same_bits():
    X, init = _overlapping(n=20_000)
    first = KMeans(len(init), init=init, n_init=1, max_iter=30, tol=0, algorithm="elkan").fit(X)
    labels = first.labels_.copy()
    other = KMeans(len(init), init=init[::-1].copy(), n_init=1, max_iter=30, tol=0, algorithm="elkan").fit(X + 1)
    again = KMeans(len(init), init=init, n_init=1, max_iter=30, tol=0, algorithm="elkan").fit(X)
    np.testing.assert_array_equal(first.labels_, labels)  # untouched by the fits after it
    np.testing.assert_array_equal(again.labels_, first.labels_)
    np.testing.assert_array_equal(again.cluster_centers_, first.cluster_centers_)
    assert again.inertia_ == first.inertia_ and other.n_iter_ > 0


def _stats(centers, bounded=0, rebuilt=0, n=100):
    k, d = centers.shape
    return {"sums": centers * 10.0, "counts": np.full(k, 10.0), "inertia": 1.0, "changed": 5, "bounded": bounded,
            "rebuilt": rebuilt, "far_d": np.empty(0), "far_label": np.empty(0, np.int64),
            "far_rows": np.empty((0, d)), "far_w": np.empty(0)}


def test_bounds_that_keep_failing_give_way_to_lloyd_until_the_centers_slow_down():
    from gdask.ml._kmeans._loop import _REARM, LoopState

    c = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    st = LoopState(c.copy(), True, 0.0, np.dtype(np.float64), 100, settled=True)

    def step(move, bounded=0, rebuilt=0):
        kind = st.chunk("tok")[0]
        new = st.centers + [move, 0.0]
        st.advance(_stats(new, bounded, rebuilt), None, 0.0)
        return kind

    assert step(1.0, 4, 4) is kernels.bounds_partial  # builds the bounds: every block's first full pass
    assert step(1.0, 4, 1) is kernels.bounds_partial  # a step: most blocks kept their bounds
    assert step(1.0, 4, 3) is kernels.bounds_partial  # most blocks gave up their step
    assert st.rearm == pytest.approx(_REARM * 1.0)  # back to Lloyd until the moves fall below half of 1.0
    assert step(0.9) is kernels.lloyd_partial
    assert step(0.2) is kernels.lloyd_partial  # 0.04 < 0.25 * 0.81 and below the rearm: settled again
    assert st.chunk("tok")[0] is kernels.bounds_partial
    lloyd = LoopState(c.copy(), False, 0.0, np.dtype(np.float64), 100)
    assert lloyd.chunk("tok")[0] is kernels.lloyd_partial


def test_a_step_on_stale_bounds_that_gives_up_keeps_stepping():
    """Bounds kept through Lloyd's passes are stale: the step on them gives up and its full pass rebuilds
    them, which says nothing about the steps to come (the next one steps on fresh bounds)."""
    from gdask.ml._kmeans._loop import LoopState

    c = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    st = LoopState(c.copy(), True, 0.0, np.dtype(np.float64), 100, settled=True)

    def step(move, bounded=0, rebuilt=0):
        kind = st.chunk("tok")[0]
        st.advance(_stats(st.centers + [move, 0.0], bounded, rebuilt), None, 0.0)
        return kind

    assert step(1.0, 4, 4) is kernels.bounds_partial  # builds the bounds
    assert step(1.0, 4, 3) is kernels.bounds_partial  # steps on them (fresh): most gave up
    assert step(0.9) is kernels.lloyd_partial  # so Lloyd's passes, the bounds kept (stale)
    assert step(0.2) is kernels.lloyd_partial  # settled again
    assert step(0.1, 4, 4) is kernels.bounds_partial  # a step on the stale bounds: every block rebuilt them
    assert st.chunk("tok")[0] is kernels.bounds_partial  # fresh now: the next pass steps on them
    assert step(0.05, 4, 1) is kernels.bounds_partial and st.chunk("tok")[0] is kernels.bounds_partial


def test_a_pass_asked_again_gets_the_same_answer_and_leaves_the_state_alone():
    # a loop resumed after a failure repeats its last pass on blocks that had already done it: the
    # block answers from memory, and the passes after it are those of a loop that never repeated
    X, init = _overlapping(n=4000)
    blk = np.asfortranarray(X)
    cs = [init.astype(np.float64)]
    for _ in range(3):  # centers along a Lloyd trajectory
        p = kernels.lloyd_partial(blk, cs[-1])
        cs.append(p["sums"] / np.maximum(p["counts"], 1)[:, None])

    def passes(tok, order):
        try:
            return [kernels.bounds_partial(blk, cs[i], tok, history=[]) for i in order]
        finally:
            _drop(tok)

    plain = passes("memo-plain", [0, 1, 2, 3])
    repeated = passes("memo-repeated", [0, 1, 2, 2, 1, 3])
    assert plain[2]["changed"] > 0  # a step that moved rows (a step on the same centers moves none)
    for got, want in zip(repeated, [plain[0], plain[1], plain[2], plain[2], plain[1], plain[3]]):
        assert got.keys() == want.keys()
        for key, value in want.items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(got[key], value)
            elif key != "inertia":  # NaN after a bounds pass
                assert got[key] == value, key
