"""Loops on the workers (gdask.gdataset.collective): one task per worker, all-gathers between them."""

import dataclasses
import os
import time

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

from gdask._compat import scheduler_workers
from gdask.gdataset.collective import CollectiveError, run_on_workers


def _gather_steps(comm, value, steps):
    return [comm.allgather((comm.rank, value, s)) for s in range(steps)]


def _fail_at(comm, rank, step, how):
    for s in range(step + 1):
        if comm.rank == rank and s == step:
            if how == "exit":
                os._exit(1)  # the worker process dies mid-loop
            raise ValueError("rank failed on purpose")
        comm.allgather(s)
    return "unreachable for the others: the failing rank never sends this step"


def _workers(client):
    return sorted(scheduler_workers(client))


def test_allgather_in_rank_order(client):
    peers = _workers(client)
    out = run_on_workers(client, _gather_steps, peers, [(np.arange(3) * r, 4) for r in range(len(peers))])
    assert len(out) == len(peers)
    for res in out:  # every rank saw every rank's value of every step, in rank order
        assert len(res) == 4
        for s, step in enumerate(res):
            assert [v[0] for v in step] == list(range(len(peers)))
            assert [v[2] for v in step] == [s] * len(peers)
            for r, v in enumerate(step):
                np.testing.assert_array_equal(v[1], np.arange(3) * r)


def test_a_failing_rank_stops_the_others_at_once(client):
    peers = _workers(client)
    t0 = time.monotonic()
    with dask.config.set({"gdask.collective.timeout": 120}):
        with pytest.raises(CollectiveError, match="rank failed on purpose"):
            run_on_workers(client, _fail_at, peers, [(1, 2, "raise")] * len(peers))
    # the others were waiting for the failing rank's step 2: the abort, not the 120 s timeout, ended them
    assert time.monotonic() - t0 < 60
    # and the workers are free again
    assert run_on_workers(client, _gather_steps, peers, [(r, 1) for r in range(len(peers))])[0][0][1] == (1, 1, 0)


def test_a_rank_that_cannot_start_ends_the_loop(client):
    addr = _workers(client)[0]  # two ranks on one worker that runs one task at a time (one stream)
    with dask.config.set({"gdask.collective.start-timeout": 1}):
        with pytest.raises(CollectiveError, match="within 1 s"):
            run_on_workers(client, _gather_steps, [addr, addr], [(0, 1), (1, 1)])


def test_plain_cluster_and_a_lost_worker():
    """A distributed.LocalCluster without gdask's worker plugins; a worker process dying mid-loop."""
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster) as c:
        peers = _workers(c)
        res = run_on_workers(c, _gather_steps, peers, [("a", 2), ("b", 2)])
        assert [v[1] for v in res[1][1]] == ["a", "b"]
        t0 = time.monotonic()
        with dask.config.set({"gdask.collective.timeout": 120}):
            with pytest.raises(CollectiveError):
                run_on_workers(c, _fail_at, peers, [(1, 1, "exit")] * 2)
        assert time.monotonic() - t0 < 60


def test_several_ranks_in_one_process():
    """Ranks that share a process (a worker with several threads, workers with processes=False) each
    get their own messages and end on their own."""
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        a, b = _workers(c)
        peers = [a, b, a, b]
        for _ in range(3):  # again and again: a rank that ends first must not take the others' messages
            out = run_on_workers(c, _gather_steps, peers, [(r, 5) for r in range(4)])
            for res in out:
                assert [[v[1] for v in step] for step in res] == [[0, 1, 2, 3]] * 5
        with pytest.raises(CollectiveError, match="rank failed on purpose"):
            run_on_workers(c, _fail_at, peers, [(2, 1, "raise")] * 4)


def test_a_step_whose_values_all_came_completes_in_a_stopped_loop():
    """A rank slow to wake after the loop was stopped (a peer died after sending its values) still
    completes the step it has every value of, so it can checkpoint it; the next step stops. Before, it
    raised at once and the fit resumed an iteration earlier than its survivors could have given."""
    from types import SimpleNamespace

    from gdask.gdataset.collective._worker import Communicator, Mailbox

    comm = object.__new__(Communicator)
    comm.token, comm.rank, comm.peers, comm.size, comm.timeout, comm._step = "loop", 0, ["w", "w"], 2, 5.0, 0
    comm.worker, comm.mailbox = SimpleNamespace(address="w"), Mailbox()
    comm.mailbox.deliver("loop", 0, 0, 1, "from rank 1")  # rank 1's value of step 0 came, then rank 1 died
    comm.mailbox.abort("loop", "lost a worker")
    assert comm.allgather("from rank 0") == ["from rank 0", "from rank 1"]
    with pytest.raises(CollectiveError, match="lost a worker"):
        comm.allgather("step 1")


@dataclasses.dataclass
class _Box:
    value: object


def _sum_args(comm, direct, boxed):
    return float(np.sum(direct[0])) + float(np.sum(boxed.value))


