"""K-means block ops: one pass over a block each, dispatched to its backend
(:func:`gdask.ml.kernels._dispatch.kernels_for`), and the combination of their partials.

Small operands (the centers, weights) come on the blocks' device (the block task moved them there).
Per-block results are device arrays (NumPy on emulated devices); the block task moves them to the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gdask.ml.kernels import _dispatch
from gdask.ml.kernels._common import FAR, N_FARTHEST

__all__ = ["assign", "labels_block", "lloyd_combine", "lloyd_partial", "min_sqdist"]


def lloyd_partial(blk: Any, centers: Any, w: Any = None) -> dict:
    """One block's Lloyd statistics, a dict: ``sums (k, d)`` and ``counts (k,)`` (float64, weighted
    by the rows' ``w`` if given), ``inertia``, and the block's rows farthest from their centers
    (``far_d``, ``far_label``, ``far_rows``, ``far_w``), which empty clusters take as scikit-learn
    does, without another pass over the data. Ties between equally far rows go to the lower row."""
    return _dispatch.kernels_for("kmeans", blk, clusters=centers.shape[0]).lloyd_partial(blk, centers, w)


def lloyd_combine(parts: list[dict]) -> dict:
    """Add Lloyd partials; keep the ``N_FARTHEST`` farthest rows over all of them."""
    out = dict(parts[0])
    for p in parts[1:]:
        out["sums"] = out["sums"] + p["sums"]
        out["counts"] = out["counts"] + p["counts"]
        out["inertia"] = out["inertia"] + p["inertia"]
        out["changed"] = out.get("changed", 0) + p.get("changed", 0)
        for key in FAR:
            out[key] = np.concatenate([out[key], p[key]])
    if len(out["far_d"]) > N_FARTHEST:
        top = np.argsort(-out["far_d"], kind="stable")[:N_FARTHEST]
        for key in FAR:
            out[key] = out[key][top]
    return out


def assign(blk: Any, centers: Any) -> tuple[Any, Any]:
    """Labels (int32) and exact squared distance to the nearest center (float64) of one block's rows."""
    return _dispatch.kernels_for("kmeans", blk, clusters=centers.shape[0]).assign(blk, centers)


def labels_block(blk: Any, centers: Any) -> Any:
    return assign(blk, centers)[0]


def min_sqdist(blk: Any, centers: Any) -> Any:
    return assign(blk, centers)[1]
