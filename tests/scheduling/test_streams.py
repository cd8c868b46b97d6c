"""The stream-count controller is a pure policy: deterministic feedback in, counts out."""

import numpy as np
import pytest

from gdask.scheduling import StreamController


def throughput(k, best):
    """Rises linearly to ``best`` streams, then contention makes more streams slightly worse."""
    return 100.0 * min(k, best) - 8.0 * max(0, k - best)


@pytest.mark.parametrize("best", [1, 3, 5, 8])
def test_reaches_best_count_within_ten_rounds(best):
    c = StreamController(8)
    for _ in range(10):
        c.observe(throughput(c.k, best))
    # settled at the best count (it may be probing a neighbour on this round)
    assert abs(c.k - best) <= 1
    assert max(c.estimate(k) or 0 for k in range(1, 9)) == throughput(best, best)
    assert throughput(c._home, best) >= 0.95 * throughput(best, best)


def test_stays_in_range_and_follows_a_drifting_optimum_under_noise():
    rng = np.random.default_rng(0)
    c = StreamController(8)
    seen = []
    for r in range(60):
        best = 5 if r < 25 else 2
        seen.append(c.k)
        c.observe(throughput(c.k, best) * (1 + 0.02 * rng.standard_normal()))
    assert all(1 <= k <= 8 for k in seen)
    assert abs(np.median(seen[15:25]) - 5) <= 1
    assert abs(np.median(seen[-10:]) - 2) <= 1


def test_single_stream_range():
    c = StreamController(1, start=4)
    assert c.k == 1
    for t in (1.0, 5.0, 0.5):
        assert c.observe(t) == 1


@pytest.mark.parametrize("kw", [{"max_streams": 0}, {"max_streams": 4, "alpha": 0}, {"max_streams": 4, "tolerance": -1},
                                {"max_streams": 4, "reprobe": 0}])
def test_bad_parameters(kw):
    with pytest.raises(ValueError):
        StreamController(**kw)


@pytest.mark.parametrize("t", [float("nan"), -1.0, float("inf")])
def test_bad_throughput(t):
    with pytest.raises(ValueError, match="throughput"):
        StreamController(4).observe(t)
