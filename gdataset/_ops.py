"""The block functions of GDataSet's operators and reductions: module level (stable tokens,
picklable), run inside block tasks by :mod:`gdask.gdataset._blocks`' task wrappers.

Written against the array API standard: the namespace of the blocks (NumPy, CuPy, array-api-strict)
from :func:`gdask.devices.array_namespace`; NumPy blocks keep their NumPy methods where that is faster.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from dask.base import tokenize

from gdask.gdataset import _blocks

__all__ = ["RowsChecked", "apply_ufunc", "argmax1", "argmin1", "fname", "identity", "max_chunk", "max_combine",
           "mean_finalize", "min_chunk", "min_combine", "moment_chunk", "moment_combine", "plain_finalize",
           "std_finalize", "sum_chunk", "sum_combine", "var_finalize"]


def fname(func: Callable) -> str:
    """A key prefix from a function's name (``"op"`` when it has none)."""
    n = getattr(func, "__name__", None) or type(func).__name__
    return n.strip("_").replace("<", "").replace(">", "") or "op"


#: NumPy ufunc names whose array API function has another name
_UFUNC_NAMES = {
    "absolute": "abs", "arccos": "acos", "arccosh": "acosh", "arcsin": "asin", "arcsinh": "asinh",
    "arctan": "atan", "arctan2": "atan2", "arctanh": "atanh", "power": "pow", "invert": "bitwise_invert",
    "left_shift": "bitwise_left_shift", "right_shift": "bitwise_right_shift", "conjugate": "conj",
    "true_divide": "divide",
}


def apply_ufunc(*args, ufunc, **kwargs):
    """NumPy ufunc ``ufunc`` on blocks: the ufunc itself on NumPy / CuPy blocks, the array API function
    of the same name on others (``np.exp(X)`` on strict blocks is ``array_api_strict.exp``)."""
    arrays = [a for a in args if hasattr(a, "shape") and not isinstance(a, np.generic)]
    if all(isinstance(a, np.ndarray) or _blocks.array_module(a).__name__ == "cupy" for a in arrays):
        return ufunc(*args, **kwargs)
    xp = _blocks.array_namespace(*arrays)
    name = _UFUNC_NAMES.get(ufunc.__name__, ufunc.__name__)
    fn = getattr(xp, name, None)
    if fn is None or kwargs:
        raise TypeError(f"NumPy's {ufunc.__name__}{' with ' + str(sorted(kwargs)) if kwargs else ''} has no array "
                        f"API equivalent in {xp.__name__}; use X.map_blocks with the namespace's functions")
    return fn(*args)


class RowsChecked:
    """A :meth:`GDataSet.map_blocks` kernel whose result must have its block's rows (the result is
    blocked like the input: a kernel that drops or adds rows would silently misalign it)."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.__name__ = fname(func)

    def __dask_tokenize__(self) -> Any:
        return ("rows-checked", tokenize(self.func))

    def __call__(self, blk: Any, *args: Any, **kwargs: Any) -> Any:
        out = self.func(blk, *args, **kwargs)
        rows = getattr(out, "shape", ())[:1]
        if rows != blk.shape[:1]:
            raise ValueError(f"map_blocks: {self.__name__} returned {'a scalar' if not rows else f'{rows[0]} rows'} "
                             f"for a block of {blk.shape[0]} rows; a kernel must return one row per input row "
                             "(use reduce_blocks for per-block results)")
        return out


def argmin1(b):
    if isinstance(b, np.ndarray):
        return b.argmin(axis=1)
    return _blocks.array_namespace(b).argmin(b, axis=1)


def argmax1(b):
    if isinstance(b, np.ndarray):
        return b.argmax(axis=1)
    return _blocks.array_namespace(b).argmax(b, axis=1)


def sum_chunk(b, axis):
    if isinstance(b, np.ndarray):
        return b.sum(axis=axis, dtype=np.float64 if b.dtype.kind == "f" else None)
    xp = _blocks.array_namespace(b)
    if xp.isdtype(b.dtype, "bool"):  # the standard sums numbers only: booleans count as integers
        b = xp.astype(b, xp.int64)
    return xp.sum(b, axis=axis, dtype=xp.float64 if xp.isdtype(b.dtype, "real floating") else None)


def sum_combine(parts):
    return _blocks.sum_parts(parts)


def min_chunk(b, axis):
    return _blocks.array_namespace(b).min(b, axis=axis)


def min_combine(parts):
    xp = _blocks.array_namespace(*parts)
    return xp.min(xp.stack(parts), axis=0)


def max_chunk(b, axis):
    return _blocks.array_namespace(b).max(b, axis=axis)


def max_combine(parts):
    xp = _blocks.array_namespace(*parts)
    return xp.max(xp.stack(parts), axis=0)


def moment_chunk(b, axis):
    """(count, mean, M2) of one block, in float64 (Chan et al. parallel variance)."""
    return _blocks.moments(b, axis)


def moment_combine(parts):
    n, mean, m2 = parts[0]
    for nb, mb, m2b in parts[1:]:
        if nb == 0:
            continue
        tot = n + nb
        delta = mb - mean
        mean = mean + delta * (nb / tot)
        m2 = m2 + m2b + delta * delta * (n * nb / tot)
        n = tot
    return (n, mean, m2)


def mean_finalize(parts, dtype):
    return _blocks.astype(parts[1], dtype)


def var_finalize(parts, dtype, ddof):
    n, _, m2 = parts
    return _blocks.astype(m2 / max(n - ddof, 0), dtype)


def std_finalize(parts, dtype, ddof):
    var = var_finalize(parts, dtype, ddof)
    return np.sqrt(var) if isinstance(var, (np.ndarray, np.generic)) else _blocks.array_namespace(var).sqrt(var)


def plain_finalize(x, dtype):
    return _blocks.astype(x, dtype)


def identity(x):
    return x
