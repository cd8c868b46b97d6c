"""Worker side of gdask: the plugin that gives a worker process its device."""

from __future__ import annotations

import logging
from typing import Any

from distributed import WorkerPlugin

from gdask._devices import DeviceSpec

logger = logging.getLogger("gdask")


def parse_pool_size(value: Any, device_memory: int) -> int | None:
    """RMM pool size from config: bytes, a "40GiB" string, a fraction of memory, or None."""
    if value is None:
        return None
    if isinstance(value, float) and 0 < value <= 1:
        return int(value * device_memory)
    from gdask._devices import parse_size

    return parse_size(value, name="rmm_pool_size")


class DeviceSetup(WorkerPlugin):
    """Give the worker its device: emulated pool, or CUDA context + RMM pool.

    Arguments are validated here, on the client; heavy libraries are imported in ``setup``, on the
    worker (the dask-cuda plugin pattern).

    Parameters
    ----------
    specs : dict
        Worker name -> :class:`DeviceSpec`. Every worker looks up its own spec by name.
    rmm_pool_size : int, float, str or None
        Pool per CUDA worker (bytes, "40GiB", fraction of the device's memory, or None).
    """

    name = "gdask-device"
    idempotent = True

    def __init__(self, specs: dict[Any, DeviceSpec], rmm_pool_size: Any = None) -> None:
        for k, s in specs.items():
            if not isinstance(s, DeviceSpec):
                raise TypeError(f"specs[{k!r}] must be a DeviceSpec, got {type(s).__name__}")
        self.specs = {str(k): s for k, s in specs.items()}
        self.rmm_pool_size = rmm_pool_size

    def setup(self, worker) -> None:
        from gdask._devices import make_device, set_current_device

        spec = self.specs.get(str(worker.name))
        if spec is None:
            logger.info("gdask: worker %s has no device spec; it runs non-device work only", worker.name)
            return
        device = make_device(spec)
        if spec.backend == "cuda":
            from gdask._devices._cuda import setup_rmm_pool

            device.allocator = setup_rmm_pool(parse_pool_size(self.rmm_pool_size, spec.memory), spec.memory)
        set_current_device(device)
        worker.gdask_device = device
        worker.metrics["gdask_device"] = lambda w: _device_metrics(w)
        logger.info("gdask: worker %s owns %s device %d", worker.name, spec.backend, spec.index)


def _device_metrics(worker) -> dict[str, Any]:
    dev = getattr(worker, "gdask_device", None)
    if dev is None:
        return {}
    info = dev.info()
    return {k: v for k, v in info.items() if isinstance(v, (int, float, str)) or v is None}


def device_info(dask_worker=None) -> dict[str, Any] | None:
    """The worker's device description: ``client.run(device_info)``."""
    if dask_worker is None:
        from distributed import get_worker

        dask_worker = get_worker()
    dev = getattr(dask_worker, "gdask_device", None)
    return None if dev is None else dev.info()
