"""gdask's configuration lives in ``dask.config`` under the ``gdask`` namespace.

Defaults come from ``gdask.yaml`` next to this file, so ``DASK_GDASK__BACKEND=emulated`` and
``dask.config.set({"gdask.emulated.n-devices": 4})`` work as for any Dask setting.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml

_fn = os.path.join(os.path.dirname(__file__), "gdask.yaml")
with open(_fn) as _f:
    _defaults = yaml.safe_load(_f)

dask.config.update_defaults(_defaults)


def get(key: str, default: Any = None) -> Any:
    """Read ``gdask.<key>`` from dask.config."""
    return dask.config.get(f"gdask.{key}", default=default)
