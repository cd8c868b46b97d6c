"""K-means' initial centers: k-means|| (Bahmani et al.), greedy k-means++ on a sample, random rows,
a callable or an array; sample weights weigh the draws."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

import dask
import numpy as np

from gdask.devices import is_sparse, sparse_vstack, to_numpy
from gdask.gdataset import (
    BlockIndex,
    Blocks,
    GDataSet,
    IterativeAlgorithm,
    LoopContext,
    Progress,
    device_call,
    run_loop,
    sum_parts,
)
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


@dataclass
class ParallelState:
    """k-means|| between rounds: the groups of candidates so far (the first row, then each round's
    draws), the generator the draws come from, the rounds done, and the fit's token (the key of the
    blocks' nearest-candidate state on the workers). Before the loop, ``first`` names the row the
    client drew as the first candidate (block, index in it): the loop takes it where its block is."""

    groups: list
    rng: np.random.Generator
    rounds: int = 0
    done: bool = False  # every row sits on a candidate: no more draws
    token: str = ""
    first: tuple[int, np.ndarray] | None = None  # (block, [row in it]) of the first candidate, before it is taken

    def copy(self) -> ParallelState:
        return replace(self, groups=list(self.groups), rng=copy.deepcopy(self.rng))

    def sizes(self) -> tuple[int, ...]:
        """The row counts of the groups, in order."""
        return tuple(int(g.shape[0]) for g in self.groups)

    def candidates(self) -> tuple[np.ndarray, tuple[int, ...]]:
        """All candidates in order, and the sizes of their groups."""
        return np.concatenate(self.groups, axis=0), self.sizes()


class ParallelInit(IterativeAlgorithm):
    """k-means|| (Bahmani et al. 2012) on the iteration engine: each round sums the blocks' cost (every
    row's squared distance to its nearest candidate) and draws each row with probability
    ``factor * w d(x)^2 / cost``. With a Client and data on the devices the rounds run in one task per
    worker (no round trip per round); each block keeps its nearest candidate between rounds
    (:func:`gdask.ml._kmeans._blocks.nearest_total`), so a round computes the distances to the last
    round's draws only. The first candidate is taken from its block in the loop too (a map over that
    block, not a graph of its own). The final pass weighs each candidate by the rows nearest to it."""

    name = "kmeans-init"

    def __init__(self, rounds: int, factor: float, weighted: bool) -> None:
        self.rounds = int(rounds)
        self.factor = float(factor)
        self.weighted = bool(weighted)

    def _wargs(self) -> tuple:
        return (Blocks("W"),) if self.weighted else ()

    def run(self, state: ParallelState, ctx: LoopContext) -> ParallelState:
        st = state.copy()
        st.token = ctx.token
        X = ctx.data["X"]
        if not st.groups:  # the first candidate, drawn by the client: taken where its block is
            block, local = st.first
            st.groups.append(np.concatenate(ctx.map(take_rows, X, local, blocks=[block], name="kmeans-first")))
        while st.rounds < self.rounds and not st.done:
            cands, sizes = st.candidates()
            phi = sum_parts(ctx.map(nearest_total, X, cands, sizes, st.token, *self._wargs(), name="kmeans-phi"))
            if phi <= 0:
                st.done = True
            else:
                seeds = tuple(int(v) for v in st.rng.integers(0, 2**63 - 1, size=ctx.nblocks))
                new = ctx.map(sample_nearest, X, cands, sizes, st.token, self.factor, phi, seeds, BlockIndex(),
                              *self._wargs(), name="kmeans-draws")
                new = np.concatenate(new, axis=0)
                if new.shape[0]:
                    st.groups.append(new)
                st.rounds += 1
            ctx.checkpoint(st.copy(), line=f"k-means|| round {st.rounds}: {sum(st.sizes())} candidates")
        return st

    def final(self, state: ParallelState) -> tuple:
        cands, sizes = state.candidates()
        return nearest_counts, (Blocks("X"), cands, sizes, state.token, *self._wargs()), {}


def _kmeans_parallel(est: Any, X: GDataSet, rng: np.random.Generator, p: np.ndarray | None,
                     W: GDataSet | None) -> np.ndarray:
    """k-means|| (:class:`ParallelInit`), then weighted k-means++ on the candidates; too few
    candidates (rows on few distinct points) are completed with random rows."""
    n, k = X.shape[0], est.n_clusters
    first = int(rng.choice(n, size=1, p=p)[0])
    block = int(np.searchsorted(np.asarray(X.block_offsets), first, side="right")) - 1
    state = ParallelState([], rng, first=(block, np.array([first - X.block_offsets[block]], dtype=np.int64)))
    algo = ParallelInit(est.init_max_iter, est.oversampling_factor * k, weighted=W is not None)
    res = run_loop(algo, {"X": X, "W": W}, state, progress=Progress(0))
    cands, _ = res.state.candidates()
    rng.bit_generator.state = res.state.rng.bit_generator.state  # the fit's generator goes on from the draws
    if cands.shape[0] <= k:  # too few candidates: they and random rows are the centers
        extra = rows(X, choice(rng, n, k - cands.shape[0] + 1, p))
        return np.concatenate([cands, extra])[:k].astype(X.dtype)
    weights = np.maximum(sum_parts(res.finals), 1e-12)
    return weighted_kmeanspp(cands.astype(np.float64), weights, k, rng).astype(X.dtype)
