"""While a tracker is active, dask.config holds nothing a nanny cannot pickle (issue #17, item 2: a
worker killed inside ``gdask.incremental`` was never restarted). The kill itself is in
tests/chaos/test_kills.py."""

from __future__ import annotations

import pickle

import cloudpickle
import dask
import numpy as np

import gdask
from gdask.gdataset import GTracker
from gdask.gdataset._tracker import active_tracker, tracked_get


def test_config_stays_picklable_while_tracking(client):
    with gdask.incremental(client) as tracker:
        assert active_tracker() is tracker
        for dumps in (pickle.dumps, cloudpickle.dumps):  # what a nanny does to restart a worker
            config = pickle.loads(dumps(dask.config.global_config))
            assert config["scheduler"] is tracked_get  # a module function, not the tracker's bound method
        X = gdask.from_array(np.arange(8.0), block_rows=4)
        assert float(X.sum().compute()) == 28.0
        assert len(tracker.history) == 1  # still routed through the tracker


def test_tracked_get_without_a_tracker_uses_the_client(client):
    # a worker restarted with the tracking config has no tracker: its computations take the usual way
    assert active_tracker() is None
    with dask.config.set(scheduler=tracked_get):
        X = gdask.from_array(np.arange(8.0), block_rows=4)
        assert float(X.sum().compute()) == 28.0


def test_compute_of_an_inactive_tracker_goes_through_it(client):
    tracker = GTracker(client)
    tracker.close()
    X = gdask.from_array(np.arange(8.0), block_rows=4)
    (total,) = tracker.compute(X.sum())
    assert float(total) == 28.0 and len(tracker.history) == 1 and active_tracker() is None
