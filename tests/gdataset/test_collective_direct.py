"""Direct connections between the tasks of a loop on the workers of one host
(gdask.gdataset.collective._direct): the values, the stops, the deadlines, the fallback."""

import ctypes
import gc
import socket
import threading
import time

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

from gdask._compat import scheduler_workers
from gdask.devices import BufferPool
from gdask.gdataset.collective import CollectiveError, _direct, run_on_workers
from gdask.gdataset.collective._worker import Communicator, Mailbox


def _mesh(n):
    """``n`` connected :class:`_direct.Direct` s (one per rank) over socket pairs, in one process."""
    socks = [{} for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            sa, sb = socket.socketpair()
            socks[a][b], socks[b][a] = sa, sb
    return [_direct.Direct(r, socks[r]) for r in range(n)]


def _comm(token, rank, size, direct, box):
    comm = object.__new__(Communicator)
    comm.token, comm.rank, comm.peers, comm.size, comm.timeout, comm._step = token, rank, ["w"] * size, size, 30.0, 0
    comm.mailbox, comm.direct, comm._waker = box, direct, _direct.Waker()
    box.add_waker(token, comm._waker)
    return comm


def _run_ranks(comms, body):
    out, errors = [None] * len(comms), [None] * len(comms)

    def run(r):
        try:
            out[r] = body(comms[r])
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(comms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank is still waiting"
    return out, errors


def test_values_in_rank_order_large_and_small():
    """Values larger than a socket's buffer go both ways at once (no rank blocks in a send while its
    peer does too), and every rank gets every rank's value of every step, in rank order."""
    box = Mailbox()
    comms = [_comm("loop", r, 3, d, box) for r, d in enumerate(_mesh(3))]
    big = [np.arange(60_000, dtype=np.float64) * (r + 1) for r in range(3)]  # 480 kB each: direct still

    def body(comm):
        steps = []
        for s in range(4):
            value = {"rank": comm.rank, "step": s, "data": big[comm.rank] if s % 2 else comm.rank * 10}
            steps.append(comm.allgather(value))
        return steps

    out, errors = _run_ranks(comms, body)
    assert errors == [None] * 3
    for steps in out:
        for s, got in enumerate(steps):
            assert [v["rank"] for v in got] == [0, 1, 2]
            assert [v["step"] for v in got] == [s] * 3
            for r, v in enumerate(got):
                if s % 2:
                    np.testing.assert_array_equal(v["data"], big[r])
                else:
                    assert v["data"] == r * 10


def test_a_stop_wakes_a_waiting_rank():
    box = Mailbox()
    comms = [_comm("loop", r, 2, d, box) for r, d in enumerate(_mesh(2))]
    threading.Timer(0.3, box.abort, args=("loop", "stopped by the test")).start()
    t0 = time.monotonic()
    with pytest.raises(CollectiveError, match="loop stopped: stopped by the test"):
        comms[0].allgather("rank 1 never sends this")
    assert time.monotonic() - t0 < 10


def test_a_step_whose_values_came_completes_after_a_stop():
    """As on distributed's path: the peer sent its value and died, the loop was stopped; the step
    completes (its state can be kept), the next one stops."""
    box = Mailbox()
    d0, d1 = _mesh(2)
    comms = [_comm("loop", r, 2, d, box) for r, d in enumerate((d0, d1))]
    ended = []

    def rank1():
        try:
            comms[1].allgather("from rank 1")
        except CollectiveError as e:  # the stop reaches it too, while it waits for rank 0
            ended.append(e)

    sender = threading.Thread(target=rank1)
    sender.start()
    # rank 1 has sent (it now waits for rank 0's value); stop the loop before rank 0 looks
    time.sleep(0.2)
    box.abort("loop", "lost a worker")
    assert comms[0].allgather("from rank 0") == ["from rank 0", "from rank 1"]
    sender.join(10)
    assert not sender.is_alive()
    with pytest.raises(CollectiveError, match="lost a worker"):
        comms[0].allgather("step 1")


def test_a_missing_rank_is_named_at_the_deadline():
    box = Mailbox()
    comms = [_comm("loop", r, 3, d, box) for r, d in enumerate(_mesh(3))]
    out, errors = _run_ranks(comms[:2], lambda c: c.allgather(c.rank, timeout=0.5))
    for e in errors:
        assert isinstance(e, CollectiveError)
        assert "no value from rank(s) [2] of 3 within 0.5 s (step 0)" in str(e)


def test_a_closed_peer_ends_the_step():
    box = Mailbox()
    d0, d1 = _mesh(2)
    comm = _comm("loop", 0, 2, d0, box)
    d1.close()  # the peer's process died
    with pytest.raises(CollectiveError, match="lost the connection to rank 1"):
        comm.allgather("rank 1 is gone")


def test_a_cancelled_task_tells_its_peers_that_nobody_resumes_the_loop():
    """The client left: the task that hears it first (its release) tells the others over the socket,
    so they drop their state too, although their own release may come later (or, for a task that
    already stopped, never reach it as a cancellation)."""
    box0, box1 = Mailbox(), Mailbox()  # two workers
    d0, d1 = _mesh(2)
    comm0, comm1 = _comm("loop", 0, 2, d0, box0), _comm("loop", 1, 2, d1, box1)
    box0.cancel_loop("loop", "its task 'kmeans-0' was cancelled")
    assert comm0.cancelled and not comm1.cancelled
    comm0.close()  # rank 0's task ends
    with pytest.raises(CollectiveError, match="rank 0: its task was cancelled"):
        comm1.allgather("rank 0 is gone")
    assert comm1.cancelled


def test_a_peer_cancelled_after_its_value_came_is_cancelled_not_lost():
    """Rank 0 sent its value of the step, then its task was cancelled and it closed: rank 1 gets the
    value, fails to send its own, and still learns that the loop was cancelled."""
    box0, box1 = Mailbox(), Mailbox()
    d0, d1 = _mesh(2)
    comm0, comm1 = _comm("loop", 0, 2, d0, box0), _comm("loop", 1, 2, d1, box1)
    big = np.zeros(40_000)  # 320 kB: more than the socket takes at once, so rank 1's send meets the closed peer
    comm0.direct.socks[1].setblocking(True)
    comm0.direct.socks[1].sendall(b"".join(bytes(f) for f in _parts(0, _direct.frames("from rank 0"))))
    box0.cancel_loop("loop", "its task 'kmeans-0' was cancelled")
    comm0.close()
    with pytest.raises(CollectiveError, match="rank 0: its task was cancelled"):
        comm1.allgather(big)
    assert comm1.cancelled


def _parts(step, frames):
    return _direct._Out(step, frames).parts


def test_a_stopped_loop_whose_task_is_then_cancelled_counts_as_cancelled():
    box = Mailbox()
    box.started("kmeans-1", "loop")
    box.abort("loop", "rank 0 raised")
    box.cancel("kmeans-1")
    assert "loop" in box.cancelled and box.aborted["loop"] == "rank 0 raised"


def test_same_host():
    assert _direct.same_host(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"])
    assert not _direct.same_host(["tcp://127.0.0.1:1", "tcp://127.0.0.1:1"])  # two ranks on one worker
    assert not _direct.same_host(["tcp://10.0.0.1:1", "tcp://10.0.0.2:1"])
    assert not _direct.same_host(["inproc://10.0.0.1/1/1", "inproc://10.0.0.1/1/2"])
    assert not _direct.same_host(["tls://127.0.0.1:1", "tls://127.0.0.1:2"])


def _transport(comm, steps):
    got = [comm.allgather(comm.rank * 2 + s) for s in range(steps)]
    # a value over _DIRECT_MAX goes by distributed's RPC (the socket says so), a small one in the same step directly
    big = comm.allgather(np.full(300_000, comm.rank, np.float64) if comm.rank == 0 else comm.rank)
    assert big[0].shape == (300_000,) and (big[0] == 0).all() and big[1:] == list(range(1, comm.size))
    return comm.direct is not None, got


def test_loops_on_one_host_connect_directly_unless_configured_off():
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster) as c:
        peers = sorted(scheduler_workers(c))
        for direct in (True, False):
            with dask.config.set({"gdask.collective.direct": direct}):
                out = run_on_workers(c, _transport, peers, [(3,)] * 2)
            for used, got in out:
                assert used is direct
                assert got == [[0, 2], [1, 3], [2, 4]]
        # messages by RPC of a loop whose 2.4 MB value goes directly, then of one where it is over the limit
        sent = []
        for lower in (False, True):
            if lower:
                c.run(_lower_direct_max)
            before = c.run(_rpc_sends)
            out = run_on_workers(c, _transport, peers, [(3,)] * 2)
            assert [used for used, _ in out] == [True, True] and out[0][1] == [[0, 2], [1, 3], [2, 4]]
            sent.append({a: n - before[a] for a, n in c.run(_rpc_sends).items()})
        # the same loop's start went by RPC both times; over the limit, rank 0's value did too
        assert {a: sent[1][a] - sent[0][a] for a in peers} == {peers[0]: 1, peers[1]: 0}


def _lower_direct_max(dask_worker):
    from gdask.gdataset.collective import _worker as w

    w._DIRECT_MAX = 1 << 20


def _rpc_sends(dask_worker):
    """How many messages this worker's loops have sent by RPC (counted from the first call on)."""
    from gdask.gdataset.collective import _worker as w

    cls = w.Communicator
    if not hasattr(cls, "_test_sends"):
        cls._test_sends, send = [0], cls._send

        def counted(self, *args, **kwargs):
            cls._test_sends[0] += 1
            return send(self, *args, **kwargs)

        cls._send = counted
        return 0
    return cls._test_sends[0]


def _fail_listen():
    raise OSError("no Unix sockets here")


def _patch_listen(dask_worker):
    from gdask.gdataset.collective import _direct as d

    d.listen = _fail_listen


def test_a_rank_that_cannot_listen_keeps_every_rank_on_distributed():
    """One worker cannot make its socket: every rank takes distributed's path (the same decision)."""
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster) as c:
        peers = sorted(scheduler_workers(c))
        c.run(_patch_listen, workers=[peers[1]])
        out = run_on_workers(c, _transport, peers, [(2,)] * 2)
        assert [used for used, _ in out] == [False, False]
        assert out[0][1] == [[0, 2], [1, 3]]


def _storage(lease):
    return ctypes.addressof(lease)  # where the buffer a lease was made over is


def test_receive_buffers_are_reused_only_once_nobody_holds_them():
    pool = BufferPool(min_bytes=1000, max_bytes=12_000)
    small = pool.take(999)
    assert isinstance(small, bytearray) and len(small) == 999 and pool.allocated == 0  # allocated as it comes
    a = pool.take(4000)
    view = np.frombuffer(a, np.float64)  # a value received into it, still held
    first = _storage(a)
    del a
    b = pool.take(4000)
    assert _storage(b) != first and pool.allocated == 2  # a new one: the first is in use
    del view
    gc.collect()
    c = pool.take(4000)  # the first, free again
    assert _storage(c) == first and pool.allocated == 2
    d = pool.take(8000)
    order = [_storage(c), _storage(b), _storage(d)]
    del c, b, d  # free in that order: 16,000 bytes, over 12,000: the oldest goes
    gc.collect()
    assert [b.ctypes.data for b in pool._free] == order[1:] and pool.free_bytes() == 12_000


def test_large_values_a_rank_keeps_are_not_overwritten_by_later_steps():
    """Frames of megabytes come into reused buffers: a value the caller still holds keeps its own
    memory, and a loop that drops its values reuses two buffers per peer, not one per step."""
    box = Mailbox()
    comms = [_comm("reuse", r, 2, d, box) for r, d in enumerate(_mesh(2))]

    def body(comm):
        kept = comm.allgather(np.full(300_000, comm.rank + 0.5))  # 2.4 MB each
        for s in range(6):
            got = comm.allgather(np.full(300_000, 10.0 * s + comm.rank))
            assert [float(v[0]) for v in got] == [10.0 * s, 10.0 * s + 1]
        return kept, comm.direct.buffers.allocated

    out, errors = _run_ranks(comms, body)
    assert errors == [None, None]
    for kept, nbufs in out:
        for r, v in enumerate(kept):
            assert (v == r + 0.5).all()
        assert nbufs <= 3  # the kept value's buffer and two the steps take turns with
