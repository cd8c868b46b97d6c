"""Devices: discovery, device specs, the device and per-process state of the running code.

The public face of :mod:`gdask._devices` (gdask's lowest layer): the other gdask packages use these
names only. Nothing here imports CuPy, RMM or NVML; they are loaded when a CUDA device is made.
"""

from __future__ import annotations

from gdask._devices import (
    BACKENDS,
    DEVICE_BACKENDS,
    BufferPool,
    DeviceSpec,
    EmulatedDevice,
    EmulatedPool,
    Inventory,
    LocalContext,
    SpareBuffers,
    StateSpaces,
    context,
    current_device,
    discover,
    make_device,
    make_specs,
    module_available,
    parse_size,
    worker_environment,
    worker_state,
)
from gdask._devices._arrays import (
    array_module,
    array_namespace,
    asarray_like,
    astype,
    is_numpy,
    numpy_dtype,
    to_numpy,
    xp_dtype,
)
from gdask._devices._sparse import (
    SparseBlockError,
    is_sparse,
    sparse_all_finite,
    sparse_astype,
    sparse_moments,
    sparse_nbytes,
    sparse_row_ids,
    sparse_row_sums,
    sparse_rows,
    sparse_to_device,
    sparse_to_host,
    sparse_vstack,
    with_data,
)
from gdask._devices._strict import StrictDevice, is_strict  # array-api-strict is imported on first use

__all__ = [
    "BACKENDS",
    "BufferPool",
    "DEVICE_BACKENDS",
    "DeviceSpec",
    "EmulatedDevice",
    "EmulatedPool",
    "Inventory",
    "LocalContext",
    "SparseBlockError",
    "SpareBuffers",
    "StateSpaces",
    "StrictDevice",
    "array_module",
    "array_namespace",
    "asarray_like",
    "astype",
    "context",
    "current_device",
    "discover",
    "is_numpy",
    "is_sparse",
    "is_strict",
    "make_device",
    "make_specs",
    "module_available",
    "numpy_dtype",
    "nvml_details",
    "parse_size",
    "setup_rmm_pool",
    "sparse_all_finite",
    "sparse_astype",
    "sparse_moments",
    "sparse_nbytes",
    "sparse_row_ids",
    "sparse_row_sums",
    "sparse_rows",
    "sparse_to_device",
    "sparse_to_host",
    "sparse_vstack",
    "to_numpy",
    "worker_environment",
    "with_data",
    "worker_state",
    "xp_dtype",
]


def setup_rmm_pool(pool_size: int | None, device_memory: int) -> str:
    """Route CuPy's allocations on the current CUDA device through an RMM pool of ``pool_size``
    bytes (``None``: RMM without a pool); returns a description of the allocator."""
    from gdask._devices._cuda import setup_rmm_pool as setup

    return setup(pool_size, device_memory)


def nvml_details(index: int) -> dict:
    """SM count and topology of CUDA device ``index`` from NVML (``{}`` without NVML)."""
    from gdask._devices import _nvml

    return _nvml.details(index)
