"""GDataSet: row-blocked datasets whose blocks live in device memory, as a Dask collection."""

from __future__ import annotations

from gdask.gdataset._core import GDataSet
from gdask.gdataset._creation import default_block_rows, from_array, from_dask_array, from_dataframe
from gdask.gdataset._channel import IterationChannel
from gdask.gdataset._iterate import IterateResult, IterationContext, iterate
from gdask.gdataset._tracker import ExecutionLog, GTracker, incremental

__all__ = ["GDataSet", "default_block_rows", "from_array", "from_dask_array", "from_dataframe",
           "ExecutionLog", "GTracker", "IterateResult", "IterationChannel", "IterationContext", "incremental",
           "iterate"]
