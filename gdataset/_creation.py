"""Creating GDataSets from NumPy/CuPy arrays, dask arrays and (dask-)DataFrames."""

from __future__ import annotations

import math
import warnings
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import Task, TaskRef

from gdask import GDaskWarning, config
from gdask._compat import scheduler_workers
from gdask.devices import discover, is_sparse, numpy_dtype, parse_size
from gdask.gdataset import _blocks, _output
from gdask.gdataset._core import GDataSet, device_layer
from gdask.gdataset.locality import default_client_or_none
from gdask.scheduling import job_salt

__all__ = ["from_array", "from_dask_array", "from_dataframe", "default_block_rows"]

#: default number of blocks to aim for when the data is large enough (load balance across devices)
_MIN_BLOCKS = 8
_MIN_BLOCK_ROWS = 4096


def _array_module_name(x: Any) -> str:
    """"cupy" and "array_api_strict" for device arrays (blocks are sliced from them on the device),
    else "numpy" (anything NumPy can read)."""
    mod = type(x).__module__.split(".")[0]
    return mod if mod in ("cupy", "array_api_strict") else "numpy"


def _device_backend(input_backend: str) -> str:
    """Array module the blocks will have: CuPy where gdask computes on CUDA."""
    if input_backend == "cupy":
        return "cupy"
    try:
        return "cupy" if discover().backend == "cuda" else "numpy"
    except Exception:  # noqa: BLE001 - discovery problems mean "no CUDA"
        return "numpy"


def _check_dtype(dtype: np.dtype) -> None:
    if dtype.kind not in "biuf":
        raise TypeError(
            f"GDataSet blocks must have a numeric (bool, integer or float) dtype, got {dtype}. "
            "Convert first, e.g. x.astype('float32'), or drop non-numeric columns."
        )


