"""The one module that talks to NVML (pynvml / nvidia-ml-py).

Like ``distributed.diagnostics.nvml`` it keeps an explicit state and degrades to "0 devices, and
here is why" on machines without the library, the driver or a GPU.

What it reads, and how:

- the inventory (:func:`state`): per GPU its NVML index, name, UUID, PCI bus id, memory, SM count
  where NVML reports it, and its MIG instances;
- the device of this process (:func:`visible_device`): the first entry of ``CUDA_VISIBLE_DEVICES``
  (an ordinal, a ``GPU-<uuid>`` or a unique prefix of one, a ``MIG-...`` UUID) resolved to its NVML
  device. NVML numbers GPUs by PCI bus id; CUDA does the same only with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (:data:`CUDA_DEVICE_ORDER`), which gdask sets for its workers;
- SMs and links of one GPU (:func:`details`): NVLink between two GPUs is decided by
  ``nvmlDeviceGetP2PStatus(..., NVML_P2P_CAPS_INDEX_NVLINK)`` (on NVSwitch systems the remote end
  of every link is the switch, never the peer GPU); SMs are the multiprocessor count (NVML device
  attributes, else the CUDA attribute through CuPy), never the number of CUDA cores; every NVML
  topology level has a name that :mod:`gdask.scheduling._topology` understands.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gdask._errors import GDaskWarning, NoDeviceError

__all__ = [
    "CUDA_DEVICE_ORDER",
    "TOPOLOGY_LEVELS",
    "NvmlState",
    "cuda_environment",
    "details",
    "index_by_pci_bus_id",
    "normalize_pci_bus_id",
    "reset",
    "resolve_visible",
    "state",
    "topology_level_name",
    "utilization",
    "visible_device",
    "visible_devices",
]

logger = logging.getLogger("gdask.devices")

#: The CUDA device order under which CUDA ordinals equal NVML indices (both by PCI bus id).
CUDA_DEVICE_ORDER = "PCI_BUS_ID"

#: NVML topology levels (``nvmlGpuTopologyLevel_t``) and the names ``nvidia-smi topo -m`` uses for
#: them. ``INTERNAL`` (two GPUs on one board, e.g. a Tesla K80) has no ``nvidia-smi`` name of its own.
TOPOLOGY_LEVELS = {0: "INTERNAL", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

_CUDA_DEV_ATTR_MULTIPROCESSOR_COUNT = 16  # cudaDevAttrMultiProcessorCount

#: after a transient failure (see :attr:`NvmlState.transient`), NVML is probed again this many seconds later
RETRY_SECONDS = 5.0
#: NVML errors that are definitive answers about this machine (no library, no driver, not allowed):
#: the probe's result is kept; every other NVML error may pass and is probed again
_DEFINITIVE_ERRORS = ("LibraryNotFound", "DriverNotLoaded", "NoPermission", "FunctionNotFound", "NotSupported")

_lock = threading.Lock()
_state: NvmlState | None = None


@dataclass
class NvmlState:
    """What NVML reported when it was probed.

    Attributes
    ----------
    available : bool
        Whether NVML could be used and found at least one GPU.
    reason : str
        Why (or why not), for messages such as ``gdask info``.
    devices : list of dict
        One dict per GPU in NVML order: ``index``, ``name``, ``uuid``, ``pci_bus_id``,
        ``memory_total``, ``memory_used`` (bytes), ``sm_count`` (each ``None`` where NVML does not
        report it), ``mig`` (MIG mode on) and ``mig_devices`` (list of dicts: ``mig_index``,
        ``uuid``, ``name``, ``memory_total``, ``sm_count``, ``gpu_instance_id``,
        ``compute_instance_id``).
    transient : bool
        The probe failed in a way that may pass (NVML timed out, ran out of resources, an unknown
        error, a query that failed): :func:`state` probes again after :data:`RETRY_SECONDS`. Definitive
        answers (pynvml not importable, no NVML library, no driver, no GPU, or GPUs found) are kept.
    probed_at : float
        ``time.monotonic()`` of the probe.
    """

    available: bool
    reason: str
    devices: list[dict[str, Any]] = field(default_factory=list)
    transient: bool = False
    probed_at: float = 0.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def normalize_pci_bus_id(bus_id: str | bytes) -> str:
    """A PCI bus id in one spelling, ``"dddd:bb:dd.f"`` in lower case.

    NVML writes an 8-digit domain (``"00000000:18:00.0"``), CUDA a 4-digit one (``"0000:18:00.0"``);
    both become ``"0000:18:00.0"``.

    Raises
    ------
    ValueError
        If ``bus_id`` is not of the form ``[domain:]bus:device.function`` in hexadecimal.

    Examples
    --------
    >>> normalize_pci_bus_id(b"00000000:9A:00.0")
    '0000:9a:00.0'
    """
    text = _text(bus_id).strip()
    m = re.fullmatch(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])", text)
    if m is None:
        raise ValueError(f"cannot read PCI bus id {text!r}: expected 'domain:bus:device.function' "
                         "in hexadecimal, e.g. '00000000:18:00.0'")
    domain, bus, device, function = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function)}"


def _optional(pynvml: Any, name: str, *args: Any) -> Any:
    """``pynvml.<name>(*args)``, or ``None`` where this pynvml or driver lacks it (logged)."""
    fn = getattr(pynvml, name, None)
    if fn is None:
        logger.debug("pynvml has no %s", name)
        return None
    try:
        return fn(*args)
    except pynvml.NVMLError as e:  # NotSupported, FunctionNotFound, InvalidArgument, ...
        logger.debug("NVML %s%r failed: %s", name, args[1:], e)
        return None


def _nvml_sm_count(pynvml: Any, handle: Any) -> int | None:
    attrs = _optional(pynvml, "nvmlDeviceGetAttributes", handle)
    count = getattr(attrs, "multiprocessorCount", None)
    return int(count) if count else None


def _mig_devices(pynvml: Any, handle: Any) -> list[dict[str, Any]]:
    out = []
    for k in range(_optional(pynvml, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
        mh = _optional(pynvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, k)
        if mh is None:  # an empty slot
            continue
        mem = _optional(pynvml, "nvmlDeviceGetMemoryInfo", mh)
        out.append({
            "mig_index": k,
            "uuid": _text(pynvml.nvmlDeviceGetUUID(mh)),
            "name": _text(_optional(pynvml, "nvmlDeviceGetName", mh) or ""),
            "memory_total": int(mem.total) if mem is not None else None,
            "sm_count": _nvml_sm_count(pynvml, mh),
            "gpu_instance_id": _optional(pynvml, "nvmlDeviceGetGpuInstanceId", mh),
            "compute_instance_id": _optional(pynvml, "nvmlDeviceGetComputeInstanceId", mh),
        })
    return out


def _definitive(error: BaseException) -> bool:
    """Whether an NVML error is a lasting fact about this machine (no library, no driver, ...)."""
    name = type(error).__name__
    return any(name.endswith(d) for d in _DEFINITIVE_ERRORS)


def _probe() -> NvmlState:
    try:
        import pynvml
    except Exception as e:  # noqa: BLE001 - any import failure means "no NVML"
        return NvmlState(False, f"pynvml is not importable ({type(e).__name__}: {e})")
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return NvmlState(False, f"NVML could not be initialised: {type(e).__name__}: {e}",
                         transient=not _definitive(e))
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = _optional(pynvml, "nvmlDeviceGetMemoryInfo", h)  # None where NVML does not support it
            mode = _optional(pynvml, "nvmlDeviceGetMigMode", h)
            mig = bool(mode and mode[0] == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1))
            devices.append({
                "index": i,
                "name": _text(_optional(pynvml, "nvmlDeviceGetName", h) or f"GPU {i}"),
                "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                "pci_bus_id": normalize_pci_bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId),
                "memory_total": None if mem is None else int(mem.total),
                "memory_used": None if mem is None else int(mem.used),
                "sm_count": _nvml_sm_count(pynvml, h),
                "mig": mig,
                "mig_devices": _mig_devices(pynvml, h) if mig else [],
            })
    except Exception as e:  # noqa: BLE001 - reported as the reason for "0 devices", probed again later
        return NvmlState(False, f"NVML query failed: {type(e).__name__}: {e}", transient=True)
    if not devices:
        return NvmlState(False, "NVML found no CUDA devices")
    return NvmlState(True, f"NVML found {len(devices)} CUDA device(s)", devices)


def state(refresh: bool = False) -> NvmlState:
    """NVML inventory, probed once per process (``refresh=True`` probes again).

    Only definitive answers are kept for the process's life: a transient failure (a timeout, an
    unknown NVML error, a query that failed) is probed again once :data:`RETRY_SECONDS` have passed.
    """
    global _state
    with _lock:
        stale = (_state is not None and _state.transient
                 and time.monotonic() - _state.probed_at >= RETRY_SECONDS)
        if _state is None or refresh or stale:
            _state = _probe()
            _state.probed_at = time.monotonic()
            if _state.transient:
                logger.info("NVML probe failed (%s); probing again in %g s", _state.reason, RETRY_SECONDS)
        return _state


def reset() -> None:
    """Forget the probed inventory; the next :func:`state` probes NVML again."""
    global _state
    with _lock:
        _state = None


def utilization(index: int, uuid: str | None = None) -> dict[str, Any]:
    """Live utilisation and memory of one CUDA device ({} where NVML is unavailable).

    Parameters
    ----------
    index : int
        NVML index of the GPU.
    uuid : str, optional
        The device's UUID; a MIG instance's (``MIG-...``) reads that instance's memory.

    Returns
    -------
    dict
        ``gpu_util``, ``mem_util`` (percent), ``memory_used``, ``memory_total`` (bytes); a reading
        NVML does not support (utilisation of a MIG instance or of a GPU in MIG mode) or that fails
        is ``None``, never an error.
    """
    if not state().available:
        return {}
    import pynvml

    handle = None
    if uuid and uuid.upper().startswith("MIG-"):
        handle = _optional(pynvml, "nvmlDeviceGetHandleByUUID", uuid)
    if handle is None:
        handle = _optional(pynvml, "nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return {"gpu_util": None, "mem_util": None, "memory_used": None, "memory_total": None}
    u = _optional(pynvml, "nvmlDeviceGetUtilizationRates", handle)
    m = _optional(pynvml, "nvmlDeviceGetMemoryInfo", handle)
    return {"gpu_util": getattr(u, "gpu", None), "mem_util": getattr(u, "memory", None),
            "memory_used": None if m is None else int(m.used), "memory_total": None if m is None else int(m.total)}


# -- device of this process -------------------------------------------------------------------------
def _seen(devices: list[dict[str, Any]]) -> str:
    return "; ".join(f"{d['index']}: {d['name']} {d['uuid']}" for d in devices) or "none"


def _strip_gpu(uuid: str) -> str:
    u = uuid.strip().lower()
    return u.removeprefix("gpu-")


def _as_visible(gpu: dict[str, Any], entry: str, mig: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {k: v for k, v in gpu.items() if k != "mig_devices"}
    out["visible_entry"] = entry
    if mig is not None:
        out.update(mig_uuid=mig["uuid"], mig_index=mig["mig_index"], name=mig["name"] or gpu["name"],
                   memory_total=mig["memory_total"], sm_count=mig["sm_count"])
    return out


def _as_gpu(gpu: dict[str, Any], entry: str) -> dict[str, Any]:
    """A GPU named by ordinal or GPU UUID. CUDA runs a process on one MIG instance at most: a GPU in
    MIG mode named so is its first instance (its memory and SMs, not the whole GPU's)."""
    migs = gpu.get("mig_devices") or ()
    return _as_visible(gpu, entry, migs[0] if gpu.get("mig") and migs else None)


def _every_device(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What an unset ``CUDA_VISIBLE_DEVICES`` gives: every GPU, a GPU in MIG mode as its MIG
    instances (addressed by their UUIDs; one without instances runs no CUDA work and is left out)."""
    out = []
    for d in devices:
        if d.get("mig"):
            out.extend(_as_visible(d, mig["uuid"], mig) for mig in d.get("mig_devices") or ())
        else:
            out.append(_as_visible(d, str(d["index"])))
    return out


def _resolve_entry(entry: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    if re.fullmatch(r"\d+", entry):
        k = int(entry)
        if k >= len(devices):
            raise ValueError(f"CUDA_VISIBLE_DEVICES entry {entry!r} is GPU ordinal {k}, but NVML sees "
                             f"{len(devices)} GPU(s) ({_seen(devices)}); use an ordinal below "
                             f"{len(devices)} or a GPU UUID")
        return _as_gpu(devices[k], entry)
    low = entry.lower()
    if low.startswith("mig-"):
        rest = entry[4:]
        m = re.fullmatch(r"(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)", rest)  # CUDA 11.0-11.x: MIG-GPU-<uuid>/gi/ci
        for gpu in devices:
            for mig in gpu.get("mig_devices") or ():
                if m is not None:
                    if (_strip_gpu(gpu["uuid"]) == _strip_gpu(m.group(1))
                            and mig.get("gpu_instance_id") == int(m.group(2))
                            and mig.get("compute_instance_id") == int(m.group(3))):
                        return _as_visible(gpu, entry, mig)
                elif mig["uuid"].lower() == low:
                    return _as_visible(gpu, entry, mig)
        migs = "; ".join(f"{g['index']}: {mi['uuid']}" for g in devices for mi in g.get("mig_devices") or ())
        raise ValueError(f"CUDA_VISIBLE_DEVICES entry {entry!r} names no MIG instance NVML sees "
                         f"(MIG instances: {migs or 'none'}; GPUs: {_seen(devices)}); list them with "
                         "`nvidia-smi -L`")
    prefix = _strip_gpu(entry)
    matches = [d for d in devices if prefix and _strip_gpu(d["uuid"]).startswith(prefix)]
    if len(matches) == 1:
        return _as_gpu(matches[0], entry)
    if len(matches) > 1:
        raise ValueError(f"CUDA_VISIBLE_DEVICES entry {entry!r} is a prefix of {len(matches)} GPU UUIDs "
                         f"({_seen(matches)}); give more of the UUID")
    raise ValueError(f"CUDA_VISIBLE_DEVICES entry {entry!r} matches no GPU NVML sees ({_seen(devices)}); "
                     "use an ordinal, a GPU UUID (or a unique prefix of one) or a MIG UUID, as listed "
                     "by `nvidia-smi -L`")


def resolve_visible(value: str | None, devices: list[dict[str, Any]],
                    order: str | None = CUDA_DEVICE_ORDER) -> list[dict[str, Any]]:
    """The NVML devices a ``CUDA_VISIBLE_DEVICES`` value makes visible, in CUDA's order (pure).

    Parameters
    ----------
    value : str or None
        The value of ``CUDA_VISIBLE_DEVICES``; ``None`` (unset) makes every GPU visible.
    devices : list of dict
        NVML devices, as in :attr:`NvmlState.devices`.
    order : str or None
        The value of ``CUDA_DEVICE_ORDER``. Ordinals are NVML indices only under ``"PCI_BUS_ID"``;
        under CUDA's default (``FASTEST_FIRST``) CUDA may number unequal GPUs differently, and a
        :class:`~gdask.GDaskWarning` says so when the GPUs are not all of one model.

    Returns
    -------
    list of dict
        One dict per visible device: the NVML device's fields (``index`` is the NVML index) and
        ``visible_entry``; for a MIG instance also ``mig_uuid``, ``mig_index``, and the instance's
        ``name``, ``memory_total`` and ``sm_count``.

    Raises
    ------
    ValueError
        If the first entry matches no device (or a UUID prefix matches several); the message names
        the value and the devices seen. As CUDA does, a later entry that matches nothing ends the
        list (with a warning), and an empty value or a negative ordinal hides every GPU from there.
    """
    if value is None:
        return _every_device(devices)
    out: list[dict[str, Any]] = []
    for n, raw in enumerate(value.split(",")):
        entry = raw.strip()
        if not entry or re.fullmatch(r"-\d+", entry):
            break  # CUDA hides this entry and every one after it
        try:
            out.append(_resolve_entry(entry, devices))
        except ValueError as e:
            if n == 0:
                raise
            warnings.warn(f"{e}. CUDA ignores it and every entry after it, so only "
                          f"{len(out)} GPU(s) of CUDA_VISIBLE_DEVICES={value!r} are visible",
                          GDaskWarning, stacklevel=3)
            break
    ordinals = any(re.fullmatch(r"\d+", d["visible_entry"]) for d in out)
    if ordinals and order != CUDA_DEVICE_ORDER and len({d["name"] for d in devices}) > 1:
        warnings.warn(f"CUDA_VISIBLE_DEVICES={value!r} uses ordinals but CUDA_DEVICE_ORDER is "
                      f"{order or 'unset (FASTEST_FIRST)'}: CUDA may number these unequal GPUs differently "
                      f"from NVML; set CUDA_DEVICE_ORDER={CUDA_DEVICE_ORDER} or use GPU UUIDs",
                      GDaskWarning, stacklevel=3)
    return out


def visible_devices(env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The NVML devices CUDA sees in this process, in CUDA's order (see :func:`resolve_visible`).

    Parameters
    ----------
    env : mapping, optional
        Environment to read ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` from (default
        ``os.environ``).

    Raises
    ------
    NoDeviceError
        If NVML is unavailable (the message says why).
    ValueError
        If the first ``CUDA_VISIBLE_DEVICES`` entry matches no GPU.
    """
    env = os.environ if env is None else env
    st = state()
    if not st.available:
        raise NoDeviceError(f"no CUDA device can be looked up: {st.reason}")
    return resolve_visible(env.get("CUDA_VISIBLE_DEVICES"), st.devices, env.get("CUDA_DEVICE_ORDER"))


def visible_device(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The device of this process: the first entry of ``CUDA_VISIBLE_DEVICES`` as an NVML device.

    Unset, it is NVML device 0. The result has ``index`` (NVML index), ``uuid``, ``pci_bus_id``,
    ``name``, ``memory_total`` (bytes), ``sm_count`` and, for a MIG instance, ``mig_uuid`` (see
    :func:`resolve_visible`).

    Raises
    ------
    NoDeviceError
        If NVML is unavailable or ``CUDA_VISIBLE_DEVICES`` hides every GPU (empty, ``-1``).
    ValueError
        If the first entry matches no GPU; the message names the value and the GPUs seen.

    Examples
    --------
    >>> visible_device({"CUDA_VISIBLE_DEVICES": "GPU-5ea1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})  # doctest: +SKIP
    {'index': 3, 'name': 'NVIDIA H200', 'uuid': 'GPU-5ea1...', 'pci_bus_id': '0000:9a:00.0', ...}
    """
    env = os.environ if env is None else env
    devices = visible_devices(env)
    if not devices:
        raise NoDeviceError(f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r} hides every GPU; "
                            "unset it or name a GPU (ordinal or UUID)")
    return devices[0]


def cuda_environment(device: Mapping[str, Any]) -> dict[str, str]:
    """Environment that gives a worker process exactly ``device`` (from :func:`state` or
    :func:`visible_device`): its UUID (MIG UUID for a MIG instance) in ``CUDA_VISIBLE_DEVICES``,
    which no device order can misread, and ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.

    Examples
    --------
    >>> cuda_environment({"index": 2, "uuid": "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"})
    {'CUDA_VISIBLE_DEVICES': 'GPU-8932f937-d72c-4106-c12f-20bd9faed9f6', 'CUDA_DEVICE_ORDER': 'PCI_BUS_ID'}
    """
    name = device.get("mig_uuid") or device.get("uuid") or str(device["index"])
    return {"CUDA_VISIBLE_DEVICES": str(name), "CUDA_DEVICE_ORDER": CUDA_DEVICE_ORDER}


def index_by_pci_bus_id(bus_id: str | bytes) -> int:
    """NVML index of the GPU at PCI bus id ``bus_id`` (any domain width, e.g. CuPy's
    ``cupy.cuda.runtime.deviceGetPCIBusId(0)``).

    Raises
    ------
    NoDeviceError
        If NVML is unavailable.
    ValueError
        If no GPU NVML sees is at that bus id; the message lists the bus ids seen.
    """
    st = state()
    if not st.available:
        raise NoDeviceError(f"no CUDA device can be looked up: {st.reason}")
    want = normalize_pci_bus_id(bus_id)
    for d in st.devices:
        if d["pci_bus_id"] == want:
            return int(d["index"])
    seen = ", ".join(f"{d['index']}: {d['pci_bus_id']}" for d in st.devices)
    raise ValueError(f"no GPU at PCI bus id {_text(bus_id)!r} ({want}); NVML sees {seen}")


# -- SMs and links of one GPU -------------------------------------------------------------------------
def topology_level_name(level: int) -> str:
    """The name of an NVML topology level (``nvmlDeviceGetTopologyCommonAncestor``).

    Known levels map as :data:`TOPOLOGY_LEVELS`. A level this gdask does not know is read as the
    next known level above it (a worse link: levels grow with distance), ``SYS`` beyond the last,
    with a :class:`~gdask.GDaskWarning`.

    Examples
    --------
    >>> [topology_level_name(v) for v in (0, 10, 20, 30, 40, 50)]
    ['INTERNAL', 'PIX', 'PXB', 'PHB', 'NODE', 'SYS']
    """
    level = int(level)
    if level in TOPOLOGY_LEVELS:
        return TOPOLOGY_LEVELS[level]
    above = [v for v in sorted(TOPOLOGY_LEVELS) if v > level]
    name = TOPOLOGY_LEVELS[above[0]] if above else "SYS"
    warnings.warn(f"unknown NVML topology level {level}: read as {name} (the next known, worse level); "
                  "a newer gdask may know it", GDaskWarning, stacklevel=2)
    return name


def _cuda_sm_count(pci_bus_id: str) -> int | None:
    """Multiprocessor count of the CUDA device at ``pci_bus_id``, through CuPy (``None`` without
    CuPy or where CUDA does not see that GPU; logged)."""
    try:
        import cupy
    except ImportError as e:
        logger.debug("no SM count from CUDA: CuPy is not importable (%s)", e)
        return None
    rt = cupy.cuda.runtime
    try:
        for ordinal in range(rt.getDeviceCount()):
            get_bus = getattr(rt, "deviceGetPCIBusId", None)
            if get_bus is not None:
                bus = get_bus(ordinal)
            else:
                p = rt.getDeviceProperties(ordinal)
                bus = f"{p['pciDomainID']:x}:{p['pciBusID']:x}:{p['pciDeviceID']:x}.0"
            if normalize_pci_bus_id(bus) != pci_bus_id:
                continue
            get_attr = getattr(rt, "deviceGetAttribute", None)
            if get_attr is not None:
                return int(get_attr(_CUDA_DEV_ATTR_MULTIPROCESSOR_COUNT, ordinal))
            return int(rt.getDeviceProperties(ordinal)["multiProcessorCount"])
    except rt.CUDARuntimeError as e:
        logger.debug("no SM count from CUDA for %s: %s", pci_bus_id, e)
        return None
    logger.debug("no SM count from CUDA: this process does not see the GPU at %s", pci_bus_id)
    return None


def _active_links(pynvml: Any, handle: Any) -> list[str | None]:
    """Remote PCI bus id (``None`` where unknown) of each active NVLink of a GPU."""
    enabled = getattr(pynvml, "NVML_FEATURE_ENABLED", 1)
    remotes: list[str | None] = []
    for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != enabled:
                continue
        except pynvml.NVMLError:  # no such link, or no NVLink on this GPU
            continue
        info = _optional(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        remotes.append(normalize_pci_bus_id(info.busId) if info is not None else None)
    return remotes


def _nvlink_name(pynvml: Any, handle: Any, other: Any, other_bus: str, remotes: list[str | None],
                 gpu_buses: set[str]) -> str | None:
    """``"NV<n>"`` (``"NV"`` where the count is unknown) if the two GPUs talk over NVLink, else None.

    The P2P NVLink status decides. ``n`` counts the links whose remote end is the peer (direct
    links); with none, the links that end at no GPU (NVSwitch ports), as ``nvidia-smi`` counts them.
    Without a P2P status (old pynvml) only direct links are seen.
    """
    status = _optional(pynvml, "nvmlDeviceGetP2PStatus", handle, other,
                       getattr(pynvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2))
    direct = sum(1 for r in remotes if r == other_bus)
    if status is None:
        return f"NV{direct}" if direct else None
    if status != getattr(pynvml, "NVML_P2P_STATUS_OK", 0):
        return None
    if direct:
        return f"NV{direct}"
    via_switch = sum(1 for r in remotes if r not in gpu_buses)
    return f"NV{via_switch}" if via_switch else "NV"


def details(index: int) -> dict[str, Any]:
    """SM count and topology of one GPU (NVML index) for the device table ({} without NVML).

    Returns
    -------
    dict
        ``uuid``, ``pci_bus_id``; ``sm_count`` (streaming multiprocessors, from NVML's device
        attributes or else CUDA's ``cudaDevAttrMultiProcessorCount`` through CuPy; absent where
        neither answers); ``topology``, a string such as ``"GPU1:NV18,GPU2:SYS"``: per other GPU
        ``NV<n>`` where the P2P NVLink status is OK (``n`` active links), else the PCIe path
        (``INTERNAL``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``). A pair NVML cannot place is
        left out (logged) and then counts as the topology's default link.
    """
    st = state()
    if not st.available:
        return {}
    import pynvml

    me = next((d for d in st.devices if d["index"] == index), None)
    if me is None:
        raise ValueError(f"no GPU with NVML index {index}; NVML sees {_seen(st.devices)}")
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    out: dict[str, Any] = {"uuid": me["uuid"], "pci_bus_id": me["pci_bus_id"]}
    sm = _nvml_sm_count(pynvml, h) or _cuda_sm_count(me["pci_bus_id"])
    if sm:
        out["sm_count"] = sm
    remotes = _active_links(pynvml, h)
    gpu_buses = {d["pci_bus_id"] for d in st.devices}
    links = []
    for other in st.devices:
        j = other["index"]
        if j == index:
            continue
        oh = pynvml.nvmlDeviceGetHandleByIndex(j)
        name = _nvlink_name(pynvml, h, oh, other["pci_bus_id"], remotes, gpu_buses)
        if name is None:
            try:
                name = topology_level_name(pynvml.nvmlDeviceGetTopologyCommonAncestor(h, oh))
            except pynvml.NVMLError as e:
                logger.warning("NVML cannot place GPU %d relative to GPU %d (%s): that link is left out",
                               index, j, e)
                continue
        links.append(f"GPU{j}:{name}")
    out["topology"] = ",".join(links)
    return out
