"""The window store's pure bookkeeping, alone: per-job quota (``JobQuota``) and pins (``Pins``)."""

from __future__ import annotations

import doctest

import gdask.window_cache._pins as pins_module
import gdask.window_cache._quota as quota_module
from gdask.window_cache import JobQuota, Pins


def test_quota_counts_bytes_per_job_and_what_is_over():
    q = JobQuota()
    q.add(None, 10)  # blocks of no job are not counted
    assert q.resident == {} and q.over(None) == 0
    q.add("A", 30)
    q.add("A", 30)
    assert q.usage("A") == 60 and q.over("A") == 0  # no request: never over
    q.set_limit("A", 40)
    assert q.over("A") == 20
    q.remove("A", 30)
    assert q.usage("A") == 30 and q.over("A") == 0
    q.remove("A", 30)
    assert q.usage("A") == 0 and "A" not in q.resident
    q.set_limit("A", None)
    assert q.limits == {} and q.over("A") == 0


def test_quota_protects_jobs_within_their_request_from_others_only():
    q = JobQuota()
    q.set_limit("A", 100)
    q.set_limit("B", 10)
    q.add("A", 50)
    q.add("B", 20)  # B is over its request: not protected
    assert q.protected(None) == {"A"} and q.protected("A") == set() and q.protected("B") == {"A"}
    q.add("A", 60)  # A goes over too
    assert q.protected(None) == set()


def test_quota_records_spills_and_describes_itself():
    q = JobQuota()
    q.record_spill(None, 5)
    q.record_spill("A", 1024)
    q.record_spill("A", 1024)
    assert q.spilled == {"A": 2048}
    q.set_limit("A", 2 * 2**20)
    q.add("A", 2**20)
    q.add("C", 2**20)  # no request: not described
    assert q.describe() == "job 'A' 1.00 MiB (request 2.00 MiB)"


def test_pins_count_per_key_over_tasks_and_release_once():
    p = Pins()
    assert p.take("t1", ["a", "b", "a"]) and p.inputs("t1") == ("a", "b")
    assert not p.take("t1", ["c"])  # a task pins once
    assert p.take("t2", ["b", "c"])
    assert (p.count("a"), p.count("b"), p.count("c"), len(p)) == (1, 2, 1, 2)
    assert p.release("t1") == ("a", "b") and p.release("t1") == ()
    assert (p.count("a"), p.count("b"), p.tasks()) == (0, 1, ["t2"])
    p.release("t2")
    assert len(p) == 0 and p.count("b") == 0 and p.inputs("t2") is None


def test_the_docstring_examples_hold():
    for module in (quota_module, pins_module):
        assert doctest.testmod(module).failed == 0
