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


_MISSING = object()


def _packaged(key: str) -> Any:
    node: Any = _defaults.get("gdask", {})
    for part in key.split("."):
        if not isinstance(node, dict):
            return _MISSING
        node = node.get(part, node.get(part.replace("_", "-"), _MISSING))
        if node is _MISSING:
            return _MISSING
    return node


def backend() -> str:
    """The configured device backend: ``gdask.device.backend`` when set, else ``gdask.backend``."""
    return get("device.backend", None) or get("backend", "auto")


def get(key: str, default: Any = None) -> Any:
    """Read ``gdask.<key>`` from dask.config; gdask.yaml's value when the config lost it (code that
    replaces ``dask.config.config`` wholesale, e.g. test harnesses), else ``default``."""
    value = dask.config.get(f"gdask.{key}", default=_MISSING)
    if value is _MISSING:
        value = _packaged(key)
    return default if value is _MISSING else value
