"""Pure window-cache policies: scan order, furthest-in-future, LRU, window size (no devices)."""

from __future__ import annotations

import math

import pytest

from gdask.window_cache import LRU, FurthestInFuture, ScanOrder, WindowSize, scan_order


def test_scan_order_alternates():
    keys = ["a", "b", "c"]
    assert scan_order(keys, 0) == keys
    assert scan_order(keys, 1) == ["c", "b", "a"]
    assert scan_order(keys, 2) == keys


def make_order(keys):
    o = ScanOrder()
    for k in keys:
        o.insert(k)
    return o


def test_first_pass_predicted_in_insertion_order():
    o = make_order("abcd")
    assert o.future() == list("abcdabcd")
    assert o.upcoming(2) == ["a", "b"]
    assert o.next_use("a") == 0 and o.next_use("d") == 3
    assert o.next_use("zz") == math.inf


def test_pass_boundary_and_learnt_order():
    o = make_order("abcd")
    for k in "dbca":
        assert o.observe(k) is False
    assert o.observe("d") is True  # a repeat starts a new pass
    assert o.passes_completed == 1
    assert o.last_pass == list("dbca")
    assert o.upcoming(3) == ["b", "c", "a"]
    assert o.next_use("b") == 0
    assert o.next_use("d") == 3 + 0  # rest of this pass (b, c, a), then d first in the next one


def test_alternating_scans_detected():
    o = make_order("abcd")
    for k in "abcd" + "dcba":
        o.observe(k)
    o.observe("a")  # third pass starts: forward again
    assert o.alternating
    assert o.future() == list("bcd") + list("dcba")


def test_hint_wins_and_ends_the_pass():
    o = make_order("abcd")
    for k in "abcd":
        o.observe(k)
    o.hint(["d", "x-not-here", "c", "b", "a"])
    assert o.passes_completed == 1
    assert o.upcoming(4) == list("dcba")
    # the hint is the reverse of the last pass: the pass after it is predicted forward again
    assert o.future()[4:] == list("abcd")


def test_remove_forgets_keys():
    o = make_order("abc")
    o.remove("b")
    assert o.future() == list("acac")
    with pytest.raises(ValueError, match="history"):
        ScanOrder(history=1)


def test_furthest_in_future_victims_and_before():
    o = make_order("abcdef")
    pol = FurthestInFuture(o, lookahead=2)
    resident = {"a": 10, "b": 10, "c": 10, "f": 10}
    assert pol.victims(resident, 15) == ["f", "c"]
    # a prefetch of "d" (next use 3) may only evict blocks needed after it
    assert pol.victims(resident, 100, before=o.next_use("d")) == ["f"]
    assert pol.victims(resident, 0) == []
    assert pol.prefetch(lambda k: k in resident) == []  # a and b are on the device
    o.observe("a")
    o.observe("b")
    assert pol.prefetch(lambda k: k in resident) == [("d", 1.0)]  # c next (resident), then d


