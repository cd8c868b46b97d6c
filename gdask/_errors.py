"""Named exceptions and warnings raised by gdask."""

from __future__ import annotations

__all__ = ["DeviceMemoryError", "GDaskWarning", "NoDeviceError", "WorkerStartError"]


class DeviceMemoryError(MemoryError):
    """A device (CUDA or emulated) ran out of memory.

    Raised by both backends, so code that handles it works unchanged with or without a GPU.
    """


class NoDeviceError(RuntimeError):
    """The requested device backend is not available on this machine."""


class GDaskWarning(UserWarning):
    """Warnings issued by gdask."""


class WorkerStartError(RuntimeError):
    """A cluster's worker process did not start; the message holds the worker's own error."""
