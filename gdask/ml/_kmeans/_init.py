"""K-means' initial centers: k-means|| (Bahmani et al.), greedy k-means++ on a sample, random rows,
a callable or an array; sample weights weigh the draws."""

from __future__ import annotations

import uuid
from typing import Any

import dask
import numpy as np

from gdask.devices import is_sparse, sparse_vstack, to_numpy
from gdask.gdataset import GDataSet, default_client_or_none, device_call, drop_state, sum_parts
from gdask.ml._kmeans._blocks import nearest_counts, nearest_total, sample_nearest, take_rows, take_sparse_rows

__all__ = ["choice", "initial_centers", "rows", "sparse_kmeanspp", "weighted_kmeanspp"]


def weighted_kmeanspp(points: np.ndarray, weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Greedy weighted k-means++ (Arthur & Vassilvitskii) on a small host array (a SciPy CSR matrix:
    :func:`sparse_kmeanspp`)."""
    if is_sparse(points):
        return sparse_kmeanspp(points, weights, k, rng)

    def sqdist(idx: np.ndarray) -> np.ndarray:  # (len(idx), n)
        return ((points[None, :, :] - points[idx][:, None, :]) ** 2).sum(-1)

    return points[_kmeanspp_draws(points.shape[0], sqdist, weights, k, rng)]


def sparse_kmeanspp(points: Any, weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """:func:`weighted_kmeanspp` on the rows of a host SciPy CSR matrix, kept sparse (squared distances
    ``|p|^2 - 2 p.q + |q|^2`` from sparse products, O(nnz) memory besides ``trials x rows``): the same
    draws from the same generator; the dense ``(k, n_features)`` centers."""
    points = points.astype(np.float64)
    norms = np.asarray(points.multiply(points).sum(axis=1)).ravel()

    def sqdist(idx: np.ndarray) -> np.ndarray:  # (len(idx), n)
        cross = (points[idx] @ points.T).toarray()
        return np.maximum(norms[idx][:, None] - 2 * cross + norms[None, :], 0.0)

    return points[_kmeanspp_draws(points.shape[0], sqdist, weights, k, rng)].toarray()


def _kmeanspp_draws(n: int, sqdist: Any, weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """The rows greedy k-means++ picks among ``n`` weighted rows; ``sqdist(idx)`` gives the squared
    distances of rows ``idx`` to every row, ``(len(idx), n)``. Each new center is the best of
    ``2 + log k`` candidates drawn in proportion to weight x squared distance to the nearest center."""
    trials = 2 + int(np.log(k))
    first = rng.choice(n, p=weights / weights.sum())
    chosen = [int(first)]
    d2 = sqdist(np.array([first]))[0]
    for _ in range(1, k):
        pot = weights * d2
        tot = pot.sum()
        if tot <= 0:
            cand = rng.choice(n, size=trials)
        else:
            cand = np.minimum(np.searchsorted(np.cumsum(pot), rng.random(trials) * tot), n - 1)
        cd = np.minimum(sqdist(cand), d2[None, :])
        best = int(np.argmin((cd * weights[None, :]).sum(1)))
        chosen.append(int(cand[best]))
        d2 = cd[best]
    return np.asarray(chosen)


def choice(rng: np.random.Generator, n: int, size: int, p: np.ndarray | None) -> np.ndarray:
    """``size`` distinct row indices, drawn with probabilities ``p`` (rows with p=0 last resort)."""
    if p is not None and np.count_nonzero(p) < size:  # not enough weighted rows: fill uniformly
        first = np.nonzero(p)[0]
        rest = rng.choice(np.setdiff1d(np.arange(n), first), size=size - first.size, replace=False)
        return np.concatenate([first, rest])
    return rng.choice(n, size=size, replace=False, p=p)


def rows(X: GDataSet, idx: np.ndarray, sparse: bool = False) -> Any:
    """Rows ``idx`` of ``X`` on the host, in ascending order (one task per block holding some); with
    ``sparse`` (CSR blocks only) a SciPy CSR matrix, else a dense array."""
    idx = np.sort(np.asarray(idx))
    offs = np.asarray(X.block_offsets + (X.shape[0],))
    parts = []
    for b in range(X.nblocks):
        sel = idx[(idx >= offs[b]) & (idx < offs[b + 1])] - offs[b]
        if sel.size:
            parts.append(dask.delayed(device_call)(take_sparse_rows if sparse else take_rows, X.block(b), sel))
    found = dask.compute(*parts)
    return sparse_vstack(list(found)) if sparse else np.concatenate(found, axis=0)


def initial_centers(est: Any, X: GDataSet, rng: np.random.Generator, w: np.ndarray | None = None,
                    W: GDataSet | None = None, original: Any = None) -> np.ndarray:
    """Initial centers of the K-means estimator ``est`` (its ``init``, ``n_clusters``, ``random_state``,
    ``oversampling_factor``, ``init_max_iter``, ``init_sample``); sample weights (``w`` on the host,
    ``W`` blocked like ``X``) weigh the draws (rows with weight 0 are drawn only when there are too few
    others). ``original``: X as the caller gave it (what a callable ``init`` is called with)."""
    n, k = X.shape[0], est.n_clusters
    if callable(est.init):
        # scikit-learn calls it with a RandomState (check_random_state's); one drawn from the fit's rng
        rs = est.random_state if isinstance(est.random_state, np.random.RandomState) else \
            np.random.RandomState(int(rng.integers(2**31)))
        centers = to_numpy(est.init(X if original is None else original, k, rs))
        est._check_init_array(centers, X.shape[1])
        return np.asarray(centers, dtype=X.dtype).copy()
    if not isinstance(est.init, str):
        return np.asarray(to_numpy(est.init), dtype=X.dtype).copy()
    p = None if w is None else w / w.sum()
    if est.init == "random":
        return rows(X, choice(rng, n, k, p))[rng.permutation(k)]
    if est.init == "k-means++":
        m = min(n, max(est.init_sample, k))
        pts = rows(X, choice(rng, n, m, p), sparse=X.nnz is not None)  # a sample of CSR blocks stays sparse
        return weighted_kmeanspp(pts.astype(np.float64), np.ones(pts.shape[0]), k, rng).astype(X.dtype)
    return _kmeans_parallel(est, X, rng, p, W)


def _kmeans_parallel(est: Any, X: GDataSet, rng: np.random.Generator, p: np.ndarray | None,
                     W: GDataSet | None) -> np.ndarray:
    """k-means|| (Bahmani et al. 2012): rounds of oversampling by the squared distance to the
    candidates so far, then weighted k-means++ on the candidates. Each block keeps its rows' nearest
    candidate between rounds (in its worker's state space, dropped at the end), so a round computes
    distances to the candidates the last round drew only: ~``oversampling_factor * n_clusters`` per
    row and round."""
    n, k = X.shape[0], est.n_clusters
    groups = [rows(X, rng.choice(n, size=1, p=p))]
    factor = est.oversampling_factor * k
    wargs = () if W is None else (W,)
    token = f"kmeans-init-{uuid.uuid4().hex}"
    try:
        for _ in range(est.init_max_iter):
            cands, sizes = np.concatenate(groups), tuple(g.shape[0] for g in groups)
            phi = X.reduce_blocks(nearest_total, sum_parts, cands, sizes, token, *wargs, name="kmeans-phi").compute()
            if phi <= 0:
                break
            seeds = rng.integers(0, 2**63 - 1, size=X.nblocks)
            new = dask.compute(*[dask.delayed(device_call)(sample_nearest, X.block(b), cands, sizes, token, factor, phi,
                                                           int(seeds[b]), None if W is None else W.block(b))
                                 for b in range(X.nblocks)])
            new = np.concatenate(new, axis=0)
            if new.shape[0]:
                groups.append(new)
        cands, sizes = np.concatenate(groups), tuple(g.shape[0] for g in groups)
        if cands.shape[0] <= k:  # too few candidates: they and random rows are the centers
            extra = rows(X, choice(rng, n, k - cands.shape[0] + 1, p))
            return np.concatenate([cands, extra])[:k].astype(X.dtype)
        weights = X.reduce_blocks(nearest_counts, sum_parts, cands, sizes, token, *wargs,
                                  name="kmeans-weights").compute()
    finally:
        drop_state(default_client_or_none(), token)
    weights = np.maximum(weights, 1e-12)
    return weighted_kmeanspp(cands.astype(np.float64), weights, k, rng).astype(X.dtype)
