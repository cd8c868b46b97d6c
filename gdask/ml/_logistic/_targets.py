"""Logistic regression's targets and weights on the client: blocked like X, and the class codes."""

from __future__ import annotations

from typing import Any

import numpy as np

from gdask.gdataset import GDataSet
from gdask.gdataset import from_dask_array as gdask_from_dask_array

__all__ = ["aligned", "encode"]


def aligned(v: Any, G: GDataSet, what: str) -> GDataSet:
    """A 1-D GDataSet blocked exactly like ``G`` from a GDataSet, dask array or dask Series ``v``."""
    if isinstance(v, GDataSet):
        out = v
    else:
        import dask.array as da

        if hasattr(v, "to_dask_array"):  # dask Series / single-column DataFrame
            v = v.to_dask_array(lengths=True)
        if not isinstance(v, da.Array):
            raise TypeError(f"{what} must be an array, a pandas Series, a GDataSet or a dask array, "
                            f"got {type(v).__name__}")
        if v.ndim == 2 and v.shape[1] == 1:
            v = v[:, 0]
        if v.ndim == 1 and v.shape[0] == G.shape[0] and tuple(v.chunks[0]) != G.row_blocks:
            v = v.rechunk({0: G.row_blocks})
        out = gdask_from_dask_array(v) if v.ndim == 1 else None
        if out is None:
            raise ValueError(f"{what} must be 1-D, got shape {v.shape}")
    if out.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {out.shape}")
    if out.shape[0] != G.shape[0]:
        raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                         f"X has {G.shape[0]}, {what} has {out.shape[0]}")
    if out.row_blocks != G.row_blocks:
        raise ValueError(f"{what} as a GDataSet must be blocked like X (row_blocks {G.row_blocks[:4]}...); "
                         f"got {out.row_blocks[:4]}...; create it with block_rows=X.row_blocks")
    return out


def encode(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(y, return_inverse=True)``; integer labels of a small range by counting (no sort)."""
    if y.dtype.kind in "iu" and y.size:
        lo, hi = int(y.min()), int(y.max())
        if hi - lo < max(1 << 16, y.size):
            off = y.astype(np.int64) - lo
            present = np.bincount(off, minlength=hi - lo + 1) > 0
            classes = (np.flatnonzero(present) + lo).astype(y.dtype)
            return classes, (np.cumsum(present) - 1)[off]
    classes, codes = np.unique(y, return_inverse=True)
    return classes, codes.ravel()
