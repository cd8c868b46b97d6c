"""What every kernel module shares, whatever its backend: constants, the bounds state's shape, the
geometry of a centers' move, and host-side helpers. Imports no other module of this package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from gdask.devices import array_namespace, asarray_like, astype, to_numpy

#: rows per block kept as candidates for empty clusters; more empty clusters than this at once take
#: an extra pass (``_farthest_rows`` in ``gdask.ml._kmeans``)
N_FARTHEST = 8

#: the keys of a K-means partial that name its farthest rows
FAR = ("far_d", "far_label", "far_rows", "far_w")

#: rows per slice of the array API reference's one-hot products (bounds its (rows, k) temporaries)
XP_CHUNK = 1 << 15


@dataclass
class BlockBounds:
    """Per-row bounds of one block and its per-cluster sums, valid for ``centers`` (Hamerly)."""

    ref: Any  # weakref to the block
    centers: Any  # (k, d) float64, the centers the bounds and labels refer to
    labels: Any  # (n,) int32
    upper: Any  # (n,) float64
    lower: Any  # (n,) float64
    sums: Any  # (k, d) float64
    counts: Any  # (k,) float64
    far: Any = None  # after a full pass: (squared distances, rows, labels) of the farthest rows
    sxx: float = float("nan")  # sum_i w_i |x_i|^2 in float64, from the full pass (for the inertia at the end)
    memo: Any = None  # the last passes' (centers' bytes, partial): a pass asked again gets the same answer
    buffer: Any = None  # the allocation behind labels and bounds (CPU): a full pass that rebuilds them reuses it
    moved: Any = None  # (CPU) per center, the drifts summed since the full pass (du, dl): bounds kept against them
    scratch: Any = None  # (CPU) the step's gather buffers and the block's row norms, kept from step to step


def center_geometry(centers: np.ndarray, old: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, float, float,
                                                                    np.ndarray]:
    """Drift per center, half the distance to the nearest other center, the largest drift (its
    center and value), the second largest, and the center-to-center distances (host float64).

    One compiled loop (:func:`_geometry`): a bounds step asks for it once per block, and as a dozen
    small NumPy operations it took 37 us a call in a quiet process and ~150 us on a worker whose
    rank loop streams blocks through the caches (~5% of a step's time on uniform rows)."""
    c = np.ascontiguousarray(centers, dtype=np.float64)
    o = np.ascontiguousarray(old, dtype=np.float64)
    k = c.shape[0]
    drift = np.empty(k)
    half = np.empty(k)
    cc = np.empty((k, k))
    m1, d1, d2 = _geometry(c, o, drift, half, cc)
    return drift, half, int(m1), float(d1), float(d2), cc


@njit(nogil=True, cache=True)
def _geometry(c, o, drift, half, cc):  # pragma: no cover - compiled
    """Fill ``drift`` (each center's move from ``o``), ``cc`` (center-to-center distances) and ``half``
    (half the distance to the nearest other center; infinite for one center); returns the largest
    drift's center (the first of equals), its value and the largest other drift (0 for one center).
    Squares summed feature by feature in float64."""
    k, d = c.shape
    for a in range(k):
        s = 0.0
        for j in range(d):
            v = c[a, j] - o[a, j]
            s += v * v
        drift[a] = np.sqrt(s)
    for a in range(k):
        cc[a, a] = 0.0
        for b in range(a + 1, k):
            s = 0.0
            for j in range(d):
                v = c[a, j] - c[b, j]
                s += v * v
            cc[a, b] = np.sqrt(s)
            cc[b, a] = cc[a, b]
    for a in range(k):
        m = np.inf
        for b in range(k):
            if b != a and cc[a, b] < m:
                m = cc[a, b]
        half[a] = 0.5 * m
    m1 = 0
    for a in range(1, k):
        if drift[a] > drift[m1]:
            m1 = a
    d2 = 0.0
    for a in range(k):
        if a != m1 and drift[a] > d2:
            d2 = drift[a]
    return m1, drift[m1], d2


def device_of(x: Any) -> Any:
    """The array API device of ``x``."""
    from array_api_compat import device

    return device(x)


def host(x: Any) -> Any:
    """A block kernel's result on the host (dict values, tuples and 0-d arrays too): what the block
    task does with it (for tests and callers outside block tasks)."""
    if isinstance(x, dict):
        return {key: host(v) for key, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(host(v) for v in x)
    out = to_numpy(x)
    return out[()] if getattr(out, "ndim", None) == 0 else out


def weighted_total(values: Any, w: Any) -> float:
    """``sum(values * w)`` (``sum(values)`` without weights) as a Python float."""
    if isinstance(values, np.ndarray) and (w is None or isinstance(w, np.ndarray)):
        return float(values.sum() if w is None else (values * w).sum())
    xp = array_namespace(values, w)
    return float(xp.sum(values) if w is None else xp.sum(values * w))


def row_weights(y: Any, w: Any, class_w: Any) -> Any:
    """Effective weight of each row (``sample_weight * class_weight[y]``) or ``None`` (all ones)."""
    if class_w is not None:
        cw = class_w[y] if isinstance(class_w, np.ndarray) else array_namespace(class_w).take(class_w, y)
        return cw if w is None else cw * w
    return w


def as_float(x: Any, dtype: Any, like: Any) -> Any:
    """A small operand in ``dtype`` on the device of block ``like`` (host data is moved there)."""
    if isinstance(x, (np.ndarray, np.generic)) and not isinstance(like, np.ndarray):
        return asarray_like(x, like, dtype=dtype)
    return astype(x, dtype) if hasattr(x, "shape") else asarray_like(x, like, dtype=dtype)


def take_rows(x: Any, idx: np.ndarray) -> Any:
    """Rows ``idx`` (host indices) of a block or weights, on the block's device."""
    if isinstance(x, np.ndarray):
        return x[idx]
    return array_namespace(x).take(x, asarray_like(np.asarray(idx, dtype=np.int64), x), axis=0)
