"""Device specifications: what a worker is told about the device it owns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dask.utils import parse_bytes

#: the backends a cluster can ask for ("auto" picks cuda where usable, else emulated)
BACKENDS = ("auto", "cuda", "emulated", "emulated-strict")
#: the backends of a device (what "auto" resolves to)
DEVICE_BACKENDS = ("cuda", "emulated", "emulated-strict")


def parse_size(value: str | int | float | None, *, name: str) -> int | None:
    """Parse ``"4GiB"`` / ``4e9`` / ``None`` into bytes, with an error that names the setting."""
    if value is None:
        return None
    try:
        nbytes = int(parse_bytes(value)) if isinstance(value, str) else int(value)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{name} must be a number of bytes or a string like '4GiB', got {value!r}") from e
    if nbytes <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return nbytes


@dataclass(frozen=True)
class DeviceSpec:
    """What one logical device is.

    Parameters
    ----------
    index : int
        Logical device number in the cluster (0, 1, ...).
    backend : {"cuda", "emulated"}
    memory : int
        Memory budget in bytes (emulated: the pool's budget; cuda: the device memory usable).
    speed : float
        Relative speed, 1.0 = full speed. Emulated devices finish work ``1 / speed`` times later.
    bandwidth : int or None
        Emulated host<->device bandwidth in bytes/s; ``None`` means transfers cost nothing extra.
    physical : int
        NVML index of the GPU this logical device lives on (cuda only; the parent GPU of a MIG
        instance). Equal to the CUDA ordinal under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
    name : str
        Human-readable name ("NVIDIA H200", "emulated").
    streams : int
        Streams (threads on emulated devices) the device's worker starts with.
    uuid : str
        The CUDA device this logical device runs on (cuda only, "" where unknown): a GPU UUID
        (``GPU-...``) or, for a MIG instance, the instance's UUID (``MIG-...``). Its worker's
        ``CUDA_VISIBLE_DEVICES`` names it. Logical devices with the same ``uuid`` share one GPU
        (``n_devices`` larger than the GPUs): they cannot be separate NCCL ranks.
    """

    index: int
    backend: str
    memory: int
    speed: float = 1.0
    bandwidth: int | None = None
    physical: int = 0
    name: str = "emulated"
    streams: int = 1
    uuid: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.backend not in DEVICE_BACKENDS:
            raise ValueError(f"backend must be one of {DEVICE_BACKENDS}, got {self.backend!r}")
        if not self.memory or self.memory <= 0:
            raise ValueError(f"device memory must be a positive number of bytes, got {self.memory!r}")
        if not (self.speed > 0):
            raise ValueError(f"device speed must be > 0, got {self.speed!r}")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ValueError(f"device bandwidth must be > 0 bytes/s or None, got {self.bandwidth!r}")
        if self.streams < 1:
            raise ValueError(f"streams must be >= 1, got {self.streams!r}")

    @property
    def is_mig(self) -> bool:
        """Whether this device is a MIG instance (a slice of a GPU with its own memory and SMs)."""
        return self.uuid.upper().startswith("MIG-")

    @property
    def visible_entry(self) -> str:
        """What names this device in ``CUDA_VISIBLE_DEVICES``: its UUID, else its NVML index."""
        return self.uuid or str(self.physical)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
