"""The one module that talks to NVML (pynvml / nvidia-ml-py).

Like ``distributed.diagnostics.nvml`` it keeps an explicit state and degrades to "0 devices, and
here is why" on machines without the library, the driver or a GPU.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

_lock = threading.Lock()
_state: NvmlState | None = None


@dataclass
class NvmlState:
    available: bool
    reason: str
    devices: list[dict[str, Any]] = field(default_factory=list)


def _probe() -> NvmlState:
    try:
        import pynvml
    except Exception as e:  # noqa: BLE001 - any import failure means "no NVML"
        return NvmlState(False, f"pynvml is not importable ({type(e).__name__}: {e})")
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return NvmlState(False, f"NVML could not be initialised: {type(e).__name__}: {e}")
    try:
        count = pynvml.nvmlDeviceGetCount()
        devices = []
        for i in range(count):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            if isinstance(name, bytes):
                name = name.decode()
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            info: dict[str, Any] = {
                "index": i,
                "name": name,
                "memory_total": int(mem.total),
                "memory_used": int(mem.used),
            }
            try:
                info["sm_count"] = int(pynvml.nvmlDeviceGetNumGpuCores(h))  # may not exist
            except Exception:  # noqa: BLE001 - optional field
                info["sm_count"] = None
            devices.append(info)
    except Exception as e:  # noqa: BLE001
        return NvmlState(False, f"NVML query failed: {type(e).__name__}: {e}")
    if not devices:
        return NvmlState(False, "NVML found no CUDA devices")
    return NvmlState(True, f"NVML found {len(devices)} CUDA device(s)", devices)


def state(refresh: bool = False) -> NvmlState:
    """NVML inventory, probed once per process (``refresh=True`` probes again)."""
    global _state
    with _lock:
        if _state is None or refresh:
            _state = _probe()
        return _state


def utilization(index: int) -> dict[str, Any]:
    """Live utilisation and memory of one CUDA device ({} where NVML is unavailable)."""
    if not state().available:
        return {}
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    u = pynvml.nvmlDeviceGetUtilizationRates(h)
    m = pynvml.nvmlDeviceGetMemoryInfo(h)
    return {"gpu_util": u.gpu, "mem_util": u.memory, "memory_used": int(m.used), "memory_total": int(m.total)}
