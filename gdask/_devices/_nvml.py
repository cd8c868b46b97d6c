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


_TOPO_NAMES = {0: "SYS-internal", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def details(index: int) -> dict[str, Any]:
    """SM count and topology of one CUDA device for the device table ({} without NVML).

    ``topology`` is a string such as ``"GPU1:NV18,GPU2:SYS"``: per other GPU, the number of active
    NVLinks between the two (``NV<n>``) or else the PCIe path (PIX, PXB, PHB, NODE, SYS).
    """
    st = state()
    if not st.available:
        return {}
    import pynvml

    out: dict[str, Any] = {}
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    try:
        out["sm_count"] = int(pynvml.nvmlDeviceGetAttributes(h).multiprocessorCount)
    except Exception:  # noqa: BLE001 - not on every driver / MIG mode
        sm = next((d.get("sm_count") for d in st.devices if d["index"] == index), None)
        if sm is not None:
            out["sm_count"] = sm
    links = []
    for other in st.devices:
        j = other["index"]
        if j == index:
            continue
        try:
            oh = pynvml.nvmlDeviceGetHandleByIndex(j)
            n_nv = 0
            opci = pynvml.nvmlDeviceGetPciInfo(oh).busId
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if (pynvml.nvmlDeviceGetNvLinkState(h, link)
                            and pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId == opci):
                        n_nv += 1
                except Exception:  # noqa: BLE001 - link absent
                    break
            if n_nv:
                links.append(f"GPU{j}:NV{n_nv}")
            else:
                level = pynvml.nvmlDeviceGetTopologyCommonAncestor(h, oh)
                links.append(f"GPU{j}:{_TOPO_NAMES.get(int(level), str(level))}")
        except Exception:  # noqa: BLE001 - topology queries are optional
            continue
    out["topology"] = ",".join(links)
    return out
