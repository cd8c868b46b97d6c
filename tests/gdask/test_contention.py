"""Emulated kernels that share a device: the stated contention model and the shared clock."""

from __future__ import annotations

import threading

import pytest

from gdask._devices._contention import ContentionModel, SharedClock


def test_model_alone_is_one_and_oversubscription_slows_by_own_weight():
    m = ContentionModel(overhead=0.0)
    assert m.slowdown((0.6, 0.2), [(0.6, 0.2)]) == 1.0
    # compute over-subscribed by 0.5: a pure compute kernel pays it all, a pure bandwidth one nothing
    assert m.slowdown((1.0, 0.0), [(1.0, 0.0), (0.5, 0.0)]) == pytest.approx(1.5)
    assert m.slowdown((0.0, 1.0), [(0.0, 1.0), (1.5, 0.0)]) == pytest.approx(1.0)
    assert ContentionModel(overhead=0.1).slowdown((0.1, 0.1), [(0.1, 0.1)] * 3) == pytest.approx(1.2)
    with pytest.raises(ValueError):
        ContentionModel(overhead=-1)


def test_kernel_alone_takes_its_work_and_usage_is_its_demand():
    clock = SharedClock(ContentionModel(overhead=0.0))
    took = clock.kernel(0.05, compute=0.6, bandwidth=0.3, job="a")
    assert 0.05 <= took < 0.08
    u = clock.usage("a")
    assert u["kernels"] == 1 and u["work"] == pytest.approx(0.05, rel=0.05)
    assert u["compute"] / u["active"] == pytest.approx(0.6, rel=0.02)
    assert u["bandwidth"] / u["active"] == pytest.approx(0.3, rel=0.02)
    assert clock.usage("nobody")["kernels"] == 0
    assert clock.busy == pytest.approx(u["active"], rel=0.05)


def test_co_running_kernels_slow_each_other_as_stated_and_a_slower_device_is_slower():
    model = ContentionModel(overhead=0.0)
    clock = SharedClock(model)
    took = {}

    def run(name):
        took[name] = clock.kernel(0.1, compute=0.9, bandwidth=0.1, job=name)

    threads = [threading.Thread(target=run, args=(n,)) for n in "xy"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = 0.1 * model.slowdown((0.9, 0.1), [(0.9, 0.1)] * 2)  # 1 + 0.9 * 0.8 = 1.72
    for name in "xy":
        assert took[name] == pytest.approx(expected, rel=0.15)
    half = SharedClock(speed=0.5).kernel(0.03, 0.5, 0.5)
    assert half >= 0.06


def test_bad_kernels_are_refused():
    clock = SharedClock()
    with pytest.raises(ValueError, match="compute"):
        clock.kernel(0.01, compute=1.5, bandwidth=0.1)
    with pytest.raises(ValueError, match="work"):
        clock.kernel(-1, compute=0.5, bandwidth=0.1)
    with pytest.raises(TypeError):
        clock.kernel(0.01, compute="lots", bandwidth=0.1)
    with pytest.raises(ValueError):
        SharedClock(speed=0)
    assert clock.running == 0
