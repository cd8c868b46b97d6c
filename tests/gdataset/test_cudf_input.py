"""cuDF DataFrames become device blocks without a host round trip: checked with a stand-in for cuDF
(a DataFrame type of module ``cudf`` whose data is array-api-strict arrays on the strict emulated device,
as cuDF's is CuPy on the GPU), whose every way to the host fails the test."""

from __future__ import annotations

import dask
import numpy as np
import pandas as pd
import pytest

import gdask

xp = pytest.importorskip("array_api_strict")


def _no_host(*args, **kwargs):
    raise AssertionError("the DataFrame was copied to the host")


class FakeCudfFrame:
    """The part of ``cudf.DataFrame`` that ``from_dataframe`` may use, over a pandas frame that stands
    for device memory: columns, dtypes, column selection, categorical codes, ``to_cupy``."""

    def __init__(self, pdf: pd.DataFrame) -> None:
        self._pdf = pdf
        self.to_cupy_calls: list = []

    @property
    def columns(self):
        return self._pdf.columns

    @property
    def dtypes(self):
        return self._pdf.dtypes

    def __getitem__(self, cols):
        if isinstance(cols, list):
            return FakeCudfFrame(self._pdf[cols])
        return FakeCudfSeries(self._pdf[cols])

    def __setitem__(self, col, value):
        self._pdf[col] = value._s if isinstance(value, FakeCudfSeries) else value

    def copy(self):
        return FakeCudfFrame(self._pdf.copy())

    def to_cupy(self, dtype=None):
        from gdask._devices._strict import STRICT_DEVICE

        self.to_cupy_calls.append(dtype)
        return xp.asarray(self._pdf.to_numpy(dtype=dtype), device=xp.Device(STRICT_DEVICE))

    to_numpy = to_pandas = values = __array__ = __iter__ = _no_host


class FakeCudfSeries:
    def __init__(self, s: pd.Series) -> None:
        self._s = s

    @property
    def cat(self):
        return FakeCudfCat(self._s)

    to_numpy = to_pandas = values = __array__ = __iter__ = _no_host


class FakeCudfCat:
    def __init__(self, s: pd.Series) -> None:
        self._s = s

    @property
    def codes(self):
        return FakeCudfSeries(self._s.cat.codes)


for cls in (FakeCudfFrame, FakeCudfSeries, FakeCudfCat):
    cls.__module__ = "cudf.core.dataframe"


def _frame():
    rng = np.random.default_rng(0)
    return pd.DataFrame({"a": rng.standard_normal(1000), "b": rng.integers(0, 9, 1000),
                         "color": pd.Categorical(rng.choice(["red", "blue", "green"], 1000))})


def test_a_cudf_frame_becomes_device_blocks_without_a_host_copy():
    pdf = _frame()
    df = FakeCudfFrame(pdf)
    with dask.config.set({"gdask.backend": "emulated-strict"}):  # local work on the strict device
        X = gdask.from_dataframe(df, block_rows=300, columns=["a", "b"])
        assert X.shape == (1000, 2) and X.nblocks == 4 and X.columns == ["a", "b"]
        assert X.input_type == "device"  # results come back as the device's arrays, as cuDF's become CuPy
        blocks = [X.block(i).compute() for i in range(X.nblocks)]
    assert all(type(b).__module__.startswith("array_api_strict") for b in blocks)
    got = np.concatenate([np.asarray(xp.asarray(b, device=xp.Device("CPU_DEVICE"))) for b in blocks])
    np.testing.assert_array_equal(got, pdf[["a", "b"]].to_numpy(np.float64))


def test_a_cudf_categorical_column_becomes_its_codes_on_the_device():
    pdf = _frame()
    df = FakeCudfFrame(pdf)
    with dask.config.set({"gdask.backend": "emulated-strict"}):
        with pytest.warns(gdask.GDaskWarning, match=r"categorical column\(s\) \['color'\] become their category"):
            X = gdask.from_dataframe(df, block_rows=500, columns=["a", "color"])
        out = gdask.to_numpy(X.compute())
    np.testing.assert_array_equal(out[:, 1], pdf["color"].cat.codes.to_numpy())
    np.testing.assert_array_equal(out[:, 0], pdf["a"].to_numpy())


def test_a_cudf_frame_with_text_columns_is_refused_before_any_copy():
    df = FakeCudfFrame(pd.DataFrame({"a": [1.0, 2.0], "s": ["x", "y"]}))
    with pytest.raises(ValueError, match=r"column\(s\) \['s'\] are not numeric"):
        gdask.from_dataframe(df)
    assert df.to_cupy_calls == []
