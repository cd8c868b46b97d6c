import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest

import gdask
from gdask.devices import array_namespace


def _np(a):
    return gdask.to_numpy(a)  # NumPy, CuPy or strict device arrays, explicitly


@pytest.fixture
def data(xp, backend):
    """(array module of the input, input, GDataSet of it) on devices of ``backend`` (local threads, or the
    cluster of ``bclient``); CuPy input (on a GPU) on the CUDA device instead, once."""
    if xp is not np and backend != "emulated":
        pytest.skip("CuPy input runs once, on the CUDA device")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 6)).astype(np.float32)
    with dask.config.set({"gdask.backend": "cuda"} if xp is not np else {}):
        yield xp, xp.asarray(x), gdask.from_array(xp.asarray(x), block_rows=128)


def _sum0(b):
    """A user's block function written against the array API (runs on every backend)."""
    return array_namespace(b).sum(b, axis=0)


def test_shape_and_blocks(data, backend):
    xp, x, X = data
    assert X.shape == (1000, 6) and X.nblocks == 8 and X.row_blocks[-1] == 1000 - 7 * 128
    assert X.dtype == np.float32 and X.ndim == 2
    out = X.compute()
    np.testing.assert_array_equal(_np(out), _np(x))
    assert type(out) is type(x)  # results follow the input's array type
    if backend == "emulated-strict":  # output_type="device": the device's array type, which refuses conversion
        dev = X.compute(output_type="device")
        assert type(dev).__module__.startswith("array_api_strict")
        with pytest.raises((RuntimeError, TypeError, ValueError)):
            np.asarray(dev)


def test_blocks_are_feature_major(data, backend):
    xp, x, X = data
    if backend == "emulated-strict":
        pytest.skip("strict arrays have no memory layout")
    blk = X.block(0).compute()
    assert blk.flags.f_contiguous and blk.T.flags.c_contiguous


def test_keys_are_deterministic(data):
    xp, x, X = data
    Y = gdask.from_array(xp.asarray(_np(x).copy()), block_rows=128)
    assert X.name == Y.name
    assert ((X * 2 + 1).name == (Y * 2 + 1).name) and ((X * 2).name != (X * 3).name)


@pytest.mark.parametrize("op", [lambda a: a * 2 + 1, lambda a: 1 - a, lambda a: a / 3, lambda a: -a,
                                lambda a: abs(a) ** 0.5, lambda a: a > 0.1])
def test_elementwise(data, op):
    xp, x, X = data
    np.testing.assert_allclose(_np(op(X).compute()), _np(op(x)), rtol=1e-6)


def test_ufunc_and_broadcast(data):
    xp, x, X = data
    v = xp.arange(6, dtype=xp.float32)
    np.testing.assert_allclose(_np(np.exp(X).compute()), _np(xp.exp(x)), rtol=1e-6)
    np.testing.assert_allclose(_np((X * v).compute()), _np(x * v), rtol=1e-6)
    np.testing.assert_allclose(_np((X - X).compute()), 0)


def test_reductions(data):
    xp, x, X = data
    h = _np(x).astype(np.float64)
    np.testing.assert_allclose(_np(X.sum(axis=0).compute()), h.sum(0), rtol=1e-5)
    np.testing.assert_allclose(_np(X.mean(axis=0).compute()), h.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_np(X.std(axis=0).compute()), h.std(0), rtol=1e-5)
    np.testing.assert_allclose(float(X.std().compute()), h.std(), rtol=1e-5)
    np.testing.assert_allclose(_np(X.min(axis=0).compute()), h.min(0))
    np.testing.assert_allclose(float(X.max().compute()), h.max())
    np.testing.assert_array_equal(_np(X.argmin(axis=1).compute()), h.argmin(1))
    np.testing.assert_array_equal(_np(X.argmax(axis=1).compute()), h.argmax(1))
    assert isinstance(X.sum(axis=0), da.Array)


def test_reduction_result_as_operand(data):
    xp, x, X = data
    h = _np(x).astype(np.float64)
    Z = (X - X.mean(axis=0)) / X.std(axis=0)
    np.testing.assert_allclose(_np(Z.compute()), (h - h.mean(0)) / h.std(0), rtol=1e-4, atol=1e-5)


def test_matmul(data):
    xp, x, X = data
    W = xp.asarray(np.random.default_rng(1).standard_normal((6, 3)).astype(np.float32))
    w = W[:, 0]
    np.testing.assert_allclose(_np((X @ W).compute()), _np(x @ W), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_np((X @ w).compute()), _np(x @ w), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_np((X.T @ X).compute()), _np(x.T @ x), rtol=1e-4)
    z = X @ w
    np.testing.assert_allclose(_np((X * z[:, None]).compute()), _np(x * (x @ w)[:, None]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_np((X.T @ z).compute()), _np(x.T @ (x @ w)), rtol=1e-3)


def test_map_blocks_and_reduce_blocks(data):
    xp, x, X = data
    Y = X.map_blocks(lambda b: b[:, :2] * 2)
    assert Y.shape == (1000, 2)
    np.testing.assert_allclose(_np(Y.compute()), _np(x[:, :2] * 2))
    n = X.reduce_blocks(lambda b: b.shape[0], sum).compute()
    assert n == 1000


def test_dask_protocol(data, bclient):
    client = bclient
    xp, x, X = data
    (a, b) = dask.compute(X.sum(axis=0), X * 2)
    np.testing.assert_allclose(_np(b), _np(x * 2))
    P = X.persist()
    assert P.name == X.name
    np.testing.assert_allclose(_np(client.compute(P.sum(axis=0)).result()), _np(x).sum(0), rtol=1e-5)
    assert "GDataSet" in P._repr_html_()


def test_dask_array_round_trip():
    a = da.random.default_rng(0).random((1000, 5), chunks=(300, 2))
    X = gdask.from_dask_array(a)
    assert X.row_blocks == (300, 300, 300, 100)
    np.testing.assert_allclose(X.compute(), a.compute())


def test_from_dataframe_numeric_columns():
    df = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [4, 5, 6], "s": ["x", "y", "z"]})
    X = gdask.from_dataframe(df, block_rows=2, columns=["a", "b"])
    assert X.shape == (3, 2) and X.columns == ["a", "b"]
    np.testing.assert_allclose(X.compute(), df[["a", "b"]].to_numpy(float))
    dd = pytest.importorskip("dask.dataframe")
    Y = gdask.from_dataframe(dd.from_pandas(df, npartitions=2), columns=["a", "b"])
    np.testing.assert_allclose(Y.compute(), df[["a", "b"]].to_numpy(float))


