"""LSTM training on a LocalGPUCluster of two emulated devices of unequal speed: data-parallel on the
workers, the same loss curve as a plain single-process PyTorch loop, nothing copied host->device
after the blocks are on the devices, data larger than the devices through the window cache, and a
worker lost mid-fit."""

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gdask  # noqa: E402
from gdask._compat import scheduler_workers  # noqa: E402
from gdask.ml import LSTMClassifier, LSTMRegressor  # noqa: E402
from tests.ml.test_lstm import plain_torch_loop, sine_windows  # noqa: E402

DEVICE_MEMORY = 8 * 2**20


@pytest.fixture(scope="module")
def client():
    from distributed import Client

    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory=DEVICE_MEMORY,
                               device_speeds=[1.0, 0.5], dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the reference loops here; the workers run with OMP_NUM_THREADS=1
    yield
    torch.set_num_threads(before)


def _device_speed(dask_worker=None):
    from gdask.devices import context

    return context(dask_worker).device.spec.speed


def test_learns_noisy_sine_on_the_devices(client):
    """The must-hold fit on a LocalGPUCluster: R^2 >= 0.9 on held-out windows, 0 bytes host->device per
    epoch, mini-batch shares following the devices' speeds."""
    X, y = sine_windows(2000)
    Xt, yt = sine_windows(500, seed=1)
    G = gdask.from_array(X, block_rows=125).persist()
    reg = LSTMRegressor(hidden_size=16, epochs=20, batch_size=128, random_state=0).fit(G, y)
    assert reg.fit_mode_ == "workers" and reg.restarts_ == 0 and reg.n_iter_ == 20
    assert reg.score(Xt, yt) >= 0.9
    assert reg.h2d_bytes_ == [0] * 20
    speeds = client.run(_device_speed)
    shares = reg.history_[0]["shares"]
    fast, slow = (shares[a] for a in sorted(shares, key=lambda a: -speeds[a]))
    assert fast + slow == 2000 and fast >= 1.4 * slow > 0  # devices of speed 1.0 and 0.5
    # the model run where the blocks are: the same predictions as in this process
    np.testing.assert_allclose(reg.predict(gdask.from_array(Xt, block_rows=100)), reg.predict(Xt), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-9), (np.float32, 2e-5)])
def test_loss_curve_matches_a_single_process_loop(client, dtype, rtol):
    X, y = sine_windows(600, T=8, seed=2, dtype=dtype)
    kw = dict(hidden_size=6, epochs=3, batch_size=64, lr=1e-2)
    ref = plain_torch_loop(X, y, seed=5, **kw)
    reg = LSTMRegressor(random_state=5, **kw).fit(gdask.from_array(X, block_rows=75), y)
    assert reg.fit_mode_ == "workers" and all(s > 0 for s in reg.history_[0]["shares"].values())
    np.testing.assert_allclose(reg.loss_curve_, ref, rtol=rtol)


def test_classifier_on_the_devices(client):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((1200, 10, 3)).astype(np.float32)
    y = (X[:, :, 1].sum(axis=1) > 0).astype(int) + 2 * (X[:, -1, 0] > 0)  # four classes
    clf = LSTMClassifier(hidden_size=12, epochs=15, batch_size=64, lr=1e-2, random_state=0).fit(X, y)
    assert clf.fit_mode_ == "workers" and list(clf.classes_) == [0, 1, 2, 3]
    G = gdask.from_array(X, block_rows=300)
    assert clf.score(G, y) > 0.85
    np.testing.assert_allclose(clf.predict_proba(G).sum(axis=1), 1, rtol=1e-5)


