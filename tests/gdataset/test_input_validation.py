"""GDataSet inputs that were accepted and gave wrong or confusing results (issue #17, item 8)."""

from __future__ import annotations

import numpy as np
import pytest

import gdask


def test_name_is_a_key_prefix_not_the_key():
    a = gdask.from_array(np.zeros((8, 2)), block_rows=4, name="train")
    b = gdask.from_array(np.ones((8, 2)), block_rows=4, name="train")
    assert a.name != b.name and a.name.startswith("train-") and b.name.startswith("train-")
    np.testing.assert_array_equal(b.compute(), np.ones((8, 2)))  # before: the first data came back
    assert gdask.from_array(np.ones((8, 2)), block_rows=4, name="train").name == b.name  # same data, same keys
    with pytest.raises(TypeError, match="name must be a non-empty string"):
        gdask.from_array(np.ones(3), name="")


def test_sparse_input_gives_csr_blocks():
    """SciPy sparse input is blocked into CSR row slices (was refused; tests/ml/test_sparse_input.py tests more)."""
    sp = pytest.importorskip("scipy.sparse")
    x = sp.random(5, 5, density=0.5, format="csc", random_state=0)
    X = gdask.from_array(x, block_rows=2)
    assert X.nnz == x.nnz
    assert abs(X.compute() - x).max() == 0


def drop_a_row(b):
    return b[1:]


def to_scalar(b):
    return b.sum()


def double(b):
    return 2 * b


def test_map_blocks_checks_the_rows_a_kernel_returns():
    X = gdask.from_array(np.arange(16.0).reshape(8, 2), block_rows=4)
    with pytest.raises(ValueError, match="drop_a_row returned 3 rows for a block of 4 rows"):
        X.map_blocks(drop_a_row, dtype=X.dtype, ncols=2).compute(scheduler="sync")
    with pytest.raises(ValueError, match="to_scalar returned a scalar"):
        X.map_blocks(to_scalar, dtype=X.dtype, ncols=None).compute(scheduler="sync")
    with pytest.raises(ValueError, match="could not infer the output of to_scalar.*returned a scalar"):
        X.map_blocks(to_scalar)
    np.testing.assert_array_equal(X.map_blocks(double).compute(scheduler="sync"), 2 * np.arange(16.0).reshape(8, 2))
    assert X.map_blocks(double).name.startswith("double-")


@pytest.mark.parametrize("dtype", [str, object, "U3", "M8[s]", complex])
def test_astype_refuses_non_numeric_dtypes(dtype):
    X = gdask.from_array(np.ones((4, 2)), block_rows=2)
    with pytest.raises(TypeError, match="numeric"):
        X.astype(dtype)
    assert X.astype("float32").dtype == np.float32
