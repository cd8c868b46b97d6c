"""``gdask info``: what devices gdask sees and why CUDA is or is not used."""

from __future__ import annotations

import platform
from typing import Any

from dask.utils import format_bytes


def info(backend: str | None = None) -> dict[str, Any]:
    """Describe the devices gdask would use on this machine.

    Returns
    -------
    dict
        ``backend`` (chosen), ``cuda_reason``, ``cuda_devices`` (list of dicts), ``devices``
        (the logical device specs a default LocalGPUCluster gets; ``devices_error`` says why there
        are none where they cannot be made) and library versions.
    """
    import dask
    import distributed
    import numpy

    from gdask.devices import BACKENDS, discover, make_specs, module_available

    inv = discover(backend)
    try:
        specs, specs_error = make_specs(backend=inv.backend), None
    except ValueError as e:  # e.g. NVML does not report a device's memory: say so, do not fail
        specs, specs_error = [], str(e)
    versions = {"python": platform.python_version(), "dask": dask.__version__,
                "distributed": distributed.__version__, "numpy": numpy.__version__}
    for mod in ("numba", "numba_cuda", "cupy", "rmm", "pynvml", "array_api_strict", "array_api_compat"):
        versions[mod] = "installed" if module_available(mod) else "not installed"
    return {
        "backend": inv.backend,
        "backends": list(BACKENDS),
        "cuda_reason": inv.cuda_reason,
        "cuda_devices": inv.cuda_devices,
        "devices": [s.to_dict() for s in specs],
        "devices_error": specs_error,
        "versions": versions,
    }


def format_info(d: dict[str, Any]) -> str:
    lines = [f"gdask backend: {d['backend']} (backends: {', '.join(d.get('backends', ()))})",
             f"CUDA: {d['cuda_reason']}"]
    for g in d["cuda_devices"]:
        memory = "memory unknown" if g.get("memory_total") is None else format_bytes(g["memory_total"])
        mig = f" (MIG instance {g['mig_uuid']})" if g.get("mig_uuid") else ""
        lines.append(f"  GPU {g['index']}{mig}: {g['name']}, {memory}")
    lines.append(f"logical devices of a default LocalGPUCluster: {len(d['devices'])}")
    if d.get("devices_error"):
        lines.append(f"  ({d['devices_error']})")
    for s in d["devices"]:
        bw = f", bandwidth {format_bytes(s['bandwidth'])}/s" if s["bandwidth"] else ""
        on = f" on {s['uuid']}" if s.get("uuid") else ""
        lines.append(f"  device {s['index']}: {s['backend']} ({s['name']}{on}), memory {format_bytes(s['memory'])}, "
                     f"speed {s['speed']:g}{bw}")
    lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in d["versions"].items()))
    return "\n".join(lines)