def test_data_larger_than_the_devices_streams_through_the_window(client):
    rng = np.random.default_rng(0)
    n, T, f = 24_576, 16, 16  # 1 KiB per row, 24 MiB in all: 1.5x the two devices' 16 MiB
    X = rng.standard_normal((n, T, f)).astype(np.float32)
    y = X[:, -4:, 0].sum(axis=1).astype(np.float32)
    G = gdask.from_array(X, block_rows=n // 16).persist()
    reg = LSTMRegressor(hidden_size=4, epochs=2, batch_size=1024, lr=1e-2, random_state=0).fit(G, y)
    assert reg.fit_mode_ == "workers" and reg.n_iter_ == 2
    assert all(b > 0 for b in reg.h2d_bytes_)  # blocks come back to the devices through the window each epoch
    assert sum(reg.history_[0]["shares"].values()) == n and reg.loss_curve_[1] < reg.loss_curve_[0]
    stats = {k: v for k, v in gdask.window_cache.stats(client).items() if k != "workers"}
    assert stats["bytes_h2d"] > 0 and stats["evictions"] > 0


def _die_at_step(n):
    """On this worker, exit the process at the ``n``-th training step of an LSTM fit."""
    import os

    from gdask.ml._lstm import _torch as _lstm_torch

    calls = [0]
    orig = _lstm_torch.LSTMTrainer._step

    def dying(self, *a, **k):
        calls[0] += 1
        if calls[0] >= n:
            os._exit(1)
        return orig(self, *a, **k)

    _lstm_torch.LSTMTrainer._step = dying


def test_a_lost_worker_restarts_the_fit_from_its_last_epoch(client, caplog):
    X, y = sine_windows(800, T=8, seed=3)
    G = gdask.from_array(X, block_rows=100).persist()
    kw = dict(hidden_size=6, epochs=4, batch_size=100, lr=1e-2, random_state=1)
    ref = LSTMRegressor(**kw).fit(G, y)
    victim = sorted(scheduler_workers(client))[1]
    client.run(_die_at_step, 2 * 8 + 3, workers=[victim])  # in the third epoch (8 steps per epoch)
    with caplog.at_level(logging.WARNING, logger="gdask.gdataset"):
        reg = LSTMRegressor(**kw).fit(G, y)
    assert "running it on the workers again from iteration 2" in caplog.text
    assert reg.restarts_ == 1 and reg.n_iter_ == 4 and [r["epoch"] for r in reg.history_] == [1, 2, 3, 4]
    # the epochs after the restart ran on the blocks as they were recomputed, on the worker left: the
    # same bits (each block's gradient partial is added in block order, whoever holds the block)
    np.testing.assert_array_equal(reg.loss_curve_, ref.loss_curve_)
    np.testing.assert_array_equal(reg.predict(X[:50]), ref.predict(X[:50]))


def test_streamed_fit_has_the_same_bits_after_a_lost_worker(client, caplog):
    """Data larger than the devices: the epoch's order is windows of blocks by block id, never the
    placement, so the fit that loses a worker (its blocks recomputed on the one left, a single rank
    streaming every block) ends with the bits of the fit that lost none."""
    client.wait_for_workers(2, timeout=60)  # a worker an earlier test killed is back (its blocks: below)
    rng = np.random.default_rng(5)
    n, T, f = 14_336, 16, 16  # 1 KiB per row, 14 MiB: over 0.8x the two devices' 16 MiB
    X = rng.standard_normal((n, T, f)).astype(np.float32)
    y = X[:, -3:, 1].sum(axis=1).astype(np.float32)
    G = gdask.from_array(X, block_rows=n // 16).persist()
    kw = dict(hidden_size=3, epochs=3, batch_size=1024, lr=1e-2, random_state=4)
    ref = LSTMRegressor(**kw).fit(G, y)
    assert ref.fit_mode_ == "workers" and all(b > 0 for b in ref.h2d_bytes_)  # streamed
    assert len(ref.history_[0]["shares"]) == 2
    steps = -(-n // 1024)
    victim = sorted(scheduler_workers(client))[0]
    client.run(_die_at_step, steps + 4, workers=[victim])  # in the second epoch
    with caplog.at_level(logging.WARNING, logger="gdask.gdataset"):
        reg = LSTMRegressor(**kw).fit(G, y)
    assert "running it on the workers again from iteration 1" in caplog.text
    assert reg.restarts_ == 1 and [r["epoch"] for r in reg.history_] == [1, 2, 3]
    np.testing.assert_array_equal(reg.loss_curve_, ref.loss_curve_)
    np.testing.assert_array_equal(reg.predict(X[:64]), ref.predict(X[:64]))


def test_gradients_per_worker_are_a_config_choice(client):
    """config gdask.ml.torch.gradients: "workers" sums one gradient per worker (placement-dependent
    rounding: the same curve as "blocks" up to it); anything else is a clear error."""
    import dask

    X, y = sine_windows(600, T=6, seed=4)
    G = gdask.from_array(X, block_rows=100).persist()
    kw = dict(hidden_size=4, epochs=2, batch_size=64, lr=1e-2, random_state=2)
    blocks = LSTMRegressor(**kw).fit(G, y)
    with dask.config.set({"gdask.ml.torch.gradients": "workers"}):
        workers = LSTMRegressor(**kw).fit(G, y)
    np.testing.assert_allclose(workers.loss_curve_, blocks.loss_curve_, rtol=1e-4)
    with dask.config.set({"gdask.ml.torch.gradients": "rows"}), pytest.raises(ValueError, match="gradients"):
        LSTMRegressor(**kw).fit(G, y)
