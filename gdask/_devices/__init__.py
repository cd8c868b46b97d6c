"""Devices: discovery, the cuda, emulated and emulated-strict backends, and the device owned by this process.

This is gdask's lowest layer. Everything that touches CuPy, RMM or NVML goes through it, lazily, so
``import gdask`` works on machines with no GPU and no CUDA driver.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

from gdask import config
from gdask._devices._buffers import BufferPool
from gdask._devices._emulated import EmulatedDevice, EmulatedPool
from gdask._devices._spec import BACKENDS, DEVICE_BACKENDS, DeviceSpec, parse_size
from gdask._errors import NoDeviceError

__all__ = [
    "BACKENDS",
    "BufferPool",
    "DEVICE_BACKENDS",
    "DeviceSpec",
    "EmulatedDevice",
    "EmulatedPool",
    "Inventory",
    "LocalContext",
    "SpareBuffers",
    "StateSpaces",
    "context",
    "current_device",
    "discover",
    "make_device",
    "make_specs",
    "module_available",
    "parse_size",
    "worker_environment",
    "worker_state",
]


def module_available(name: str) -> bool:
    """Whether ``name`` can be imported, checked without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@dataclass
class Inventory:
    """What this machine offers: CUDA devices (possibly none) and why CUDA is or is not used."""

    cuda_devices: list[dict[str, Any]] = field(default_factory=list)
    cuda_reason: str = ""
    backend: str = "emulated"

    @property
    def cuda_available(self) -> bool:
        return bool(self.cuda_devices)


def discover(backend: str | None = None) -> Inventory:
    """Find the CUDA devices of this machine and choose a backend.

    Parameters
    ----------
    backend : {"auto", "cuda", "emulated", "emulated-strict"}, optional
        Defaults to config ``gdask.backend``. "emulated-strict" is an emulated backend (no GPU is
        looked for) whose blocks are ``array_api_strict`` arrays.

    Raises
    ------
    NoDeviceError
        ``backend="cuda"`` on a machine where CUDA cannot be used; the message says why.
    ValueError
        ``CUDA_VISIBLE_DEVICES`` names no GPU of this machine (the message lists them).
    """
    from gdask._devices import _nvml

    backend = backend or config.backend()
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    inv = Inventory()
    if backend in ("emulated", "emulated-strict"):
        if backend == "emulated-strict" and not module_available("array_api_strict"):
            raise NoDeviceError("backend='emulated-strict' needs array-api-strict and array-api-compat: "
                                "pip install 'gdask[strict]'")
        inv.cuda_reason = f"{backend} backend requested"
        inv.backend = backend
        return inv
    st = _nvml.state()
    if not st.available:
        inv.cuda_reason = st.reason
    elif not module_available("cupy"):
        inv.cuda_reason = f"{st.reason}, but CuPy is not installed (pip install 'gdask[cuda13]')"
    elif not (visible := _nvml.visible_devices()):  # the GPUs CUDA_VISIBLE_DEVICES leaves visible
        inv.cuda_reason = f"{st.reason}, but CUDA_VISIBLE_DEVICES hides every GPU"
    else:
        inv.cuda_devices = visible
        inv.cuda_reason = st.reason
        inv.backend = "cuda"
    if backend == "cuda" and inv.backend != "cuda":
        raise NoDeviceError(f"backend='cuda' requested but CUDA cannot be used: {inv.cuda_reason}")
    return inv


