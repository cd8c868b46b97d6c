"""The plugins a gdask cluster installs, as config lists them.

``LocalGPUCluster``, ``gdask worker`` and :mod:`gdask.testing` install the worker plugins of config
``gdask.plugins.worker`` and the scheduler plugins of ``gdask.plugins.scheduler``: lists of
``"module:attribute"`` factories, imported when a cluster starts. So the cluster knows no package
above it (the kernel warm-up of ``gdask.ml`` is one entry of the list, not an import), and a site can
add its own plugins, or drop one, in its Dask config.

A worker-plugin factory is called with keyword arguments: ``specs`` (the device specs by worker
name, or None for one device made from config per worker) and the caller's device options
(``rmm_pool_size``, ``max_streams``, ``adaptive_streams`` where given); a scheduler-plugin factory
with none. Either returns a plugin, a list of plugins, or None (nothing to install).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from gdask import config, protocol

__all__ = ["device_plugin", "load_factory", "scheduler_plugins", "worker_plugins"]


def load_factory(ref: str, key: str = "plugins") -> Callable[..., Any]:
    """The callable ``ref`` (``"module:attribute"``) names; ``key`` (the config key that listed it)
    goes into the error."""
    module, sep, attr = str(ref).partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"config gdask.{key} lists {ref!r}: entries are 'module:attribute' factories, e.g. "
                         "'gdask.scheduling:worker_plugins'")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"config gdask.{key} lists {ref!r}, which cannot be loaded ({e!r}); fix or remove "
                         "the entry") from e
    if not callable(obj):
        raise ValueError(f"config gdask.{key} lists {ref!r}, which is not callable")
    return obj


def _listed(key: str) -> list[str]:
    refs = config.get(key, []) or []
    if isinstance(refs, str):
        refs = [refs]
    return list(refs)


def _flat(made: Any) -> list[Any]:
    if made is None:
        return []
    if isinstance(made, (list, tuple)):
        return [p for p in made if p is not None]
    return [made]


def worker_plugins(specs: dict | None = None, **options: Any) -> list[Any]:
    """The worker plugins of config ``gdask.plugins.worker`` for the workers of ``specs``, in the
    listed order (``options``: the device options given to the cluster, passed to every factory)."""
    out: list[Any] = []
    for ref in _listed("plugins.worker"):
        out.extend(_flat(load_factory(ref, "plugins.worker")(specs=specs, **options)))
    return out


def scheduler_plugins() -> list[Any]:
    """The scheduler plugins of config ``gdask.plugins.scheduler``, in the listed order."""
    out: list[Any] = []
    for ref in _listed("plugins.scheduler"):
        out.extend(_flat(load_factory(ref, "plugins.scheduler")()))
    return out


def device_plugin(plugins: list[Any]) -> Any:
    """The device plugin among ``plugins`` (it says how many threads a device worker runs)."""
    for p in plugins:
        if getattr(p, "name", None) == protocol.PLUGIN_DEVICE:
            return p
    raise ValueError("config gdask.plugins.worker lists no device plugin: keep 'gdask.scheduling:worker_plugins' "
                     "in it (every device worker needs its device)")
