"""The functions K-means runs in block tasks: the init's draws, the final pass's labels, predictions.

Device blocks in, small host results out (moved explicitly, :func:`gdask.devices.to_numpy`); the
device work is the kernels' (:mod:`gdask.ml.kernels`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from gdask.devices import array_namespace, asarray_like, astype, is_sparse, sparse_rows, to_numpy, worker_state
from gdask.ml import kernels
from gdask.ml._base import require_finite

__all__ = [
    "assign_host", "bounds_labels_host", "distances_block", "distances_host", "farthest_rows",
    "join_lists", "label_dtype", "labels_block", "labels_host", "narrow", "nearest_counts", "nearest_total",
    "sample_nearest", "take", "take_rows", "take_sparse_rows",
]


# -- block functions: device blocks, operands already on the blocks' device (the block task moved
# them there), results that go to the host moved explicitly (gdask.devices.to_numpy) --------------
def take(x, idx):
    """Rows ``idx`` (host indices, or indices on the block's device) of a device block (or weights),
    on the block's device (a CSR block's rows as a dense array: a few rows, for centers)."""
    if is_sparse(x):
        return sparse_rows(x, to_numpy(idx))
    if isinstance(x, np.ndarray):
        return x[to_numpy(idx)]
    if isinstance(idx, np.ndarray):
        idx = asarray_like(idx.astype(np.int64, copy=False), x)
    return array_namespace(x).take(x, idx, axis=0)


# -- k-means||: each block keeps, in its worker's state space of the init, every row's squared distance
# to its nearest candidate so far and that candidate's index, so a round computes the distances to
# the candidates drawn in the last round only (not to all of them again) ------------------------------
@dataclass
class _Nearest:
    """A block's rows' nearest candidate among the first ``seen`` candidates (``groups`` rounds)."""

    ref: Any  # weak reference to the block: the state of a block this process let go is not reused
    groups: int
    seen: int
    mind: Any  # squared distance (float64, exact), on the block's device
    label: Any  # candidate index (int32), on the block's device


def _nearest(blk, cands, sizes, token):
    """The block's :class:`_Nearest` state brought to all ``len(sizes)`` candidate groups (``cands``
    holds them in order, ``sizes`` their row counts). A block without state (the first round, or
    moved to another worker, recomputed) replays every group in order: the same bits as a block that
    kept its state. A row's candidate changes only for a strictly nearer one (ties: the first)."""
    space = worker_state(token)
    st = space.get(id(blk))
    if st is not None and (st.ref() is not blk or st.groups > len(sizes) or st.seen != sum(sizes[:st.groups])):
        st = None  # another block's, or of other candidates (a loop resumed elsewhere): start again
    start = 0 if st is None else st.seen
    for size in sizes[0 if st is None else st.groups:]:
        group = cands[:start + size, :]
        if st is None:
            mind, label = kernels.nearest_update(blk, group, 0)
            st = _Nearest(weakref.ref(blk), 0, 0, mind, label)
        else:
            st.mind, st.label = kernels.nearest_update(blk, group, st.seen, st.mind, st.label)
        st.groups += 1
        st.seen += size
        start += size
    space[id(blk)] = st
    return st


def nearest_total(blk, cands, sizes, token, w=None):
    """The block's part of the k-means|| cost: the sum of ``w`` times each row's squared distance to
    its nearest candidate (:func:`_nearest`)."""
    return kernels.weighted_total(_nearest(blk, cands, sizes, token).mind, w)


def sample_nearest(blk, cands, sizes, token, factor, phi, seeds, b, w=None):
    """k-means|| oversampling: keep each row independently with probability ``min(1, factor * w d(x)^2 /
    phi)``, ``d(x)`` the distance to its nearest candidate, drawn from the NumPy generator seeded with
    ``seeds[b]`` (``b``: the block's index) from values exact on every backend: the same rows on
    every backend, wherever the block is.

    The draws thin a sparser process (:func:`_thinned_draws`): rows are first drawn at the largest
    probability of the block, then each kept with its own probability over that one. A round draws
    about ``factor`` rows over all blocks, so only the largest ``w d(x)^2`` and those few rows'
    values leave the device, not a value per row, and no random number is drawn per row."""
    score = _nearest(blk, cands, sizes, token).mind
    if w is not None:
        score = score * asarray_like(w, score)
    keep = _thinned_draws(score, float(factor) / float(phi), np.random.default_rng(seeds[b]))
    return to_numpy(take(blk, keep))


#: above this share of a block's rows drawn at the largest probability, a block draws one number per row
#: (the thinning would draw nearly all rows twice)
THIN_MAX_SHARE = 0.125


