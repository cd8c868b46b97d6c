"""Reductions of elementwise chains on data larger than the devices, on strict devices (issue 26): the
combine never mixes host and device partials (a partial fetched from another worker, or moved to host
memory by the window, is put on the device first), and the results are the emulated backend's, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import gdask
from gdask.devices import to_numpy

DEVICE = 4 * 2**20  # bytes per device; two devices


def _chains(x):
    X = gdask.from_array(x, block_rows=4096).persist()
    return [to_numpy(r) for r in ((X * 2).sum(0).compute(), (X - X.mean(0)).sum(0).compute(),
                                  ((X + 1) * (X - 1)).max(0).compute())]


@pytest.fixture(scope="module")
def results():
    from distributed import Client

    rng = np.random.default_rng(0)
    datas = {f: rng.standard_normal((int(f * 2 * DEVICE / (16 * 8)), 16)) for f in (1.2, 2.0, 3.0)}
    out = {}
    for backend in ("emulated", "emulated-strict"):
        with gdask.LocalGPUCluster(n_devices=2, backend=backend, device_memory=DEVICE,
                                   dashboard_address=":0") as cluster, Client(cluster):
            out[backend] = {f: _chains(x) for f, x in datas.items()}
    return datas, out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("factor", [1.2, 2.0, 3.0])
def test_chains_beyond_device_memory_on_strict_devices(results, factor):
    datas, out = results
    x = datas[factor]
    expect = [(x * 2).sum(0), (x - x.mean(0)).sum(0), ((x + 1) * (x - 1)).max(0)]
    for got_strict, got_emulated, ref in zip(out["emulated-strict"][factor], out["emulated"][factor], expect):
        assert isinstance(got_strict, np.ndarray)
        np.testing.assert_array_equal(got_strict, got_emulated)  # the same bits: block moments in one order
        np.testing.assert_allclose(got_emulated, ref, rtol=1e-10, atol=1e-8)
