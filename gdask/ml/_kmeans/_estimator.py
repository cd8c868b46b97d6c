"""The K-means estimator: parameters, input and weights, the fit on the iteration engine, predictions."""

from __future__ import annotations

import functools
import logging
import numbers
from typing import Any, Callable

import dask
import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin

from gdask import config
from gdask.devices import numpy_dtype, to_numpy
from gdask.gdataset import (
    GDataSet,
    Progress,
    default_client_or_none,
    device_call,
    from_array,
    persisted_futures,
    run_loop,
)
from gdask.ml import kernels
from gdask.ml._base import (
    DeviceEstimatorMixin,
    Input,
    NotFinite,
    check_finite,
    host_array,
    in_task_scope,
    shared_docs,
)
from gdask.ml._kmeans._blocks import assign_host, distances_block, distances_host, join_lists, labels_block
from gdask.ml._kmeans._init import initial_centers
from gdask.ml._kmeans._loop import KMeansLoop, LoopState, collect_finals

logger = logging.getLogger("gdask.ml")

__all__ = ["KMeans"]


@shared_docs
class KMeans(DeviceEstimatorMixin, ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin, BaseEstimator):
    """K-means clustering (Lloyd) over device-resident blocks, scikit-learn API.

    Accepts NumPy / CuPy arrays, pandas DataFrames, SciPy sparse matrices and arrays (any format) and
    GDataSets; works with a ``distributed.Client`` (blocks on the cluster's devices) or without one
    (local threads). Sparse input is never densified: it is blocked into CSR row slices (SciPy CSR on
    emulated devices, ``cupyx.scipy.sparse`` CSR on CUDA), and each pass computes the distances as
    ``|c|^2 - 2 X C^T`` and the new centers' sums as ``X^T @ onehot`` (O(nnz) per block, plus
    ``rows x n_clusters`` temporaries).
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
        bounds steps; the pass that builds the bounds has neither).
    algorithm : {"auto", "elkan", "lloyd"}, default "auto"
        "lloyd" computes every row's distance to every center in each iteration. "elkan" gives the
        same assignments with far fewer distance computations: each row keeps bounds on its
        distances (Hamerly's variant of Elkan's method: one lower bound per row, so 24 bytes of
        state per row on the device instead of 8 per row and center), and only rows whose bounds
        no longer prove their cluster are looked at. "auto" is "elkan" from 8 features up (below,
        distances are too cheap for the bookkeeping to pay). On sparse input every algorithm runs
        Lloyd's passes (the same assignments, hence the same answer).
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

    The timings, ``history_`` and ``fit_mode_`` are gdask's diagnostics: readable as attributes but not listed
    by ``dir()``, so the listed fitted attributes are scikit-learn's.
    """

    _diagnostics = ("iteration_times_", "history_", "fit_mode_")

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

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True  # CSR blocks, never densified (gdask.ml.kernels._kmeans_sparse)
        return tags

    @property
    def _n_features_out(self) -> int:
        """Number of transformed output features (one distance per center), for ``get_feature_names_out``."""
        return self.cluster_centers_.shape[0]

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
        if len(shape) != 2:
            raise ValueError(f"init array must be 2-D of shape (n_clusters, n_features) = ({self.n_clusters}, "
                             f"{n_features}), got {shape}")
        if shape[0] != self.n_clusters:  # scikit-learn's messages
            raise ValueError(f"The shape of the initial centers {shape} does not match the number of clusters "
                             f"{self.n_clusters}.")
        if shape[1] != n_features:
            raise ValueError(f"The shape of the initial centers {shape} does not match the number of features of "
                             f"the data {n_features}.")
        if not np.isfinite(np.asarray(to_numpy(init), dtype=np.float64)).all():
            raise ValueError("init array contains NaN or infinity")

    def _prepare(self, X: Any, reset: bool) -> tuple[GDataSet, Input]:
        """(GDataSet, the adapted input); host input goes through scikit-learn's ``validate_data``
        (same errors, ``n_features_in_``, ``feature_names_in_``)."""
        inp = self._input(X, reset=reset, accept_sparse="csr")
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
    def _init_centers(self, X: GDataSet, rng: np.random.Generator, w: np.ndarray | None = None,
                      W: GDataSet | None = None, original: Any = None) -> np.ndarray:
        """Initial centers (:func:`gdask.ml._kmeans._init.initial_centers`)."""
        return initial_centers(self, X, rng, w, W, original)

    # -- fit -----------------------------------------------------------------------------------
    @in_task_scope
    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> KMeans:
        """Compute the clustering.

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, CuPy array, dask array or GDataSet of shape (n_samples, n_features)
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

    def _count_inits(self) -> int:
        n_init = self.n_init
        if n_init == "auto":
            return 10 if (isinstance(self.init, str) and self.init == "random") or callable(self.init) else 1
        if not isinstance(self.init, str) and not callable(self.init) and n_init != 1:
            import warnings

            warnings.warn(f"Explicit initial center position passed: performing only one init in KMeans instead "
                          f"of n_init={n_init}.", RuntimeWarning, stacklevel=5)
            return 1
        return int(n_init)

    def _n_init_checked(self, n_features: int) -> int:
        """The number of inits (kept as ``_n_init``, as scikit-learn), and scikit-learn's warnings."""
        import warnings

        self._n_init = self._count_inits()
        if self.n_clusters == 1 and self.algorithm == "elkan":
            warnings.warn("algorithm='elkan' doesn't make sense for a single cluster. Using 'lloyd' instead.",
                          RuntimeWarning, stacklevel=4)
        return self._n_init

    def _fit(self, X: Any, sample_weight: Any) -> KMeans:
        G, inp = self._prepare(X, reset=True)
        n, d = G.shape
        self._check_params(n, d)
        n_init = self._n_init_checked(d)
        w = self._weights(sample_weight, G)
        if persisted_futures(G) is None:  # persisting again would cost a round trip
            G = G.persist()
        W = None if w is None else from_array(w, block_rows=G.row_blocks).persist()
        rng = np.random.default_rng(self.random_state if not isinstance(self.random_state, np.random.RandomState)
                                    else self.random_state.randint(2**31))
        tolerance = self._tolerance(G, inp)
        lazy = inp.kind.lazy
        # equal weights draw the init from the same distribution as none: draw it the same way (same seed,
        # same centers: unit weights fit as no weights, as scikit-learn)
        init_weights = (None, None) if w is not None and bool(np.all(w == w[0])) else (w, W)
        best = None
        for _ in range(n_init):
            centers = self._init_centers(G, rng, *init_weights, original=X)
            bounds = (self.n_clusters > 1 and G.nnz is None  # CSR blocks: Lloyd's passes
                      and (self.algorithm == "elkan" or (self.algorithm == "auto" and d >= 8)))
            state = LoopState(centers, bounds, tolerance(), np.dtype(G.dtype), n)
            algo = KMeansLoop(self.max_iter, weighted=W is not None, labels=not lazy)
            progress = Progress(self.verbose, self.callback, total=self.max_iter, desc="KMeans")
            try:
                res = run_loop(algo, {"X": G, "W": W}, state, progress=progress)
            except NotFinite:
                self._raise_not_finite(G)
            labels, inertia = collect_finals(res.finals, G, labels=not lazy)
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
        if labels is not None:
            _warn_distinct(np.asarray(to_numpy(labels)), self.n_clusters)
        return self

    def _tolerance(self, G: GDataSet, inp: Input) -> Callable[[], float]:
        """The absolute tolerance, ``tol`` times the mean feature variance (as scikit-learn), as a
        function that returns it. Data not from the host is checked for NaN/inf here, before the init
        reads it. Host data (already checked) with a Client: the variance's graph starts now and is
        read when the first Lloyd loop starts, so its round trips overlap the init's."""
        if self.tol <= 0:  # 0 needs no pass
            if not inp.kind.host and isinstance(self.init, str):  # the init reads the data: check first
                check_finite(G)
            return lambda: 0.0
        client = default_client_or_none() if inp.kind.host else None
        if client is None:
            variances = to_numpy(G.var(axis=0).compute())
            if not inp.kind.host and not np.isfinite(variances).all():  # NaN/inf make it non-finite
                check_finite(G)
            tol = float(np.mean(variances)) * self.tol
            return lambda: tol
        future = client.compute(G.var(axis=0))
        limit = float(config.get("timeouts.pass", 3600))

        @functools.cache  # read once (every init of n_init asks)
        def tolerance() -> float:
            try:
                variances = future.result(timeout=limit)
            except TimeoutError:
                raise TimeoutError(f"KMeans: the data's variance (for tol) was not computed within {limit:g} s "
                                   "(gdask.timeouts.pass)") from None
            finally:
                future.release()  # the workers drop it now, not when the fit ends
            return float(np.mean(to_numpy(variances))) * self.tol

        return tolerance

    @staticmethod
    def _raise_not_finite(G: GDataSet) -> None:
        check_finite(G)
        raise ValueError("K-means sums overflowed float64; scale the data down")

    def _assign(self, G: GDataSet, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Labels and exact squared distances of all rows, one task per group of blocks."""
        groups = G.block_groups() or [[b] for b in range(G.nblocks)]
        found = dask.compute(*G.reduce_groups(assign_host, join_lists, centers, groups=groups, name="assign"))
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
        return self._blockwise(inp, labels_block, self._centers_for(G), dtype=np.int32, ncols=None,
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
        # scikit-learn's dtype: float32 only when both X and the fitted centers are float32
        dt = np.result_type(np.dtype(G.dtype), numpy_dtype(self.cluster_centers_.dtype))
        if dt != np.dtype(G.dtype):
            G = G.astype(dt)
            inp = Input(inp.kind, G, inp.original)
        c = self._centers_for(G)
        if inp.kind.lazy:
            return self._blockwise(inp, distances_block, c, dtype=G.dtype, ncols=c.shape[0], name="kmeans-transform")
        parts = dask.compute(*[dask.delayed(device_call)(distances_host, G.block(b), c) for b in range(G.nblocks)])
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


def _warn_distinct(labels: np.ndarray, n_clusters: int) -> None:
    """scikit-learn's ConvergenceWarning when fewer clusters than ``n_clusters`` hold rows (duplicate points)."""
    # labels are 0 .. n_clusters - 1: counting them is a pass, where np.unique sorts (~5x dearer at 1M rows)
    distinct = int(np.count_nonzero(np.bincount(labels.ravel(), minlength=n_clusters)))
    if distinct < n_clusters:
        import warnings

        from sklearn.exceptions import ConvergenceWarning

        warnings.warn(f"Number of distinct clusters ({distinct}) found smaller than n_clusters ({n_clusters}). "
                      "Possibly due to duplicate points in X.", ConvergenceWarning, stacklevel=4)
