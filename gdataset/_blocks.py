"""Functions that run inside block tasks, on the worker that owns the device.

Every GDataSet task calls one of these, so device placement, memory accounting, emulated speed,
host <-> device moves and the coalesced layout are handled in one place.

Small host operands of a block function (centers, weights, index arrays: NumPy arrays) reach the
device here, through the device (:func:`on_device`), for every backend whose arrays are not NumPy:
a block function always gets its operands in its blocks' namespace and on their device. Results
that go back to the caller leave the device here too (:func:`to_host`). Block functions are written
against the array API standard (:func:`gdask.devices.array_namespace`), with NumPy fast paths.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from numba import njit

from gdask.devices import (  # noqa: F401 (array_module, to_numpy re-exported)
    array_module,
    array_namespace,
    asarray_like,
    astype,
    current_device,
    is_sparse,
    numpy_dtype,
    sparse_astype,
    sparse_moments,
    sparse_to_device,
    sparse_to_host,
    sparse_vstack,
    to_numpy,
)
from gdask.gdataset import _seq


def sum_parts(parts: list) -> Any:
    """Add reduction partials (arrays or scalars) together."""
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def on_device(arg: Any, dev: Any = None) -> Any:
    """A block function's operand as the device needs it: a host NumPy array copied onto ``dev``
    (default: this process's device) by the device itself (``dev.asarray``: counted, charged, and an
    out-of-memory error makes room first), a NumPy scalar as a Python scalar (array API namespaces
    take Python scalars only). Anything else, and everything on NumPy devices, is returned as is."""
    dev = current_device() if dev is None else dev
    if dev.xp is np:
        return arg
    if isinstance(arg, np.ndarray):
        return dev.asarray(arg, order="C")
    if isinstance(arg, np.generic):
        return arg.item()
    return arg


_on_device = on_device


def _is_device_array(a: Any) -> bool:
    return (hasattr(a, "shape") and not isinstance(a, (np.ndarray, np.generic))
            and array_module(a) is not np)


def _leaves(x: Any) -> list:
    return [v for item in x for v in _leaves(item)] if isinstance(x, (tuple, list)) else [x]


def _mixed(parts: Any) -> bool:
    """Whether ``parts`` hold both device arrays and host (NumPy) arrays; host-only partials (a chunk that
    returns host data) stay on the host."""
    leaves = [v for v in _leaves(parts) if hasattr(v, "shape")]
    device = [_is_device_array(v) for v in leaves]
    return any(device) and not all(device)


def _on_device_nested(arg: Any, dev: Any) -> Any:
    """:func:`on_device` of ``arg`` and of the items of tuples and lists in it (reduction partials such as
    ``(count, mean, M2)``)."""
    if isinstance(arg, (tuple, list)) and not hasattr(arg, "_fields"):
        return type(arg)(_on_device_nested(v, dev) for v in arg)
    return _on_device(arg, dev)


def user_task(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """A user's task (``dask.delayed(f)(X.block(i), state)``) in a graph gdask rewrites (a tracked loop:
    :func:`gdask.iterate`, :func:`gdask.incremental`): when a device array is among its arguments (a
    block), its host arguments (NumPy arrays, NumPy scalars; also inside lists and tuples) move to this
    process's device first (:func:`on_device`: once per task), so a function written for NumPy data
    gets device arrays only, as it would on NumPy blocks. Without device arguments ``func`` runs as is
    (host work stays on the host)."""
    flat = [*args, *kwargs.values()]
    flat += [v for a in flat if isinstance(a, (list, tuple)) for v in a]
    if not any(_is_device_array(a) for a in flat):
        return func(*args, **kwargs)
    dev = current_device()

    return func(*(_on_device_nested(a, dev) for a in args),
                **{k: _on_device_nested(v, dev) for k, v in kwargs.items()})


def coalesce(x: Any, xp=None) -> Any:
    """The coalesced block layout: 2-D blocks are feature-major (Fortran order).

    Consecutive rows of one feature are adjacent in memory, so a kernel whose threads (or SIMD
    lanes) walk rows reads consecutive addresses. ``block.T`` is a C-contiguous ``(features, rows)``
    view of the same memory. Arrays without a memory layout (array API arrays such as strict ones)
    are returned as they are.
    """
    if getattr(x, "ndim", 0) == 2 and hasattr(x, "flags") and not x.flags.f_contiguous:
        return (xp or array_module(x)).asfortranarray(x)
    return x


def to_device(chunk: Any, handed: bool = False) -> Any:
    """Copy one host (or other-device) chunk into this process's device, coalesced (a sparse chunk
    as a CSR block: :func:`gdask.devices.sparse_to_device`). ``handed``: nothing else holds or writes
    ``chunk`` (a block read from its file), so a device whose memory is the host's may keep it as it is
    when it is coalesced already (:meth:`~gdask.devices.EmulatedDevice.hand_over`)."""
    if is_sparse(chunk):
        return sparse_to_device(chunk, current_device())
    if np.ndim(chunk) == 3:  # sequences: time-major
        return _seq.to_device(chunk)
    dev = current_device()
    put = dev.hand_over if handed else dev.asarray
    return put(chunk, order="F" if getattr(chunk, "ndim", np.ndim(chunk)) == 2 else "C")


def block_op(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``func`` on device blocks and return a block in the coalesced layout."""
    dev = current_device()
    args = tuple(_on_device(a, dev) for a in args)
    out = dev.run(func, *args, **kwargs)
    if getattr(out, "ndim", 0) == 2 and hasattr(out, "flags") and not out.flags.f_contiguous:
        out = dev.adopt(coalesce(out, dev.xp))
    elif getattr(out, "ndim", 0) == 3 and not _seq.is_time_major(out):  # sequences: time-major
        out = dev.adopt(_seq.to_time_major(out))
    return out


