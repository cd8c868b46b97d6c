"""K-means over GDataSet blocks with a fused per-block Lloyd kernel."""

from __future__ import annotations

import logging
import math
import numbers
import threading
import time
import uuid
from typing import Any

import dask
import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin

from gdask.gdataset import GDataSet, from_array
from gdask.gdataset import from_dask_array as gdask_from_dask_array
from gdask.gdataset import from_dataframe
from gdask.gdataset._blocks import array_module, group_partial_op, sum_parts, to_numpy
from gdask.gdataset._collective import CollectiveError, run_on_workers
from gdask.gdataset._repr import block_workers, groups_of, persisted_futures
from gdask.ml import _bounds, _kernels
from gdask.ml._input import check_finite as _check_finite
from gdask.ml._input import estimator_job
from gdask.ml._input import is_host_input as _is_host_input
from gdask.scheduling._plugin import report_work

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


def _sample_block(blk, centers, factor, phi, seed, w=None):
    """k-means|| oversampling: keep each row with probability ``factor * w d(x)^2 / phi``."""
    d2 = to_numpy(_kernels.min_sqdist(blk, centers))
    if w is not None:
        d2 = d2 * to_numpy(w)
    rng = np.random.default_rng(seed)
    keep = np.nonzero(rng.random(d2.shape[0]) < factor * d2 / phi)[0]
    return to_numpy(blk[keep])


def _count_nearest(blk, centers, w=None):
    labels = to_numpy(_kernels.labels_block(blk, centers))
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
    return to_numpy(blk[idx])


