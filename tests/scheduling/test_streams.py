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


def test_reprobes_back_off_on_a_stable_workload():
    c = StreamController(8)
    probes = []
    for r in range(200):
        probes.append(c.k != c.home)
        c.observe(throughput(c.k, 3))
    assert c.home == 3
    # intervals 8, 16, 32, 64, 64: five probes where a fixed interval of 8 would make ~21
    assert 3 <= sum(probes[10:]) <= 6


def test_a_changed_workload_is_detected_at_the_settled_count():
    c = StreamController(8, drift=0.25)
    for r in range(40):
        c.observe(throughput(c.k, 6 if r < 20 else 2))
        if r == 19:
            assert c.home == 6 and len([k for k in range(1, 9) if c.estimate(k) is not None]) >= 2
        if r == 20:  # the settled count measured 168 instead of 600: everything else is forgotten
            assert [k for k in range(1, 9) if c.estimate(k) is not None] == [6]
    assert c.home == 2
    slow = StreamController(8, drift=None)  # without detection it waits for the next re-probe
    for r in range(28):
        slow.observe(throughput(slow.k, 6 if r < 20 else 2))
    assert slow.home == 6


@pytest.mark.parametrize("noisy", [False, True])
def test_noisy_measurements_raise_the_margin_a_probe_must_beat(noisy):
    c = StreamController(2, start=1, alpha=1.0, reprobe=12, max_reprobe=12, drift=None)
    assert c.observe(100.0) == 2  # probe the unmeasured neighbour
    assert c.observe(50.0) == 1  # worse: back
    for r in range(10):  # settled at 1: steady, or +-10% around 100; then the re-probe
        assert c.observe(100.0 * (1 + (0.1 if r % 2 else -0.1) * noisy)) == (1 if r < 9 else 2)
    assert c.noise == pytest.approx(0.0) if not noisy else c.noise > 0.05
    assert c.margin == max(0.03, c.noise)
    est = c.estimate(1)
    c.observe(est * 1.06)
    assert c.home == (1 if noisy else 2)  # +6%: a win only without noise


def test_single_stream_range():
    c = StreamController(1, start=4)
    assert c.k == 1
    for t in (1.0, 5.0, 0.5):
        assert c.observe(t) == 1


@pytest.mark.parametrize("kw", [{"max_streams": 0}, {"max_streams": 4, "alpha": 0}, {"max_streams": 4, "tolerance": -1},
                                {"max_streams": 4, "reprobe": 0}, {"max_streams": 4, "max_reprobe": 2},
                                {"max_streams": 4, "drift": 0}])
def test_bad_parameters(kw):
    with pytest.raises(ValueError):
        StreamController(**kw)


@pytest.mark.parametrize("t", [float("nan"), -1.0, float("inf")])
def test_bad_throughput(t):
    with pytest.raises(ValueError, match="throughput"):
        StreamController(4).observe(t)