def default_block_rows(n_rows: int, row_bytes: int) -> int:
    """Rows per block: about config ``gdask.gdataset.block-bytes`` per block, and at least
    ``_MIN_BLOCKS`` blocks for large data so several devices (and streams) share the work."""
    target = parse_size(config.get("gdataset.block-bytes", "64MiB"), name="gdask.gdataset.block-bytes")
    by_bytes = max(1, target // max(row_bytes, 1))
    by_count = max(_MIN_BLOCK_ROWS, math.ceil(n_rows / _MIN_BLOCKS))
    return int(max(1, min(by_bytes, by_count, n_rows)))


def _check_block_rows(block_rows: Any) -> int:
    if isinstance(block_rows, bool) or not isinstance(block_rows, (int, np.integer)) or block_rows <= 0:
        raise ValueError(f"block_rows must be a positive integer, got {block_rows!r}")
    return int(block_rows)


def _split(n: int, block_rows: int) -> tuple[int, ...]:
    full, rest = divmod(n, block_rows)
    return (block_rows,) * full + ((rest,) if rest else ())


def from_array(x: Any, block_rows: int | None = None, *, name: str | None = None) -> GDataSet:
    """Split a NumPy or CuPy array (1-D, 2-D, or 3-D sequences ``(n, T, f)``; rows = samples) into
    device blocks.

    Parameters
    ----------
    x : array-like
        NumPy array, CuPy array, or anything ``np.asarray`` accepts. 3-D data is blocked along
        ``n`` and stored time-major inside a block (see :class:`GDataSet`). A SciPy sparse matrix
        or array (any format, converted to CSR) gives CSR blocks (row slices; SciPy CSR on emulated
        devices, ``cupyx.scipy.sparse`` CSR on CUDA): nothing is densified.
    block_rows : int or sequence of int, optional
        Rows per block. Default: about ``gdask.gdataset.block-bytes`` (64 MiB) per block and at
        least 8 blocks for large data. A sequence gives every block's rows, e.g. ``Y.row_blocks``
        to block ``x`` like another GDataSet ``Y``.
    name : str, optional
        Key prefix (default ``"from-array"``); the rest of the key is derived from the content, so the
        same data gives the same keys and other data under the same name gets other keys.

    Returns
    -------
    GDataSet
        Lazy: blocks are copied to devices when computed or persisted.

    Raises
    ------
    ValueError
        Empty data, ``ndim`` not 1, 2 or 3, or ``block_rows <= 0``.
    TypeError
        Non-numeric dtype.

    Examples
    --------
    >>> X = gdask.from_array(np.random.default_rng(0).random((10_000, 8)), block_rows=2_500)
    >>> X.nblocks
    4
    """
    mod = _array_module_name(x)
    input_type = _output.array_type(x)
    if mod == "numpy":
        if hasattr(x, "dtypes") and hasattr(x, "columns"):
            return from_dataframe(x, block_rows=block_rows)
        if is_sparse(x):
            return _from_sparse(x, block_rows, name, input_type)
        if _is_sparse(x):
            raise TypeError(f"from_array takes SciPy sparse matrices and arrays, not {type(x).__module__}."
                            f"{type(x).__name__} (shape {getattr(x, 'shape', '?')}): convert it with "
                            "scipy.sparse.csr_matrix(x) (or x.toarray() if it fits in memory)")
        x = np.asarray(x)
    if x.ndim not in (1, 2, 3):
        raise ValueError(f"from_array needs a 1-D, 2-D or 3-D array (rows = samples; 3-D: (n, T, f) sequences), "
                         f"got {x.ndim}-D of shape {x.shape}")
    dtype = numpy_dtype(x.dtype)
    _check_dtype(dtype)
    n = x.shape[0]
    if n == 0 or 0 in x.shape[1:]:
        raise ValueError(f"cannot make a GDataSet from empty data of shape {x.shape}")
    if block_rows is None:
        row_bytes = dtype.itemsize * math.prod(x.shape[1:])
        block_rows = default_block_rows(n, row_bytes)
    rows = _rows_of(n, block_rows)
    name, graph = _row_slices(x, rows, name)
    return GDataSet(graph, name, rows, x.shape[1:] or None, dtype, _device_backend(mod), input_type=input_type)


def _rows_of(n: int, block_rows: Any) -> tuple[int, ...]:
    """The rows of every block of ``n`` rows: ``block_rows`` per block, or each block's rows."""
    if isinstance(block_rows, (tuple, list)):  # an exact blocking, e.g. another GDataSet's row_blocks
        rows = tuple(_check_block_rows(r) for r in block_rows)
        if sum(rows) != n:
            raise ValueError(f"block_rows {_short_rows(rows)} add up to {sum(rows)} rows, but the array has {n}")
        return rows
    return _split(n, _check_block_rows(block_rows))


def _check_name(name: Any) -> None:
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"name must be a non-empty string (a key prefix), got {name!r}")


def _row_slices(x: Any, rows: tuple[int, ...], name: str | None) -> tuple[str, HighLevelGraph]:
    """The dataset name and graph of ``x``'s row slices of ``rows`` rows each, one ``to_device`` task per
    block (dense arrays of any kind, and SciPy CSR matrices)."""
    _check_name(name)
    # the name is a prefix: keys always name the content, so the same name with other data is another dataset
    name = f"{name or 'from-array'}-{tokenize(x, rows, *job_salt())}"
    layer = {}
    start = 0
    for i, r in enumerate(rows):  # x[a:b, ...]: array-api-strict refuses a partial index of a 2-D array
        layer[(name, i)] = Task((name, i), _blocks.to_device, x[start:start + r, ...])
        start += r
    return name, HighLevelGraph.from_collections(name, device_layer(layer, "to_device"), dependencies=())


