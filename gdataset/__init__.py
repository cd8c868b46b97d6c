"""GDataSet: row-blocked datasets whose blocks live in device memory, as a Dask collection.

Public modules: :mod:`gdask.gdataset.engine` (the iteration engine), :mod:`gdask.gdataset.collective`
(loops on the workers), :mod:`gdask.gdataset.locality` (where a dataset's blocks are); their public
names are re-exported here.
"""

from __future__ import annotations

from gdask.gdataset._blocks import device_call, moments, sum_parts
from gdask.gdataset._channel import IterationChannel
from gdask.gdataset._core import GDataSet
from gdask.gdataset._creation import default_block_rows, from_array, from_dask_array, from_dataframe
from gdask.gdataset._iterate import IterateResult, IterationContext, iterate
from gdask.gdataset._progress import Progress
from gdask.gdataset._seq import is_time_major, time_major
from gdask.gdataset._share import DeviceShare, device_share
from gdask.gdataset._tracker import ExecutionLog, GTracker, incremental
from gdask.gdataset.collective import CollectiveError, Communicator, run_on_workers
from gdask.gdataset.engine import (
    MODES,
    BlockIndex,
    Blocks,
    EngineResult,
    IterativeAlgorithm,
    LoopContext,
    drop_state,
    exceeds_devices,
    run_loop,
)
from gdask.gdataset.locality import (
    BlockPlaces,
    block_places,
    block_workers,
    default_client_or_none,
    groups_of,
    persisted_futures,
)

__all__ = [
    "BlockIndex", "BlockPlaces", "Blocks", "CollectiveError", "Communicator", "DeviceShare", "EngineResult",
    "ExecutionLog", "GDataSet", "GTracker", "IterateResult", "IterationChannel", "IterationContext",
    "IterativeAlgorithm", "LoopContext", "MODES", "Progress", "block_places", "block_workers", "default_block_rows",
    "default_client_or_none", "device_call", "device_share", "drop_state", "exceeds_devices", "from_array",
    "from_dask_array", "from_dataframe", "groups_of", "incremental", "is_time_major", "iterate", "moments",
    "persisted_futures", "run_loop", "run_on_workers", "sum_parts", "time_major",
]
