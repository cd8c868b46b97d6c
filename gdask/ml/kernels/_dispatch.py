"""The one place that chooses the implementation a block takes.

* ``"cpu"``: NumPy blocks (emulated devices): the numba CPU kernels (``_*_cpu``).
* ``"cuda"``: CuPy blocks, when numba.cuda can run here and the op's shape fits its kernels: the
  numba.cuda kernels (``_*_cuda``).
* ``"xp"``: any other array API array (``array_api_strict`` on ``emulated-strict`` devices), and CuPy
  blocks the CUDA kernels cannot take: the array API code (``_*_xp``), which the fast kernels are
  tested against.
* ``"sparse"``: CSR blocks (SciPy on emulated devices, ``cupyx.scipy.sparse`` on CUDA): sparse
  matrix products (``_*_sparse``), written once for both libraries. K-means on sparse blocks steps
  with Lloyd's passes only (no ``hamerly`` module).

Every backend module of an algorithm has the same op names (``lloyd_partial``, ``assign``,
``first_pass``, ``step``, ``loss_grad``, ...): :func:`kernels_for` returns the module, the caller calls
the op.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from gdask.devices import array_module, is_sparse
from gdask.ml.kernels import (
    _cuda_common,
    _hamerly_cpu,
    _hamerly_cuda,
    _hamerly_xp,
    _kmeans_cpu,
    _kmeans_cuda,
    _kmeans_sparse,
    _kmeans_xp,
    _logistic_cpu,
    _logistic_cuda,
    _logistic_sparse,
    _logistic_xp,
)

__all__ = ["BACKENDS", "backend_for", "block_kind", "kernels_for"]

BACKENDS = ("cpu", "cuda", "xp", "sparse")

_MODULES: dict[str, dict[str, ModuleType]] = {
    "kmeans": {"cpu": _kmeans_cpu, "cuda": _kmeans_cuda, "xp": _kmeans_xp, "sparse": _kmeans_sparse},
    "hamerly": {"cpu": _hamerly_cpu, "cuda": _hamerly_cuda, "xp": _hamerly_xp},
    "logistic": {"cpu": _logistic_cpu, "cuda": _logistic_cuda, "xp": _logistic_xp, "sparse": _logistic_sparse},
}


def block_kind(block: Any) -> str:
    """``"numpy"``, ``"cupy"``, ``"sparse"`` (a SciPy or CuPy CSR block) or ``"other"``: the array
    library of a block."""
    if isinstance(block, np.ndarray):
        return "numpy"
    if is_sparse(block):
        return "sparse"
    return "cupy" if array_module(block).__name__ == "cupy" else "other"


def backend_for(block: Any, *, clusters: int | None = None, classes: int | None = None) -> str:
    """``"cpu"``, ``"cuda"``, ``"xp"`` or ``"sparse"``: the implementation ``block`` takes.

    Parameters
    ----------
    block : a device block (NumPy, CuPy or another array API array)
    clusters : int, optional
        For K-means ops: the number of centers (the CUDA kernels hold per-cluster bookkeeping in
        shared memory and take only so many).
    classes : int, optional
        For logistic ops: the coefficient rows (1 for binary), likewise bounded on CUDA.
    """
    kind = block_kind(block)
    if kind == "numpy":
        return "cpu"
    if kind == "sparse":
        return "sparse"
    if kind != "cupy" or not _cuda_common.usable():
        return "xp"
    if clusters is not None and not _kmeans_cuda.fits(int(clusters)):
        return "xp"
    if classes is not None and not _logistic_cuda.fits(int(classes)):
        return "xp"
    return "cuda"


def kernels_for(algorithm: str, block: Any, **shape: int) -> ModuleType:
    """The module of ``algorithm`` (``"kmeans"``, ``"hamerly"``, ``"logistic"``) for ``block`` (see
    :func:`backend_for` for ``shape``).

    Raises
    ------
    TypeError
        ``algorithm`` has no implementation for the block's kind (Hamerly's bounds on CSR blocks).
    """
    backend = backend_for(block, **shape)
    try:
        return _MODULES[algorithm][backend]
    except KeyError:
        raise TypeError(f"{algorithm!r} has no {backend!r} kernels (a {type(block).__name__} block); K-means on "
                        "sparse blocks runs Lloyd's passes (algorithm='lloyd')") from None
