"""The engine's pure parts, without a cluster: the mode choice (``_plan.plan``), where blocks are
(``locality.BlockPlaces``), the fit's records (``_records.Records``) and the decisions after a failed
attempt (``_run._after_failure``); and ``run_loop(share=)`` on a cluster."""

import dataclasses
import logging

import dask
import numpy as np
import pytest
from distributed.scheduler import KilledWorker

import gdask
from gdask import protocol
from gdask.gdataset import BlockPlaces, CollectiveError, IterativeAlgorithm, Progress, groups_of, run_loop
from gdask.gdataset.engine import _plan, _records, _run

PLACES = BlockPlaces({0: "w1", 1: "w2", 2: "w1", 3: "w2"}, {"w1": 2, "w2": 1})
MODES_ALL = ("workers", "client", "stream")


def test_block_places_group_each_workers_blocks_by_thread():
    assert PLACES.groups(4) == [[0], [2], [1, 3]]
    assert PLACES.groups(5) is None  # a block is held by no worker
    assert groups_of(PLACES.as_tuple(), 4) == groups_of(PLACES, 4) == PLACES.groups(4)
    assert groups_of(None, 4) is None


def test_a_block_several_workers_hold_goes_where_it_balances():
    from gdask.gdataset.locality import _one_holder

    a, b = "tcp://a", "tcp://b"
    # a reduction fetched blocks 0, 2, 4, 6 to b: the first holder of each put 6 of 8 on a
    held = {i: ([a] if i % 2 == 0 else [b]) for i in range(8)}
    held.update({i: [a, b] for i in (0, 2, 4, 6)})
    got = _one_holder(held, [10] * 8, {a: 1, b: 1})
    assert sorted(got) == list(range(8)) and {i: got[i] for i in (1, 3, 5, 7)} == {i: b for i in (1, 3, 5, 7)}
    assert sorted(list(got.values()).count(w) for w in (a, b)) == [4, 4]
    # by rows per thread: b's two threads take twice a's rows; a short last block counts less
    held = {i: [a, b] for i in range(6)}
    got = _one_holder(held, [10, 10, 10, 10, 10, 1], {a: 1, b: 2})
    rows = {w: sum([10, 10, 10, 10, 10, 1][i] for i, x in got.items() if x == w) for w in (a, b)}
    assert rows == {a: 20, b: 31}, got


def test_blocks_another_worker_fetched_keep_the_ranks_even(client):
    """Blocks a task elsewhere fetched are held twice (a reduction's, e.g. K-means' variance pass
    right after persist): one holder each, half the blocks on each worker (the first holder of each
    put every block on one worker here)."""
    from distributed import futures_of

    from gdask.gdataset import block_places

    X = gdask.from_array(np.random.default_rng(0).random((8_000, 3)), block_rows=1_000).persist()
    places = block_places(X, client, wait_ready=True)
    later = max(places.workers.values())
    futures = futures_of(X)
    client.replicate([futures[i] for i, w in places.workers.items() if w == later], n=2)
    who = client.who_has(futures)
    assert sum(len(v) == 2 for v in who.values()) == list(places.workers.values()).count(later) > 0
    again = block_places(X, client)
    assert sorted(list(again.workers.values()).count(w) for w in set(again.workers.values())) == [
        min(list(places.workers.values()).count(w) for w in set(places.workers.values())),
        max(list(places.workers.values()).count(w) for w in set(places.workers.values()))]
    assert again.workers == places.workers  # each block on the worker it was placed on


def _situation(**kw):
    base = dict(has_client=True, has_data=True, nblocks=4, streaming=False, places=PLACES, worker_loop=True)
    return _plan.Situation(**{**base, **kw})


@pytest.mark.parametrize("modes, kw, mode", [
    (("workers", "client", "stream"), {}, "workers"),
    (("workers", "client", "stream"), dict(worker_loop=False), "client"),
    (("workers", "client", "stream"), dict(places=None), "client"),  # blocks not all in cluster memory
    (("workers", "client", "stream"), dict(streaming=True, places=None), "stream"),
    (("workers", "client"), dict(streaming=True, places=None), "client"),
    (("workers",), dict(worker_loop=False, streaming=True), "workers"),  # workers-only: ignores both
    (("client",), {}, "client"),
    (("workers", "client", "stream"), dict(has_client=False, places=None), "client"),
    (("workers",), dict(has_client=False, places=None), "local"),
])
def test_the_mode_choice(modes, kw, mode):
    p = _plan.plan("algo", modes, _situation(**kw))
    assert p.mode == mode
    assert p.workers_only == (modes == ("workers",)) and p.streaming == _situation(**kw).streaming
    assert p.groups == (None if p.places is None else p.places.groups(4))


def test_a_forced_mode_and_the_errors_of_a_loop_that_must_run_on_the_workers():
    assert _plan.plan("algo", MODES_ALL, _situation(), mode="client").mode == "client"
    with pytest.raises(ValueError, match="needs its blocks in cluster memory"):
        _plan.plan("algo", ("workers",), _situation(places=None))
    with pytest.raises(ValueError, match="needs a GDataSet in data"):
        _plan.plan("algo", ("workers",), _situation(has_client=False, has_data=False, places=None))


def test_records_keep_every_iteration_once_in_order():
    got = []
    records = _records.Records("s0", Progress(callback=got.append))
    assert records.resume == _records.Resume(0, "s0")
    records.newer(1, "s1", {"iteration": 1, "mode": "workers"})
    records.newer(1, "s1-again", {"iteration": 1, "mode": "workers"})  # a repeated event: dropped
    records.fill(3, "s3")  # iterations 2 and 3 never came back: recorded with the driver's state
    assert [r["iteration"] for r in records.history] == [1, 2, 3] == [r["iteration"] for r in got]
    assert records.resume == _records.Resume(3, "s3")


