"""Pure placement policies: events in, decisions out, no cluster."""

from __future__ import annotations

import pytest

from gdask.scheduling import DurationModel, EarliestFinish, makespan, proportional_mapping, rebalance_plan
from gdask.scheduling._placement import size_bucket


def test_size_bucket_groups_within_factor_two():
    assert size_bucket(0) == 0
    assert size_bucket(1000) == size_bucket(1023)
    assert size_bucket(1024) != size_bucket(1023)


def test_duration_model_learns_cells_and_speeds():
    m = DurationModel(alpha=0.5)
    for _ in range(3):
        m.observe("k", 1 << 20, "fast", 1.0)
        m.observe("k", 1 << 20, "slow", 4.0)
    assert m.predict("k", 1 << 20, "fast") == pytest.approx(1.0)
    assert m.predict("k", 1 << 20, "slow") == pytest.approx(4.0)
    rel = m.relative_speeds()
    assert rel["fast"] == pytest.approx(1.0)
    assert rel["slow"] == pytest.approx(0.25, rel=0.05)
    # a kind seen only on the fast device is predicted 4x longer on the slow one
    m.observe("other", 1 << 10, "fast", 0.5)
    assert m.predict("other", 1 << 10, "slow") == pytest.approx(2.0, rel=0.05)
    # a new size of a known kind scales with the size class
    assert m.predict("k", 1 << 21, "fast") == pytest.approx(2.0)
    assert m.predict("never", 10, "fast") == m.default


def test_duration_model_heavy_tasks_dominate_speed():
    m = DurationModel()
    for _ in range(5):
        m.observe("big", 1 << 20, "a", 1.0)
        m.observe("big", 1 << 20, "b", 2.0)
        m.observe("tiny", 0, "a", 0.001)  # fixed overhead: same on both devices
        m.observe("tiny", 0, "b", 0.001)
    assert m.relative_speeds()["b"] == pytest.approx(0.5, rel=0.05)


def test_duration_model_short_tasks_do_not_set_speed():
    m = DurationModel(min_speed_seconds=0.005)
    for _ in range(3):
        m.observe("tiny", 0, "a", 0.001)
        m.observe("tiny", 0, "b", 0.003)  # overhead noise, not a 3x slower device
    assert not m.measured("b") and m.speed("b") == 1.0
    assert m.predict("tiny", 0, "b") == pytest.approx(0.003)  # the cell is still learned


def test_duration_model_outlier_of_a_light_kind_does_not_set_speed():
    m = DurationModel(min_speed_seconds=0.005)
    for _ in range(3):
        m.observe("big", 1 << 20, "a", 0.05)
        m.observe("big", 1 << 20, "b", 0.10)
        m.observe("tiny", 1 << 10, "a", 0.0002)
    before = m.relative_speeds()["a"]
    m.observe("tiny", 1 << 10, "a", 0.05)  # preempted: 250x its usual time
    assert m.relative_speeds()["a"] == before == 1.0
    assert m.relative_speeds()["b"] == pytest.approx(0.5, rel=0.05)
    m.observe("big", 1 << 20, "a", 0.20)  # a heavy task still measures: a slowed down
    assert m.relative_speeds()["b"] == 1.0


def test_duration_model_prior_warmup_and_forget():
    m = DurationModel(warmup=1)
    m.set_prior("b", 0.5)
    assert m.speed("b") == 0.5 and not m.measured("b")
    m.observe("k", 100, "a", 30.0)  # first run: JIT compile, ignored
    assert not m.known("k")
    m.observe("k", 100, "a", 1.0)
    assert m.predict("k", 100, "a") == pytest.approx(1.0)
    assert m.predict("k", 100, "b") == pytest.approx(2.0)  # from the prior
    m.forget_device("b")
    assert m.speed("b") == 1.0
    with pytest.raises(ValueError, match="seconds"):
        m.observe("k", 100, "a", float("nan"))
    with pytest.raises(ValueError, match="alpha"):
        DurationModel(alpha=0)


def test_duration_model_tracks_drift():
    m = DurationModel(alpha=0.5)
    for _ in range(4):
        m.observe("k", 100, "a", 1.0)
        m.observe("k", 100, "b", 1.0)
    for _ in range(8):  # b becomes 3x slower
        m.observe("k", 100, "a", 1.0)
        m.observe("k", 100, "b", 3.0)
    assert m.relative_speeds()["b"] == pytest.approx(1 / 3, rel=0.1)


