"""The layout of sequence blocks (``(n, T, f)`` data blocked along ``n``), and the block side of row selection.

A 3-D GDataSet holds ``n`` sequences of ``T`` steps of ``f`` features, blocked along ``n``. Inside a
block the memory is *time-major*, ``(T, rows, f)`` C-contiguous, the layout cuDNN's (and
``torch.nn.LSTM``'s, ``batch_first=False``) recurrent kernels read: one time step of every sequence
of the block is one contiguous run. Block functions see the block with the GDataSet's logical axis
order, ``(rows, T, f)``, as a strided view of that memory (as 2-D blocks are Fortran-ordered views),
so indexing, broadcasting and reductions read as for NumPy data, and :func:`time_major` gives the
``(T, rows, f)`` C-contiguous array without a copy.

Row selection (``X[rows]``, built in :mod:`gdask.gdataset._core` from :func:`row_index` and
:func:`take_rows`) keeps every selected row in its block: blocks stay where they are (no transfer
between devices), and blocks left without rows are dropped.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from gdask.devices import array_module, array_namespace, asarray_like, current_device, is_strict, to_numpy

__all__ = ["is_time_major", "row_index", "take_rows", "time_major", "to_device", "to_time_major"]


def time_major(b: Any) -> Any:
    """The ``(T, rows, f)`` view of a ``(rows, T, f)`` sequence block (C-contiguous for blocks in
    the time-major layout: no copy)."""
    if getattr(b, "ndim", 0) != 3:
        raise ValueError(f"time_major needs a 3-D (rows, T, f) block, got shape {getattr(b, 'shape', None)}")
    return array_namespace(b).permute_dims(b, (1, 0, 2))


def is_time_major(b: Any) -> bool:
    """Whether a 3-D block is stored time-major (its ``(T, rows, f)`` view is C-contiguous). Arrays
    without a memory layout (array-api-strict) count as time-major."""
    if getattr(b, "ndim", 0) != 3:
        return False
    return is_strict(b) or bool(b.transpose(1, 0, 2).flags.c_contiguous)


def to_time_major(b: Any) -> Any:
    """``b`` (a ``(rows, T, f)`` array) in the time-major layout: ``b`` itself when it is, else a copy
    made by ``b``'s own array module."""
    if is_time_major(b):
        return b
    return array_module(b).ascontiguousarray(b.transpose(1, 0, 2)).transpose(1, 0, 2)


def to_device(chunk: Any) -> Any:
    """Copy a host (or other-device) ``(rows, T, f)`` chunk onto this process's device, time-major
    (the task function of 3-D blocks, as :func:`gdask.gdataset._blocks.to_device` for 1-D/2-D)."""
    dev = current_device()
    if dev.backend == "emulated-strict":  # strict arrays have no memory layout to choose
        return dev.asarray(chunk)
    return dev.asarray(chunk.transpose(1, 0, 2), order="C").transpose(1, 0, 2)


def take_rows(b: Any, rows: Any) -> Any:
    """Rows ``rows`` (block-local indices) of a block, in the block's layout."""
    xp = array_namespace(b)
    rows = asarray_like(rows, b)
    if b.ndim == 3:  # (T, rows, f) in, (T, rows, f) out: the time-major layout stays
        return xp.permute_dims(xp.take(xp.permute_dims(b, (1, 0, 2)), rows, axis=1), (1, 0, 2))
    if b.ndim == 2:
        return xp.take(b.T, rows, axis=1).T  # Fortran order in, Fortran order out
    return xp.take(b, rows, axis=0)


def row_index(index: Any, n: int) -> np.ndarray:
    """Sorted global row numbers (int64) from a slice, integer or boolean array, or list."""
    if isinstance(index, slice):
        start, stop, step = index.indices(n)
        if step <= 0:
            raise ValueError(f"row slices must have a positive step, got {index}: the rows stay in their blocks, "
                             "so a GDataSet keeps row order")
        return np.arange(start, stop, step, dtype=np.int64)
    if isinstance(index, numbers.Integral) and not isinstance(index, bool):
        raise TypeError("X[i] with one integer would drop the row axis; select rows with X[[i]] or a slice")
    if hasattr(index, "__dask_graph__"):
        raise TypeError("GDataSet row selection needs in-memory indices (NumPy array, list, slice); compute a "
                        "lazy mask first, e.g. X[np.asarray(mask.compute())]")
    idx = to_numpy(index) if not isinstance(index, (list, tuple)) else np.asarray(index)
    if idx.dtype == bool:
        if idx.shape != (n,):
            raise IndexError(f"a boolean row mask must have shape ({n},), got {idx.shape}")
        return np.flatnonzero(idx).astype(np.int64)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise IndexError(f"rows must be a 1-D integer or boolean array, a list or a slice; got {idx.dtype} of "
                         f"shape {idx.shape}")
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"row index out of range for {n} rows")
    idx = np.where(idx < 0, idx + n, idx)
    if idx.size > 1 and (np.diff(idx) < 0).any():
        raise ValueError("row indices must be in ascending order: the selected rows stay in their blocks, so "
                         "a GDataSet keeps row order; pass np.sort(rows)")
    return idx
