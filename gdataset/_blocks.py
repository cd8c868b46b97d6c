"""Functions that run inside block tasks, on the worker that owns the device.

Every GDataSet task calls one of these, so device placement, memory accounting, emulated speed and
the coalesced layout are handled in one place.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from numba import njit

from gdask.devices import array_module, current_device, to_numpy  # noqa: F401 (re-exported)


def sum_parts(parts: list) -> Any:
    """Add reduction partials (arrays or scalars) together."""
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def _on_device(arg: Any, dev) -> Any:
    """Move small host operands (centers, weights) to the device's array module."""
    if dev.xp is not np and isinstance(arg, np.ndarray):
        return dev.xp.asarray(arg)
    return arg


def coalesce(x: Any, xp=None) -> Any:
    """The coalesced block layout: 2-D blocks are feature-major (Fortran order).

    Consecutive rows of one feature are adjacent in memory, so a kernel whose threads (or SIMD
    lanes) walk rows reads consecutive addresses. ``block.T`` is a C-contiguous ``(features, rows)``
    view of the same memory.
    """
    if getattr(x, "ndim", 0) == 2 and not x.flags.f_contiguous:
        return (xp or array_module(x)).asfortranarray(x)
    return x


def to_device(chunk: Any) -> Any:
    """Copy one host (or other-device) chunk into this process's device, coalesced."""
    if np.ndim(chunk) == 3:  # sequences: time-major
        from gdask.gdataset._seq import to_device as to_device_seq

        return to_device_seq(chunk)
    dev = current_device()
    return dev.asarray(chunk, order="F" if np.ndim(chunk) == 2 else "C")


def block_op(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``func`` on device blocks and return a block in the coalesced layout."""
    dev = current_device()
    args = tuple(_on_device(a, dev) for a in args)
    out = dev.run(func, *args, **kwargs)
    if getattr(out, "ndim", 0) == 2 and not out.flags.f_contiguous:
        out = dev.adopt(coalesce(out, dev.xp))
    elif getattr(out, "ndim", 0) == 3:  # sequences: time-major
        from gdask.gdataset._seq import is_time_major, to_time_major

        if not is_time_major(out):
            out = dev.adopt(to_time_major(out, dev.xp))
    return out


def partial_op(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``func`` on device blocks for a small result (a reduction partial)."""
    dev = current_device()
    args = tuple(_on_device(a, dev) for a in args)
    return dev.run(func, *args, **kwargs)


def to_host(x: Any) -> Any:
    """A small result with every device array in it (also inside tuples/lists/dicts) copied to host."""
    if isinstance(x, (tuple, list)):
        return type(x)(to_host(v) for v in x)
    if isinstance(x, dict):
        return {k: to_host(v) for k, v in x.items()}
    if array_module(x) is not np:
        return x.get() if getattr(x, "ndim", 0) else x.item()
    return x


def group_partial_op(func: Callable[..., Any], combine: Callable[[list], Any], nargs: int, *flat: Any,
                     host: bool = False, **kwargs: Any) -> Any:
    """Run ``func`` on several blocks held by this worker and combine the partials here: one task
    and one result per group instead of one per block. ``flat`` holds ``nargs`` arguments per block;
    ``host`` returns the combined partial as host (NumPy) data."""
    dev = current_device()
    flat = tuple(_on_device(a, dev) for a in flat)
    run = dev.compute if host else dev.run  # host results are not charged to the device
    parts = [run(func, *flat[j:j + nargs], **kwargs) for j in range(0, len(flat), nargs)]
    out = parts[0] if len(parts) == 1 else run(combine, parts)
    return to_host(out) if host else out


def group_map_op(func: Callable[..., Any], nargs: int, *flat: Any, **kwargs: Any) -> list:
    """Run ``func`` on each of several blocks held by this worker; the list of its results, as host
    data, in the order of the blocks (``flat`` holds ``nargs`` arguments per block). Nothing is
    combined here: callers combine per-block results in block order, whatever the grouping."""
    dev = current_device()
    flat = tuple(_on_device(a, dev) for a in flat)
    return [to_host(dev.compute(func, *flat[j:j + nargs], **kwargs)) for j in range(0, len(flat), nargs)]


def combine_op(combine: Callable[[list], Any], *parts: Any, finalize: tuple | None = None) -> Any:
    """Combine reduction partials (one level of the reduction tree); at the root, also apply
    ``finalize = (func, args)`` to the combined value."""
    dev = current_device()
    out = parts[0] if len(parts) == 1 else dev.run(combine, list(parts))
    if finalize is not None:
        func, args = finalize
        out = dev.run(func, out, *args)
    return out


@njit(nogil=True, fastmath={"reassoc", "contract"}, cache=True)
def _moments_rows(xt, mean, m2):  # pragma: no cover - compiled
    """Per row of a C-contiguous ``(features, rows)`` array: mean and sum of squared deviations in
    float64, two vectorised passes, no float64 copy of the block (NaN/inf propagate)."""
    d, n = xt.shape
    for j in range(d):
        r = xt[j]
        s = 0.0
        for i in range(n):
            s += r[i]
        mu = s / n
        acc = 0.0
        for i in range(n):
            v = r[i] - mu
            acc += v * v
        mean[j] = mu
        m2[j] = acc


def moments(b: Any, axis: int | None) -> tuple[int, Any, Any]:
    """``(count, mean, M2)`` of one block over ``axis`` (0 or None) in float64, for Chan et al.'s
    parallel variance. NumPy feature-major float blocks take a numba fast path."""
    n = b.shape[0] if axis == 0 else b.size
    if (axis == 0 and n and array_module(b) is np and b.ndim == 2 and b.flags.f_contiguous
            and b.dtype in (np.float32, np.float64)):
        mean = np.empty(b.shape[1])
        m2 = np.empty(b.shape[1])
        _moments_rows(b.T, mean, m2)
        return n, mean, m2
    bf = b.astype(np.float64, copy=False)
    if n == 0:
        z = bf.sum(axis=axis) * 0
        return (0, z, z)
    mean = bf.mean(axis=axis)
    return n, mean, ((bf - mean) ** 2).sum(axis=axis)


def concat_blocks(blocks) -> Any:
    """``__dask_postcompute__``: join computed blocks into one array of the blocks' type."""
    blocks = list(blocks)
    if len(blocks) == 1:
        return blocks[0]
    return array_module(blocks[0]).concatenate(blocks, axis=0)


def getitem(x: Any, index: Any) -> Any:
    return x[index]


def matmul_right(blk: Any, w: Any) -> Any:
    """``blk @ w`` computed as ``(w.T @ blk.T).T`` so the result is feature-major without a copy."""
    if w.ndim == 1:
        return blk @ w
    return (w.T @ blk.T).T


def tmatmul(a: Any, b: Any) -> Any:
    """``a.T @ b`` for one block pair: a small dense (features x k) partial."""
    return a.T @ b


def astype(x: Any, dtype: Any) -> Any:
    return x.astype(dtype, copy=False)
