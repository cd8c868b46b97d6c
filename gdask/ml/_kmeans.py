"""K-means over GDataSet blocks with a fused per-block Lloyd kernel."""

from __future__ import annotations

import logging
import math
import numbers
import time
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
    from_dataframe,
    persisted_futures,
    run_loop,
    sum_parts,
)
from gdask.gdataset import from_dask_array as gdask_from_dask_array
from gdask.ml import kernels
from gdask.ml._input import all_finite, estimator_job, in_task_scope
from gdask.ml._input import check_finite as _check_finite
from gdask.ml._input import is_host_input as _is_host_input

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


class KMeans(ClusterMixin, TransformerMixin, BaseEstimator):
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
    gpu : float, optional
        Fit inside ``gdask.job(client, gpu=gpu, memory=memory, name=job_name)``: a share of a
        device of the current Client's cluster (see :func:`gdask.job`). Default None: no share
        is asked for (and none without a Client).
    memory : int or str, optional
        Device memory of that share (``"4GiB"``); default ``gpu`` times the device's memory.
    job_name : str, optional
        The job's name in :func:`gdask.scheduling.jobs` (default: the class name and a random suffix).

    Attributes
    ----------
    cluster_centers_, inertia_, n_iter_, n_features_in_
    labels_ : array
        NumPy (CuPy for CuPy input); a lazy collection blocked like X (GDataSet, or dask array)
        for GDataSet or dask input.
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
                 job_name: str | None = None) -> None:
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

    def _prepare(self, X: Any, reset: bool) -> tuple[GDataSet, str]:
        """(GDataSet, kind of input: 'numpy' | 'cupy' | 'gdataset' | 'dask'). Host input goes through
        scikit-learn's ``validate_data`` (same errors, ``n_features_in_``, ``feature_names_in_``)."""
        if _is_host_input(X):
            from sklearn.utils.validation import validate_data

            X = validate_data(self, X, accept_sparse=False, dtype=[np.float64, np.float32], reset=reset)
            return from_array(X), "numpy"
        if isinstance(X, GDataSet):
            G, kind = X, "gdataset"
        elif type(X).__module__.split(".")[0] == "cupy":
            G, kind = from_array(X), "cupy"
        else:  # dask / cuDF DataFrames and dask arrays
            G = from_dataframe(X) if hasattr(X, "columns") else gdask_from_dask_array(X)
            kind = "dask" if hasattr(X, "__dask_graph__") else "gdataset"
        if G.ndim != 2:
            raise ValueError(f"KMeans needs 2-D data (n_samples, n_features), got shape {G.shape}")
        if G.dtype.kind != "f":
            G = G.astype(np.float64)
        elif G.dtype.itemsize < 4:  # float16: the kernels compute in float32 or float64
            G = G.astype(np.float32)
        if reset:
            self.n_features_in_ = G.shape[1]
            if G.columns is not None and kind == "numpy":
                self.feature_names_in_ = np.asarray(G.columns, dtype=object)
        elif G.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {G.shape[1]} features, but KMeans is expecting {self.n_features_in_} features")
        return G, kind

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

            w = to_numpy(sample_weight) if hasattr(sample_weight, "__cuda_array_interface__") else sample_weight
            w = _check_sample_weight(w, np.empty((G.shape[0], 0)), dtype=np.float64, ensure_non_negative=True)
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
        with estimator_job(self):  # blocks made inside a job get the job's private keys
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
        G, kind = self._prepare(X, reset=True)
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
            if kind != "numpy" and not np.isfinite(variances).all():  # NaN/inf make it non-finite
                _check_finite(G)
            tol = float(np.mean(variances)) * self.tol
        else:
            tol = 0.0
            if kind != "numpy" and isinstance(self.init, str):  # the init reads the data: check first
                _check_finite(G)
        lazy = kind == "gdataset" or kind == "dask"
        best = None
        for _ in range(n_init):
            centers = self._init_centers(G, rng, w, W, original=X)
            bounds = self.algorithm == "elkan" or (self.algorithm == "auto" and d >= 8)
            state = _Loop(centers, bounds, tol, G.dtype, n).state()
            algo = _KMeansLoop(self.max_iter, weighted=W is not None, labels=not lazy)
            progress = Progress(self.verbose, self.callback, total=self.max_iter, desc="KMeans")
            try:
                res = run_loop(algo, {"X": G, "W": W}, state, progress=progress)
            except _NotFinite:
                self._raise_not_finite(G)
            labels, inertia = _collect_finals(res.finals, G, labels=not lazy)
            if best is None or inertia < best[1]:
                best = (res, inertia, labels)
        res, self.inertia_, labels = best
        loop = _Loop.from_state(res.state)
        self.n_iter_ = loop.n_iter
        self.iteration_times_ = loop.times
        self.fit_mode_ = res.mode
        self.history_ = res.history
        self.cluster_centers_ = loop.centers if kind != "cupy" else _xp_from_host(loop.centers)
        if lazy:
            self.labels_ = self._lazy_labels(X, G)
        else:
            self.labels_ = labels if kind != "cupy" else _xp_from_host(labels)
        return self

    @staticmethod
    def _raise_not_finite(G: GDataSet) -> None:
        _check_finite(G)
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

    def _lazy_labels(self, X: Any, G: GDataSet) -> Any:
        """Labels as a lazy collection blocked like ``X`` (a GDataSet, or a dask array for dask input)."""
        out = G.map_blocks(_labels_block, self._centers_for(G), dtype=np.int32, ncols=None, name="kmeans-labels")
        return out if isinstance(X, GDataSet) else out.to_dask_array()

    @in_task_scope
    def predict(self, X: Any, sample_weight: Any = None) -> Any:
        """Index of the nearest cluster center for each row: NumPy (CuPy for CuPy input); for a
        GDataSet or dask input a lazy collection blocked like X."""
        self._check_fitted()
        G, kind = self._prepare(X, reset=False)
        if kind in ("gdataset", "dask"):
            return self._lazy_labels(X, G)
        labels, _ = self._assign(G, self._centers_for(G))
        return _xp_from_host(labels) if kind == "cupy" else labels

    def fit_predict(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        return self.fit(X, sample_weight=sample_weight).labels_

    @in_task_scope
    def transform(self, X: Any) -> Any:
        """Distances from each row to every center, shape (n_samples, n_clusters); lazy (blocked like
        X) for a GDataSet or dask input."""
        self._check_fitted()
        G, kind = self._prepare(X, reset=False)
        c = self._centers_for(G)
        if kind in ("gdataset", "dask"):
            out = G.map_blocks(_distances_block, c, dtype=G.dtype, ncols=c.shape[0], name="kmeans-transform")
            return out if isinstance(X, GDataSet) else out.to_dask_array()
        parts = dask.compute(*[dask.delayed(device_call)(_distances_host, G.block(b), c) for b in range(G.nblocks)])
        out = np.concatenate(parts, axis=0)
        return _xp_from_host(out) if kind == "cupy" else out

    def fit_transform(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        return self.fit(X, sample_weight=sample_weight).transform(X)

    @in_task_scope
    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Opposite of the inertia of X against the fitted centers (higher is better)."""
        self._check_fitted()
        G, _ = self._prepare(X, reset=False)
        _, mind = self._assign(G, self._centers_for(G))
        return -kernels.weighted_total(mind, self._weights(sample_weight, G))


class _NotFinite(ArithmeticError):
    """The partial sums of a pass were not finite (NaN / inf in the data, or an overflow)."""


class _Loop:
    """A fit's state between passes and the decisions taken on it: the next centers, whether the
    next pass steps on the bounds, convergence. Wherever the engine runs the driver, it takes the
    same steps from the same state (the state is plain data: it is also the fit's checkpoint)."""

    def __init__(self, centers: np.ndarray, bounds: bool, tol: float, dtype: Any, n: int) -> None:
        self.centers = centers
        self.bounds = bounds
        self.tol = tol
        self.dtype = np.dtype(dtype)
        self.n = n
        self.settled = False  # centers move less than the bounds can absorb: bounds pay from here on
        self.last_move = 0.0  # the largest squared move of a center in the previous iteration (none yet)
        self.cargs: tuple = ()  # the chunk arguments of the last pass: (token,) when it stepped on bounds
        self.history: list[np.ndarray] = []  # the centers of every bounds pass so far (to rebuild lost bounds)
        self.n_iter = 0
        self.times: list[float] = []

    @classmethod
    def from_state(cls, state: dict) -> _Loop:
        loop = cls.__new__(cls)
        vars(loop).update(state)
        loop.history = list(loop.history)
        loop.times = list(loop.times)
        return loop

    def state(self) -> dict:
        return dict(vars(self))

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

    def run(self, state: dict, ctx: LoopContext) -> dict:
        loop = _Loop.from_state(state)
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
                raise _NotFinite("non-finite K-means sums")
            done, record = loop.advance(stats, farthest, t0)
            ctx.checkpoint(loop.state(), **record)
            if done:
                break
        return loop.state()

    def final(self, state: dict) -> tuple:
        loop = _Loop.from_state(state)
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
    idx = idx[np.lexsort((idx, -mind[idx]))]  # farthest first, equal distances in row order
    ws = np.ones(idx.size) if w is None else to_numpy(_take(w, idx)).astype(np.float64)
    return mind[idx], labels[idx], to_numpy(_take(blk, idx)), ws


def _next_centers(stats: dict, centers: np.ndarray, dtype: Any, far: tuple | None = None) -> np.ndarray | None:
    """The new centers from one iteration's combined statistics, as scikit-learn computes them
    (:func:`gdask.ml.kernels.next_centers`): empty clusters take the rows farthest from their centers,
    those the pass reported or ``far`` = (squared distances, labels, rows, weights) from a separate
    pass. ``None`` when more clusters are empty than there are such rows, or the sums are not finite."""
    if not np.isfinite(stats["sums"]).all():
        return None
    far = far if far is not None else tuple(stats[k] for k in kernels.FAR)
    new = kernels.next_centers(stats["sums"], stats["counts"], centers, far)
    return None if new is None else new.astype(dtype)


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
    _require_finite(blk)
    return kernels.assign(blk, centers)[0]


def _assign_host(blk, centers):
    _require_finite(blk)
    labels, mind = kernels.assign(blk, centers)
    return [(to_numpy(labels), to_numpy(mind))]


def _join_lists(parts):
    return [p for part in parts for p in part]


def _distances_block(blk, centers):
    _require_finite(blk)
    xp = np if isinstance(blk, np.ndarray) else array_namespace(blk)
    c = astype(centers, blk.dtype) if hasattr(centers, "shape") else asarray_like(centers, blk, dtype=blk.dtype)
    d2 = xp.sum(blk * blk, axis=1)[:, None] - 2 * (blk @ c.T) + xp.sum(c * c, axis=1)[None, :]
    return xp.sqrt(xp.clip(d2, min=0))


def _distances_host(blk, centers):
    return to_numpy(_distances_block(blk, centers))


def _require_finite(blk) -> None:
    """Predicting on rows with NaN or infinity raises, as for NumPy input (scikit-learn's check),
    also when the rows come lazily in blocks (checked in each block's task)."""
    if not all_finite(blk):
        raise ValueError(f"Input X contains NaN or infinity (in a block of {blk.shape[0]} rows); remove or impute "
                         "them before predicting")


def _xp_from_host(x):
    import cupy

    return cupy.asarray(x)
