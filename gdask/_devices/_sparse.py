"""CSR blocks: sparse rows on a device.

A sparse block is a CSR matrix whose three arrays (``data``, ``indices``, ``indptr``) live on the
block's device: a ``scipy.sparse`` CSR matrix (or array, as given) over NumPy arrays in the pool of an
emulated device, a ``cupyx.scipy.sparse.csr_matrix`` over CuPy arrays on a CUDA device. Its memory is
O(nnz): nothing here makes a dense ``rows x features`` array. ``emulated-strict`` devices hold array
API arrays only and refuse sparse blocks.

The helpers work on both libraries' CSR matrices through their common methods (``@`` with dense
operands, ``.T``, ``.data`` / ``.indices`` / ``.indptr``), so the kernels that use them are written
once. Nothing here imports SciPy or CuPy until such a matrix is passed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gdask._devices._arrays import array_module

__all__ = ["SparseBlockError", "is_sparse", "sparse_all_finite", "sparse_astype", "sparse_moments",
           "sparse_nbytes", "sparse_row_ids", "sparse_row_sums", "sparse_rows", "sparse_to_device", "sparse_to_host",
           "sparse_vstack", "with_data"]

#: top-level modules of the sparse matrix types gdask takes
_SPARSE_MODULES = ("scipy", "cupyx")


class SparseBlockError(TypeError):
    """A sparse block where it cannot go (an ``emulated-strict`` device, a dtype CUDA's sparse matrices lack)."""


def is_sparse(x: Any) -> bool:
    """Whether ``x`` is a SciPy or CuPy sparse matrix / array (checked without importing either)."""
    return type(x).__module__.split(".")[0] in _SPARSE_MODULES and hasattr(x, "nnz") and hasattr(x, "format")


def _is_cupyx(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "cupyx"


def sparse_nbytes(x: Any) -> int:
    """Bytes of a CSR matrix's three arrays."""
    return int(x.data.nbytes + x.indices.nbytes + x.indptr.nbytes)


def sparse_to_device(chunk: Any, dev: Any) -> Any:
    """A host CSR chunk (any SciPy sparse format is converted to CSR) copied onto device ``dev``: a
    SciPy CSR of the chunk's class over arrays of the emulated device's pool, or a
    ``cupyx.scipy.sparse.csr_matrix`` over CuPy arrays on CUDA (int32 indices, float data, as
    cuSPARSE takes them).

    Raises
    ------
    SparseBlockError
        ``dev`` is an emulated-strict device, or CUDA data that cuSPARSE cannot hold.
    """
    if _is_cupyx(chunk):
        chunk = chunk.get()  # another GPU's block: through the host, explicitly
    chunk = chunk.tocsr()
    xp = dev.xp
    if xp is np:
        data, indices, indptr = (dev.asarray(a, order="C") for a in (chunk.data, chunk.indices, chunk.indptr))
        return type(chunk)((data, indices, indptr), shape=chunk.shape, copy=False)
    if getattr(xp, "__name__", "") != "cupy":
        raise SparseBlockError(
            f"sparse blocks need NumPy (emulated) or CUDA devices; {type(dev).__name__} holds array API arrays only. "
            "Use backend='emulated' (or a GPU), or densify the data with x.toarray() if it fits")
    if chunk.dtype.kind != "f":
        raise SparseBlockError(f"CUDA sparse blocks hold float32 / float64 data, got {chunk.dtype}; convert first, "
                               "e.g. x.astype('float32')")
    if chunk.nnz >= 2**31:
        raise SparseBlockError(f"a CUDA sparse block holds fewer than 2**31 nonzeros (int32 indices), got {chunk.nnz}; "
                               "use smaller blocks (block_rows=...)")
    from cupyx.scipy import sparse as cusparse  # only for CuPy devices

    data = dev.asarray(chunk.data, order="C")
    indices = dev.asarray(chunk.indices.astype(np.int32, copy=False), order="C")
    indptr = dev.asarray(chunk.indptr.astype(np.int32, copy=False), order="C")
    return cusparse.csr_matrix((data, indices, indptr), shape=chunk.shape)


def sparse_to_host(x: Any) -> Any:
    """A SciPy sparse matrix of a SciPy or CuPy one (CuPy's copied to the host)."""
    return x.get() if _is_cupyx(x) else x


def with_data(x: Any, data: Any) -> Any:
    """A CSR matrix with ``x``'s structure (its ``indices`` and ``indptr``, not copied) and ``data``."""
    if _is_cupyx(x):
        from cupyx.scipy import sparse as cusparse

        return cusparse.csr_matrix((data, x.indices, x.indptr), shape=x.shape)
    return type(x)((data, x.indices, x.indptr), shape=x.shape, copy=False)


def sparse_row_ids(x: Any) -> Any:
    """The row of every stored entry of CSR ``x`` (int64, on its device)."""
    xp = array_module(x.data)
    if xp is np:
        return np.repeat(np.arange(x.shape[0], dtype=np.int64), np.diff(x.indptr))
    return xp.searchsorted(x.indptr, xp.arange(x.nnz, dtype=x.indptr.dtype), side="right").astype(xp.int64) - 1


def sparse_row_sums(x: Any, values: Any) -> Any:
    """Per row of CSR ``x``, the sum of ``values`` (one per stored entry, in ``x.data``'s order), in
    ``values``' dtype and on its device: a sparse matrix-vector product, one pass over the row's entries."""
    xp = array_module(values)
    ones = xp.ones(x.shape[1], dtype=values.dtype)
    return with_data(x, values) @ ones


def sparse_rows(x: Any, idx: Any, dense: bool = True) -> Any:
    """Rows ``idx`` (host indices) of CSR ``x``: a dense array on ``x``'s device (``dense``), else CSR."""
    if _is_cupyx(x):
        import cupy

        idx = cupy.asarray(np.asarray(idx, dtype=np.int64))
    else:
        idx = np.asarray(idx, dtype=np.int64)
    rows = x[idx]
    return rows.toarray() if dense else rows


def sparse_astype(x: Any, dtype: Any) -> Any:
    """``x`` with its data in ``dtype`` (no copy when it has it already)."""
    return x if x.dtype == np.dtype(dtype) else with_data(x, x.data.astype(dtype))


def sparse_all_finite(x: Any) -> bool:
    """Whether the stored values of ``x`` hold no NaN or infinity (implicit zeros are finite)."""
    if x.dtype.kind in "biu":
        return True
    return bool(array_module(x.data).isfinite(x.data).all())


def sparse_moments(x: Any) -> tuple[int, np.ndarray, np.ndarray]:
    """``(count, mean, M2)`` per column of CSR ``x`` in float64 on the host (Chan et al.'s parallel
    variance): ``M2`` is the sum of squared deviations of the stored values plus those of the
    implicit zeros, ``(n - stored) * mean^2``; no dense copy of the block."""
    n, d = x.shape
    host = sparse_to_host(x)
    vals = host.data.astype(np.float64)
    cols = host.indices
    total = np.bincount(cols, weights=vals, minlength=d)
    stored = np.bincount(cols, minlength=d).astype(np.float64)
    mean = total / n if n else total * 0
    dev = vals - mean[cols]
    m2 = np.bincount(cols, weights=dev * dev, minlength=d) + (n - stored) * mean * mean
    return n, mean, m2


def sparse_vstack(blocks: list) -> Any:
    """Host CSR blocks (SciPy, or CuPy ones copied to the host) stacked along the rows, as CSR of the
    first block's class."""
    import scipy.sparse as sp

    host = [sparse_to_host(b) for b in blocks]
    if len(host) == 1:
        return host[0]
    out = sp.vstack(host, format="csr")
    return out if type(out) is type(host[0]) else type(host[0])(out)