def _sum_mind(blk, centers, w=None):
    d2 = _kernels.min_sqdist(blk, centers)
    return float(d2.sum() if w is None else (d2 * w).sum())


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

    Parameters
    ----------
    n_clusters : int, default 8
    init : {"k-means||", "k-means++", "random"} or array of shape (n_clusters, n_features)
        "k-means||" (default) is the scalable oversampling init of Bahmani et al.; "k-means++"
        runs greedy k-means++ on a uniform sample of at most ``init_sample`` rows (all rows when
        the data is smaller); "random" picks ``n_clusters`` distinct rows.
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
        Print one line per iteration (time, inertia or rows reassigned, center shift).
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
    cluster_centers_, labels_, inertia_, n_iter_, n_features_in_
    iteration_times_ : list of float
        Seconds per iteration (without the set-up and the final labels pass).
    """

    def __init__(self, n_clusters: int = 8, *, init: Any = "k-means||", max_iter: int = 300, tol: float = 1e-4,
                 random_state: Any = None, oversampling_factor: float = 2.0, init_max_iter: int = 5,
                 init_sample: int = 200_000, verbose: bool | int = False, algorithm: str = "auto",
                 gpu: float | None = None, memory: Any = None, job_name: str | None = None) -> None:
        self.n_clusters = n_clusters
        self.init = init
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
        if isinstance(self.init, str):
            if self.init not in ("k-means||", "k-means++", "random"):
                raise ValueError(f"init must be 'k-means||', 'k-means++', 'random' or an array, got {self.init!r}")
        else:
            shape = np.shape(self.init)
            if shape != (self.n_clusters, n_features):
                raise ValueError(
                    f"init array must have shape (n_clusters, n_features) = ({self.n_clusters}, {n_features}), got {shape}"
                )

    def _prepare(self, X: Any, reset: bool) -> tuple[GDataSet, str]:
        """(GDataSet, kind of input: 'numpy' | 'cupy' | 'gdataset'). Host input goes through
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
            G, kind = from_dataframe(X) if hasattr(X, "columns") else gdask_from_dask_array(X), "gdataset"
        if G.ndim != 2:
            raise ValueError(f"KMeans needs 2-D data (n_samples, n_features), got shape {G.shape}")
        if G.dtype.kind != "f":
            G = G.astype(np.float64)
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
                parts.append(dask.delayed(_take_rows)(X.block(b), sel))
        return np.concatenate(dask.compute(*parts), axis=0)

    def _init_centers(self, X: GDataSet, rng: np.random.Generator, w: np.ndarray | None = None,
                      W: GDataSet | None = None) -> np.ndarray:
        """Initial centers; sample weights (``w`` on the host, ``W`` blocked like ``X``) weigh the
        draws (rows with weight 0 are drawn only when there are too few others)."""
        n, k = X.shape[0], self.n_clusters
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
            new = dask.compute(*[dask.delayed(_sample_block)(X.block(b), cands, factor, phi, int(seeds[b]),
                                                             None if W is None else W.block(b))
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
    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> KMeans:
        """Compute the clustering.

        Raises
        ------
        ValueError
            NaN/inf in X, wrong ndim, empty X, n_clusters > n_samples, bad parameters.
        TypeError
            Non-numeric data.
        """
        with estimator_job(self):  # blocks made inside a job get the job's private keys
            return self._fit(X, sample_weight)

    def _fit(self, X: Any, sample_weight: Any) -> KMeans:
        G, kind = self._prepare(X, reset=True)
        n, d = G.shape
        self._check_params(n, d)
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
        centers = self._init_centers(G, rng, w, W)
        # one task per worker thread over the blocks it holds (groups), whether the loop runs on the
        # workers or from here; data larger than the devices streams through the window cache one
        # block per task instead (a task over a group of blocks would need them all on the device at once)
        streaming = _exceeds_devices(G)
        where = None if streaming else block_workers(G, wait_ready=True)  # one question to the scheduler
        groups = [[b] for b in range(G.nblocks)] if streaming else groups_of(where, G.nblocks)
        bounds = not streaming and (self.algorithm == "elkan" or (self.algorithm == "auto" and d >= 8))
        # bounds live with the blocks on the workers, under a key of this fit (freed by the final pass)
        tokens = []

        def start() -> _Loop:
            tokens.append(uuid.uuid4().hex if bounds else None)
            return _Loop(centers, bounds, tokens[-1], tol, G.dtype, n, self.verbose)

        try:
            if not streaming and groups is not None and dask.config.get("gdask.ml.worker-loop"):
                loop = start()
                try:  # the whole loop on the workers: no client round trip per iteration
                    labels, self.inertia_ = self._fit_on_workers(G, W, loop, groups, where[0])
                except CollectiveError as e:  # the loop from here gives the same result
                    logger.warning("KMeans: the loop on the workers did not run to its end (%s); "
                                   "running it from the client", e)
                else:
                    return self._fitted(loop, labels, kind)
            loop = start()  # from the initial centers again, with bounds of its own
            labels, self.inertia_ = self._fit_from_client(G, W, loop, groups, streaming)
        finally:
            for token in tokens:
                if token is not None:
                    _bounds.free(token)
        return self._fitted(loop, labels, kind)

    def _fitted(self, loop: _Loop, labels: np.ndarray, kind: str) -> KMeans:
        self.n_iter_ = loop.n_iter
        self.iteration_times_ = loop.times
        self.cluster_centers_ = loop.centers if kind != "cupy" else _xp_from_host(loop.centers)
        self.labels_ = labels if kind != "cupy" else _xp_from_host(labels)
        return self

    def _fit_from_client(self, G: GDataSet, W: GDataSet | None, loop: _Loop, groups: list | None,
                         streaming: bool) -> tuple[np.ndarray, float]:
        """The loop driven from here: one graph per iteration. Labels and inertia for the final centers."""
        wargs = () if W is None else (W,)
        for it in range(self.max_iter):
            t0 = time.perf_counter()
            chunk, cargs = loop.chunk()
            if streaming:  # forward and backward in turn: what a pass leaves on the device comes first next
                from gdask import window_cache

                with window_cache.scan(G.__dask_keys__(), it):
                    part = G.reduce_blocks(chunk, _kernels.lloyd_combine, loop.centers, *wargs, name="lloyd")
                stats = part.compute()
            else:
                stats = _kernels.lloyd_combine(list(dask.compute(*G.reduce_groups(
                    chunk, _kernels.lloyd_combine, loop.centers, *cargs, *wargs, groups=groups, name="lloyd"))))
            if not np.isfinite(stats["sums"]).all():  # every row is in some sum: NaN/inf in X show up here
                self._raise_not_finite(G)
            done = loop.advance(stats, lambda c, s: self._farthest(G, W, c, s), t0)
            if loop.lines:
                print(loop.lines[-1])
            if done:
                break
        # the labels for the final centers: from the bounds when the last iteration stepped on them
        return self._final_pass(G, loop.centers, groups, loop.cargs, wargs)

    def _fit_on_workers(self, G: GDataSet, W: GDataSet | None, loop: _Loop, groups: list[list[int]],
                        workers: dict[int, str]) -> tuple[np.ndarray, float]:
        """The whole loop as one task per worker (:func:`gdask.gdataset._collective.run_on_workers`):
        each computes its groups' partials, all-gathers them, and takes the same step as
        :meth:`_fit_from_client` would. ``workers`` maps blocks to the workers holding them. Raises
        ``CollectiveError`` when the loop could not run to its end."""
        from distributed import default_client

        client = default_client()
        peers = sorted({workers[g[0]] for g in groups})
        mine: dict[str, list] = {a: [] for a in peers}
        for gi, g in enumerate(groups):
            mine[workers[g[0]]].append((gi, g, [G.block(b) for b in g], None if W is None else [W.block(b) for b in g]))
        topic = f"gdask-kmeans-{uuid.uuid4().hex}" if self.verbose else None
        printed: list[int] = []
        lock = threading.Lock()

        def show(index: int, line: str) -> None:
            with lock:
                if index == len(printed):
                    print(line)
                    printed.append(index)

        if topic:
            client.subscribe_topic(topic, lambda event: show(*event[1]))
        try:
            results = run_on_workers(client, _fit_on_worker, peers,
                                     [(mine[a], loop.state(), self.max_iter, topic) for a in peers], name="kmeans")
        finally:
            if topic:
                client.unsubscribe_topic(topic)
        if results[0] is None:  # the sums were not finite (every rank saw the same)
            self._raise_not_finite(G)
        loop.load(results[0]["loop"])
        # the passes' durations teach the placement plugin the devices' speeds, as the tasks of
        # the loop from the client would (it rebalances the blocks when they differ)
        try:
            report_work(client, [(kind, nbytes, addr, sec) for addr, r in zip(peers, results)
                                 for kind, nbytes, sec in r["observed"]])
        except Exception as e:  # noqa: BLE001 - the fit is done: a scheduler that cannot take this loses nothing
            logger.debug("could not report the passes' durations to the placement plugin: %r", e)
        for i, line in enumerate(loop.lines):  # the lines the topic did not bring in time
            show(i, line)
        found = dict(kv for r in results for kv in r["found"].items())
        return _collect_labels(G, groups, [found[gi] for gi in range(len(groups))])

    @staticmethod
    def _raise_not_finite(G: GDataSet) -> None:
        _check_finite(G)
        raise ValueError("K-means sums overflowed float64; scale the data down")

    def _final_pass(self, G: GDataSet, centers: np.ndarray, groups: list | None, bounds: tuple,
                    wargs: tuple) -> tuple[np.ndarray, float]:
        """Labels of all rows for the final centers and the (weighted) inertia, one task per group
        of blocks; with ``bounds = (fit token,)`` from the rows' bounds, which this frees. Each block's
        inertia is summed where the block is, so only the labels come back (as the narrowest
        integer type that holds them)."""
        groups = groups or [[b] for b in range(G.nblocks)]
        func = _bounds_labels_host if bounds else _labels_host
        found = dask.compute(*G.reduce_groups(func, _join_lists, centers, *bounds, *wargs, groups=groups,
                                              name="labels"))
        return _collect_labels(G, groups, found)

    def _farthest(self, G: GDataSet, W: GDataSet | None, centers: np.ndarray, stats: dict) -> tuple:
        """The rows farthest from their centers, for more empty clusters at once than the Lloyd pass
        reported rows for: a pass in which each block reports as many of its own."""
        m = int((stats["counts"] == 0).sum())
        parts = dask.compute(*[dask.delayed(_farthest_rows)(G.block(b), centers, m, None if W is None else W.block(b))
                               for b in range(G.nblocks)])
        return tuple(np.concatenate([p[i] for p in parts], axis=0) for i in range(4))

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

    def predict(self, X: Any) -> Any:
        """Index of the nearest cluster center for each row (NumPy, or CuPy for CuPy input)."""
        self._check_fitted()
        G, kind = self._prepare(X, reset=False)
        labels, _ = self._assign(G, to_numpy(self.cluster_centers_).astype(G.dtype))
        return _xp_from_host(labels) if kind == "cupy" else labels

    def fit_predict(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        return self.fit(X, sample_weight=sample_weight).labels_

    def transform(self, X: Any) -> Any:
        """Distances from each row to every center, shape (n_samples, n_clusters)."""
        self._check_fitted()
        G, kind = self._prepare(X, reset=False)
        c = to_numpy(self.cluster_centers_).astype(G.dtype)
        parts = dask.compute(*[dask.delayed(_distances_host)(G.block(b), c) for b in range(G.nblocks)])
        out = np.concatenate(parts, axis=0)
        return _xp_from_host(out) if kind == "cupy" else out

    def fit_transform(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Opposite of the inertia of X against the fitted centers (higher is better)."""
        self._check_fitted()
        G, _ = self._prepare(X, reset=False)
        _, mind = self._assign(G, to_numpy(self.cluster_centers_).astype(G.dtype))
        return -_bounds._weighted_total(mind, self._weights(sample_weight, G))


class _Loop:
    """A fit's state between passes and the decisions taken on it: the next centers, whether the
    next pass steps on the bounds, convergence. The loop from the client and the loop on the
    workers both run this, so they take the same steps to the same result."""

    def __init__(self, centers: np.ndarray, bounds: bool, token: str | None, tol: float, dtype: Any, n: int,
                 verbose: bool | int) -> None:
        self.centers = centers
        self.bounds = bounds
        self.token = token
        self.tol = tol
        self.dtype = np.dtype(dtype)
        self.n = n
        self.verbose = bool(verbose)
        self.settled = False  # centers move less than the bounds can absorb: bounds pay from here on
        self.last_move = 0.0  # the largest squared move of a center in the previous iteration (none yet)
        self.cargs: tuple = ()  # the chunk arguments of the last pass: (token,) when it stepped on bounds
        self.n_iter = 0
        self.times: list[float] = []
        self.lines: list[str] = []

    def chunk(self) -> tuple[Any, tuple]:
        """The per-block function of the next pass and its extra arguments."""
        if self.bounds and self.settled:
            self.cargs = (self.token,)
            return _bounds.bounds_partial, self.cargs
        self.cargs = ()  # while centers still jump, nearly every row fails its bounds: plain Lloyd is cheaper
        return _kernels.lloyd_partial, self.cargs

    def advance(self, stats: dict, farthest: Any, t0: float) -> bool:
        """Take the step from one pass's combined statistics; whether the fit converged.
        ``farthest(centers, stats)`` is the extra pass for more empty clusters than the pass
        reported rows for."""
        new = _next_centers(stats, self.centers, self.dtype)
        if new is None:
            new = _next_centers(stats, self.centers, self.dtype, farthest(self.centers, stats))
        moves = ((new.astype(np.float64) - self.centers) ** 2).sum(1)
        shift = float(moves.sum())
        # a center's largest move falling below half the previous one bets on settling: that pass
        # builds the bounds (a little dearer than Lloyd's), so the next one can step on them
        self.settled = self.bounds and (_settled(new, moves) or float(moves.max()) < _SETTLING * self.last_move)
        self.last_move = float(moves.max())
        self.centers = new
        self.n_iter += 1
        self.times.append(time.perf_counter() - t0)
        if self.verbose:
            if not self.cargs:
                what = f"inertia {stats['inertia']:.6g}"
            else:  # a first bounds pass counts every row
                what = "bounds built" if stats["changed"] >= self.n else f"{stats['changed']} rows reassigned"
            self.lines.append(f"iteration {self.n_iter}: {self.times[-1] * 1e3:.1f} ms, {what}, "
                              f"center shift {shift:.3g}")
        return shift <= self.tol

    def state(self) -> dict:
        return dict(vars(self))

    def load(self, state: dict) -> None:
        vars(self).update(state)


def _group_partial(func: Any, combine: Any, blocks: list, args: tuple, weights: list | None) -> Any:
    """What the task of one group of blocks computes in the loop from the client (``reduce_groups``)."""
    flat = [a for j, blk in enumerate(blocks) for a in (blk, *args, *(() if weights is None else (weights[j],)))]
    return group_partial_op(func, combine, len(flat) // len(blocks), *flat, host=True)


def _fit_on_worker(comm: Any, mine: list, state: dict, max_iter: int, topic: str | None) -> dict | None:
    """One worker's task of :meth:`KMeans._fit_on_workers`: ``mine`` lists its groups as
    ``(group index, block indices, blocks, weight blocks or None)``. Returns the loop's final
    state, per group what the final labels pass of the loop from the client returns, and the
    groups' passes as ``(kind, input bytes, seconds)`` (for the placement plugin); None when the
    sums were not finite."""
    loop = _Loop.__new__(_Loop)
    loop.load(state)
    observed: list[tuple[str, int, float]] = []
    for _ in range(max_iter):
        t0 = time.perf_counter()
        chunk, cargs = loop.chunk()
        own = []
        for gi, _, blocks, ws in mine:
            t = time.perf_counter()
            own.append((gi, _group_partial(chunk, _kernels.lloyd_combine, blocks, (loop.centers, *cargs), ws)))
            # what the group's task would have taken (kind and input bytes as in the loop from the client)
            observed.append(("lloyd-partial", _nbytes(blocks, ws), time.perf_counter() - t))
        parts = sorted((p for ps in comm.allgather(own) for p in ps), key=lambda p: p[0])
        stats = _kernels.lloyd_combine([p for _, p in parts])  # in group order, as the client combines them
        if not np.isfinite(stats["sums"]).all():
            return None
        done = loop.advance(stats, lambda c, s: _farthest_on_workers(comm, mine, c, s), t0)
        if topic and loop.lines and comm.rank == 0:
            comm.worker.log_event(topic, (len(loop.lines) - 1, loop.lines[-1]))
        if done:
            break
    func = _bounds_labels_host if loop.cargs else _labels_host
    found = {gi: _group_partial(func, _join_lists, blocks, (loop.centers, *loop.cargs), ws) for gi, _, blocks, ws in mine}
    return {"loop": loop.state(), "found": found, "observed": observed}


def _nbytes(blocks: list, weights: list | None) -> int:
    return sum(int(b.nbytes) for b in blocks) + sum(int(w.nbytes) for w in weights or ())


def _farthest_on_workers(comm: Any, mine: list, centers: np.ndarray, stats: dict) -> tuple:
    """:meth:`KMeans._farthest` on the workers: every block's farthest rows, all-gathered in block order."""
    m = int((stats["counts"] == 0).sum())
    own = [(b, _farthest_rows(blk, centers, m, None if ws is None else ws[j]))
           for _, g, blocks, ws in mine for j, (b, blk) in enumerate(zip(g, blocks))]
    rows = [r for _, r in sorted((p for ps in comm.allgather(own) for p in ps), key=lambda p: p[0])]
    return tuple(np.concatenate([r[i] for r in rows], axis=0) for i in range(4))


def _settled(centers: np.ndarray, moves: np.ndarray) -> bool:
    """Whether the last move of the centers (squared, per center) is small against their spacing:
    then most rows keep bounds that prove their cluster, and the bounds pass beats Lloyd's."""
    if len(centers) < 2:
        return True
    c = centers.astype(np.float64)
    d2 = ((c[:, None, :] - c[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    return float(np.sqrt(moves.max())) < 0.25 * float(np.sqrt(d2.min()))


def _exceeds_devices(G: GDataSet, fraction: float = 0.8) -> bool:
    """Whether ``G`` takes more than ``fraction`` of the memory of the client's gdask devices."""
    try:
        from distributed import default_client

        client = default_client()
    except (ImportError, ValueError):  # no client: local threads, host memory
        return False
    specs = getattr(getattr(client, "cluster", None), "device_specs", None)
    if specs:  # a LocalGPUCluster in this process knows its devices: no round trip to the scheduler
        total = sum(int(s.memory or 0) for s in specs)
    else:
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
        total = sum(int((w.get("metrics", {}).get("gdask_device") or {}).get("memory") or 0) for w in workers)
    return total > 0 and G.nbytes > fraction * total


def _farthest_rows(blk, centers, m, w=None):
    labels, mind = (to_numpy(a) for a in _kernels.assign(blk, centers))
    m = min(m, mind.shape[0])
    idx = np.argpartition(-mind, m - 1)[:m] if m < mind.shape[0] else np.arange(mind.shape[0])
    return mind[idx], labels[idx], to_numpy(blk[idx]), np.ones(idx.size) if w is None else to_numpy(w)[idx]


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
        dists, labels, rows, ws = far if far is not None else (stats[k] for k in _kernels._FAR)
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


def _collect_labels(G: GDataSet, groups: list, found: list) -> tuple[np.ndarray, float]:
    """All rows' labels (int32) and the inertia from per-group lists of per-block (labels, inertia)."""
    offs = tuple(G.block_offsets) + (G.shape[0],)
    labels = np.empty(G.shape[0], np.int32)
    inertia = [0.0] * G.nblocks
    for g, res in zip(groups, found):
        for b, (lab, part) in zip(g, res):
            labels[offs[b]:offs[b + 1]] = lab
            inertia[b] = part
    return labels, math.fsum(inertia)


def _narrow(labels: np.ndarray, k: int) -> np.ndarray:
    """Labels in the narrowest unsigned type for ``k`` clusters (less to send back)."""
    return labels.astype(np.min_scalar_type(max(k - 1, 0)), copy=False)


def _labels_host(blk, centers, w=None):
    labels, mind = _kernels.assign(blk, centers)
    return [(_narrow(to_numpy(labels), centers.shape[0]), _bounds._weighted_total(mind, w))]


def _bounds_labels_host(blk, centers, token, w=None):
    labels, inertia = _bounds.bounds_labels(blk, centers, token, w)
    return [(_narrow(to_numpy(labels), centers.shape[0]), inertia)]


def _assign_host(blk, centers):
    labels, mind = _kernels.assign(blk, centers)
    return [(to_numpy(labels), to_numpy(mind))]


def _join_lists(parts):
    return [p for part in parts for p in part]


def _distances_host(blk, centers):
    xp = array_module(blk)
    c = xp.asarray(centers)
    d2 = (blk * blk).sum(1)[:, None] - 2 * (blk @ c.T) + (c * c).sum(1)[None, :]
    return to_numpy(xp.sqrt(xp.maximum(d2, 0)))


def _xp_from_host(x):
    import cupy

    return cupy.asarray(x)