def _from_sparse(x: Any, block_rows: Any, name: str | None, input_type: str) -> GDataSet:
    """:func:`from_array` of a SciPy sparse matrix or array (any format, converted to CSR): blocks of
    CSR row slices, O(nnz) each (SciPy CSR on emulated devices, ``cupyx.scipy.sparse`` CSR on CUDA)."""
    if x.ndim != 2:
        raise ValueError(f"from_array needs 2-D sparse data (rows = samples), got shape {x.shape}")
    x = x.tocsr()
    _check_dtype(np.dtype(x.dtype))
    n, d = x.shape
    if n == 0 or d == 0:
        raise ValueError(f"cannot make a GDataSet from empty data of shape {x.shape}")
    if block_rows is None:  # rows of about block-bytes of stored values and indices
        row_bytes = max(1, math.ceil(x.nnz * (x.dtype.itemsize + x.indices.dtype.itemsize) / n))
        block_rows = default_block_rows(n, row_bytes)
    rows = _rows_of(n, block_rows)
    name, graph = _row_slices(x, rows, name)
    return GDataSet(graph, name, rows, d, x.dtype, _device_backend("numpy"), input_type=input_type, nnz=x.nnz)


def _is_sparse(x: Any) -> bool:
    """scipy.sparse matrices and arrays, pydata sparse, CuPy sparse (checked without importing them)."""
    mod = type(x).__module__.split(".")[0]
    return (mod in ("scipy", "sparse", "cupyx") and hasattr(x, "nnz")) or hasattr(x, "todense") and hasattr(x, "nnz")


def _short_rows(rows) -> str:
    return str(rows) if len(rows) <= 6 else f"({rows[0]}, {rows[1]}, ..., {rows[-1]})"


def from_dask_array(a: Any, block_rows: int | None = None) -> GDataSet:
    """A GDataSet whose blocks are the row chunks of a dask array (columns joined into one chunk).

    Parameters
    ----------
    a : dask.array.Array
        1-D, 2-D or 3-D (sequences ``(n, T, f)``), NumPy or CuPy chunks.
    block_rows : int, optional
        Rechunk rows to this size first; default keeps ``a``'s row chunks.
    """
    if not isinstance(a, da.Array):
        raise TypeError(f"from_dask_array needs a dask.array.Array, got {type(a).__name__}")
    if a.ndim not in (1, 2, 3):
        raise ValueError(f"from_dask_array needs a 1-D, 2-D or 3-D array, got {a.ndim}-D")
    if any(math.isnan(s) for s in a.shape):
        raise ValueError("from_dask_array needs known chunk sizes; call a.compute_chunk_sizes() first")
    if is_sparse(getattr(a, "_meta", None)):
        raise TypeError("from_dask_array takes dense chunks; a dask array of sparse chunks is not blocked into CSR "
                        "blocks yet: compute it to one SciPy sparse matrix and pass that to from_array (or to the "
                        "estimator)")
    _check_dtype(np.dtype(a.dtype))
    if a.shape[0] == 0 or 0 in a.shape[1:]:
        raise ValueError(f"cannot make a GDataSet from empty data of shape {a.shape}")
    rechunk: dict[int, Any] = {ax: -1 for ax in range(1, a.ndim) if a.numblocks[ax] != 1}
    if block_rows is not None:
        rechunk[0] = _check_block_rows(block_rows)
    if rechunk:
        a = a.rechunk(rechunk)
    rows = tuple(int(c) for c in a.chunks[0])
    if any(r == 0 for r in rows):
        a = a.rechunk({0: tuple(r for r in rows if r)})
        rows = tuple(int(c) for c in a.chunks[0])
    name = f"from-dask-array-{tokenize(a, *job_salt())}"
    layer = {}
    for i in range(len(rows)):
        src = (a.name, i) + (0,) * (a.ndim - 1)
        layer[(name, i)] = Task((name, i), _blocks.to_device, TaskRef(src))
    graph = HighLevelGraph.from_collections(name, device_layer(layer, "to_device"), dependencies=[a])
    backend = _device_backend(_array_module_name(a._meta))
    return GDataSet(graph, name, rows, a.shape[1:] or None, a.dtype, backend, input_type=_output.array_type(a._meta))


def _kind(t: Any) -> str:
    try:
        return np.dtype(t).kind
    except TypeError:  # pandas extension dtypes (strings, categoricals)
        return "O"