def test_victims_match_a_full_sort_of_next_uses():
    """The batched, partial selection picks what sorting every block by (next use, -cost, order)
    picks, for one victim and for many, with and without ``before``."""
    import random

    rng = random.Random(0)
    for trial in range(40):
        p = FurthestInFuture(cost=lambda k, n: float(n))
        keys = [f"b{i}" for i in range(rng.randint(1, 40))]
        for k in keys:
            p.on_insert(k)
        for k in rng.sample(keys, rng.randint(0, len(keys))):  # part of a pass read
            p.on_read(k)
        if trial % 3 == 0:
            p.hint(rng.sample(keys, len(keys) // 2))  # some keys never predicted: inf
        resident = {k: rng.choice([1, 2, 2, 3]) for k in rng.sample(keys, rng.randint(1, len(keys)))}
        need = rng.randint(1, 2 * sum(resident.values()))
        before = rng.choice([None, None, float(rng.randint(0, len(keys)))])
        order = list(resident)
        ranked = sorted(((p.order.next_use(k), -float(resident[k]), -i, k) for i, k in enumerate(order)),
                        reverse=True)
        expect, got = [], 0
        for u, _, _, k in ranked:
            if got >= need:
                break
            if before is not None and not u > before:
                continue
            expect.append(k)
            got += resident[k]
        assert p.victims(resident, need, before=before) == expect
        assert p.order.next_uses(order) == [p.order.next_use(k) for k in order]


def test_furthest_in_future_prefetch_lists_missing_blocks():
    o = make_order("abcd")
    pol = FurthestInFuture(o, lookahead=3)
    assert pol.prefetch(lambda k: k == "a") == [("b", 1.0), ("c", 2.0)]
    with pytest.raises(ValueError):
        FurthestInFuture(lookahead=-1)


def test_cost_breaks_ties_among_never_needed_blocks():
    o = make_order("ab")
    pol = FurthestInFuture(o, cost=lambda k, n: {"x": 5.0, "y": 1.0}.get(k, 0.0))
    assert pol.victims({"x": 1, "y": 1}, 1) == ["y"]  # both never needed: the cheap one goes


def test_lru_victims():
    pol = LRU()
    for k in "abc":
        pol.on_insert(k)
    pol.on_read("a")
    assert pol.victims({"a": 1, "b": 1, "c": 1}, 2) == ["b", "c"]
    pol.on_remove("b")
    assert pol.victims({"a": 1, "c": 1}, 1) == ["c"]
    assert pol.prefetch(lambda k: False) == []


def test_window_size_follows_free_memory():
    ws = WindowSize(reserve=100)
    assert ws.capacity(budget=1000, used=300, held=300) == 900
    # someone else allocates 400 bytes: the window shrinks by as much
    assert ws.capacity(budget=1000, used=700, held=300) == 500
    # ... and grows back when they free it
    assert ws.capacity(budget=1000, used=300, held=300) == 900
    assert ws.capacity(budget=1000, used=300, held=300, largest=250) == 750  # one block always free
    assert WindowSize(0.1).reserve_bytes(1000) == 100
    assert ws.capacity(budget=100, used=100, held=0) == 0
    with pytest.raises(ValueError, match="reserve"):
        WindowSize(-1)


def simulate(policy, n, capacity, passes, reverse_odd=False):
    """Cyclic reads of n unit blocks with a device of ``capacity`` blocks; prefetch counts as a
    copy. Returns (hits, copies)."""
    resident: dict[int, int] = {}
    for k in range(n):
        policy.on_insert(k)
        if len(resident) < capacity:
            resident[k] = 1
    hits = copies = 0
    for p in range(passes):
        order = list(range(n))[::-1] if reverse_odd and p % 2 else list(range(n))
        for k in order:
            policy.on_read(k)
            if k in resident:
                hits += 1
            else:
                copies += 1
                if len(resident) >= capacity:
                    for v in policy.victims(resident, 1):
                        del resident[v]
                resident[k] = 1
            for t, nu in policy.prefetch(lambda key: key in resident):
                if len(resident) >= capacity:
                    vs = policy.victims({r: 1 for r in resident if r != k}, 1, before=nu)
                    if not vs:
                        break
                    del resident[vs[0]]
                resident[t] = 1
                copies += 1
    return hits, copies


@pytest.mark.parametrize("reverse", [False, True])
def test_window_reaches_capacity_over_data_where_lru_gets_nothing(reverse):
    n, cap, passes = 40, 20, 10
    hits, copies = simulate(FurthestInFuture(lookahead=2), n, cap, passes, reverse_odd=reverse)
    lru_hits, lru_copies = simulate(LRU(), n, cap, passes)
    assert hits / (n * passes) >= 0.4  # ideal cap / n = 0.5, minus the prefetch slots
    assert copies <= 0.6 * n * passes
    # LRU hits only the blocks left on the device by their creation, in the first pass
    assert lru_hits == cap and lru_copies == n * passes - cap