def _thinned_draws(score, scale: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted host indices of the rows kept, each independently with probability ``min(1, scale *
    score[i])`` (``score`` float64 on any device, ``scale`` finite and positive).

    With ``q = min(1, scale * max(score))``: ``Binomial(n, q)`` distinct rows drawn uniformly are the
    rows of a Bernoulli(``q``) process, and keeping each with probability ``min(1, scale * score[i]) / q``
    leaves each row with its own probability. Where ``q`` exceeds :data:`THIN_MAX_SHARE` every row gets
    a number (the same law)."""
    n = int(score.shape[0])
    if n == 0:
        return np.empty(0, np.int64)
    xp = array_namespace(score)
    top = float(to_numpy(xp.max(score)))
    q = min(1.0, scale * top)
    if not q > 0.0:  # every row sits on a candidate
        return np.empty(0, np.int64)
    if q > THIN_MAX_SHARE:
        p = scale * np.asarray(to_numpy(score), dtype=np.float64)
        return np.nonzero(rng.random(n) < p)[0]
    m = int(rng.binomial(n, q))
    idx = np.sort(rng.choice(n, size=m, replace=False, shuffle=False)).astype(np.int64)
    if m == 0:
        return idx
    p = scale * np.asarray(to_numpy(take(score, idx)), dtype=np.float64)
    return idx[rng.random(m) * q < p]


def nearest_counts(blk, cands, sizes, token, w=None):
    """Weight (rows, or their ``w``) of each candidate's nearest rows; ends the block's init state."""
    st = _nearest(blk, cands, sizes, token)
    worker_state(token).pop(id(blk), None)
    return np.bincount(to_numpy(st.label), weights=None if w is None else to_numpy(w),
                       minlength=int(sum(sizes))).astype(np.float64)


def take_rows(blk, idx):
    return to_numpy(take(blk, idx))


def take_sparse_rows(blk, idx):
    """Rows ``idx`` of a CSR block as a SciPy CSR matrix on the host (a sample kept sparse)."""
    from gdask.devices import sparse_to_host

    return sparse_to_host(sparse_rows(blk, idx, dense=False))


def farthest_rows(blk, centers, m, w=None):
    labels, mind = (to_numpy(a) for a in kernels.assign(blk, centers))
    m = min(m, mind.shape[0])
    idx = np.argpartition(-mind, m - 1)[:m] if m < mind.shape[0] else np.arange(mind.shape[0])
    idx = idx[np.lexsort((idx, -mind[idx]))]  # farthest first, equal distances in row order
    ws = np.ones(idx.size) if w is None else to_numpy(take(w, idx)).astype(np.float64)
    return mind[idx], labels[idx], to_numpy(take(blk, idx)), ws


def label_dtype(k: int) -> np.dtype:
    """The narrowest unsigned type that holds the labels of ``k`` clusters."""
    return np.min_scalar_type(max(k - 1, 0))


def narrow(labels: np.ndarray, k: int) -> np.ndarray:
    """Labels in the narrowest unsigned type for ``k`` clusters (less to send back)."""
    return labels.astype(label_dtype(k), copy=False)


def labels_host(blk, centers, w=None, labels=True):
    lab, mind = kernels.assign(blk, centers)
    return (narrow(to_numpy(lab), centers.shape[0]) if labels else None), kernels.weighted_total(mind, w)


def bounds_labels_host(blk, centers, token, w=None, history=None, labels=True):
    # the labels come narrowed (a copy): the bounds' memory goes to the next fit's blocks
    dtype = label_dtype(centers.shape[0]) if labels else False
    lab, inertia = kernels.bounds_labels(blk, centers, token, w, history=history, dtype=dtype)
    return (to_numpy(lab) if labels else None), inertia


def labels_block(blk, centers):
    require_finite(blk)
    return kernels.assign(blk, centers)[0]


def assign_host(blk, centers):
    require_finite(blk)
    labels, mind = kernels.assign(blk, centers)
    return [(to_numpy(labels), to_numpy(mind))]


def join_lists(parts):
    return [p for part in parts for p in part]


def distances_block(blk, centers):
    require_finite(blk)
    if is_sparse(blk):
        return kernels.kernels_for("kmeans", blk).distances(blk, centers)
    xp = np if isinstance(blk, np.ndarray) else array_namespace(blk)
    c = astype(centers, blk.dtype) if hasattr(centers, "shape") else asarray_like(centers, blk, dtype=blk.dtype)
    d2 = xp.sum(blk * blk, axis=1)[:, None] - 2 * (blk @ c.T) + xp.sum(c * c, axis=1)[None, :]
    return xp.sqrt(xp.clip(d2, min=0))


def distances_host(blk, centers):
    return to_numpy(distances_block(blk, centers))
