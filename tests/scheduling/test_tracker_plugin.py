"""The execution log on the scheduler (``gdask.scheduling.ExecutionLogPlugin``): what it records, what a
pop returns and forgets, and its handler's answer (pairs: tuple keys survive the message)."""

import asyncio
from types import SimpleNamespace

import pytest

from gdask import protocol
from gdask.scheduling import ExecutionLogPlugin


def _log(limit=500_000):
    plugin = ExecutionLogPlugin(limit=limit)
    scheduler = SimpleNamespace(handlers={}, tasks={
        ("x", 0): SimpleNamespace(state="memory", nbytes=80),
        ("x", 1): SimpleNamespace(state="memory", nbytes=-1),  # size unknown
        ("x", 2): SimpleNamespace(state="released", nbytes=80),
    })
    asyncio.run(plugin.start(scheduler))
    return plugin, scheduler


def test_records_computed_tasks_only_and_pops_them_once():
    plugin, _ = _log()
    plugin.transition(("x", 0), "processing", "memory", nbytes=80)
    plugin.transition(("x", 1), "waiting", "processing")
    plugin.transition(("x", 2), "released", "memory", nbytes=8)  # not computed here (e.g. scattered)
    assert plugin.pop([("x", 0), ("x", 9)]) == {("x", 0): 80}
    assert plugin.pop() == {}


def test_the_handler_answers_popped_records_and_sizes_in_memory_as_pairs():
    plugin, scheduler = _log()
    plugin.transition("a", "processing", "memory", nbytes=5)
    plugin.transition(("x", 0), "processing", "memory")
    handler = scheduler.handlers[protocol.HANDLER_EXECUTION_LOG]
    done, mem = handler(keys=None, sizes=[("x", 0), ("x", 1), ("x", 2), ("y", 0)])
    assert dict(done) == {"a": 5, ("x", 0): 0} and dict(mem) == {("x", 0): 80, ("x", 1): 0}
    assert handler(keys=["a"], sizes=()) == ([], [])


def test_the_log_is_bounded():
    plugin, _ = _log(limit=4)
    for i in range(5):
        plugin.transition(i, "processing", "memory", nbytes=i)
    assert plugin.pop() == {2: 2, 3: 3, 4: 4}  # beyond the limit the oldest half went
    with pytest.raises(ValueError, match="at least 2"):
        ExecutionLogPlugin(limit=1)
