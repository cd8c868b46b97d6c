"""k-means|| keeps each block's nearest candidate between rounds: distances to the new candidates only,
the same centers when a block lost that state (replayed), and nothing left behind."""

import numpy as np
import pytest

import gdask
from gdask.devices import context
from gdask.ml import KMeans, kernels
from gdask.ml._kmeans import _blocks


@pytest.fixture(scope="module")
def blobs():
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(12_000, 6, centers=5, cluster_std=2.0, random_state=1)
    return X.astype(np.float32)


def _init(X, **kw):
    G = gdask.from_array(X, block_rows=3000)
    return KMeans(5, max_iter=1, random_state=4, **kw).fit(G)


def test_each_round_computes_distances_to_its_new_candidates_only(blobs, backend, monkeypatch):
    from gdask.ml._kmeans import _init as init_module

    seen, inside = [], []
    update, parallel = kernels.nearest_update, init_module._kmeans_parallel

    def counting(blk, cands, done, *args):
        if inside:
            seen.append(cands.shape[0] - done)  # the candidates this call computes distances to
        return update(blk, cands, done, *args)

    def tracked(*args, **kwargs):
        inside.append(True)
        try:
            return parallel(*args, **kwargs)
        finally:
            inside.clear()

    monkeypatch.setattr(kernels, "nearest_update", counting)
    monkeypatch.setattr(init_module, "_kmeans_parallel", tracked)
    km = _init(blobs, init_max_iter=4)
    # every block looks at each group of candidates once (the first row, then each round's draws): 5 calls
    # per block at most; recomputing all candidates each round would also look at them ~3x as often
    assert len(seen) % 4 == 0 and len(seen) // 4 <= 5  # 4 blocks
    assert len(seen) // 4 >= 3 and sum(seen) // 4 > 5
    assert np.isfinite(km.inertia_)


def test_a_block_that_lost_its_state_replays_to_the_same_centers(blobs, backend, monkeypatch):
    kept = _init(blobs).cluster_centers_
    real = _blocks.worker_state
    monkeypatch.setattr(_blocks, "worker_state", lambda token, create=True: {})  # every round: no state
    lost = _init(blobs).cluster_centers_
    monkeypatch.setattr(_blocks, "worker_state", real)
    np.testing.assert_array_equal(lost, kept)


def test_init_state_is_dropped(blobs):
    before = set(context().state.tokens())
    _init(blobs)
    assert not [t for t in context().state.tokens() if t.startswith("kmeans-init-") and t not in before]


def test_init_state_is_dropped_when_the_init_fails(blobs, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("sampling failed")

    monkeypatch.setattr(_blocks, "sample_nearest", broken)
    from gdask.ml._kmeans import _init as init_module

    monkeypatch.setattr(init_module, "sample_nearest", broken)
    with pytest.raises(RuntimeError, match="sampling failed"):
        _init(blobs)
    assert not [t for t in context().state.tokens() if t.startswith("kmeans-init-")]


def test_block_functions_match_brute_force(blobs):
    blk = np.asfortranarray(blobs[:2000])
    rng = np.random.default_rng(0)
    groups = [blobs[rng.choice(len(blobs), m)] for m in (1, 7, 4)]
    w = rng.uniform(0.5, 2.0, len(blk))
    d2 = ((blk[:, None, :].astype(np.float64) - np.concatenate(groups)[None].astype(np.float64)) ** 2).sum(-1)
    token = "kmeans-init-test"
    try:
        for r in range(1, 4):  # round by round, as the init asks
            cands, sizes = np.concatenate(groups[:r]), tuple(len(g) for g in groups[:r])
            total = _blocks.nearest_total(blk, cands, sizes, token, w)
            assert total == pytest.approx(float((w * d2[:, :cands.shape[0]].min(1)).sum()), rel=1e-5)
        counts = _blocks.nearest_counts(blk, cands, sizes, token, w)
    finally:
        context().state.drop(token)
    expect = np.bincount(d2.argmin(1), weights=w, minlength=cands.shape[0])
    np.testing.assert_allclose(counts, expect)
    assert token not in context().state.tokens() or not context().state.get(token, create=False)


def test_a_state_of_other_candidates_is_not_used(blobs):
    """A block whose state holds more rounds than asked for (a loop resumed from an earlier
    checkpoint) starts again from the candidates it is given."""
    blk = np.asfortranarray(blobs[:1500])
    rng = np.random.default_rng(3)
    groups = [blobs[rng.choice(len(blobs), m)] for m in (1, 6, 5)]
    d2 = ((blk[:, None, :].astype(np.float64) - np.concatenate(groups)[None].astype(np.float64)) ** 2).sum(-1)
    token = "kmeans-init-test-resumed"
    try:
        _blocks.nearest_total(blk, np.concatenate(groups), (1, 6, 5), token)
        total = _blocks.nearest_total(blk, np.concatenate(groups[:2]), (1, 6), token)
    finally:
        context().state.drop(token)
    assert total == pytest.approx(float(d2[:, :7].min(1).sum()), rel=1e-5)


def _draw_frequencies(score, scale, trials):
    counts = np.zeros(np.asarray(score).shape[0])
    sizes = []
    for seed in range(trials):
        kept = _blocks._thinned_draws(score, scale, np.random.default_rng(seed))
        assert np.all(np.diff(kept) > 0)  # sorted, each row once
        counts[kept] += 1
        sizes.append(kept.size)
    return counts / trials, np.array(sizes)


@pytest.mark.parametrize("case", ["thinned", "every-row", "clipped"])
def test_oversampling_keeps_each_row_with_its_own_probability(case):
    """k-means||'s draws: row i kept with probability min(1, scale * score[i]), whether the block
    thins a sparser process (small probabilities) or draws a number per row (a large one)."""
    rng = np.random.default_rng(11)
    score = rng.uniform(0.2, 1.0, 300)
    scale = 6.0 / score.sum()  # ~6 rows a draw, the largest probability ~0.03: thinned
    if case == "every-row":
        score[7] = 0.5 / scale  # probability 0.5: above THIN_MAX_SHARE
    elif case == "clipped":
        score[[3, 9]] = [2.5 / scale, 1.0 / scale]  # kept every time
    score[100:110] = 0.0  # on a candidate: never kept
    p = np.minimum(1.0, scale * score)
    assert (p.max() > _blocks.THIN_MAX_SHARE) == (case != "thinned")
    trials = 3000
    freq, sizes = _draw_frequencies(score, scale, trials)
    sigma = np.sqrt(p * (1 - p) / trials)
    assert np.all(np.abs(freq - p) <= 5 * sigma + 1e-12)
    assert np.all(freq[100:110] == 0) and np.all(freq[p == 1.0] == 1)
    assert abs(sizes.mean() - p.sum()) < 5 * np.sqrt((p * (1 - p)).sum() / trials)


def test_oversampling_draws_the_same_rows_on_a_strict_device():
    xps = pytest.importorskip("array_api_strict")
    score = np.random.default_rng(2).uniform(0.0, 1.0, 5000) ** 3
    on_device = xps.asarray(score, device=xps.Device("device1"))
    for seed, scale in [(0, 8.0 / score.sum()), (1, 0.9 / score.max())]:
        np.testing.assert_array_equal(_blocks._thinned_draws(on_device, scale, np.random.default_rng(seed)),
                                      _blocks._thinned_draws(score, scale, np.random.default_rng(seed)))
    assert _blocks._thinned_draws(np.zeros(10), 1.0, np.random.default_rng(0)).size == 0
