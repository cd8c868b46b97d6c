"""Array helpers that every layer needs: which module an array belongs to, and host copies."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["array_module", "to_numpy"]


def array_module(x: Any):
    """``numpy`` or ``cupy``, whichever ``x`` belongs to (scalars count as NumPy)."""
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def to_numpy(x: Any) -> np.ndarray:
    """A host NumPy array of a NumPy, CuPy or other device array (no copy for NumPy)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "get") and type(x).__module__.split(".")[0] == "cupy":
        return x.get()
    return np.asarray(x)
