"""Array helpers that every layer needs: the namespace of an array (array API standard), dtypes
across namespaces, and explicit host <-> device conversions.

Device code in gdask is written once against the Python array API standard: it asks
:func:`array_namespace` for the namespace of its inputs and calls the standard's functions there.
NumPy blocks (emulated devices) get ``array_api_compat.numpy``, CuPy blocks ``array_api_compat.cupy``
and the blocks of ``emulated-strict`` devices ``array_api_strict``, whose arrays refuse to mix with
NumPy arrays or to be converted to NumPy implicitly, as CuPy's do. Moves between the host and a
device are explicit: :func:`to_numpy` (device -> host) and :func:`asarray_like` (host -> the device
of a given array). Nothing here imports CuPy or array-api-strict unless such an array is passed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["array_module", "array_namespace", "asarray_like", "astype", "is_numpy", "numpy_dtype", "to_numpy",
           "xp_dtype"]

#: dtype names the conversions between namespaces know (the array API standard's dtypes)
_DTYPE_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
                "float64", "complex64", "complex128")


def _top(x: Any) -> str:
    return type(x).__module__.split(".")[0]


def is_numpy(x: Any) -> bool:
    """Whether ``x`` is host data: a NumPy array or scalar, or a Python scalar."""
    return isinstance(x, (np.ndarray, np.generic, int, float, bool, complex))


def array_module(x: Any):
    """``numpy`` for NumPy arrays and scalars, ``cupy`` for CuPy arrays, else the array API namespace
    of ``x`` (e.g. ``array_api_strict``). Code that only needs to tell NumPy blocks (fast CPU paths)
    from the others compares the result with ``numpy``."""
    top = _top(x)
    if top == "cupy":
        import cupy

        return cupy
    if top == "array_api_strict" or (not isinstance(x, (np.ndarray, np.generic)) and hasattr(x, "__array_namespace__")):
        return x.__array_namespace__()
    return np


def array_namespace(*xs: Any):
    """The array API namespace of the arrays among ``xs`` (``None`` and Python scalars are skipped):
    ``array_api_compat.numpy`` for NumPy, ``array_api_compat.cupy`` for CuPy, ``array_api_strict``
    for strict arrays.

    Raises
    ------
    TypeError
        The arrays belong to different libraries (e.g. a NumPy array beside a device array): move
        the host one to the device first (:func:`asarray_like`).
    """
    from array_api_compat import array_namespace as namespace

    arrays = [x for x in xs if x is not None and not isinstance(x, (int, float, bool, complex))]
    if not arrays:
        import array_api_compat.numpy as xp_np

        return xp_np
    return namespace(*arrays)


def xp_dtype(xp: Any, dtype: Any) -> Any:
    """The dtype of namespace ``xp`` for a NumPy dtype (or anything ``numpy.dtype`` takes, or a dtype
    of ``xp`` itself)."""
    if not isinstance(dtype, (np.dtype, type, str)):
        return dtype  # already the namespace's dtype object (e.g. array_api_strict.float32)
    name = np.dtype(dtype).name
    try:
        return getattr(xp, name)
    except AttributeError as e:  # pragma: no cover - every standard namespace has these
        raise TypeError(f"the array namespace {xp.__name__} has no dtype {name}") from e


def numpy_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype equal to ``dtype``, a dtype of any array API namespace."""
    try:
        return np.dtype(dtype)
    except TypeError:
        pass
    mod = type(dtype).__module__.split(".")[0]
    if mod == "array_api_strict":
        import array_api_strict as xps

        for name in _DTYPE_NAMES:
            if getattr(xps, name) == dtype:
                return np.dtype(name)
    raise TypeError(f"cannot find the NumPy dtype of {dtype!r}")


def astype(x: Any, dtype: Any, copy: bool = False) -> Any:
    """``x`` in ``dtype`` (a NumPy dtype or the namespace's), in ``x``'s namespace and device."""
    if isinstance(x, (np.ndarray, np.generic)):
        return x.astype(dtype, copy=copy)
    xp = array_namespace(x)
    return xp.astype(x, xp_dtype(xp, dtype), copy=copy)


def to_numpy(x: Any) -> Any:
    """A host NumPy array of a NumPy, CuPy or other device array (no copy for NumPy; Python and
    NumPy scalars are returned as they are). The explicit device -> host move: a strict device
    array is first moved to the CPU device, as ``cupy.asnumpy`` copies CuPy arrays."""
    if isinstance(x, (np.ndarray, np.generic, int, float, bool, complex)) or x is None:
        return x
    top = _top(x)
    if top == "cupy":
        return x.get()
    if top == "array_api_strict":
        import array_api_strict as xps

        host = x.to_device(xps.Device("CPU_DEVICE"))
        return np.from_dlpack(host, copy=True)
    if hasattr(x, "get") and callable(x.get) and hasattr(x, "__cuda_array_interface__"):
        return x.get()
    return np.asarray(x)


def asarray_like(x: Any, like: Any, dtype: Any = None) -> Any:
    """Host data ``x`` (a NumPy array, scalar or list) as an array of ``like``'s namespace on
    ``like``'s device: the explicit host -> device move of a small operand (indices, centers) inside
    device code. NumPy ``like`` gives a NumPy array (no copy when nothing changes)."""
    if isinstance(like, (np.ndarray, np.generic)):
        return np.asarray(x, dtype=dtype)
    top = _top(like)
    if top == "cupy":
        import cupy

        return cupy.asarray(to_numpy(x) if _top(x) == "array_api_strict" else x, dtype=dtype)
    xp = array_namespace(like)
    if dtype is not None:
        dtype = xp_dtype(xp, dtype)
    from array_api_compat import device

    where = device(like)
    if top == "array_api_strict" and not isinstance(x, (int, float, bool)):
        if _top(x) == top and device(x) == where:
            return x if dtype is None else xp.astype(x, dtype)
        x = np.asarray(to_numpy(x))  # a strict array on another device travels through the host
    return xp.asarray(x, dtype=dtype, device=where)
