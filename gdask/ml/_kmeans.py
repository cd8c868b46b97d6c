"""K-means over GDataSet blocks with a fused per-block Lloyd kernel."""

from __future__ import annotations

import logging
import math
import numbers
import time
from dataclasses import dataclass, field, replace
from typing import Any

import dask
import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin

from gdask.devices import array_namespace, asarray_like, astype, to_numpy
from gdask.gdataset import (
    GDataSet,
    IterativeAlgorithm,
    LoopContext,
    Progress,
    device_call,
    from_array,
    persisted_futures,
    run_loop,
    sum_parts,
)
from gdask.ml import kernels
from gdask.ml._base import (
    DeviceEstimatorMixin,
    Input,
    NotFinite,
    check_finite,
    host_array,
    in_task_scope,
    require_finite,
    shared_docs,
)

logger = logging.getLogger("gdask.ml")

__all__ = ["KMeans"]

#: a center's largest squared move falling below this fraction of the previous iteration's (its
#: move below half the previous one) counts as settling: that pass builds the bounds
_SETTLING = 0.25


def _weighted_kmeanspp(points: np.ndarray, weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Greedy weighted k-means++ (Arthur & Vassilvitskii) on a small host array."""
    n = points.shape[0]
    trials = 2 + int(np.log(k))
    p = weights / weights.sum()
    centers = np.empty((k, points.shape[1]), points.dtype)
    first = rng.choice(n, p=p)
    centers[0] = points[first]
    d2 = ((points - centers[0]) ** 2).sum(1)
    for c in range(1, k):
        pot = weights * d2
        tot = pot.sum()
        if tot <= 0:
            cand = rng.choice(n, size=trials)
        else:
            cand = np.searchsorted(np.cumsum(pot), rng.random(trials) * tot)
            cand = np.minimum(cand, n - 1)
        cd = ((points[None, :, :] - points[cand][:, None, :]) ** 2).sum(-1)
        cd = np.minimum(cd, d2[None, :])
        best = int(np.argmin((cd * weights[None, :]).sum(1)))
        centers[c] = points[cand[best]]
        d2 = cd[best]
    return centers


# -- block functions: device blocks, operands already on the blocks' device (the block task moved
# them there), results that go to the host moved explicitly (gdask.devices.to_numpy) --------------
def _take(x, idx):
    """Rows ``idx`` (host indices, or indices on the block's device) of a device block (or weights),
    on the block's device."""
    if isinstance(x, np.ndarray):
        return x[to_numpy(idx)]
    if isinstance(idx, np.ndarray):
        idx = asarray_like(idx.astype(np.int64, copy=False), x)
    return array_namespace(x).take(x, idx, axis=0)


def _sample_block(blk, centers, factor, phi, seed, w=None):
    """k-means|| oversampling: keep each row with probability ``factor * w d(x)^2 / phi``. The draws
    are made on the host (a seeded NumPy generator: the same rows on every backend)."""
    d2 = to_numpy(kernels.min_sqdist(blk, centers))
    if w is not None:
        d2 = d2 * to_numpy(w)
    rng = np.random.default_rng(seed)
    keep = np.nonzero(rng.random(d2.shape[0]) < factor * d2 / phi)[0]
    return to_numpy(_take(blk, keep))


def _count_nearest(blk, centers, w=None):
    labels = to_numpy(kernels.labels_block(blk, centers))
    return np.bincount(labels, weights=None if w is None else to_numpy(w),
                       minlength=centers.shape[0]).astype(np.float64)


def _choice(rng: np.random.Generator, n: int, size: int, p: np.ndarray | None) -> np.ndarray:
    """``size`` distinct row indices, drawn with probabilities ``p`` (rows with p=0 last resort)."""
    if p is not None and np.count_nonzero(p) < size:  # not enough weighted rows: fill uniformly
        first = np.nonzero(p)[0]
        rest = rng.choice(np.setdiff1d(np.arange(n), first), size=size - first.size, replace=False)
        return np.concatenate([first, rest])
    return rng.choice(n, size=size, replace=False, p=p)


def _concat_rows(parts):
    return np.concatenate(parts, axis=0)


def _take_rows(blk, idx):
    return to_numpy(_take(blk, idx))


def _sum_mind(blk, centers, w=None):
    return kernels.weighted_total(kernels.min_sqdist(blk, centers), w)


@shared_docs
class KMeans(DeviceEstimatorMixin, ClusterMixin, TransformerMixin, BaseEstimator):
    """K-means clustering (Lloyd) over device-resident blocks, scikit-learn API.

    Accepts NumPy / CuPy arrays, pandas DataFrames and GDataSets; works with a
    ``distributed.Client`` (blocks on the cluster's devices) or without one (local threads).
    Each Lloyd iteration runs one fused kernel per block (distances + argmin + partial sums) and
    a tree reduction of the small partials. With a Client and persisted data that fits on the
    devices, the whole loop runs as one task per worker, the workers exchanging their partials
    directly (no client round trip per iteration; same result as the loop from the client, which
    runs instead when the data streams, config ``gdask.ml.worker-loop`` is false, or a worker
    cannot take part).

    The loop runs on gdask's iteration engine (:func:`gdask.gdataset.run_loop`): per-block partial
    sums are combined in block order, so a seeded fit gives the same bits wherever its blocks are
    placed, moved or recomputed, and a loop on the workers that fails resumes from the client at its
    last finished iteration.

    Parameters
    ----------
    n_clusters : int, default 8
    init : {"k-means||", "k-means++", "random"}, callable or array of shape (n_clusters, n_features)
        "k-means||" (default) is the scalable oversampling init of Bahmani et al.; "k-means++"
        runs greedy k-means++ on a uniform sample of at most ``init_sample`` rows (all rows when
        the data is smaller); "random" picks ``n_clusters`` distinct rows. A callable is called as
        ``init(X, n_clusters, random_state)`` (``X`` as given) and returns the centers.
    n_init : "auto" or int, default "auto"
        Fits with different initial centers; the one with the lowest inertia is kept (as
        scikit-learn). "auto": 10 for ``init="random"`` or a callable, else 1.
    max_iter : int, default 300
    tol : float, default 1e-4
        Relative tolerance (scaled by the mean feature variance, as in scikit-learn) on the
        squared movement of the centers.
    random_state : int, Generator or None
    oversampling_factor : float, default 2.0
        k-means||: expected candidates per round, times ``n_clusters``.
    init_max_iter : int, default 5
        k-means|| rounds.
    init_sample : int, default 200_000
        k-means++: rows sampled for the init.
    verbose : bool or int, default False
        Print one line per iteration (time, inertia or rows reassigned, center shift), in the
        calling thread (the notebook cell running the fit), also when the loop runs on the workers.
    copy_x : bool, default True
        Accepted for scikit-learn compatibility: gdask never modifies X (blocks are immutable).
    callback : callable, optional
        ``callback(record)`` after every iteration: a dict with ``iteration``, ``seconds``,
        ``mode``, ``center_shift`` and ``inertia`` (Lloyd passes) or ``changed`` (rows reassigned,
        bounds passes).
    algorithm : {"auto", "elkan", "lloyd"}, default "auto"
        "lloyd" computes every row's distance to every center in each iteration. "elkan" gives the
        same assignments with far fewer distance computations: each row keeps bounds on its
        distances (Hamerly's variant of Elkan's method: one lower bound per row, so 24 bytes of
        state per row on the device instead of 8 per row and center), and only rows whose bounds
        no longer prove their cluster are looked at. "auto" is "elkan" from 8 features up (below,
        distances are too cheap for the bookkeeping to pay).
    {job_parameters}
    {output_type_parameter}

    Attributes
    ----------
    cluster_centers_ : array of shape (n_clusters, n_features)
        NumPy (CuPy for CuPy input; see ``output_type``).
    inertia_, n_iter_, n_features_in_
    labels_ : array
        NumPy (CuPy for CuPy input; see ``output_type``); a lazy collection blocked like X
        (GDataSet, or dask array) for GDataSet or dask input.
    iteration_times_ : list of float
        Seconds per iteration (without the set-up and the final labels pass).
    history_ : list of dict
        The per-iteration records (as given to ``callback``).
    fit_mode_ : str
        Where the loop ran: "workers", "client" or "stream".
    """

    def __init__(self, n_clusters: int = 8, *, init: Any = "k-means||", n_init: Any = "auto", max_iter: int = 300,
                 tol: float = 1e-4, verbose: bool | int = False, random_state: Any = None, copy_x: bool = True,
                 algorithm: str = "auto", oversampling_factor: float = 2.0, init_max_iter: int = 5,
                 init_sample: int = 200_000, callback: Any = None, gpu: float | None = None, memory: Any = None,
                 job_name: str | None = None, output_type: str | None = None) -> None:
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.copy_x = copy_x
        self.callback = callback
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.oversampling_factor = oversampling_factor
        self.init_max_iter = init_max_iter
        self.init_sample = init_sample
        self.verbose = verbose
        self.algorithm = algorithm
        self.gpu = gpu
        self.memory = memory
        self.job_name = job_name
        self.output_type = output_type

    # -- validation ----------------------------------------------------------------------------
    def _check_params(self, n_samples: int, n_features: int) -> None:
        if not isinstance(self.n_clusters, numbers.Integral) or self.n_clusters < 1:
            raise ValueError(f"n_clusters must be a positive integer, got {self.n_clusters!r}")
        if self.n_clusters > n_samples:
            raise ValueError(f"n_samples={n_samples} should be >= n_clusters={self.n_clusters}")
        if not isinstance(self.max_iter, numbers.Integral) or self.max_iter < 1:
            raise ValueError(f"max_iter must be a positive integer, got {self.max_iter!r}")
        if not isinstance(self.tol, numbers.Real) or self.tol < 0:
            raise ValueError(f"tol must be a non-negative number, got {self.tol!r}")
        if self.algorithm not in ("auto", "elkan", "lloyd"):
            raise ValueError(f"algorithm must be 'auto', 'elkan' or 'lloyd', got {self.algorithm!r}")
        if not (self.n_init == "auto" or (isinstance(self.n_init, numbers.Integral)
                                          and not isinstance(self.n_init, bool) and self.n_init >= 1)):
            raise ValueError(f"n_init must be 'auto' or a positive integer, got {self.n_init!r}")
        if not isinstance(self.copy_x, (bool, np.bool_)):
            raise ValueError(f"copy_x must be True or False, got {self.copy_x!r}")
        if self.callback is not None and not callable(self.callback):
            raise ValueError(f"callback must be callable or None, got {type(self.callback).__name__}")
        if isinstance(self.init, str):
            if self.init not in ("k-means||", "k-means++", "random"):
                raise ValueError(f"init must be 'k-means||', 'k-means++', 'random', a callable or an array, "
                                 f"got {self.init!r}")
        elif not callable(self.init):
            self._check_init_array(self.init, n_features)

    def _check_init_array(self, init: Any, n_features: int) -> None:
        shape = np.shape(init)
        if shape != (self.n_clusters, n_features):
            raise ValueError(
                f"init array must have shape (n_clusters, n_features) = ({self.n_clusters}, {n_features}), got {shape}"
            )
        if not np.isfinite(np.asarray(to_numpy(init), dtype=np.float64)).all():
            raise ValueError("init array contains NaN or infinity")

    def _prepare(self, X: Any, reset: bool) -> tuple[GDataSet, Input]:
        """(GDataSet, the adapted input); host input goes through scikit-learn's ``validate_data``
        (same errors, ``n_features_in_``, ``feature_names_in_``)."""
        inp = self._input(X, reset=reset)
        return inp.gdataset(), inp

    @staticmethod
    def _weights(sample_weight: Any, G: GDataSet) -> np.ndarray | None:
        """``sample_weight`` validated, as a host float64 array (None: all ones)."""
        if sample_weight is None:
            return None
        if isinstance(sample_weight, GDataSet):
            if sample_weight.ndim != 1 or sample_weight.row_blocks != G.row_blocks:
                raise ValueError("sample_weight as a GDataSet must be 1-D and blocked like X")
            w = to_numpy(sample_weight.compute())
        else:
            from sklearn.utils.validation import _check_sample_weight

            w = _check_sample_weight(host_array(sample_weight), np.empty((G.shape[0], 0)), dtype=np.float64,
                                     ensure_non_negative=True)
        if not np.isfinite(w).all():
            raise ValueError("sample_weight contains NaN or infinity")
        if (w < 0).any():
            raise ValueError("sample_weight must be non-negative")
        if not (w > 0).any():
            raise ValueError("Sample weights must contain at least one non-zero number; all are zero.")
        return w.astype(np.float64, copy=False)

    # -- init ----------------------------------------------------------------------------------
    def _rows(self, X: GDataSet, idx: np.ndarray) -> np.ndarray:
        idx = np.sort(np.asarray(idx))
        offs = np.asarray(X.block_offsets + (X.shape[0],))
        parts = []
        for b in range(X.nblocks):
            sel = idx[(idx >= offs[b]) & (idx < offs[b + 1])] - offs[b]
            if sel.size:
                parts.append(dask.delayed(device_call)(_take_rows, X.block(b), sel))
        return np.concatenate(dask.compute(*parts), axis=0)

    def _init_centers(self, X: GDataSet, rng: np.random.Generator, w: np.ndarray | None = None,
                      W: GDataSet | None = None, original: Any = None) -> np.ndarray:
        """Initial centers; sample weights (``w`` on the host, ``W`` blocked like ``X``) weigh the
        draws (rows with weight 0 are drawn only when there are too few others)."""
        n, k = X.shape[0], self.n_clusters
        if callable(self.init):
            centers = to_numpy(self.init(X if original is None else original, k, self.random_state))
            self._check_init_array(centers, X.shape[1])
            return np.asarray(centers, dtype=X.dtype).copy()
        if not isinstance(self.init, str):
            return np.asarray(to_numpy(self.init), dtype=X.dtype).copy()
        p = None if w is None else w / w.sum()
        if self.init == "random":
            return self._rows(X, _choice(rng, n, k, p))[rng.permutation(k)]
        if self.init == "k-means++":
            m = min(n, max(self.init_sample, k))
            pts = self._rows(X, _choice(rng, n, m, p))
            return _weighted_kmeanspp(pts.astype(np.float64), np.ones(len(pts)), k, rng).astype(X.dtype)
        # k-means|| (Bahmani et al. 2012)
        cands = self._rows(X, rng.choice(n, size=1, p=p))
        factor = self.oversampling_factor * k
        wargs = () if W is None else (W,)
        for r in range(self.init_max_iter):
            phi = X.reduce_blocks(_sum_mind, sum_parts, cands, *wargs, name="kmeans-phi").compute()
            if phi <= 0:
                break
            seeds = rng.integers(0, 2**63 - 1, size=X.nblocks)
            new = dask.compute(*[dask.delayed(device_call)(_sample_block, X.block(b), cands, factor, phi,
                                                           int(seeds[b]), None if W is None else W.block(b))
                                 for b in range(X.nblocks)])
            cands = np.concatenate([cands, *new], axis=0)
        if cands.shape[0] <= k:
            extra = self._rows(X, _choice(rng, n, k - cands.shape[0] + 1, p))
            cands = np.concatenate([cands, extra])[: max(k, cands.shape[0])]
            if cands.shape[0] == k:
                return cands.astype(X.dtype)
        weights = X.reduce_blocks(_count_nearest, sum_parts, cands, *wargs, name="kmeans-weights").compute()
        weights = np.maximum(weights, 1e-12)
        return _weighted_kmeanspp(cands.astype(np.float64), weights, k, rng).astype(X.dtype)

    # -- fit -----------------------------------------------------------------------------------
    @in_task_scope
    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> KMeans:
        """Compute the clustering.

        Parameters
        ----------
        X : array-like, DataFrame, CuPy array, dask array or GDataSet of shape (n_samples, n_features)
        y : ignored
        sample_weight : array-like or GDataSet of shape (n_samples,), optional

        Raises
        ------
        ValueError
            NaN/inf in X, wrong ndim, empty X, n_clusters > n_samples, bad parameters.
        TypeError
            Non-numeric data.
        """
        with self._job():  # blocks made inside a job get the job's private keys
            return self._fit(X, sample_weight)

    def _n_init(self) -> int:
        n_init = self.n_init
        if n_init == "auto":
            return 10 if (isinstance(self.init, str) and self.init == "random") or callable(self.init) else 1
        if not isinstance(self.init, str) and not callable(self.init) and n_init != 1:
            import warnings

            warnings.warn(f"Explicit initial center position passed: performing only one init in KMeans instead "
                          f"of n_init={n_init}.", RuntimeWarning, stacklevel=3)
            return 1
        return int(n_init)

    def _fit(self, X: Any, sample_weight: Any) -> KMeans:
        G, inp = self._prepare(X, reset=True)
        n, d = G.shape
        self._check_params(n, d)
        n_init = self._n_init()
        w = self._weights(sample_weight, G)
        if persisted_futures(G) is None:  # persisting again would cost a round trip
            G = G.persist()
        W = None if w is None else from_array(w, block_rows=G.row_blocks).persist()
        rng = np.random.default_rng(self.random_state if not isinstance(self.random_state, np.random.RandomState)
                                    else self.random_state.randint(2**31))
        if self.tol > 0:  # tol is relative to the mean variance (as scikit-learn); 0 needs no pass
            variances = to_numpy(G.var(axis=0).compute())
            if not inp.kind.host and not np.isfinite(variances).all():  # NaN/inf make it non-finite
                check_finite(G)
            tol = float(np.mean(variances)) * self.tol
        else:
            tol = 0.0
            if not inp.kind.host and isinstance(self.init, str):  # the init reads the data: check first
                check_finite(G)
        lazy = inp.kind.lazy
        best = None
        for _ in range(n_init):
            centers = self._init_centers(G, rng, w, W, original=X)
            bounds = self.algorithm == "elkan" or (self.algorithm == "auto" and d >= 8)
            state = LoopState(centers, bounds, tol, np.dtype(G.dtype), n)
            algo = _KMeansLoop(self.max_iter, weighted=W is not None, labels=not lazy)
            progress = Progress(self.verbose, self.callback, total=self.max_iter, desc="KMeans")
            try:
                res = run_loop(algo, {"X": G, "W": W}, state, progress=progress)
            except NotFinite:
                self._raise_not_finite(G)
            labels, inertia = _collect_finals(res.finals, G, labels=not lazy)
            if best is None or inertia < best[1]:
                best = (res, inertia, labels)
        res, self.inertia_, labels = best
        loop = res.state
        self.n_iter_ = loop.n_iter
        self.iteration_times_ = loop.times
        self.fit_mode_ = res.mode
        self.history_ = res.history
        self.cluster_centers_ = self._to_output(loop.centers, inp.kind, G)
        self.labels_ = self._lazy_labels(inp, G) if lazy else self._to_output(labels, inp.kind, G)
        return self

    @staticmethod
    def _raise_not_finite(G: GDataSet) -> None:
        check_finite(G)
        raise ValueError("K-means sums overflowed float64; scale the data down")

    def _assign(self, G: GDataSet, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Labels and exact squared distances of all rows, one task per group of blocks."""
        groups = G.block_groups() or [[b] for b in range(G.nblocks)]
        found = dask.compute(*G.reduce_groups(_assign_host, _join_lists, centers, groups=groups, name="assign"))
        parts: list = [None] * G.nblocks
        for g, res in zip(groups, found):
            for b, r in zip(g, res):
                parts[b] = r
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    # -- predict / transform ---------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "cluster_centers_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError("This KMeans instance is not fitted yet. Call 'fit' first.")

    def _centers_for(self, G: GDataSet) -> np.ndarray:
        return to_numpy(self.cluster_centers_).astype(G.dtype)

    def _lazy_labels(self, inp: Input, G: GDataSet) -> Any:
        """Labels as a lazy collection blocked like the input (a GDataSet, or a dask array for dask input)."""
        return self._blockwise(inp, _labels_block, self._centers_for(G), dtype=np.int32, ncols=None,
                               name="kmeans-labels")

    @in_task_scope
    def predict(self, X: Any, sample_weight: Any = None) -> Any:
        """Index of the nearest cluster center for each row: NumPy (CuPy for CuPy input); for a
        GDataSet or dask input a lazy collection blocked like X."""
        self._check_fitted()
        G, inp = self._prepare(X, reset=False)
        if inp.kind.lazy:
            return self._lazy_labels(inp, G)
        labels, _ = self._assign(G, self._centers_for(G))
        return self._to_output(labels, inp.kind, G)

    def fit_predict(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        return self.fit(X, sample_weight=sample_weight).labels_

    @in_task_scope
    def transform(self, X: Any) -> Any:
        """Distances from each row to every center, shape (n_samples, n_clusters); lazy (blocked like
        X) for a GDataSet or dask input."""
        self._check_fitted()
        G, inp = self._prepare(X, reset=False)
        c = self._centers_for(G)
        if inp.kind.lazy:
            return self._blockwise(inp, _distances_block, c, dtype=G.dtype, ncols=c.shape[0], name="kmeans-transform")
        parts = dask.compute(*[dask.delayed(device_call)(_distances_host, G.block(b), c) for b in range(G.nblocks)])
        return self._to_output(np.concatenate(parts, axis=0), inp.kind, G)

    def fit_transform(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        return self.fit(X, sample_weight=sample_weight).transform(X)

    @in_task_scope
    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Opposite of the inertia of X against the fitted centers (higher is better)."""
        self._check_fitted()
        G, _ = self._prepare(X, reset=False)
        _, mind = self._assign(G, self._centers_for(G))
        return -kernels.weighted_total(mind, self._weights(sample_weight, G))


@dataclass
class LoopState:
    """A fit's state between passes and the decisions taken on it: the next centers, whether the
    next pass steps on the bounds, convergence. Wherever the engine runs the driver, it takes the
    same steps from the same state (plain data: a copy of it is the fit's checkpoint)."""

    centers: np.ndarray
    bounds: bool  # the fit may step on Hamerly's bounds (algorithm "elkan", or "auto" from 8 features)
    tol: float  # absolute tolerance on the centers' squared movement
    dtype: np.dtype
    n: int  # rows
    settled: bool = False  # centers move less than the bounds can absorb: bounds pay from here on
    last_move: float = 0.0  # the largest squared move of a center in the previous iteration (none yet)
    cargs: tuple = ()  # the chunk arguments of the last pass: (token,) when it stepped on bounds
    history: list[np.ndarray] = field(default_factory=list)  # centers of every bounds pass (to rebuild lost bounds)
    n_iter: int = 0
    times: list[float] = field(default_factory=list)

    def copy(self) -> LoopState:
        """A copy that the loop's next steps leave alone (a checkpoint, a resumed loop's start)."""
        return replace(self, history=list(self.history), times=list(self.times))

    def chunk(self, token: str) -> tuple[Any, tuple]:
        """The per-block function of the next pass and its extra arguments (before the weights)."""
        if self.bounds and self.settled:
            self.cargs = (token,)
            return kernels.bounds_partial, self.cargs
        self.cargs = ()  # while centers still jump, nearly every row fails its bounds: plain Lloyd is cheaper
        return kernels.lloyd_partial, self.cargs

    def advance(self, stats: dict, farthest: Any, t0: float) -> tuple[bool, dict]:
        """Take the step from one pass's combined statistics: (converged, the iteration's record).
        ``farthest(centers, stats)`` is the extra pass for more empty clusters than the pass
        reported rows for."""
        new = _next_centers(stats, self.centers, self.dtype)
        if new is None:
            new = _next_centers(stats, self.centers, self.dtype, farthest(self.centers, stats))
        if self.cargs:
            self.history.append(np.asarray(self.centers, dtype=np.float64))
        moves = ((new.astype(np.float64) - self.centers) ** 2).sum(1)
        shift = float(moves.sum())
        # a center's largest move falling below half the previous one bets on settling: that pass
        # builds the bounds (a little dearer than Lloyd's), so the next one can step on them
        self.settled = self.bounds and (_settled(new, moves) or float(moves.max()) < _SETTLING * self.last_move)
        self.last_move = float(moves.max())
        self.centers = new
        self.n_iter += 1
        self.times.append(time.perf_counter() - t0)
        record: dict[str, Any] = {"center_shift": shift}
        if not self.cargs:
            record["inertia"] = float(stats["inertia"])
            what = f"inertia {stats['inertia']:.6g}"
        else:  # a first bounds pass counts every row
            record["changed"] = int(stats["changed"])
            what = "bounds built" if stats["changed"] >= self.n else f"{stats['changed']} rows reassigned"
        record["line"] = (f"iteration {self.n_iter}: {self.times[-1] * 1e3:.1f} ms, {what}, "
                          f"center shift {shift:.3g}")
        return shift <= self.tol, record


class _KMeansLoop(IterativeAlgorithm):
    """K-means on the iteration engine: one pass (Lloyd's, or a step on the bounds) per iteration."""

    name = "kmeans"

    def __init__(self, max_iter: int, weighted: bool, labels: bool) -> None:
        self.max_iter = int(max_iter)
        self.weighted = bool(weighted)
        self.labels = bool(labels)

    def _wargs(self, ctx: LoopContext) -> tuple:
        return (ctx.data["W"],) if self.weighted else ()

    def run(self, state: LoopState, ctx: LoopContext) -> LoopState:
        loop = state.copy()
        if ctx.mode == "stream":  # bounds live next to device blocks: not for blocks that come and go
            loop.bounds = False
        X, wargs = ctx.data["X"], self._wargs(ctx)

        def farthest(centers: np.ndarray, stats: dict) -> tuple:
            m = int((stats["counts"] == 0).sum())
            rows = ctx.map(_farthest_rows, X, centers, m, *wargs, name="kmeans-farthest")
            return tuple(np.concatenate([r[i] for r in rows], axis=0) for i in range(4))

        while ctx.iteration < self.max_iter:
            t0 = time.perf_counter()
            chunk, cargs = loop.chunk(ctx.token)
            kw = {}
            if cargs and (ctx.mode == "workers" or not loop.history):  # the history is at hand: no replay round
                kw["history"] = loop.history
            parts = ctx.map(chunk, X, loop.centers, *cargs, *wargs, name="lloyd-partial", **kw)
            missing = [b for b, p in enumerate(parts) if p.get("missing")]
            if missing:  # blocks whose bounds were lost (moved, recomputed): rebuilt from the fit's history
                redo = ctx.map(chunk, X, loop.centers, *cargs, *wargs, blocks=missing, name="lloyd-partial",
                               history=loop.history)
                for b, p in zip(missing, redo):
                    parts[b] = p
            stats = kernels.lloyd_combine(parts)  # in block order, wherever the blocks are
            if not np.isfinite(stats["sums"]).all():  # every row is in some sum: NaN/inf in X show up here
                raise NotFinite("non-finite K-means sums")
            done, record = loop.advance(stats, farthest, t0)
            ctx.checkpoint(loop.copy(), **record)
            if done:
                break
        return loop

    def final(self, state: LoopState) -> tuple:
        loop = state
        from gdask.gdataset import Blocks

        X = Blocks("X")
        wargs = (Blocks("W"),) if self.weighted else ()
        if loop.cargs:  # the labels from the bounds when the last iteration stepped on them
            return _bounds_labels_host, (X, loop.centers, *loop.cargs, *wargs), {"history": loop.history,
                                                                                 "labels": self.labels}
        return _labels_host, (X, loop.centers, *wargs), {"labels": self.labels}


def _settled(centers: np.ndarray, moves: np.ndarray) -> bool:
    """Whether the last move of the centers (squared, per center) is small against their spacing:
    then most rows keep bounds that prove their cluster, and the bounds pass beats Lloyd's."""
    if len(centers) < 2:
        return True
    c = centers.astype(np.float64)
    d2 = ((c[:, None, :] - c[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    return float(np.sqrt(moves.max())) < 0.25 * float(np.sqrt(d2.min()))


def _farthest_rows(blk, centers, m, w=None):
    labels, mind = (to_numpy(a) for a in kernels.assign(blk, centers))
    m = min(m, mind.shape[0])
    idx = np.argpartition(-mind, m - 1)[:m] if m < mind.shape[0] else np.arange(mind.shape[0])
    ws = np.ones(idx.size) if w is None else to_numpy(_take(w, idx)).astype(np.float64)
    return mind[idx], labels[idx], to_numpy(_take(blk, idx)), ws


def _next_centers(stats: dict, centers: np.ndarray, dtype: Any, far: tuple | None = None) -> np.ndarray | None:
    """The new centers from one iteration's combined statistics: the mean of each cluster's rows.
    Empty clusters take the rows farthest from their centers, which leave their old clusters
    (scikit-learn's rule): those the pass reported, or ``far`` = (squared distances, labels, rows,
    weights) from a separate pass. ``None`` when more clusters are empty than there are such rows,
    or the sums are not finite."""
    sums, counts = stats["sums"], stats["counts"]
    if not np.isfinite(sums).all():
        return None
    empty = np.nonzero(counts == 0)[0]
    if empty.size:
        dists, labels, rows, ws = far if far is not None else (stats[k] for k in kernels.FAR)
        if empty.size > len(dists):
            return None
        sums, counts = sums.copy(), counts.copy()
        rows = rows.astype(np.float64)
        order = np.argsort(-dists, kind="stable")[:empty.size]
        for new_c, j in zip(empty, order):
            old_c = labels[j]
            sums[old_c] -= ws[j] * rows[j]
            counts[old_c] -= ws[j]
            sums[new_c] = ws[j] * rows[j]
            counts[new_c] = ws[j]
    new = centers.astype(np.float64).copy()
    nz = counts > 0
    new[nz] = sums[nz] / counts[nz, None]
    return new.astype(dtype)


def _collect_finals(finals: list, G: GDataSet, labels: bool) -> tuple[np.ndarray | None, float]:
    """All rows' labels (or None when they stay lazy) and the inertia from per-block (labels, inertia)."""
    inertia = math.fsum(p[1] for p in finals)
    if not labels:
        return None, inertia
    return np.concatenate([p[0] for p in finals]).astype(np.int32, copy=False), inertia


def _narrow(labels: np.ndarray, k: int) -> np.ndarray:
    """Labels in the narrowest unsigned type for ``k`` clusters (less to send back)."""
    return labels.astype(np.min_scalar_type(max(k - 1, 0)), copy=False)


def _labels_host(blk, centers, w=None, labels=True):
    lab, mind = kernels.assign(blk, centers)
    return (_narrow(to_numpy(lab), centers.shape[0]) if labels else None), kernels.weighted_total(mind, w)


def _bounds_labels_host(blk, centers, token, w=None, history=None, labels=True):
    lab, inertia = kernels.bounds_labels(blk, centers, token, w, history=history)
    return (_narrow(to_numpy(lab), centers.shape[0]) if labels else None), inertia


def _labels_block(blk, centers):
    require_finite(blk)
    return kernels.assign(blk, centers)[0]


def _assign_host(blk, centers):
    require_finite(blk)
    labels, mind = kernels.assign(blk, centers)
    return [(to_numpy(labels), to_numpy(mind))]


def _join_lists(parts):
    return [p for part in parts for p in part]


def _distances_block(blk, centers):
    require_finite(blk)
    xp = np if isinstance(blk, np.ndarray) else array_namespace(blk)
    c = astype(centers, blk.dtype) if hasattr(centers, "shape") else asarray_like(centers, blk, dtype=blk.dtype)
    d2 = xp.sum(blk * blk, axis=1)[:, None] - 2 * (blk @ c.T) + xp.sum(c * c, axis=1)[None, :]
    return xp.sqrt(xp.clip(d2, min=0))


def _distances_host(blk, centers):
    return to_numpy(_distances_block(blk, centers))