def test_from_dataframe_drops_no_column_silently():
    df = pd.DataFrame({"a": [1.0, 2.0, 3.0, 4.0], "s": ["x", "y", "z", "x"],
                       "color": pd.Categorical(["red", "blue", None, "red"])})
    with pytest.raises(ValueError, match=r"column\(s\) \['s'\] are not numeric"):
        gdask.from_dataframe(df)
    with pytest.warns(gdask.GDaskWarning, match=r"categorical column\(s\) \['color'\] become their category codes"):
        X = gdask.from_dataframe(df, columns=["a", "color"])
    np.testing.assert_array_equal(X.compute(), [[1, 1], [2, 0], [3, -1], [4, 1]])
    dd = pytest.importorskip("dask.dataframe")
    lazy = dd.from_pandas(df[["a", "color"]], npartitions=2).clear_divisions()
    lazy["color"] = lazy["color"].cat.as_unknown()  # as read from files: categories not known up front
    with pytest.warns(gdask.GDaskWarning, match="category codes"):
        Y = gdask.from_dataframe(lazy)
    np.testing.assert_array_equal(Y.compute(), X.compute())  # every partition codes alike


def test_from_dataframe_splits_a_single_partition_for_the_workers(client):
    dd = pytest.importorskip("dask.dataframe")
    df = pd.DataFrame({"a": np.arange(1000.0), "b": np.arange(1000.0) * 2})
    one = dd.from_pandas(df, npartitions=1)  # e.g. one Parquet file
    with pytest.warns(gdask.GDaskWarning, match="1 partition.s. for 2 workers"):
        X = gdask.from_dataframe(one)
    assert X.row_blocks == (500, 500)
    np.testing.assert_array_equal(X.compute(), df.to_numpy())


@pytest.mark.parametrize(
    "x, kwargs, exc, match",
    [(np.ones((2, 2, 2, 2)), {}, ValueError, "1-D, 2-D or 3-D"), (np.ones((0, 3)), {}, ValueError, "empty"),
     (np.array(["a", "b"]), {}, TypeError, "numeric"), (np.ones((4, 2)), {"block_rows": 0}, ValueError, "block_rows"),
     (np.ones((4, 2)), {"block_rows": -3}, ValueError, "block_rows")],
)
def test_bad_input(x, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        gdask.from_array(x, **kwargs)


def test_mismatched_blocking_is_an_error():
    a = gdask.from_array(np.ones((10, 2)), block_rows=5)
    b = gdask.from_array(np.ones((10, 2)), block_rows=3)
    with pytest.raises(ValueError, match="same row blocking"):
        a + b
    with pytest.raises(TypeError, match="compute"):
        np.asarray(a)


def test_reduce_groups_and_block_groups(data, bclient):
    xp, x, X = data
    P = X.persist()
    groups = P.block_groups()
    assert groups is not None and sorted(i for g in groups for i in g) == list(range(P.nblocks))
    # every group's blocks are held by one worker
    from gdask.gdataset import block_workers

    where, _ = block_workers(P)
    assert all(len({where[i] for i in g}) == 1 for g in groups)
    parts = dask.compute(*P.reduce_groups(_sum0, sum, groups=groups))
    assert len(parts) == len(groups) and all(isinstance(p, np.ndarray) for p in parts)  # host results
    np.testing.assert_allclose(sum(parts), _np(x).sum(0), rtol=1e-4)
    # the same groups through the full tree reduction
    total = P.reduce_blocks(_sum0, sum, groups=groups).compute()
    np.testing.assert_allclose(_np(total), _np(x).sum(0), rtol=1e-4)
    assert "not persisted" not in P._repr_html_()


def test_block_groups_without_cluster_memory(data):
    xp, x, X = data
    assert X.block_groups() is None  # not persisted: no locations
    parts = dask.compute(*X.reduce_groups(lambda b: b.shape[0], sum))
    assert sum(parts) == x.shape[0]
    with pytest.raises(ValueError, match="cover each"):
        X.reduce_blocks(lambda b: 0, sum, groups=[[0]]).compute()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_var_fast_path_matches_numpy(dtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5000, 7)) * 3 + 1e3).astype(dtype)  # large mean: cancellation-prone
    X = gdask.from_array(x, block_rows=1234)
    np.testing.assert_allclose(X.var(axis=0).compute(), x.astype(np.float64).var(axis=0), rtol=1e-6)
    np.testing.assert_allclose(X.std(axis=0, ddof=1).compute(), x.astype(np.float64).std(axis=0, ddof=1),
                               rtol=1e-6)
