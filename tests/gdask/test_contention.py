"""Emulated kernels that share a device: the stated contention model and the shared clock."""

from __future__ import annotations

import threading
import time

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
    t = time.perf_counter()
    took = clock.kernel(0.05, compute=0.6, bandwidth=0.3, job="a")
    assert time.perf_counter() - t >= 0.05  # the thread waited the kernel's time
    # the device's time and usage do not depend on when the host woke the thread up
    assert took == pytest.approx(0.05, rel=1e-9)
    u = clock.usage("a")
    assert u["kernels"] == 1 and u["work"] == pytest.approx(0.05, rel=1e-9)
    assert u["active"] == pytest.approx(0.05, rel=1e-9)
    assert u["compute"] / u["active"] == pytest.approx(0.6, rel=1e-9)
    assert u["bandwidth"] / u["active"] == pytest.approx(0.3, rel=1e-9)
    assert clock.usage("nobody")["kernels"] == 0
    assert clock.busy == pytest.approx(u["active"], rel=1e-9)


def test_a_kernel_ends_on_the_device_when_its_work_is_done_whenever_its_thread_wakes_up():
    # a host too busy to wake the kernel's thread on time: the first wait returns 0.12 s after the
    # kernel's end; the kernel still took its work on the device, and the device was busy that long
    class LateWaker(SharedClock):
        def __init__(self):
            super().__init__(ContentionModel(overhead=0.0))
            self._cv = _LateCondition(self._cv, late=0.12)

    clock = LateWaker()
    took = clock.kernel(0.02, compute=0.5, bandwidth=0.5, job="a")
    assert took == pytest.approx(0.02, rel=1e-9)
    assert clock.usage("a")["active"] == pytest.approx(0.02, rel=1e-9)
    assert clock.running == 0 and clock.busy == pytest.approx(0.02, rel=1e-9)


class _LateCondition:
    """A condition whose first timed wait oversleeps by ``late`` seconds (a thread woken late)."""

    def __init__(self, cv, late):
        self._cv, self._late = cv, late

    def __enter__(self):
        return self._cv.__enter__()

    def __exit__(self, *exc):
        return self._cv.__exit__(*exc)

    def notify_all(self):
        self._cv.notify_all()

    def wait(self, timeout=None):
        if self._late:
            self._cv.wait(timeout + self._late)
            self._late = 0
            return False
        return self._cv.wait(timeout)


def test_co_running_kernels_slow_each_other_as_stated_and_a_slower_device_is_slower():
    model = ContentionModel(overhead=0.0)
    clock = SharedClock(model)
    took = {}

    # both start together (a start skew of s seconds makes both take 0.72 s less: see below)
    start = threading.Barrier(2)

    def run(name):
        start.wait(timeout=30)
        took[name] = clock.kernel(0.1, compute=0.9, bandwidth=0.1, job=name)

    threads = [threading.Thread(target=run, args=(n,)) for n in "xy"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = 0.1 * model.slowdown((0.9, 0.1), [(0.9, 0.1)] * 2)  # 1 + 0.9 * 0.8 = 1.72
    # y starting s after x: x alone for s, both for (0.1 - s) * 1.72, y alone for s: each takes
    # 0.172 - 0.72 s, the same for both
    assert took["x"] == pytest.approx(took["y"], rel=1e-9)
    for name in "xy":
        assert took[name] == pytest.approx(expected, rel=0.15)
    half = SharedClock(speed=0.5).kernel(0.03, 0.5, 0.5)
    assert half == pytest.approx(0.06, rel=1e-9)


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
