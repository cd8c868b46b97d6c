"""The estimators' shared base (gdask.ml._base): one way to read inputs, cuML's ``output_type``
convention for what comes back (issue 23 item 1), the job parameters' docs written once."""

from __future__ import annotations

import sys
import types

import dask
import numpy as np
import pandas as pd
import pytest

import gdask
from gdask.devices import to_numpy
from gdask.ml import KMeans, LogisticRegression
from gdask.ml._base import InputKind, host_array, input_kind


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(c, 0.5, (100, 3)) for c in (0, 4, 8)])
    return x, (x[:, 0] > 4).astype(int)


class FakeCupyArray:
    """Stands for a CuPy array (no GPU here): the type's module is ``cupy``."""

    __module__ = "cupy"

    def __init__(self, a):
        self.a = np.asarray(a)
        self.shape, self.dtype, self.ndim = self.a.shape, self.a.dtype, self.a.ndim

    def get(self):
        return self.a


@pytest.fixture
def fake_cupy(monkeypatch):
    mod = types.ModuleType("cupy")
    mod.asarray = FakeCupyArray
    monkeypatch.setitem(sys.modules, "cupy", mod)
    return mod


def test_one_place_tells_inputs_apart(data):
    import dask.array as da
    import dask.dataframe as dd

    x, _ = data
    df = pd.DataFrame(x, columns=list("abc"))
    assert input_kind(x) == input_kind(x.tolist()) == input_kind(df) == InputKind("array", "numpy")
    assert input_kind(x).host and not input_kind(x).lazy
    assert input_kind(gdask.from_array(x)) == InputKind("gdataset", "numpy")
    assert input_kind(da.from_array(x)) == input_kind(dd.from_pandas(df, npartitions=2)) == InputKind("dask", "numpy")
    assert input_kind(FakeCupyArray(x)) == InputKind("array", "cupy")
    assert not input_kind(FakeCupyArray(x)).host
    strict = pytest.importorskip("array_api_strict")
    assert input_kind(strict.asarray(x)) == InputKind("array", "device")


def test_host_array_brings_targets_and_weights_to_the_host(data):
    import dask.array as da

    x, y = data
    assert host_array(y) is y and host_array(None) is None
    np.testing.assert_array_equal(host_array(da.from_array(y, chunks=50)), y)
    np.testing.assert_array_equal(host_array(gdask.from_array(y, block_rows=50)), y)
    np.testing.assert_array_equal(host_array(FakeCupyArray(y)), y)


def test_numpy_in_numpy_out_and_lazy_in_lazy_out(data):
    x, y = data
    km = KMeans(3, random_state=0, max_iter=10).fit(x)
    assert type(km.cluster_centers_) is np.ndarray and type(km.labels_) is np.ndarray
    assert type(km.predict(x)) is np.ndarray and type(km.transform(x)) is np.ndarray
    G = gdask.from_array(x, block_rows=100)
    kg = KMeans(3, random_state=0, max_iter=10, output_type="numpy").fit(G)
    assert type(kg.cluster_centers_) is np.ndarray and isinstance(kg.labels_, gdask.GDataSet)
    assert isinstance(kg.predict(G), gdask.GDataSet)  # lazy stays lazy whatever the output type
    lr = LogisticRegression().fit(x, y)
    for out in (lr.coef_, lr.intercept_, lr.predict(x), lr.predict_proba(x), lr.decision_function(x)):
        assert type(out) is np.ndarray
    assert isinstance(lr.predict_proba(G), gdask.GDataSet)


def test_output_type_cupy_and_the_config_key(data, fake_cupy):
    x, y = data
    ref = KMeans(3, random_state=0, max_iter=10).fit(x)
    km = KMeans(3, random_state=0, max_iter=10, output_type="cupy").fit(x)
    assert isinstance(km.cluster_centers_, FakeCupyArray) and isinstance(km.labels_, FakeCupyArray)
    np.testing.assert_array_equal(km.cluster_centers_.get(), ref.cluster_centers_)  # the same bits
    assert isinstance(km.predict(x), FakeCupyArray) and isinstance(km.transform(x), FakeCupyArray)
    with dask.config.set({"gdask.output-type": "cupy"}):
        lr = LogisticRegression().fit(x, y)
        assert isinstance(lr.coef_, FakeCupyArray) and isinstance(lr.predict_proba(x), FakeCupyArray)
        assert isinstance(LogisticRegression(output_type="numpy").fit(x, y).coef_, np.ndarray)  # the parameter wins
        strings = np.where(y == 1, "up", "down")
        assert LogisticRegression().fit(x, strings).predict(x).dtype.kind == "U"  # labels device arrays cannot hold


@pytest.mark.parametrize("bad", ["torch", "NumPy"])
def test_an_unknown_output_type_is_refused(data, bad):
    x, _ = data
    with pytest.raises(ValueError, match="output_type must be one of"):
        KMeans(3, max_iter=2, output_type=bad).fit(x)
    with dask.config.set({"gdask.output-type": bad}), pytest.raises(ValueError, match="gdask.output-type"):
        KMeans(3, max_iter=2).fit(x)


def test_output_type_device_gives_the_devices_arrays(data, backend):
    x, y = data
    ref = KMeans(3, random_state=0, max_iter=10).fit(x)
    km = KMeans(3, random_state=0, max_iter=10, output_type="device").fit(x)
    lr = LogisticRegression(output_type="device").fit(x, y)
    results = [km.cluster_centers_, km.labels_, km.predict(x), km.transform(x), lr.coef_, lr.predict_proba(x)]
    want = "array_api_strict" if backend == "emulated-strict" else "numpy"
    assert {type(r).__module__.split(".")[0] for r in results} == {want}
    np.testing.assert_array_equal(to_numpy(km.cluster_centers_), ref.cluster_centers_)
    np.testing.assert_array_equal(to_numpy(km.labels_), ref.labels_)


def test_the_shared_parameter_docs_are_in_every_estimator():
    from gdask.ml import LSTMClassifier, LSTMRegressor, pagerank

    for obj in (KMeans, LogisticRegression, LSTMRegressor, pagerank):
        doc = obj.__doc__
        assert "{job_parameters}" not in doc and "{output_type_parameter}" not in doc
        assert "\n    gpu : float, optional\n        Run inside ``gdask.job(" in doc, obj
        assert "\n    job_name : str, optional\n" in doc
    for cls in (KMeans, LogisticRegression, LSTMRegressor, LSTMClassifier):
        assert "output_type" in cls().get_params()
        if cls is not LSTMClassifier:
            assert '\n    output_type : {"input", "numpy", "cupy", "device"}, optional\n' in cls.__doc__
