"""GDataSet: row-blocked datasets whose blocks live in device memory, as a Dask collection."""

from __future__ import annotations

from gdask.gdataset._blocks import device_call, sum_parts
from gdask.gdataset._channel import IterationChannel
from gdask.gdataset._collective import CollectiveError, Communicator, run_on_workers
from gdask.gdataset._core import GDataSet
from gdask.gdataset._creation import default_block_rows, from_array, from_dask_array, from_dataframe
from gdask.gdataset._engine import (
                                    MODES,
                                    Blocks,
                                    EngineResult,
                                    IterativeAlgorithm,
                                    LoopContext,
                                    exceeds_devices,
                                    run_loop,
)
from gdask.gdataset._iterate import IterateResult, IterationContext, iterate
from gdask.gdataset._progress import Progress
from gdask.gdataset._repr import block_workers, groups_of, persisted_futures
from gdask.gdataset._seq import is_time_major, time_major
from gdask.gdataset._share import DeviceShare, device_share
from gdask.gdataset._tracker import ExecutionLog, GTracker, incremental

__all__ = [
    "Blocks", "CollectiveError", "Communicator", "DeviceShare", "EngineResult", "ExecutionLog", "GDataSet",
    "GTracker", "IterateResult", "IterationChannel", "IterationContext", "IterativeAlgorithm", "LoopContext",
    "MODES", "Progress", "block_workers", "default_block_rows", "device_call", "device_share", "exceeds_devices",
    "from_array", "from_dask_array", "from_dataframe", "groups_of", "incremental", "is_time_major", "iterate",
    "persisted_futures", "run_loop", "run_on_workers", "sum_parts", "time_major",
]