def device_call(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` as device work on this process's device, its host operands moved to
    the device first (:func:`on_device`) and its result moved to the host (:func:`to_host`): for
    ``dask.delayed`` calls on single blocks (``dask.delayed(device_call)(f, X.block(i), centers)``)."""
    dev = current_device()
    args = tuple(_on_device(a, dev) for a in args)
    return to_host(dev.compute(func, *args, **kwargs))


def partial_op(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``func`` on device blocks for a small result (a reduction partial)."""
    dev = current_device()
    args = tuple(_on_device(a, dev) for a in args)
    return dev.run(func, *args, **kwargs)


def to_host(x: Any) -> Any:
    """A small result with every device array in it (also inside tuples/lists/dicts) copied to host
    (:func:`gdask.devices.to_numpy`); a 0-d device array becomes a NumPy scalar."""
    if isinstance(x, (tuple, list)):
        return type(x)(to_host(v) for v in x)
    if isinstance(x, dict):
        return {k: to_host(v) for k, v in x.items()}
    if x is None or isinstance(x, (np.ndarray, np.generic, int, float, bool, complex, str)):
        return x
    if not hasattr(x, "shape"):
        return x
    if is_sparse(x):  # a SciPy CSR matrix (CuPy's copied to the host)
        return sparse_to_host(x)
    out = to_numpy(x)
    return out[()] if getattr(out, "ndim", None) == 0 else out


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
    if dev.xp is not np and _mixed(parts):  # partials a window cache moved to host memory join the device ones
        parts = tuple(_on_device_nested(p, dev) for p in parts)
    out = parts[0] if len(parts) == 1 else dev.run(combine, list(parts))
    if finalize is not None:
        func, args = finalize
        out = dev.run(func, out, *args)
    return out


#: the column sums behind a block's moments add the rows in at most this many slabs (see :func:`_slab_rows`)
_SLABS = 64


def _slab_rows(n: int) -> int:
    """Rows per slab of a block of ``n`` rows. A column sum runs in a fixed order that elementwise
    array-API operations can follow exactly: the slabs of ``c`` rows added one after the other into
    ``c`` partial sums (the last, shorter slab into the first ones), then those folded in halves, the
    top half onto the bottom one (a middle row, when odd, waits for the next fold). Every backend
    (the numba kernel on NumPy blocks, the array namespace on CuPy or strict devices) adds the same
    numbers in the same order: the same bits. It depends on ``n`` only, never on the backend."""
    return max(1, -(-n // _SLABS))


@njit(nogil=True, cache=True)  # pragma: no cover - compiled; no fast-math: IEEE order, as _xp_column_sums
def _fold_slabs(acc, c):
    r = c
    while r > 1:
        h = r // 2
        for i in range(h):
            acc[i] = acc[i] + acc[r - h + i]
        r -= h
    return acc[0]


@njit(nogil=True, cache=True)  # pragma: no cover - compiled; no fast-math: the order of _xp_column_sums
def _slab_sum(r, c, acc, mu, squares):
    """The sum of ``r`` (float64 of each value, or with ``squares`` of its deviation from ``mu``) in
    the slab order of :func:`_slab_rows`: full slabs two at a time (the same adds, in the same order,
    as one at a time), each with a constant trip count so that the adds vectorise over the slab."""
    n = r.shape[0]
    for i in range(c):
        v = np.float64(r[i]) - mu if squares else np.float64(r[i]) + 0.0  # + 0.0: as the array-API path
        acc[i] = v * v if squares else v
    s = c
    while s + 2 * c <= n:
        s0 = r[s:s + c]
        s1 = r[s + c:s + 2 * c]
        if squares:
            for i in range(c):
                v0 = np.float64(s0[i]) - mu
                v1 = np.float64(s1[i]) - mu
                acc[i] = (acc[i] + v0 * v0) + v1 * v1
        else:
            for i in range(c):
                acc[i] = (acc[i] + np.float64(s0[i])) + np.float64(s1[i])
        s += 2 * c
    if s + c <= n:
        s0 = r[s:s + c]
        for i in range(c):
            v = np.float64(s0[i]) - mu if squares else np.float64(s0[i])
            acc[i] = acc[i] + (v * v if squares else v)
        s += c
    rest = r[s:]
    for i in range(rest.shape[0]):
        v = np.float64(rest[i]) - mu if squares else np.float64(rest[i])
        acc[i] = acc[i] + (v * v if squares else v)
    return _fold_slabs(acc, c)


@njit(nogil=True, cache=True)  # pragma: no cover - compiled
def _moments_rows(xt, c, acc, mean, m2):
    """Per row of a C-contiguous ``(features, rows)`` array: mean and sum of squared deviations in
    float64 (two passes, no float64 copy of the block; NaN/inf propagate), each sum in the slab order
    of :func:`_slab_rows`. ``acc``: ``c`` float64 of scratch."""
    d, n = xt.shape
    for j in range(d):
        mu = _slab_sum(xt[j], c, acc, 0.0, False) / n
        mean[j] = mu
        m2[j] = _slab_sum(xt[j], c, acc, mu, True)


def _xp_column_sums(xp: Any, v: Any) -> Any:
    """Sums over axis 0 of a 2-D float64 array in the slab order of :func:`_slab_rows` (elementwise
    operations only: the same bits on every array library)."""
    n = v.shape[0]
    c = _slab_rows(n)
    acc = v[:c, ...] + 0.0  # a new array (the numba kernel adds this 0.0 too: -0.0 becomes 0.0 in both)
    for s in range(c, n, c):
        m = min(c, n - s)
        acc = acc + v[s:s + c, ...] if m == c else xp.concat([acc[:m, ...] + v[s:s + m, ...], acc[m:, ...]], axis=0)
    r = c
    while r > 1:
        h = r // 2
        acc = xp.concat([acc[:h, ...] + acc[r - h:r, ...], acc[h:r - h, ...]], axis=0)
        r -= h
    return acc[0, ...]


def moments(b: Any, axis: int | tuple[int, ...] | None) -> tuple[int, Any, Any]:
    """``(count, mean, M2)`` of one block over ``axis`` (0, a tuple such as ``(0, 1)`` for rows and
    time steps of sequences, or None) in float64, for Chan et al.'s parallel variance. Over the rows
    of a 2-D block, the sums run in the slab order of :func:`_slab_rows` on every backend (NumPy
    feature-major float blocks through a numba kernel), so emulated, strict and CUDA devices agree
    bit for bit; CSR blocks (``axis=0``) read their stored values only."""
    if is_sparse(b) and axis == 0:
        return sparse_moments(b)
    axes = tuple(range(b.ndim)) if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
    n = math.prod(b.shape[a] for a in axes)
    if axes == (0,) and n and isinstance(b, np.ndarray) and b.ndim == 2 and b.flags.f_contiguous \
            and b.dtype in (np.float32, np.float64):
        c = _slab_rows(n)
        mean = np.empty(b.shape[1])
        m2 = np.empty(b.shape[1])
        _moments_rows(b.T, c, np.empty(c), mean, m2)
        return n, mean, m2
    xp = array_namespace(b)
    bf = astype(b, np.float64)
    if n == 0:
        z = xp.sum(bf, axis=axis) * 0
        return (0, z, z)
    if axes == (0,) and b.ndim == 2:
        mean = _xp_column_sums(xp, bf) / n
        dev = bf - mean
        return n, mean, _xp_column_sums(xp, dev * dev)
    mean = xp.mean(bf, axis=axis)
    keep = tuple(None if a in axes else slice(None) for a in range(b.ndim))  # mean broadcast over the axes
    dev = bf - (mean if axis is None else mean[keep])
    return n, mean, xp.sum(dev * dev, axis=axis)


def concat_blocks(blocks) -> Any:
    """``__dask_postcompute__``: join computed blocks into one array of the blocks' type."""
    blocks = list(blocks)
    if is_sparse(blocks[0]):  # CSR blocks join on the host
        return sparse_vstack(blocks)
    if len(blocks) == 1:
        return blocks[0]
    if isinstance(blocks[0], np.ndarray):
        return np.concatenate(blocks, axis=0)
    return array_namespace(blocks[0]).concat(blocks, axis=0)


def _is_index_array(v: Any) -> bool:
    return isinstance(v, (list, np.ndarray)) or (hasattr(v, "shape") and hasattr(v, "dtype") and len(v.shape) > 0)


def getitem(x: Any, index: Any) -> Any:
    """``x[index]``. Array API arrays take the standard's indexing: integer arrays along one axis
    (``X[:, cols]``) become ``take``, a partial index is completed with ``...``."""
    if isinstance(x, np.ndarray) or array_module(x).__name__ == "cupy":
        return x[index]
    index = index if isinstance(index, tuple) else (index,)
    arrays = [i for i, v in enumerate(index) if _is_index_array(v)]
    if arrays:
        if len(arrays) > 1 or any(v is None or v is Ellipsis for v in index):
            raise IndexError(f"index {index!r} has more than integer arrays along one axis; array API "
                             "arrays take one integer array, e.g. X[:, cols]")
        pos = arrays[0]
        basic = tuple(slice(None) if i == pos else v for i, v in enumerate(index))
        axis = pos - sum(1 for v in index[:pos] if isinstance(v, int))
        idx = index[pos]
        idx = idx if hasattr(idx, "__array_namespace__") and not isinstance(idx, np.ndarray) else \
            asarray_like(np.asarray(idx, dtype=np.int64), x)
        return array_namespace(x).take(_basic(x, basic), idx, axis=axis)
    return _basic(x, index)


def _basic(x: Any, index: tuple) -> Any:
    if Ellipsis not in index and sum(1 for v in index if v is not None) < x.ndim:
        index = index + (Ellipsis,)
    return x[index]


def _same_kind(a: Any, b: Any) -> tuple[Any, Any]:
    """``a`` and ``b`` in their NumPy-promoted dtype (the array API does not promote across kinds)."""
    da, db = numpy_dtype(a.dtype), numpy_dtype(b.dtype)
    if da.kind == db.kind:
        return a, b
    dt = np.result_type(da, db)
    return astype(a, dt), astype(b, dt)


def matmul_right(blk: Any, w: Any) -> Any:
    """``blk @ w`` computed as ``(w.T @ blk.T).T`` so the result is feature-major without a copy."""
    blk, w = _same_kind(blk, w)
    if w.ndim == 1:
        return blk @ w
    return (w.T @ blk.T).T


def tmatmul(a: Any, b: Any) -> Any:
    """``a.T @ b`` for one block pair: a small dense (features x k) partial."""
    a, b = _same_kind(a, b)
    if a.ndim == 1:
        return a @ b
    return a.T @ b


def block_astype(x: Any, dtype: Any) -> Any:
    """``x`` in ``dtype`` (a NumPy dtype), without a copy when it has it already."""
    return sparse_astype(x, dtype) if is_sparse(x) else astype(x, dtype)
