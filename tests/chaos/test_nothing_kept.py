"""Nothing kept after a fit (issue #26): the scheduler keeps no checkpoint events or topics of loops on
the workers, and a client that dies mid-fit leaves no loop running on the workers, no loop state and no
topic.

Before: every fit left a ``gdask-loop-<token>`` topic with one checkpoint event per iteration in the
scheduler, and after a client was SIGKILLed its loop tasks ran on (holding their blocks) for 11-13 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import dask
import numpy as np
import pytest

import gdask
import gdask.ml

pytestmark = pytest.mark.timeout(240)

PREFIX = "gdask-loop-"


def _loop_topics(dask_scheduler=None) -> dict[str, int]:
    """(on the scheduler) gdask's loop topics with events, and how many events it keeps of each."""
    return {name: len(events) for name, events in dask_scheduler.get_events().items() if name.startswith(PREFIX)}


def _topic_names(dask_scheduler=None) -> list[str]:
    # every topic the scheduler has, with events or only subscribers (distributed keeps them in its broker)
    return sorted(t for t in dask_scheduler._broker._topics if t.startswith(PREFIX))


def _running_loops(dask_worker=None) -> list[str]:
    """(on a worker) keys of loop tasks still running here (executing, or cancelled but still running)."""
    return sorted(str(k) for k, ts in dask_worker.state.tasks.items()
                  if str(k).startswith("kmeans-") and ts.state in ("executing", "cancelled", "long-running"))


def _loop_states(dask_worker=None) -> list[str]:
    """(on a worker) the state spaces of loops gdask keeps here: each loop's checkpoint space and the
    space of its fit (K-means bounds), under the fit's token."""
    from gdask.devices import context

    suffix = "-engine-checkpoint"
    tokens = context(dask_worker).state.tokens()
    loops = [t for t in tokens if t.endswith(suffix)]
    return sorted(loops + [t[:-len(suffix)] for t in loops if t[:-len(suffix)] in tokens])


def test_fits_on_the_workers_leave_no_topic_or_event_on_the_scheduler(client):
    X = np.random.default_rng(0).random((40_000, 8), dtype=np.float32)
    G = gdask.from_array(X, block_rows=5_000).persist()
    for _ in range(3):
        km = gdask.ml.KMeans(4, init=X[:4], max_iter=12, tol=0).fit(G)
        assert km.fit_mode_ == "workers" and km.n_iter_ == 12
    assert len(km.history_) == 12  # the checkpoints reached the client
    deadline = time.monotonic() + 10
    while client.run_on_scheduler(_topic_names) and time.monotonic() < deadline:
        time.sleep(0.05)  # the client tells the scheduler without waiting
    assert client.run_on_scheduler(_topic_names) == []
    assert client.run_on_scheduler(_loop_topics) == {}


def _loop_events_sent(dask_worker=None) -> dict[str, list[str]]:
    """(on a worker) per loop topic, the kinds of events ("checkpoint": with the state, "progress": the
    record only) in the messages distributed keeps of this worker's stream to the scheduler."""
    out: dict[str, list[str]] = {}
    for payload in list(dask_worker.batched_stream.recent_message_log):
        for msg in payload if isinstance(payload, list) else ():
            topic = msg.get("topic") if isinstance(msg, dict) and msg.get("op") == "log-event" else None
            if isinstance(topic, str) and topic.startswith(PREFIX):
                out.setdefault(topic, []).extend(k for k in ("checkpoint", "progress") if k in msg["msg"])
    return out