def make_specs(
    n_devices: int | None = None,
    *,
    backend: str | None = None,
    device_memory: int | str | None = None,
    device_speeds: list[float] | None = None,
    bandwidth: int | str | None = None,
    streams: int | None = None,
) -> list[DeviceSpec]:
    """Describe the logical devices a cluster should have; keyword arguments override config.

    On cuda, ``n_devices`` larger than the number of GPUs splits GPUs into several logical devices
    (round-robin), each with an equal share of the device's memory.
    """
    inv = discover(backend)
    if n_devices is not None and (not isinstance(n_devices, int) or isinstance(n_devices, bool) or n_devices < 1):
        raise ValueError(f"n_devices must be a positive integer, got {n_devices!r}")
    streams = int(streams if streams is not None else config.get("device.streams", 1))
    if inv.backend == "cuda":
        limit = parse_size(device_memory if device_memory is not None else config.get("cuda.memory-limit"),
                           name="device_memory")
        specs = _cuda_specs(inv.cuda_devices, n_devices, limit, streams)
    else:
        n = n_devices or int(config.get("emulated.n-devices", 2))
        mem = parse_size(device_memory if device_memory is not None else config.get("emulated.memory"),
                         name="device_memory")
        bw = parse_size(bandwidth if bandwidth is not None else config.get("emulated.bandwidth"),
                        name="bandwidth")
        speeds = device_speeds if device_speeds is not None else config.get("emulated.speeds")
        if speeds is None:
            speeds = [1.0] * n
        speeds = [float(s) for s in speeds]
        if len(speeds) != n:
            raise ValueError(f"device_speeds has {len(speeds)} entries but there are {n} devices")
        specs = [DeviceSpec(index=i, backend=inv.backend, memory=mem, speed=speeds[i], bandwidth=bw,
                            streams=streams, name=inv.backend)
                 for i in range(n)]
    if device_speeds is not None and inv.backend == "cuda":
        raise ValueError("device_speeds applies to emulated devices only; CUDA devices run at their own speed")
    return specs


def _cuda_specs(gpus: list[dict[str, Any]], n_devices: int | None, limit: int | None,
                streams: int) -> list[DeviceSpec]:
    """Logical devices over the visible CUDA devices (GPUs or MIG instances), round-robin: each has
    an equal share of its device's memory (a MIG instance's own memory), at most ``limit``."""
    n = n_devices or len(gpus)
    per_gpu = [sum(1 for i in range(n) if i % len(gpus) == g) for g in range(len(gpus))]
    specs = []
    for i in range(n):
        g = gpus[i % len(gpus)]
        total = g.get("memory_total")
        if not total and not limit:
            raise ValueError(f"NVML does not report the memory of CUDA device {g.get('mig_uuid') or g['uuid']} "
                             f"({g['name']}); give device_memory= (gdask worker --device-memory-limit)")
        mem = total // per_gpu[i % len(gpus)] if total else limit
        specs.append(DeviceSpec(index=i, backend="cuda", memory=min(mem, limit) if limit else mem, speed=1.0,
                                physical=g["index"], name=g["name"], streams=streams,
                                uuid=str(g.get("mig_uuid") or g.get("uuid") or "")))
    return specs


def worker_environment(specs: list[DeviceSpec], i: int) -> dict[str, str]:
    """Environment of the worker process of ``specs[i]`` (a cluster's logical devices on one host).

    A CUDA worker sees every GPU of the cluster, its own first (CUDA device 0 of the process: CuPy,
    RMM, numba and torch use it by default), as ``dask cuda worker`` does: NCCL and CUDA IPC between
    workers need the peers visible. GPUs are named by UUID (no device order can misread one), with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` for ordinals. A MIG instance is named alone by its MIG UUID:
    CUDA runs a process on one instance, and instances share no memory. Other backends: ``{}``.
    """
    from gdask._devices._nvml import CUDA_DEVICE_ORDER

    spec = specs[i]
    if spec.backend != "cuda":
        return {}
    if spec.is_mig:
        visible = spec.visible_entry
    else:
        order = list(dict.fromkeys(s.visible_entry for s in specs if s.backend == "cuda" and not s.is_mig))
        k = order.index(spec.visible_entry)
        visible = ",".join(order[k:] + order[:k])
    return {"CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": CUDA_DEVICE_ORDER}


def make_device(spec: DeviceSpec):
    """Create the device object (``EmulatedDevice``, ``StrictDevice`` or ``CudaDevice``) for ``spec``."""
    if spec.backend == "cuda":
        from gdask._devices._cuda import CudaDevice

        return CudaDevice(spec)
    if spec.backend == "emulated-strict":
        from gdask._devices._strict import StrictDevice

        return StrictDevice(spec)
    return EmulatedDevice(spec)


def _register_strict_sizeof() -> None:
    """dask's ``sizeof`` learns strict arrays when it first meets one (array-api-strict is imported then)."""
    from dask.sizeof import sizeof

    @sizeof.register_lazy("array_api_strict")
    def _register() -> None:
        from gdask._devices._strict import register_dask

        register_dask()


_register_strict_sizeof()


from gdask._devices._context import LocalContext, SpareBuffers, StateSpaces, context, current_device, worker_state  # noqa: E402