def _column_kinds(df: Any, cols: list[Any]) -> tuple[list[Any], list[Any]]:
    """(categorical columns, columns neither numeric nor categorical) of ``cols``."""
    categorical = [c for c in cols if getattr(df.dtypes[c], "name", "") == "category"]
    other = [c for c in cols if c not in categorical and _kind(df.dtypes[c]) not in "biuf"]
    return categorical, other


def _as_codes(sub: Any, categorical: list[Any], lazy: bool) -> Any:
    """``sub`` with each categorical column replaced by its category codes (-1: missing); a dask
    DataFrame's unknown categories are found first (one pass), so every partition codes alike."""
    if not categorical:
        return sub
    warnings.warn(f"from_dataframe: the categorical column(s) {categorical} become their category codes "
                  "(integers, -1 for a missing value); pass columns=[...] to leave them out", GDaskWarning,
                  stacklevel=3)
    if lazy and not all(sub[c].cat.known for c in categorical):
        sub = sub.categorize(columns=categorical)
    sub = sub.copy()
    for c in categorical:
        sub[c] = sub[c].cat.codes
    return sub


def _client_workers() -> int:
    """Workers of the current Client (0 without one)."""
    client = default_client_or_none()
    if client is None:
        return 0
    return len(scheduler_workers(client))


def from_dataframe(df: Any, block_rows: int | None = None, *, columns: list[Any] | None = None) -> GDataSet:
    """A GDataSet from the numeric columns of a pandas / cuDF / dask(-cuDF) DataFrame.

    Columnar storage maps straight onto the feature-major block layout: each column becomes one
    contiguous run of a block. No column is dropped silently: categorical columns become their
    category codes (with a :class:`gdask.GDaskWarning` naming them), and any other column that is not
    numeric (strings, objects, dates) raises ValueError; choose the columns with ``columns=``. A dask
    DataFrame with fewer partitions than the Client has workers (e.g. one Parquet or CSV file) is
    split into one block per worker, with a warning that says so (``block_rows=`` chooses instead).

    Parameters
    ----------
    df : DataFrame
        pandas, cuDF, dask or dask-cuDF DataFrame.
    block_rows : int, optional
        Rows per block (dask DataFrames: default keeps partitions, or one block per worker when it
        has fewer).
    columns : list, optional
        Columns to use; default: every column.
    """
    cols = list(columns) if columns is not None else list(df.columns)
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise KeyError(f"columns {missing} are not in the DataFrame (it has {list(df.columns)})")
    if not cols:
        raise ValueError("from_dataframe needs at least one column")
    categorical, other = _column_kinds(df, cols)
    if other:
        raise ValueError(f"from_dataframe: column(s) {other} are not numeric (dtypes "
                         f"{ {c: str(df.dtypes[c]) for c in other} }); choose numeric columns with columns=[...], or "
                         "convert them first (pd.to_numeric, or .astype('category') for their codes)")
    mod = type(df).__module__.split(".")[0]
    lazy = mod in ("dask", "dask_cudf")
    sub = _as_codes(df[cols], categorical, lazy)
    dtype = np.result_type(*[np.dtype(t) for t in sub.dtypes])
    _check_dtype(dtype)
    if lazy:
        arr = sub.to_dask_array(lengths=True).astype(dtype)
        workers = _client_workers()
        if block_rows is None and arr.numblocks[0] < workers and arr.shape[0] >= workers:
            block_rows = math.ceil(arr.shape[0] / workers)
            warnings.warn(f"from_dataframe: the DataFrame has {arr.numblocks[0]} partition(s) for {workers} workers: "
                          f"its {arr.shape[0]} rows are split into blocks of {block_rows} rows, one per worker, so "
                          "that every device has work (pass block_rows= to choose)", GDaskWarning, stacklevel=2)
        out = from_dask_array(arr, block_rows=block_rows)
    elif mod == "cudf":
        out = from_array(sub.to_cupy(dtype=dtype), block_rows=block_rows)
    else:
        out = from_array(np.asfortranarray(sub.to_numpy(dtype=dtype)), block_rows=block_rows)
    out.columns = [str(c) for c in cols]
    return out
