"""Input handling shared by the gdask.ml estimators."""

from __future__ import annotations

from typing import Any

from gdask.gdataset import GDataSet
from gdask.gdataset._blocks import array_module


def module_name(x: Any) -> str:
    """Top-level module of ``x``'s type ("numpy", "cupy", "pandas", ...)."""
    return type(x).__module__.split(".")[0]


def is_host_input(X: Any) -> bool:
    """In-memory host data scikit-learn's own validation understands (arrays, lists, pandas, sparse)."""
    if isinstance(X, GDataSet) or module_name(X) in ("cupy", "cudf", "dask_cudf"):
        return False
    return not hasattr(X, "__dask_graph__")


def all_finite(b: Any) -> bool:
    """Whether a block has no NaN or infinity."""
    return bool(b.dtype.kind in "biu" or array_module(b).isfinite(b).all())


def check_finite(X: GDataSet, what: str = "X") -> None:
    """Raise ``ValueError`` when the GDataSet ``X`` contains NaN or infinity (one pass over it)."""
    if not X.reduce_blocks(all_finite, all, name="check-finite").compute():
        raise ValueError(f"Input {what} contains NaN or infinity; remove or impute them before fitting")
