"""Results follow the input: the array type of what reaches the caller (cuML's ``output_type``).

A GDataSet remembers the array type of what it was made from (:attr:`GDataSet.input_type`: "numpy" for
NumPy, lists, pandas and NumPy-chunked dask arrays; "cupy" for CuPy, cuDF and CuPy-chunked dask arrays;
"device" for arrays of a device's own namespace, as the blocks of emulated-strict devices). What reaches
the caller (``X.compute()``, the result of a reduction, ``gdask.iterate``'s state) comes back in the type
config ``gdask.output-type`` names: "input" (default) follows the input, "numpy", "cupy", or "device"
(the devices' blocks as they are: CuPy on CUDA devices, NumPy on emulated ones, strict arrays on
emulated-strict ones). The same key and values choose the type of the estimators' results
(:mod:`gdask.ml`). Intermediate GDataSets stay on the devices; only what leaves the collection is
converted, explicitly (:func:`gdask.devices.to_numpy` on the way to the host).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gdask import config
from gdask.devices import is_sparse, to_numpy
from gdask.gdataset import _blocks

__all__ = ["OUTPUT_TYPES", "array_type", "as_type", "join_blocks", "output_type", "to_output"]

#: the values of config ``gdask.output-type`` and of ``output_type=`` arguments
OUTPUT_TYPES = ("input", "numpy", "cupy", "device")

#: top-level modules whose arrays live on a device, and the array type that stands for them
_DEVICE_MODULES = {"cupy": "cupy", "cupyx": "cupy", "cudf": "cupy", "dask_cudf": "cupy", "array_api_strict": "device"}


def array_type(x: Any) -> str:
    """The array type ``x`` stands for: "cupy" (CuPy, cuDF), "device" (a device namespace's own arrays,
    e.g. array-api-strict) or "numpy" (everything else: NumPy, lists, pandas, scalars)."""
    return _DEVICE_MODULES.get(type(x).__module__.split(".")[0], "numpy")


def output_type(input_type: str, output_type: str | None = None) -> str:
    """The array type ("numpy", "cupy" or "device") results of data made from ``input_type`` come
    back as: ``output_type`` if given, else config ``gdask.output-type``; "input" follows the input.

    Raises
    ------
    ValueError
        ``output_type`` (or the config value) is not one of :data:`OUTPUT_TYPES`.
    """
    out = config.get("output-type", "input") if output_type is None else output_type
    if out not in OUTPUT_TYPES:
        raise ValueError(f"output_type must be one of {OUTPUT_TYPES} (None: config gdask.output-type), got {out!r}; "
                         "set gdask.output-type or pass output_type= with one of them")
    return input_type if out == "input" else out


def _to_cupy(x: Any) -> Any:
    try:
        import cupy  # optional: only asked for by output type "cupy"
    except ImportError as e:
        raise ImportError("output type 'cupy' needs CuPy, which is not installed; use output_type='numpy' (or "
                          "config gdask.output-type: numpy) or install cupy") from e
    return x if array_type(x) == "cupy" else cupy.asarray(to_numpy(x))


def as_type(x: Any, target: str) -> Any:
    """``x`` (an array, a scalar, or a tuple / list / dict of them) as array type ``target``:
    "numpy" copies device arrays to the host, "cupy" makes CuPy arrays, "device" leaves ``x`` as it is.
    Python and NumPy scalars and non-array values are returned as they are."""
    if target == "device" or x is None:
        return x
    if isinstance(x, (tuple, list)):
        return type(x)(as_type(v, target) for v in x)
    if isinstance(x, dict):
        return {k: as_type(v, target) for k, v in x.items()}
    if isinstance(x, (np.generic, int, float, bool, complex, str)) or not hasattr(x, "shape"):
        return x
    if target == "cupy":
        return _to_cupy(x)
    if array_type(x) == "numpy":
        return x
    out = to_numpy(x)
    return out[()] if getattr(out, "ndim", None) == 0 else out


def to_output(x: Any, target: str) -> Any:
    """The last task of a result that goes to the caller (a reduction): ``x`` as ``target``, converted
    on the worker that holds it (:func:`as_type`)."""
    return as_type(x, target)


def join_blocks(blocks: Any, target: str) -> Any:
    """``X.compute()``'s last step (``__dask_postcompute__``): the computed blocks joined along the rows,
    as array type ``target``. For "numpy" each block is moved to the host first and NumPy joins them
    (no device concatenation on the caller's device)."""
    blocks = list(blocks)
    if is_sparse(blocks[0]):  # CSR blocks: one SciPy CSR matrix on the host
        return _blocks.concat_blocks(blocks)
    if target == "numpy":
        blocks = [to_numpy(b) for b in blocks]
        return blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=0)
    return as_type(_blocks.concat_blocks(blocks), target)
