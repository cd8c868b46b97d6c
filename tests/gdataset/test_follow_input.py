"""Laptop code runs unchanged on GPUs: results follow the input's array type (issue 23, items 1-3).

One script written against NumPy (``from_array`` / ``persist``, reductions mixed with NumPy arrays,
``map_blocks`` with NumPy arguments, elementwise operations with NumPy arrays and scalars, KMeans,
LogisticRegression, ``gdask.iterate`` and ``gdask.incremental`` with NumPy state) runs on a 2-device
``LocalGPUCluster`` of each backend. On ``emulated-strict`` the blocks are array-api-strict arrays on a
non-CPU device, which refuse NumPy operands and implicit conversion exactly as CuPy arrays do: the script
passing there unchanged, every result NumPy and equal to ``emulated``'s, is what a GPU user gets.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest

import gdask
from gdask.gdataset import _blocks, _output
from gdask.ml import KMeans, LogisticRegression

pytest.importorskip("array_api_strict")

W = np.array([1.0, -2.0, 0.5, 3.0])


# -- the laptop script: NumPy only, no gdask.to_numpy, no device_call --------------------------------
def scaled(block, w):
    return block * w


def jacobi_block(b, x):  # one block of x = 0.5 x + b, the README's delta iteration
    return 0.5 * x + b


def jacobi_step(data, state, ctx):
    outs = [dask.delayed(jacobi_block)(data.block(i), ctx.refs[i]) for i in range(data.nblocks)]
    return list(dask.compute(*outs))


def gd_step(data, state, ctx):  # whole-state iteration: a least-squares gradient step with NumPy state
    X, Y = data
    grad = ((X @ state["w"] - Y)[:, None] * X).mean(axis=0).compute()
    return {"w": state["w"] - 0.5 * grad}


def laptop_script(client) -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2400, 4))
    y = (x @ W + 0.3 * rng.standard_normal(2400) > 0).astype(np.int64)
    X = gdask.from_array(x, block_rows=600).persist()
    Y = gdask.from_array(x @ W, block_rows=600).persist()
    x_new = rng.standard_normal((5, 4))
    out = {
        "compute": X.compute(),
        "standardised": (x_new - X.mean(0).compute()) / X.std(0).compute(),
        "moments": [X.sum(0).compute(), X.var(0).compute(), X.min().compute(), X.max(0).compute()],
        "map_blocks": X.map_blocks(scaled, W).compute(),
        "binops": (2.0 * X - W + np.float64(1.5)).compute(),
        "reversed": (W / (abs(X) + 1)).compute(),
        "centred_sum": ((X - X.mean(0)) / X.std(0)).sum(0).compute(),
        "matmul": (X @ W).compute(),
        "gram": (X.T @ X).compute(),
        "rows": X[np.arange(0, 2400, 7)].compute(),
        "ufunc": np.exp(X[:, 0]).compute(),
    }
    km = KMeans(3, random_state=0, n_init=1, max_iter=10).fit(X)
    out["kmeans"] = [km.cluster_centers_, km.labels_.compute(), km.predict(x_new)]
    lr = LogisticRegression(max_iter=20).fit(X, y)
    out["logistic"] = [lr.coef_, lr.intercept_, lr.predict_proba(x_new)]
    b = gdask.from_array(np.r_[np.ones(4), np.zeros(4), np.full(4, 3.0)], block_rows=4)
    res = gdask.iterate(jacobi_step, [np.zeros(4), np.zeros(4), np.zeros(4)], data=b, tol=1e-3, client=client)
    out["iterate"] = res.state
    out["iterate_converged"] = res.converged
    res = gdask.iterate(gd_step, {"w": np.zeros(4)}, data=(X, Y), max_iter=15, tol=1e-12, client=client)
    out["iterate_dict"] = res.state
    with gdask.incremental(client) as tracker:
        w = np.zeros(4)
        for _ in range(3):
            w = w - 0.5 * ((X @ w - Y)[:, None] * X).mean(axis=0).compute()
        total = X.map_blocks(scaled, w).sum(axis=0).compute()
        again = X.map_blocks(scaled, w).sum(axis=0).compute()  # the same graph: reused
    out["incremental"] = [w, total, again]
    out["incremental_reused"] = tracker.history[-1]["reused"]
    return out


def _leaves(v):
    if isinstance(v, dict):
        for x in v.values():
            yield from _leaves(x)
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _leaves(x)
    else:
        yield v


def _run(request, backend: str) -> dict:
    c = request.getfixturevalue("_emulated_client" if backend == "emulated" else "_strict_client")
    with c.as_current():
        return laptop_script(c)


# one fixture per backend, each set up by its own first test (each within the suite's per-test limit)
@pytest.fixture(scope="module")
def emulated_run(request):
    return _run(request, "emulated")


@pytest.fixture(scope="module")
def strict_run(request):
    return _run(request, "emulated-strict")


@pytest.fixture(scope="module")
def runs(emulated_run, strict_run):
    return {"emulated": emulated_run, "emulated-strict": strict_run}


def _all_numpy(out: dict, backend: str) -> None:
    for name, value in out.items():
        for leaf in _leaves(value):
            assert isinstance(leaf, (np.ndarray, np.generic, bool, int, float)), (backend, name, type(leaf))


def test_every_result_of_the_laptop_script_is_numpy_on_strict_devices(strict_run):
    _all_numpy(strict_run, "emulated-strict")


def test_every_result_of_the_laptop_script_is_numpy_on_emulated_devices(emulated_run):
    _all_numpy(emulated_run, "emulated")


@pytest.mark.parametrize("name", ["compute", "map_blocks", "binops", "reversed", "rows", "ufunc", "iterate",
                                  "standardised", "moments", "centred_sum"])
def test_strict_devices_give_emulated_results_exactly(runs, name):
    for a, b in zip(_leaves(runs["emulated"][name]), _leaves(runs["emulated-strict"][name]), strict=True):
        np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("name", ["matmul", "gram", "kmeans", "logistic", "iterate_dict", "incremental"])
def test_strict_devices_agree_with_emulated_to_rounding(runs, name):
    # the strict path sums in the array API's order, the emulated one with BLAS, NumPy's and numba's kernels
    # (means, variances and the sums of elementwise chains are the same bits: tested exactly above)
    for a, b in zip(_leaves(runs["emulated"][name]), _leaves(runs["emulated-strict"][name]), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-11)


def test_the_script_computes_what_numpy_does(runs):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2400, 4))
    rng.standard_normal(2400)
    x_new = rng.standard_normal((5, 4))
    for out in runs.values():
        np.testing.assert_array_equal(out["compute"], x)
        np.testing.assert_allclose(out["standardised"], (x_new - x.mean(0)) / x.std(0), rtol=1e-12)
        np.testing.assert_array_equal(out["map_blocks"], x * W)
        np.testing.assert_allclose(out["binops"], 2.0 * x - W + 1.5, rtol=1e-15)
        np.testing.assert_allclose(out["gram"], x.T @ x, rtol=1e-12)
        assert out["iterate_converged"]
        np.testing.assert_allclose(np.concatenate(out["iterate"]), np.r_[np.full(4, 2.0), np.zeros(4), np.full(4, 6.0)],
                                   atol=1e-3)  # the fixed point, to the loop's tolerance
        np.testing.assert_allclose(out["iterate_dict"]["w"], W, atol=1e-3)  # least squares recovers W
        assert out["incremental_reused"] > 0  # the repeated graph was reused inside the tracker


# -- the escape hatch and the config ----------------------------------------------------------------
def test_output_type_device_and_config_keep_the_devices_arrays(backend):
    X = gdask.from_array(np.arange(12.0).reshape(6, 2), block_rows=2)
    assert X.input_type == "numpy" and (X * 2 + 1).input_type == "numpy" and X[[0, 3]].input_type == "numpy"
    want = "array_api_strict" if backend == "emulated-strict" else "numpy"
    assert type(X.compute(output_type="device")).__module__.split(".")[0] == want
    assert isinstance(X.compute(), np.ndarray) and isinstance(X.compute(output_type="numpy"), np.ndarray)
    with dask.config.set({"gdask.output-type": "device"}):
        assert type(X.sum(0).compute()).__module__.split(".")[0] == want
        assert type((X + 1).compute()).__module__.split(".")[0] == want
    np.testing.assert_array_equal(gdask.to_numpy(X.compute(output_type="device")), X.compute())


def test_an_unknown_output_type_is_refused_before_any_work():
    X = gdask.from_array(np.ones((4, 2)))
    with pytest.raises(ValueError, match="output_type must be one of"):
        X.compute(output_type="torch")
    with dask.config.set({"gdask.output-type": "NumPy"}), pytest.raises(ValueError, match="gdask.output-type"):
        X.sum(0)


def test_dask_arrays_and_dataframes_remember_their_chunk_type():
    import dask.array as da
    import pandas as pd

    a = da.from_array(np.ones((8, 3)), chunks=4)
    assert gdask.from_dask_array(a).input_type == "numpy"
    assert isinstance(gdask.from_dask_array(a).compute(), np.ndarray)
    assert gdask.from_dataframe(pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]})).input_type == "numpy"


def test_as_type_converts_nested_results(backend):
    dev = gdask.devices.current_device()
    d = dev.asarray(np.arange(3.0))
    out = _output.as_type({"a": [d, 1.5], "b": (d,)}, "numpy")
    assert isinstance(out["a"][0], np.ndarray) and out["a"][1] == 1.5 and isinstance(out["b"], tuple)
    assert _output.as_type(d, "device") is d
    assert _output.array_type(d) == ("device" if backend == "emulated-strict" else "numpy")


def test_user_tasks_get_host_arguments_on_the_blocks_device(backend):
    dev = gdask.devices.current_device()
    blk = dev.asarray(np.ones((3, 2)))
    out = _blocks.user_task(scaled, blk, np.array([2.0, 3.0]))  # a NumPy function's task on a device block
    np.testing.assert_array_equal(gdask.to_numpy(out), [[2.0, 3.0]] * 3)
    assert _output.array_type(out) == _output.array_type(blk)
    host = _blocks.user_task(np.add, np.ones(2), np.ones(2))  # no device argument: host work stays on the host
    assert isinstance(host, np.ndarray)
    pair = _blocks.user_task(lambda bs, w: [b * w for b in bs], [blk, blk], np.float64(2.0))
    np.testing.assert_array_equal(gdask.to_numpy(pair[1]), np.full((3, 2), 2.0))


def test_host_partials_join_device_partials_and_host_only_ones_stay_host(backend):
    dev = gdask.devices.current_device()
    d = dev.asarray(np.ones(3))
    mixed = _blocks.combine_op(_blocks.sum_parts, d, np.ones(3))  # one partial came back from host memory
    np.testing.assert_array_equal(gdask.to_numpy(mixed), np.full(3, 2.0))
    host = _blocks.combine_op(_blocks.sum_parts, np.ones(3), np.ones(3))  # a chunk that returns host data
    assert isinstance(host, np.ndarray)
    moments = _blocks.combine_op(lambda ps: [sum(p[i] for p in ps) for i in range(2)], (d, d), (np.ones(3), 1))
    np.testing.assert_array_equal(gdask.to_numpy(moments[0]), np.full(3, 2.0))