def _new_loop_events(client, seen: set[str]) -> dict[str, list[str]]:
    deadline = time.monotonic() + 10
    while True:  # a message enters the log once written, which may be a moment after the fit returned
        found = {t: kinds for w in client.run(_loop_events_sent).values() for t, kinds in w.items() if t not in seen}
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _loop_events(client, seen: set[str], **config) -> tuple[list[str], gdask.ml.KMeans]:
    """Fit with ``gdask.engine`` ``config``: the kinds of its loop's events, and the fit."""
    X = np.random.default_rng(1).random((40_000, 8), dtype=np.float32)
    G = gdask.from_array(X, block_rows=5_000).persist()
    with dask.config.set({f"gdask.engine.{k.replace('_', '-')}": v for k, v in config.items()}):
        km = gdask.ml.KMeans(4, init=X[:4], max_iter=20, tol=0).fit(G)
    assert km.fit_mode_ == "workers" and [r["iteration"] for r in km.history_] == list(range(1, 21))
    assert all("center_shift" in r for r in km.history_)  # the records came back, not filled in
    new = _new_loop_events(client, seen)
    assert len(new) == 1, new
    seen |= set(new)
    return next(iter(new.values())), km


def test_a_loop_sends_its_state_once_per_checkpoint_interval(client):
    """distributed keeps the last messages of every stream: a state sent every iteration (tens of KB for
    K-means' center history) stayed in the worker's and the scheduler's memory up to a thousand times.
    The records come (here) every iteration, the state once per ``gdask.engine.checkpoint-interval``."""
    seen = set(_new_loop_events(client, set()))
    kinds, rare = _loop_events(client, seen, checkpoint_interval=3600, progress_interval=0)
    assert kinds == ["progress"] * 20
    kinds, often = _loop_events(client, seen, checkpoint_interval=0, progress_interval=0)
    assert kinds == ["checkpoint"] * 20
    np.testing.assert_array_equal(rare.cluster_centers_, often.cluster_centers_)


def test_a_loop_sends_its_records_in_batches(client):
    """Each event wakes the worker's event loop, whose thread then competes with the loop's for the
    interpreter (~1 ms an iteration on 2 cores): rank 0 sends its records at most once per
    ``gdask.engine.progress-interval``, the rest at the loop's end, and every record still arrives."""
    seen = set(_new_loop_events(client, set()))
    kinds, km = _loop_events(client, seen, checkpoint_interval=3600, progress_interval=3600)
    assert kinds == ["progress"]  # one batch: the loop's end sent all 20 records


VICTIM = textwrap.dedent("""
    import sys
    import numpy as np
    import gdask, gdask.ml
    from distributed import Client

    if __name__ == "__main__":
        client = Client(sys.argv[1])
        X = np.random.default_rng(0).random((200_000, 8), dtype=np.float32)
        G = gdask.from_array(X, block_rows=25_000).persist()
        print("fitting", flush=True)
        gdask.ml.KMeans(8, init=X[:8], max_iter=1_000_000, tol=0, algorithm="lloyd").fit(G)
""")


def test_a_client_killed_mid_fit_leaves_no_loop_state_or_topic(tmp_path):
    from distributed import Client

    script = tmp_path / "victim.py"
    script.write_text(VICTIM)
    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        proc = subprocess.Popen([sys.executable, str(script), cluster.scheduler_address])
        try:
            deadline = time.monotonic() + 150
            # the loop runs, keeps state (from its first checkpoint) and has its topic
            while not (any(client.run(_running_loops).values()) and any(client.run(_loop_states).values())):
                assert proc.poll() is None, "the client process ended before its fit ran on the workers"
                assert time.monotonic() < deadline, "the fit's loop never ran on the workers"
                time.sleep(0.1)
            assert client.run_on_scheduler(_topic_names)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        # the scheduler notices the dead client at once (its connection closes); the loops stop at their
        # next exchange and drop their state
        deadline = time.monotonic() + 5
        while True:
            running, states = client.run(_running_loops), client.run(_loop_states)
            topics = client.run_on_scheduler(_topic_names)
            if not any(running.values()) and not any(states.values()) and not topics:
                break
            assert time.monotonic() < deadline, f"still running {running}, states {states}, topics {topics}"
            time.sleep(0.1)