def test_futures_and_collections_in_the_arguments_arrive_computed(client):
    peers = _workers(client)
    fut = client.scatter(np.arange(4.0), broadcast=True)  # in a list: the task is submitted as it is
    lazy = dask.delayed(np.ones)(3)  # a collection inside a dataclass: dask.delayed computes it first
    out = run_on_workers(client, _sum_args, peers, [([fut], _Box(lazy))] * len(peers))
    assert out == [9.0] * len(peers)
    boxed_future = run_on_workers(client, _sum_args, peers, [([np.zeros(1)], _Box(fut))] * len(peers))
    assert boxed_future == [6.0] * len(peers)  # a future inside a dataclass too


# -- the worker's profiler pauses while ranks run ----------------------------------------------------------------
_PROFILER = ("profile", "profile-cycle")


def _profiler_stopped_within(comm, wait):
    """(a rank) Whether the worker's profiler stopped within ``wait`` s; every rank looks before any ends."""
    pcs = [comm.worker.periodic_callbacks[k] for k in _PROFILER]
    deadline = time.monotonic() + wait
    while any(pc.is_running() for pc in pcs) and time.monotonic() < deadline:
        time.sleep(0.01)
    stopped = not any(pc.is_running() for pc in pcs)
    comm.allgather(stopped)
    return stopped


def _profiler_running(dask_worker=None):
    return all(dask_worker.periodic_callbacks[k].is_running() for k in _PROFILER)


def _all_running_within(client, wait):
    deadline = time.monotonic() + wait
    while not all(client.run(_profiler_running).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return all(client.run(_profiler_running).values())


def test_the_profiler_pauses_while_ranks_run(client):
    peers = _workers(client)
    assert _all_running_within(client, 10)  # distributed's default: the workers sample their threads
    assert run_on_workers(client, _profiler_stopped_within, peers, [(10,)] * len(peers)) == [True] * len(peers)
    assert _all_running_within(client, 10)  # and sample again after the loop
    with dask.config.set({"gdask.collective.pause-profiler": False}):
        assert run_on_workers(client, _profiler_stopped_within, peers, [(1,)] * len(peers)) == [False] * len(peers)


class _PC:
    def __init__(self, running=True):
        self.running = running

    def is_running(self):
        return self.running

    def stop(self):
        self.running = False

    def start(self):
        self.running = True


class _Loop:
    """An event loop whose callbacks run when the test says so."""

    def __init__(self):
        self.queued = []

    def add_callback(self, f, *args):
        self.queued.append((f, args))

    def run(self):
        queued, self.queued = self.queued, []
        for f, args in queued:
            f(*args)


def _stub_worker(**running):
    from types import SimpleNamespace

    from distributed.core import Status

    pcs = {k: _PC(running.get(k.replace("-", "_"), True)) for k in (*_PROFILER, "heartbeat")}
    return SimpleNamespace(loop=_Loop(), periodic_callbacks=pcs, status=Status.running)


def _states(w):
    return {k: pc.running for k, pc in w.periodic_callbacks.items()}


def test_the_profiler_pause_counts_the_ranks_and_keeps_what_it_did_not_stop():
    from distributed.core import Status

    from gdask.gdataset.collective._worker import CollectivePlugin

    on, off = {"profile": True, "profile-cycle": True, "heartbeat": True}, {"profile": False, "profile-cycle": False,
                                                                            "heartbeat": True}
    p, w = CollectivePlugin(), _stub_worker()
    p.rank_started(w)
    w.loop.run()
    assert _states(w) == off and p.profiler_paused
    p.rank_started(w)  # a second rank on this worker, which outlives the first
    p.rank_finished(w)
    w.loop.run()
    assert _states(w) == off
    p.rank_finished(w)
    w.loop.run()
    assert _states(w) == on and not p.profiler_paused

    # a rank that ends before the event loop pauses anything: nothing stays stopped
    p.rank_started(w)
    p.rank_finished(w)
    w.loop.run()
    assert _states(w) == on

    # the last rank ends and a new one starts before the event loop resumes: the pause holds
    p.rank_started(w)
    w.loop.run()
    p.rank_finished(w)
    p.rank_started(w)
    w.loop.run()
    assert _states(w) == off
    p.rank_finished(w)
    w.loop.run()
    assert _states(w) == on

    # what was stopped before (the user's choice) is not started; a closing worker's stay stopped
    p, w = CollectivePlugin(), _stub_worker(profile_cycle=False)
    p.rank_started(w)
    w.loop.run()
    p.rank_finished(w)
    w.loop.run()
    assert _states(w) == {"profile": True, "profile-cycle": False, "heartbeat": True}
    p.rank_started(w)
    w.loop.run()
    w.status = Status.closing
    p.rank_finished(w)
    w.loop.run()
    assert _states(w) == {"profile": False, "profile-cycle": False, "heartbeat": True}
