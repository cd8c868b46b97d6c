"""GDataSet: row-blocked datasets whose blocks live in device memory, as a Dask collection."""

from __future__ import annotations

from gdask.gdataset._core import GDataSet
from gdask.gdataset._creation import default_block_rows, from_array, from_dask_array, from_dataframe

__all__ = ["GDataSet", "default_block_rows", "from_array", "from_dask_array", "from_dataframe"]