def _placer(speeds, bandwidth=1e9):
    m = DurationModel()
    for d, s in speeds.items():
        m.set_prior(d, s)
    m.observe("k", 1000, "ref", 1.0)  # 1 s of work at speed 1 (ref has speed 1)
    p = EarliestFinish(m, bandwidth=bandwidth)
    for d in speeds:
        p.add_device(d)
    return p


def test_earliest_finish_balances_by_speed():
    p = _placer({"a": 1.0, "b": 1.0, "c": 0.5, "d": 0.25})
    counts = {d: 0 for d in "abcd"}
    for i in range(55):
        dev, pred = p.choose("k", 1000)
        p.assign(i, dev, pred)
        counts[dev] += 1
    # proportional to speed: 20, 20, 10, 5
    assert counts == {"a": 20, "b": 20, "c": 10, "d": 5}
    assert p.outstanding() == 55
    for i in range(55):
        p.finished(i)
    assert p.outstanding() == 0
    assert all(v["backlog"] == pytest.approx(0) for v in p.snapshot().values())


def test_earliest_finish_prefers_data_unless_transfer_is_cheap():
    slow_link = _placer({"a": 1.0, "b": 1.0}, bandwidth=100.0)  # moving 1000 B costs 10 s
    slow_link.assign("x", "a", 3.0)  # a is busy for 3 s
    assert slow_link.choose("k", 1000, {"a": 1000})[0] == "a"
    fast_link = _placer({"a": 1.0, "b": 1.0}, bandwidth=1e9)
    fast_link.assign("x", "a", 3.0)
    assert fast_link.choose("k", 1000, {"a": 1000})[0] == "b"


def test_earliest_finish_latency_keeps_small_tasks_local():
    m = DurationModel()
    m.observe("k", 1000, "a", 0.002)
    p = EarliestFinish(m, bandwidth=1e9, latency=0.01)
    p.add_device("a")
    p.add_device("b")
    p.assign("x", "a", 0.005)  # a is busy 5 ms: fetching to b would cost 10 ms
    assert p.choose("k", 1000, {"a": 1000})[0] == "a"
    p.assign("y", "a", 0.05)
    assert p.choose("k", 1000, {"a": 1000})[0] == "b"
    with pytest.raises(ValueError, match="latency"):
        EarliestFinish(m, bandwidth=1.0, latency=-1)


def test_earliest_finish_ready_time_memory_and_candidates():
    p = _placer({"a": 1.0, "b": 0.25})
    p.assign("x", "a", 2.0)
    # inputs ready in 5 s: a's backlog no longer matters and the fast device wins
    assert p.choose("k", 1000, ready=5.0)[0] == "a"
    assert p.finish_time("a", "k", 1000, ready=5.0) == pytest.approx(6.0)
    p.set_memory_free("a", 10)
    assert p.choose("k", 1000, ready=5.0)[0] == "b"  # a cannot hold the input
    assert p.choose("k", 1000, candidates=["a"])[0] == "a"  # nothing fits: most free memory wins
    assert p.remove_device("a") == ["x"]
    with pytest.raises(ValueError, match="no device"):
        p.choose("k", 1000, candidates=["a"])
    with pytest.raises(ValueError, match="bandwidth"):
        EarliestFinish(DurationModel(), bandwidth=0)


def test_rebalance_plan_moves_only_when_it_pays():
    work = [1.0] * 8
    even = [0, 0, 0, 0, 1, 1, 1, 1]
    plan = rebalance_plan(work, even, [1.0, 0.25])
    assert plan is not None and plan.count(1) == 1
    assert makespan(work, plan, [1.0, 0.25]) < makespan(work, even, [1.0, 0.25])
    # affinity: only blocks of the overloaded device move
    assert all(p == c for p, c in zip(plan, even) if c == 0)
    # moving costs more than `horizon` iterations save: stay
    assert rebalance_plan(work, even, [1.0, 0.25], move_cost=100.0) is None
    # small drift (below min_gain): stay
    assert rebalance_plan(work, even, [1.0, 0.95], min_gain=0.1) is None
    # already balanced: stay
    assert rebalance_plan(work, [0] * 7 + [1], [1.0, 0.25]) is None
    with pytest.raises(ValueError, match="current"):
        rebalance_plan(work, [0] * 3, [1.0])
    with pytest.raises(ValueError, match="outside"):
        rebalance_plan(work, [5] * 8, [1.0])


def test_rebalance_plan_reaches_proportional_share():
    speeds = [1.0, 1.0, 0.5, 0.25]
    work = [1.0] * 24
    start = [i % 4 for i in range(24)]
    plan = rebalance_plan(work, start, speeds)
    assert sorted(plan.count(d) for d in range(4)) == sorted(proportional_mapping(work, speeds).count(d)
                                                             for d in range(4))
