"""3-D GDataSets (sequences ``(n, T, f)`` blocked along n, time-major inside a block) and row selection."""

import dask
import dask.array as da
import numpy as np
import pytest

import gdask
from gdask.gdataset._seq import is_time_major, time_major


@pytest.fixture(scope="module")
def seq():
    x = np.random.default_rng(0).standard_normal((50, 7, 3)).astype(np.float32)
    return x, gdask.from_array(x, block_rows=16)


def _block(G, i):
    return dask.compute(G.block(i))[0]


def test_shape_layout_and_round_trip(seq):
    x, X = seq
    assert X.shape == (50, 7, 3) and X.ndim == 3 and X.ncols == (7, 3) and X.row_blocks == (16, 16, 16, 2)
    assert X.nbytes == x.nbytes
    b = _block(X, 1)
    assert b.shape == (16, 7, 3) and is_time_major(b) and not b.flags.c_contiguous
    tm = time_major(b)  # the (T, rows, f) array the LSTM kernels read: a view, no copy
    assert tm.flags.c_contiguous and np.shares_memory(tm, b)
    np.testing.assert_array_equal(tm, x[16:32].transpose(1, 0, 2))
    np.testing.assert_array_equal(X.compute(), x)
    assert "time-major" in X._repr_html_()


def test_reductions_over_rows_and_time(seq):
    x, X = seq
    np.testing.assert_allclose(X.mean(axis=(0, 1)).compute(), x.mean(axis=(0, 1)), rtol=1e-5)
    np.testing.assert_allclose(X.std(axis=(0, 1)).compute(), x.std(axis=(0, 1)), rtol=1e-5)
    np.testing.assert_allclose(X.var(axis=(0, 1), ddof=1).compute(), x.var(axis=(0, 1), ddof=1), rtol=1e-5)
    np.testing.assert_allclose(X.mean(axis=0).compute(), x.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(X.sum(axis=(0, 1)).compute(), x.sum(axis=(0, 1), dtype=np.float64), rtol=1e-6)
    np.testing.assert_array_equal(X.max(axis=(0, 1)).compute(), x.max(axis=(0, 1)))
    assert X.mean(axis=(0, 1)).shape == (3,) and X.std(axis=0).shape == (7, 3)
    with pytest.raises(ValueError, match="axis must be one of"):
        X.mean(axis=(1, 2))


def test_elementwise_normalisation_keeps_the_layout(seq):
    x, X = seq
    Z = (X - X.mean(axis=(0, 1))) / X.std(axis=(0, 1))
    assert Z.shape == X.shape and all(is_time_major(_block(Z, i)) for i in range(Z.nblocks))
    np.testing.assert_allclose(Z.compute(), (x - x.mean(axis=(0, 1))) / x.std(axis=(0, 1)), rtol=1e-4, atol=1e-5)
    # a block kernel that returns C-ordered (rows, T, f) output is brought back to the time-major layout
    C = X.map_blocks(lambda b: np.ascontiguousarray(b * 2))
    assert is_time_major(_block(C, 0))
    np.testing.assert_allclose(C.compute(), 2 * x)
    np.testing.assert_array_equal(X[:, -1, :].compute(), x[:, -1, :])  # last time step: a 2-D GDataSet


@pytest.mark.parametrize("index", [np.array([0, 3, 17, 18, 40, 49]), slice(10, 30), slice(None, None, 7),
                                   np.arange(50) % 3 == 0, [1, 2, 2, 20]],
                         ids=["ints", "slice", "step", "mask", "list"])
def test_row_selection(seq, index):
    x, X = seq
    S = X[index]
    np.testing.assert_array_equal(S.compute(), x[index])
    assert all(r > 0 for r in S.row_blocks) and all(is_time_major(_block(S, i)) for i in range(S.nblocks))


def test_row_selection_2d_and_errors(seq):
    x2 = np.asfortranarray(np.arange(40.0).reshape(20, 2))
    X2 = gdask.from_array(x2, block_rows=6)
    S = X2[[1, 2, 13]]
    assert S.row_blocks == (2, 1) and _block(S, 0).flags.f_contiguous
    np.testing.assert_array_equal(S.compute(), x2[[1, 2, 13]])
    np.testing.assert_array_equal(X2[5:9, 1].compute(), x2[5:9, 1])
    X = seq[1]
    with pytest.raises(ValueError, match="ascending"):
        X[[3, 1]]
    with pytest.raises(IndexError, match="no rows"):
        X[np.zeros(50, bool)]
    with pytest.raises(TypeError, match="X\\[\\[i\\]\\]"):
        X[3]


def test_from_dask_array_and_update_blocks(seq):
    x, X = seq
    D = gdask.from_dask_array(da.from_array(x, chunks=(20, 3, 2)))
    assert D.row_blocks == (20, 20, 10) and is_time_major(_block(D, 0))
    np.testing.assert_array_equal(D.compute(), x)
    U = X.update_blocks({1: np.ones((16, 7, 3), np.float32)})
    np.testing.assert_array_equal(U.compute()[16:32], 1)
    with pytest.raises(ValueError, match="shape"):
        X.update_blocks({1: np.ones((16, 3), np.float32)})


def test_time_major_blocks_survive_the_window_cache():
    from gdask.devices import DeviceSpec, make_device
    from gdask.window_cache import WindowStore

    dev = make_device(DeviceSpec(index=0, backend="emulated", memory=2048))
    store = WindowStore("lru", device=dev, reserve=0)
    for i in range(4):  # 672 bytes each: they do not all fit in 2 KiB
        store[i] = dev.asarray(np.full((7, 8, 3), i, np.float32), order="C").transpose(1, 0, 2)
    for i in range(4):
        got = store[i]
        assert is_time_major(got) and (got == i).all()
    assert store.counters["evictions"] > 0 and store.counters["bytes_h2d"] > 0