def test_records_without_states_move_progress_not_the_resume_point():
    got = []
    records = _records.Records("s0", Progress(callback=got.append))
    records.newer(1, "s1", {"iteration": 1, "loss": 1.0})
    records.newer(2, None, {"iteration": 2, "loss": 0.5})  # a record whose state stayed on the workers
    records.newer(3, None, {"iteration": 3, "loss": 0.25})
    assert [r["iteration"] for r in got] == [1, 2, 3]
    assert records.resume == _records.Resume(1, "s1")  # the newest state the client has
    records.newer(3, "s3", {"iteration": 3, "loss": 0.25})  # a survivor's state for iteration 3
    assert records.resume == _records.Resume(3, "s3") and len(records.history) == 3
    # a loop resumed from an older state repeats iterations already recorded: their records are not repeated
    records("s2", {"iteration": 2, "loss": 0.5})
    records("s3", {"iteration": 3, "loss": 0.25})
    records("s4", {"iteration": 4, "loss": 0.125})
    assert [r["iteration"] for r in records.history] == [1, 2, 3, 4] == [r["iteration"] for r in got]
    assert records.resume == _records.Resume(4, "s4")
    records.fill_history(6)  # records lost with a worker: filled in, the resume point stays
    assert [r["iteration"] for r in records.history] == [1, 2, 3, 4, 5, 6]
    assert records.resume == _records.Resume(4, "s4")


class _Algo(IterativeAlgorithm):
    name = "algo"

    def __init__(self, modes):
        self.modes = modes


@dataclasses.dataclass(frozen=True)
class _FitWithoutCluster(_run._Fit):
    """Where the blocks are after a failure: given, not asked from a cluster."""

    places_now: BlockPlaces | None = PLACES

    def where_now(self):
        return self.places_now, None if self.places_now is None else self.places_now.groups(4)


def _fit(modes, client=object(), max_restarts=2, places=PLACES):
    datasets = {"X": gdask.from_array(np.zeros((8, 2)), block_rows=2)}
    return _FitWithoutCluster(_Algo(modes), datasets, client, "token", _records.Records(None, Progress()),
                              _plan.plan("algo", modes, _situation()), max_restarts, places)


def _lost_peer():
    try:
        raise CollectiveError("a peer left") from KilledWorker("task", "w2", 3)
    except CollectiveError as e:
        return e


def test_after_a_failed_loop_on_the_workers(caplog):
    attempt = _run.Attempt("workers", PLACES, PLACES.groups(4))
    with caplog.at_level(logging.WARNING, logger="gdask.gdataset"):
        nxt = _run._after_failure(_fit(MODES_ALL), attempt, _lost_peer())
    assert (nxt.mode, nxt.restarts) == ("client", 1) and "resuming from the client at iteration 0" in caplog.text
    nxt = _run._after_failure(_fit(("workers",)), attempt, _lost_peer())
    assert (nxt.mode, nxt.restarts, nxt.groups) == ("workers", 1, PLACES.groups(4))
    with pytest.raises(CollectiveError, match="failed 3 times"):  # max-restarts 2: the third failure ends it
        _run._after_failure(_fit(("workers",)), dataclasses.replace(attempt, restarts=2), _lost_peer())
    with pytest.raises(CollectiveError, match="not all in cluster memory"):
        _run._after_failure(_fit(("workers",), places=None), attempt, _lost_peer())
    try:
        raise CollectiveError("rank 0 raised") from ValueError("a bug")
    except CollectiveError as e:
        own = e
    with pytest.raises(ValueError, match="a bug"):  # the driver's own error: not run again
        _run._after_failure(_fit(("workers",)), attempt, own)


def test_after_a_pass_from_the_client_lost_its_work():
    lost = KilledWorker("task", "w2", 3)
    for mode in ("client", "stream"):
        nxt = _run._after_failure(_fit(MODES_ALL), _run.Attempt(mode, None, None, 1), lost)
        assert (nxt.mode, nxt.restarts) == (mode, 2)
        assert nxt.groups == (PLACES.groups(4) if mode == "client" else None)  # the client regroups
    with pytest.raises(KilledWorker):
        _run._after_failure(_fit(MODES_ALL), _run.Attempt("client", None, None, 2), lost)
    with pytest.raises(KilledWorker):  # without a Client nothing comes back from lineage
        _run._after_failure(_fit(MODES_ALL, client=None), _run.Attempt("client", None, None), lost)
    with pytest.raises(KilledWorker):  # the loop on the workers reports lost work as CollectiveError only
        _run._after_failure(_fit(MODES_ALL), _run.Attempt("workers", PLACES, PLACES.groups(4)), lost)
    with pytest.raises(CollectiveError):  # a driver's CollectiveError from the client is its own
        _run._after_failure(_fit(MODES_ALL), _run.Attempt("client", None, None), _lost_peer())


class _JobOfTheLoop(IterativeAlgorithm):
    """One client-mode iteration that records the job its passes are annotated with."""

    name = "job-of-the-loop"
    modes = ("client",)

    def run(self, state, ctx):
        ctx.map(np.sum, ctx.data["X"])
        ctx.checkpoint(state, job=dask.get_annotations().get(protocol.ANN_JOB))
        return state


def test_run_loop_with_a_share_runs_inside_a_job(client):
    X = gdask.from_array(np.ones((64, 2)), block_rows=16)
    share = gdask.gdataset.DeviceShare(gpu=0.5, name="loop-share-test")
    res = run_loop(_JobOfTheLoop(), {"X": X}, 0, share=share)
    assert res.history[0]["job"] == "loop-share-test"
    assert run_loop(_JobOfTheLoop(), {"X": X}, 0).history[0]["job"] is None
