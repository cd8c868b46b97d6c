"""A Ctrl-C during a fit is never lost, also when its exception is raised (and dropped by Python)
inside a finaliser, e.g. while the garbage collector releases a distributed future."""

from __future__ import annotations

import gc
import signal
import threading

import numpy as np
import pytest

from gdask.gdataset import Progress
from gdask.gdataset.engine import Interrupts
from gdask.gdataset.engine._records import Records
from gdask.ml import KMeans

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the lost ones


class _CtrlCInFinaliser:
    """Its finaliser receives a SIGINT: Python prints "Exception ignored in ..." and goes on."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)


def _swallowed_ctrl_c() -> None:
    _CtrlCInFinaliser()  # dropped at once
    gc.collect()


def test_without_the_guard_python_loses_the_interrupt():
    _swallowed_ctrl_c()  # what the guard is for: nothing raised here


def test_a_lost_interrupt_is_raised_when_the_guarded_work_ends():
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), Interrupts():
        _swallowed_ctrl_c()
    assert signal.getsignal(signal.SIGINT) is handler  # put back


def test_a_lost_interrupt_ends_a_fit_at_its_next_checkpoint():
    with Interrupts() as interrupts:
        records = Records(None, Progress(verbose=0), interrupts)
        records(None, {"iteration": 1})
        _swallowed_ctrl_c()
        with pytest.raises(KeyboardInterrupt, match="lost in a finaliser"):
            records(None, {"iteration": 2})
        assert [r["iteration"] for r in records.history] == [1, 2]
        records(None, {"iteration": 3})  # raised once
        records.poll()


def test_an_interrupt_raised_normally_is_raised_once():
    with pytest.raises(KeyboardInterrupt), Interrupts() as interrupts:
        try:
            signal.raise_signal(signal.SIGINT)
        finally:
            assert interrupts.pending  # noted, and on its way up
    with Interrupts() as interrupts:  # a new fit starts clean
        interrupts.check()


def test_guards_nest_and_a_thread_that_is_not_main_changes_nothing():
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), Interrupts():
        with pytest.raises(KeyboardInterrupt), Interrupts():
            _swallowed_ctrl_c()
    assert signal.getsignal(signal.SIGINT) is handler
    seen = []

    def in_thread():  # signals reach the main thread only: a guard here installs nothing
        with Interrupts():
            seen.append(signal.getsignal(signal.SIGINT))
    t = threading.Thread(target=in_thread)
    t.start()
    t.join(10)
    assert seen == [handler]


def test_a_kmeans_fit_stops_at_the_checkpoint_after_a_lost_interrupt(monkeypatch):
    X = np.random.default_rng(0).random((2000, 4))
    seen = []
    update = Progress.update

    def update_and_lose_a_ctrl_c(self, record):
        seen.append(record["iteration"])
        update(self, record)
        if record["iteration"] == 3:
            _swallowed_ctrl_c()

    monkeypatch.setattr(Progress, "update", update_and_lose_a_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        KMeans(5, init=X[:5], max_iter=300, tol=0, algorithm="lloyd").fit(X)
    assert seen == [1, 2, 3]
