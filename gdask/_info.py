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
        (the logical device specs a default LocalGPUCluster gets) and library versions.
    """
    import dask
    import distributed
    import numpy

    from gdask.devices import BACKENDS, discover, make_specs, module_available

    inv = discover(backend)
    specs = make_specs(backend=inv.backend)
    versions = {"python": platform.python_version(), "dask": dask.__version__,
                "distributed": distributed.__version__, "numpy": numpy.__version__}
    for mod in ("numba", "cupy", "rmm", "pynvml", "array_api_strict", "array_api_compat"):
        versions[mod] = "installed" if module_available(mod) else "not installed"
    return {
        "backend": inv.backend,
        "backends": list(BACKENDS),
        "cuda_reason": inv.cuda_reason,
        "cuda_devices": inv.cuda_devices,
        "devices": [s.to_dict() for s in specs],
        "versions": versions,
    }


def format_info(d: dict[str, Any]) -> str:
    lines = [f"gdask backend: {d['backend']} (backends: {', '.join(d.get('backends', ()))})",
             f"CUDA: {d['cuda_reason']}"]
    for g in d["cuda_devices"]:
        lines.append(f"  GPU {g['index']}: {g['name']}, {format_bytes(g['memory_total'])}")
    lines.append(f"logical devices of a default LocalGPUCluster: {len(d['devices'])}")
    for s in d["devices"]:
        bw = f", bandwidth {format_bytes(s['bandwidth'])}/s" if s["bandwidth"] else ""
        lines.append(f"  device {s['index']}: {s['backend']} ({s['name']}), memory {format_bytes(s['memory'])}, "
                     f"speed {s['speed']:g}{bw}")
    lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in d["versions"].items()))
    return "\n".join(lines)
