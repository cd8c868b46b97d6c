"""Input and output adaptation of the estimators of ``_decomposition``, ``_linear_model`` and
``_mixture``: every input type becomes a GDataSet, every result goes back as the input's type.

* NumPy / pandas / lists go through scikit-learn's ``validate_data`` (its errors, ``n_features_in_``,
  ``feature_names_in_``) and come back as NumPy.
* CuPy arrays come back as CuPy arrays.
* GDataSets give lazy GDataSets, dask arrays and dask DataFrames lazy dask arrays (NumPy chunks),
  blocked like X (scikit-learn returns arrays for DataFrames too).

One module so that these estimators move onto a shared estimator base in one place.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from gdask.devices import to_numpy
from gdask.gdataset import GDataSet, from_array, from_dataframe
from gdask.gdataset import from_dask_array as gdask_from_dask_array
from gdask.ml._base import is_host_input, module_name

__all__ = ["aligned", "as_gdataset", "check_int", "check_real", "collect", "host", "is_dask", "output",
           "sample_weights", "to_dask_array"]


def is_dask(x: Any) -> bool:
    """A dask collection other than a GDataSet."""
    return hasattr(x, "__dask_graph__") and not isinstance(x, GDataSet)


def check_real(est: Any, name: str, low: float | None = None, high: float | None = None, *,
               low_open: bool = False, high_open: bool = False, none: bool = False) -> None:
    """Raise ValueError naming the parameter when ``est.<name>`` is not a real number in the range."""
    v = getattr(est, name)
    if v is None and none:
        return
    bad = isinstance(v, bool) or not isinstance(v, numbers.Real) or np.isnan(v)
    if not bad and low is not None:
        bad = v <= low if low_open else v < low
    if not bad and high is not None:
        bad = v >= high if high_open else v > high
    if bad:
        lo = "" if low is None else f"{'(' if low_open else '['}{low}, "
        hi = "inf)" if high is None else f"{high}{')' if high_open else ']'}"
        raise ValueError(f"The '{name}' parameter of {type(est).__name__} must be a float in the range "
                         f"{lo or '(-inf, '}{hi}{' or None' if none else ''}. Got {v!r} instead.")


def check_int(est: Any, name: str, low: int = 0, *, none: bool = False, extra: tuple = ()) -> None:
    """Raise ValueError naming the parameter when ``est.<name>`` is not an int >= ``low`` (or one of ``extra``)."""
    v = getattr(est, name)
    if (v is None and none) or (isinstance(v, str) and v in extra):
        return
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
        also = "".join(f" or {e!r}" for e in extra) + (" or None" if none else "")
        raise ValueError(f"The '{name}' parameter of {type(est).__name__} must be an int in the range "
                         f"[{low}, inf){also}. Got {v!r} instead.")


def _float_input(G: GDataSet) -> GDataSet:
    if G.dtype.kind != "f":
        return G.astype(np.float64)
    if G.dtype.itemsize < 4:  # float16: computed in float32
        return G.astype(np.float32)
    return G


def as_gdataset(est: Any, X: Any, *, reset: bool, block_rows: Any = None, ensure_min_samples: int = 1
                ) -> tuple[GDataSet, str]:
    """``(GDataSet, kind)`` of any input, ``kind`` one of "numpy", "cupy", "gdataset", "dask" (what the
    results come back as, see :func:`output`). Sets or checks ``n_features_in_`` (and
    ``feature_names_in_``) on ``est``."""
    if is_host_input(X):
        from sklearn.utils.validation import validate_data

        Xh = validate_data(est, X, accept_sparse=False, dtype=[np.float64, np.float32], reset=reset,
                           ensure_min_samples=ensure_min_samples)
        return from_array(Xh, block_rows=block_rows), "numpy"
    if isinstance(X, GDataSet):
        G, kind = X, "gdataset"
    elif module_name(X) == "cupy":
        G, kind = from_array(X, block_rows=block_rows), "cupy"
    elif module_name(X) == "cudf":
        G, kind = from_dataframe(X), "gdataset"
    else:  # dask arrays, dask (cuDF) DataFrames
        G = from_dataframe(X) if hasattr(X, "columns") else gdask_from_dask_array(X)
        kind = "dask"
    name = type(est).__name__
    if G.ndim != 2:
        raise ValueError(f"{name} needs 2-D X (n_samples, n_features), got shape {G.shape}; reshape it "
                         "(X.reshape(-1, 1) for a single feature)")
    if G.shape[0] < ensure_min_samples:
        raise ValueError(f"Found array with {G.shape[0]} sample(s) (shape={G.shape}) while a minimum of "
                         f"{ensure_min_samples} is required by {name}.")
    G = _float_input(G)
    if reset:
        est.n_features_in_ = G.shape[1]
        if G.columns is not None:
            est.feature_names_in_ = np.asarray(G.columns, dtype=object)
        elif hasattr(est, "feature_names_in_"):
            del est.feature_names_in_
    elif G.shape[1] != est.n_features_in_:
        raise ValueError(f"X has {G.shape[1]} features, but {name} is expecting {est.n_features_in_} features "
                         "as input.")
    return G, kind


def aligned(v: Any, G: GDataSet, what: str, dtype: Any = np.float64, ndim: tuple[int, ...] = (1,)) -> GDataSet:
    """``v`` (host, CuPy, dask or GDataSet; ``len(G)`` rows) as a GDataSet blocked like ``G``."""
    if isinstance(v, GDataSet):
        out = v
    elif is_dask(v):
        import dask.array as da

        if hasattr(v, "to_dask_array"):  # dask Series / DataFrame
            v = v.to_dask_array(lengths=True)
        if not isinstance(v, da.Array):
            raise TypeError(f"{what} must be an array, a GDataSet or a dask array, got {type(v).__name__}")
        if v.shape[0] == G.shape[0] and tuple(v.chunks[0]) != G.row_blocks:
            v = v.rechunk({0: G.row_blocks})
        out = gdask_from_dask_array(v)
    else:
        host = to_numpy(v) if module_name(v) == "cupy" else np.asarray(v)
        if host.shape[:1] != (G.shape[0],):
            raise ValueError(f"Found input variables with inconsistent numbers of samples: [{G.shape[0]}, "
                             f"{host.shape[0] if host.ndim else 1}] (X and {what})")
        out = from_array(np.ascontiguousarray(host), block_rows=G.row_blocks)
    if out.ndim not in ndim:
        raise ValueError(f"{what} must be {' or '.join(f'{d}-D' for d in ndim)}, got shape {out.shape}")
    if out.shape[0] != G.shape[0]:
        raise ValueError(f"Found input variables with inconsistent numbers of samples: [{G.shape[0]}, "
                         f"{out.shape[0]}] (X and {what})")
    if out.row_blocks != G.row_blocks:
        raise ValueError(f"{what} as a GDataSet must be blocked like X; create it with block_rows=X.row_blocks")
    return out if dtype is None or out.dtype == np.dtype(dtype) else out.astype(dtype)


def sample_weights(sample_weight: Any, G: GDataSet, *, non_negative: bool = True) -> tuple[GDataSet | None, Any]:
    """``(weights blocked like G or None, their host copy or None)``; host weights are checked as
    scikit-learn checks them (shape, finite, non-negative)."""
    if sample_weight is None:
        return None, None
    if isinstance(sample_weight, GDataSet) or is_dask(sample_weight):
        return aligned(sample_weight, G, "sample_weight"), None
    from sklearn.utils.validation import _check_sample_weight

    w = to_numpy(sample_weight) if module_name(sample_weight) == "cupy" else sample_weight
    w = _check_sample_weight(w, np.empty((G.shape[0], 0)), dtype=np.float64, ensure_non_negative=non_negative)
    return from_array(w, block_rows=G.row_blocks), w


def collect(G: GDataSet) -> np.ndarray:
    """A GDataSet computed to one host NumPy array."""
    return np.asarray(to_numpy(G.compute()))


def host(result: Any) -> np.ndarray:
    """Any result (NumPy, CuPy, GDataSet, dask array) as a host NumPy array (computed)."""
    if isinstance(result, GDataSet):
        return collect(result)
    if is_dask(result):
        result = result.compute()
    return np.asarray(to_numpy(result))


def _to_host_block(b: Any) -> Any:
    return to_numpy(b)


def to_dask_array(G: GDataSet) -> Any:
    """A dask array (NumPy chunks) blocked like ``G``: each chunk is its block moved to the host."""
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
    from dask.task_spec import Task, TaskRef

    name = f"to-host-{tokenize(G.name)}"
    tail = (0,) * (G.ndim - 1)
    layer = {(name, i, *tail): Task((name, i, *tail), _to_host_block, TaskRef((G.name, i)))
             for i in range(G.nblocks)}
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[G])
    chunks = (G.row_blocks, *((s,) for s in G.shape[1:]))
    return da.Array(graph, name, chunks, meta=np.empty((0,) * G.ndim, dtype=G.dtype))


def output(result: Any, kind: str) -> Any:
    """A result in the input's type: a lazy GDataSet stays one ("gdataset") or becomes a dask array
    ("dask"); host results become CuPy for "cupy" input, NumPy otherwise (a GDataSet computed)."""
    if isinstance(result, GDataSet):
        if kind == "gdataset":
            return result
        if kind == "dask":
            return to_dask_array(result)
        result = collect(result)
    if kind == "cupy":
        import cupy

        return cupy.asarray(result)
    return result
