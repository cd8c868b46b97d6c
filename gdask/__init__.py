"""gdask: iterative machine-learning loops on GPUs (or emulated devices) with Dask.

Importing gdask is cheap and never touches CUDA: the public names below are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from gdask import config  # noqa: F401  (registers gdask.yaml defaults with dask.config)
from gdask._errors import DeviceMemoryError, GDaskWarning, NoDeviceError, WorkerStartError

__version__ = "0.1.0"

__all__ = [
    "DeviceMemoryError",
    "GDaskWarning",
    "GDataSet",
    "LocalGPUCluster",
    "NoDeviceError",
    "WorkerStartError",
    "from_array",
    "from_dask_array",
    "from_dataframe",
    "incremental",
    "info",
    "iterate",
    "job",
    "config",
    "devices",
    "gdataset",
    "ml",
    "plot",
    "protocol",
    "scheduling",
    "testing",
    "to_numpy",
    "window_cache",
    "__version__",
]

_lazy = {
    "GDataSet": ("gdask.gdataset", "GDataSet"),
    "from_array": ("gdask.gdataset", "from_array"),
    "from_dask_array": ("gdask.gdataset", "from_dask_array"),
    "from_dataframe": ("gdask.gdataset", "from_dataframe"),
    "LocalGPUCluster": ("gdask._cluster", "LocalGPUCluster"),
    "info": ("gdask._info", "info"),
    "incremental": ("gdask.gdataset", "incremental"),
    "iterate": ("gdask.gdataset", "iterate"),
    "job": ("gdask.scheduling", "job"),
    "devices": ("gdask.devices", None),
    "gdataset": ("gdask.gdataset", None),
    "ml": ("gdask.ml", None),
    "plot": ("gdask.plot", None),
    "protocol": ("gdask.protocol", None),
    "scheduling": ("gdask.scheduling", None),
    "testing": ("gdask.testing", None),
    "to_numpy": ("gdask.devices", "to_numpy"),
    "window_cache": ("gdask.window_cache", None),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _lazy[name]
    except KeyError:
        raise AttributeError(f"module 'gdask' has no attribute {name!r}") from None
    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (and the module's dunders): not the helpers this module imports for itself."""
    return sorted(set(__all__) | {k for k in globals() if k.startswith("__") and k.endswith("__")})
