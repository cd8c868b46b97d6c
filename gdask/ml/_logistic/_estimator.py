"""The logistic regression estimator: parameters, input, labels and weights, the fit, predictions."""

from __future__ import annotations

import numbers
import warnings
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin

from gdask.devices import array_namespace, to_numpy
from gdask.gdataset import GDataSet, Progress, from_array, run_loop, sum_parts
from gdask.ml import kernels as _k
from gdask.ml._base import (
    DeviceEstimatorMixin,
    Input,
    NotFinite,
    check_finite,
    host_array,
    in_task_scope,
    input_kind,
    module_name,
    shared_docs,
)
from gdask.ml._logistic._blocks import (
    checked_decision,
    decision_block,
    predict_block,
    proba_block,
    probabilities,
    weight_sum,
    weighted_bincount,
)
from gdask.ml._logistic._loop import GRAM_MAX_FEATURES, Layout, LogisticLoop, SolverState
from gdask.ml._logistic._targets import aligned, encode

__all__ = ["LogisticRegression"]

_SOLVERS = ("lbfgs", "gd")
#: scikit-learn's solvers of the same problem (L2 or no penalty, unpenalised intercept, multinomial loss),
#: accepted by name and solved by gdask's L-BFGS ("liblinear" is not: it penalises the intercept and fits
#: one-vs-rest)
_SAME_PROBLEM = ("newton-cg", "newton-cholesky", "sag", "saga")
#: the solvers of the "l1" and "elasticnet" penalties: scikit-learn's "saga", and gdask's "gd"; both solved by
#: gdask's proximal gradient descent (FISTA)
_L1_SOLVERS = ("saga", "gd")


@shared_docs
class LogisticRegression(DeviceEstimatorMixin, ClassifierMixin, BaseEstimator):
    """L2-penalised logistic regression over device-resident blocks, scikit-learn API.

    Minimises scikit-learn's objective ``sum_i s_i logloss_i / S + ||W||^2 / (2 C S)`` (``s_i``
    the sample weights, ``S`` their sum; the intercept is not penalised): binary problems with the
    binomial loss, three or more classes with the multinomial (softmax) loss, as scikit-learn's
    default. Each evaluation of the loss and its gradient is one pass over the blocks: one task per
    worker thread over the blocks it holds, combined on the client (one Dask round trip).

    Accepts NumPy / CuPy arrays, pandas DataFrames, lists, SciPy sparse matrices and arrays (any
    format) and GDataSets; ``y`` as an array, list or Series, or as a GDataSet / dask array blocked
    like ``X``. Works with a ``distributed.Client`` (blocks on the cluster's devices) or without one
    (local threads). Sparse input is never densified: it is blocked into CSR row slices (SciPy CSR on
    emulated devices, ``cupyx.scipy.sparse`` CSR on CUDA) and every pass computes ``X @ w`` and
    ``X^T @ r`` as sparse products; predictions for sparse host input are NumPy.

    Parameters
    ----------
    penalty : {"auto", "l2", "l1", "elasticnet", None}, default "auto"
        "auto" reads the penalty from ``l1_ratio`` as scikit-learn 1.8+ does by default: 0 is L2
        (the default), 1 is L1, between is their mix (elastic net), and ``C=np.inf`` no penalty
        (``"deprecated"``, scikit-learn's name for it, is taken too). "l2", "l1", "elasticnet" and
        None (no penalty; ``C`` is then ignored) name it directly, as scikit-learn before 1.8.
        L1 and elastic net need ``solver="saga"`` (as scikit-learn) or ``"gd"``: both are solved by
        gdask's proximal gradient descent (FISTA with adaptive restart; ``tol`` bounds the gradient
        mapping).
    C : float, default 1.0
        Inverse of the regularisation strength (``np.inf``: no penalty).
    l1_ratio : float, default 0.0
        The L1 share of the elastic-net penalty (scikit-learn's): the objective is the mean log-loss
        plus ``(l1_ratio |w|_1 + (1 - l1_ratio) |w|^2 / 2) / (C S)``, ``S`` the sum of the weights.
    dual : bool, default False
        Only the primal problem is solved; ``dual=True`` raises ValueError.
    intercept_scaling : float, default 1
        Accepted for compatibility: as in scikit-learn, it matters for the liblinear solver only.
    random_state : int, RandomState or None
        Accepted for compatibility: the lbfgs and gd solvers are deterministic (as scikit-learn's lbfgs).
    n_jobs : int or None
        Accepted for compatibility: the work is spread over the cluster's devices, not joblib jobs.
    fit_intercept : bool, default True
    max_iter : int, default 100
        lbfgs: L-BFGS iterations; gd: gradient steps (passes over the data).
    tol : float, default 1e-4
        Stop when the largest absolute entry of the gradient is at most ``tol`` (lbfgs: scipy's
        ``gtol`` of the projected gradient, as scikit-learn).
    solver : {"lbfgs", "gd", "newton-cg", "newton-cholesky", "sag", "saga"}, default "lbfgs"
        scikit-learn's "newton-cg", "newton-cholesky", "sag" and "saga" solve the same problem (with
        the penalties gdask supports): they are accepted and solved by gdask's "lbfgs"; "liblinear"
        (which penalises the intercept) raises ValueError.
        "lbfgs": scipy's L-BFGS-B with scikit-learn's options (results match scikit-learn's lbfgs);
        with a Client and persisted data it runs on every worker at once over the all-gathered
        objective (no client round trip per evaluation), else from the client. "gd": full-batch gradient
        descent preconditioned by a fixed bound
        on the Hessian (Böhning's bound ``[X, 1]^T [X, 1] / 4``, from one extra pass at the
        start), with Nesterov momentum and adaptive restart; exactly one pass per iteration.
    class_weight : dict, "balanced" or None, default None
        Weights of the classes (multiplied into ``sample_weight``), as scikit-learn.
    warm_start : bool, default False
        Start from the previous fit's coefficients.
    verbose : int, default 0
        Print one line per iteration (loss, gradient norm), in the calling thread, also when the loop
        runs on the workers.
    callback : callable, optional
        ``callback(record)`` after every iteration: a dict with ``iteration``, ``seconds``, ``mode``,
        ``loss`` and ``grad_max``.
    {job_parameters}
    {output_type_parameter}

    Attributes
    ----------
    classes_ : ndarray (n_classes,)
    coef_ : array (1, n_features) for two classes, else (n_classes, n_features)
        NumPy (CuPy for CuPy input; see ``output_type``).
    intercept_ : array (1,) or (n_classes,)
    n_iter_ : ndarray (1,) int32
    n_features_in_ : int
    feature_names_in_ : ndarray of str, when X has feature names
    pass_times_ : list of float
        Seconds per pass over the data (one loss-and-gradient evaluation, or the Gram pass of gd).
    history_ : list of dict
        The per-iteration records (as given to ``callback``).
    fit_mode_ : str
        Where the loop ran: "workers", "client" or "stream".

    The timings, ``history_`` and ``fit_mode_`` are gdask's diagnostics: readable as attributes but not listed
    by ``dir()``, so the listed fitted attributes are scikit-learn's.

    Examples
    --------
    >>> X = gdask.from_array(x, block_rows=250_000)
    >>> clf = gdask.ml.LogisticRegression(C=1.0).fit(X, y)
    >>> clf.predict_proba(X[:10])     # doctest: +SKIP
    """

    _diagnostics = ("pass_times_", "history_", "fit_mode_")

    def __init__(self, penalty: str | None = "auto", *, C: float = 1.0, l1_ratio: float | None = 0.0,
                 dual: bool = False, tol: float = 1e-4, fit_intercept: bool = True, intercept_scaling: float = 1,
                 class_weight: Any = None, random_state: Any = None, solver: str = "lbfgs", max_iter: int = 100,
                 verbose: int = 0, warm_start: bool = False, n_jobs: int | None = None, callback: Any = None,
                 gpu: float | None = None, memory: Any = None, job_name: str | None = None,
                 output_type: str | None = None) -> None:
        self.penalty = penalty
        self.l1_ratio = l1_ratio
        self.dual = dual
        self.intercept_scaling = intercept_scaling
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.callback = callback
        self.C = C
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.solver = solver
        self.class_weight = class_weight
        self.warm_start = warm_start
        self.verbose = verbose
        self.gpu = gpu
        self.memory = memory
        self.job_name = job_name
        self.output_type = output_type

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True  # CSR blocks, never densified (gdask.ml.kernels._logistic_sparse)
        return tags

    # -- validation ------------------------------------------------------------------------------
    def _check_params(self) -> None:
        if isinstance(self.C, bool) or not isinstance(self.C, numbers.Real) or not self.C > 0:
            raise ValueError(f"C must be a positive float (np.inf for no penalty), got {self.C!r}")
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, numbers.Integral) or self.max_iter < 0:
            raise ValueError(f"max_iter must be a non-negative integer, got {self.max_iter!r}")
        if isinstance(self.tol, bool) or not isinstance(self.tol, numbers.Real) or not self.tol >= 0:
            raise ValueError(f"tol must be a non-negative float, got {self.tol!r}")
        if self.solver not in _SOLVERS + _SAME_PROBLEM:
            raise ValueError(f"solver must be one of {_SOLVERS + _SAME_PROBLEM} (the last four solved by gdask's "
                             f"lbfgs), got {self.solver!r}")
        if self.penalty not in ("auto", "l2", "l1", "elasticnet", None, "deprecated"):
            raise ValueError(f"penalty must be 'auto', 'l2', 'l1', 'elasticnet' or None, got {self.penalty!r}")
        r = self.l1_ratio
        if r is not None and (isinstance(r, bool) or not isinstance(r, numbers.Real) or not 0 <= r <= 1):
            raise ValueError(f"l1_ratio must be a float between 0 and 1 (or None), got {r!r}")
        penalty, _ = self._penalty()
        if penalty == "elasticnet" and r is None:
            raise ValueError("l1_ratio must be specified when penalty is elasticnet.")
        if penalty in ("l1", "elasticnet") and self.solver not in _L1_SOLVERS:  # scikit-learn's messages
            if penalty == "elasticnet":
                raise ValueError(f"Only 'saga' solver supports elasticnet penalty, got solver={self.solver}.")
            raise ValueError(f"Solver {self.solver} supports only 'l2' or None penalties, got {penalty} penalty.")
        if penalty != "elasticnet" and r is not None and 0 < r < 1:
            warnings.warn(f"l1_ratio parameter is only used when penalty is 'elasticnet'. Got (penalty={penalty})",
                          UserWarning, stacklevel=3)
        if (self.penalty == "l2" and r != 0) or (self.penalty == "l1" and r != 1):  # scikit-learn's warning
            warnings.warn(f"Inconsistent values: penalty={self.penalty} with l1_ratio={r}: penalty={self.penalty} is "
                          "used (leave penalty='auto' and set l1_ratio: 0 for L2, 1 for L1, between for an elastic "
                          "net)", UserWarning, stacklevel=3)
        if self.dual:
            raise ValueError("dual=True is not supported: gdask solves the primal problem (dual=False)")
        if (isinstance(self.intercept_scaling, bool) or not isinstance(self.intercept_scaling, numbers.Real)
                or not self.intercept_scaling > 0):
            raise ValueError(f"intercept_scaling must be a positive float, got {self.intercept_scaling!r}")
        if self.n_jobs is not None and (isinstance(self.n_jobs, bool) or not isinstance(self.n_jobs, numbers.Integral)):
            raise ValueError(f"n_jobs must be an integer or None, got {self.n_jobs!r}")
        if self.callback is not None and not callable(self.callback):
            raise ValueError(f"callback must be callable or None, got {type(self.callback).__name__}")
        cw = self.class_weight
        if not (cw is None or cw == "balanced" or isinstance(cw, dict)):
            raise ValueError(f"class_weight must be None, 'balanced' or a dict, got {cw!r}")
        if self.penalty is None and self.C != 1.0:  # scikit-learn's warning
            warnings.warn("Setting penalty=None will ignore the C and l1_ratio parameters", UserWarning, stacklevel=3)

    def _penalty(self) -> tuple[str | None, float]:
        """The penalty and its L1 share, as scikit-learn reads ``penalty`` / ``l1_ratio`` / ``C``
        (``penalty="auto"``: from ``l1_ratio``, 0 L2, 1 L1, between elastic net; ``C=np.inf`` none)."""
        r = self.l1_ratio
        penalty = self.penalty
        if penalty in ("auto", "deprecated"):
            penalty = "l2" if r in (0, None) else "l1" if r == 1 else "elasticnet"
            if self.C == np.inf:
                penalty = None
        share = {"l1": 1.0, "elasticnet": float(r or 0.0)}.get(penalty, 0.0)
        return penalty, share

    def _labels(self, y: Any, G: GDataSet, W: GDataSet | None, w_host: np.ndarray | None
                ) -> tuple[GDataSet, np.ndarray, np.ndarray]:
        """(class codes blocked like G, classes, weighted class counts) from ``y``; ``W`` the
        weights blocked like G (``w_host``: their host copy when they came from the host)."""
        from sklearn.utils.multiclass import check_classification_targets
        from sklearn.utils.validation import column_or_1d

        if input_kind(y).container == "gdataset" or (input_kind(y).lazy and np.dtype(y.dtype).kind in "biuf"):
            Yl = aligned(y, G, "y")
            args = () if W is None else (W,)
            classes, counts, nan = Yl.reduce_blocks(_k.label_counts, _k.label_counts_combine, *args,
                                                    name="logreg-labels").compute()
            if nan:
                raise ValueError("Input y contains NaN.")
            check_classification_targets(classes)  # e.g. "Unknown label type: continuous"
            Y = Yl.map_blocks(_k.encode_labels, classes, dtype=np.int32, ncols=None, name="logreg-codes")
            return Y, classes, counts
        y = column_or_1d(host_array(y), warn=True)
        if y.shape[0] != G.shape[0]:
            raise ValueError("Found input variables with inconsistent numbers of samples: "
                             f"[{G.shape[0]}, {y.shape[0]}]")
        if y.dtype.kind == "O":  # labels of mixed types: sklearn's error, before they are sorted
            check_classification_targets(y)
        classes, codes = encode(y)
        check_classification_targets(classes)  # (1-D: the labels' kind is their distinct values')
        Y = from_array(codes.astype(np.int32), block_rows=G.row_blocks)
        if W is not None and w_host is None:  # weights on the devices: count there
            counts = None
        else:
            counts = np.bincount(codes, weights=w_host, minlength=len(classes)).astype(np.float64)
        return Y, classes, counts

    def _weights(self, sample_weight: Any, G: GDataSet) -> tuple[GDataSet | None, np.ndarray | None]:
        """(weights blocked like G or None, host copy or None)."""
        if sample_weight is None:
            return None, None
        if input_kind(sample_weight).lazy:
            W = aligned(sample_weight, G, "sample_weight").astype(np.float64)
            check_finite(W, "sample_weight")
            return W, None
        from sklearn.utils.validation import _check_sample_weight

        w = _check_sample_weight(host_array(sample_weight), np.empty((G.shape[0], 0)), dtype=np.float64)
        return from_array(w, block_rows=G.row_blocks), w

    def _class_weights(self, classes: np.ndarray, counts: np.ndarray | None, Y: GDataSet,
                       W: GDataSet | None) -> np.ndarray | None:
        cw = self.class_weight
        if cw is None:
            return None
        if cw == "balanced":
            if counts is None:
                counts = Y.reduce_blocks(weighted_bincount, sum_parts, len(classes), W,
                                         name="logreg-class-counts").compute()
            if (counts <= 0).any():
                raise ValueError("class_weight='balanced' needs a positive (weighted) count for every class")
            return counts.sum() / (len(classes) * counts)
        unknown = [k for k in cw if k not in set(classes.tolist())]
        if unknown:
            raise ValueError(f"The classes, {unknown}, are not in class_weight")
        return np.array([float(cw.get(c, 1.0)) for c in classes.tolist()])

    # -- fit -------------------------------------------------------------------------------------
    @in_task_scope
    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> LogisticRegression:
        """Fit the model.

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, CuPy array or GDataSet of shape (n_samples, n_features)
        y : array-like, Series, GDataSet or dask array of shape (n_samples,)
            Class labels; a GDataSet or dask array is used blockwise (blocked like X, or rechunked).
        sample_weight : array-like, GDataSet or dask array of shape (n_samples,), optional

        Raises
        ------
        ValueError
            NaN/inf, wrong shapes, fewer than two classes, continuous targets, bad parameters.
        """
        self._check_params()
        with self._job():
            return self._fit(X, y, sample_weight)

    def _fit(self, X: Any, y: Any, sample_weight: Any) -> LogisticRegression:
        inp, y = self._input_xy(X, y, accept_sparse="csr")
        G = inp.gdataset(block_rows=y.row_blocks if isinstance(y, GDataSet) else None)  # X follows a blocked y
        n, d = G.shape
        W, w_host = self._weights(sample_weight, G)
        Y, classes, counts = self._labels(y, G, W, w_host)
        if len(classes) < 2:
            raise ValueError("This solver needs samples of at least 2 classes in the data, but the data "
                             f"contains only one class: {classes[0]!r}")
        self.classes_ = classes
        K = 1 if len(classes) == 2 else len(classes)
        class_w = self._class_weights(classes, counts, Y, W)
        # one pass for the weight sum when the weights live on the devices
        if W is None and class_w is None:
            sw_sum = float(n)
        elif W is not None and w_host is not None and class_w is None:
            sw_sum = float(w_host.sum())
        else:
            sw_sum = float(Y.reduce_blocks(weight_sum, sum_parts, W, class_w, name="logreg-wsum").compute())
        if not sw_sum > 0:
            raise ValueError(f"the sample weights must have a positive sum, got {sw_sum}")
        layout = Layout(K, d, self.fit_intercept)
        penalty, l1_ratio = self._penalty()
        C = np.inf if penalty is None else self.C
        solver = "lbfgs" if self.solver in _SAME_PROBLEM else self.solver
        algo = LogisticLoop(layout, W is not None, class_w, sw_sum, C, solver, self.max_iter, self.tol,
                             GRAM_MAX_FEATURES, l1_ratio=l1_ratio)
        progress = Progress(self.verbose, self.callback, total=self.max_iter, desc="LogisticRegression")
        try:
            res = run_loop(algo, {"X": G, "Y": Y, "W": W}, SolverState(self._initial(layout)), progress=progress)
        except NotFinite as e:
            check_finite(G)
            raise ValueError(f"{e}; scale the features down (e.g. StandardScaler)") from None
        if res.state.status != 0:
            _convergence_warning(_not_converged(self.solver, res.iterations) + f" (status={res.state.status}): "
                                 f"{res.state.message}")
        coef, intercept = layout.unpack(res.state.x)
        dtype = G.dtype
        self.coef_ = self._to_output(coef.astype(dtype), inp.kind, G)
        self.intercept_ = self._to_output(intercept.astype(dtype), inp.kind, G)
        self.n_iter_ = np.array([min(res.iterations, self.max_iter)], dtype=np.int32)
        self.history_ = res.history
        self.fit_mode_ = res.mode
        self.pass_times_ = list(res.state.passes)
        return self

    def _initial(self, layout: Layout) -> np.ndarray:
        K, d = layout.K, layout.d
        coef, intercept = np.zeros((K, d)), np.zeros(K)
        if self.warm_start and hasattr(self, "coef_"):
            c, b = to_numpy(self.coef_), to_numpy(self.intercept_)
            if c.shape != (K, d):
                raise ValueError(f"warm start: the previous coef_ has shape {c.shape}, expected {(K, d)}")
            coef, intercept = c.astype(np.float64), b.astype(np.float64)
        return layout.pack(coef, intercept if self.fit_intercept else np.zeros(K))

    # -- predict ---------------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "coef_")

    @in_task_scope
    def decision_function(self, X: Any) -> Any:
        """Confidence scores ``X @ coef_.T + intercept_``: shape (n_samples,) for two classes,
        else (n_samples, n_classes). NumPy (CuPy for CuPy input; see ``output_type``); for a GDataSet
        or dask input a lazy collection blocked like X."""
        self._check_fitted()
        inp = self._input(X, reset=False, accept_sparse="csr")
        if inp.kind.lazy:
            return self._lazy(inp, decision_block, None)
        scores = self._scores(inp)
        return self._to_output(scores.ravel() if scores.shape[1] == 1 else scores, inp.kind, inp.data)

    def _lazy(self, inp: Input, func: Any, dtype: Any, *extra: Any) -> Any:
        """``func(block, coef, intercept, *extra)`` per block of a GDataSet / dask input, as a lazy
        GDataSet (dask array for dask input)."""
        G = inp.gdataset()
        coef, intercept = to_numpy(self.coef_), to_numpy(self.intercept_)
        K = coef.shape[0]
        score_dtype = np.result_type(G.dtype, coef.dtype)
        ncols = {decision_block: None if K == 1 else K, proba_block: max(K, 2), predict_block: None}[func]
        return self._blockwise(inp, func, coef, intercept, *extra, dtype=dtype or score_dtype, ncols=ncols,
                               name=f"logreg-{func.__name__.strip('_')}")

    def _scores(self, inp: Input) -> Any:
        """Decision scores (n_samples, K) of in-memory input (or of lazy input, computed): NumPy, or
        CuPy for CuPy input (computed on its device)."""
        if inp.kind.host:
            return inp.data @ to_numpy(self.coef_).T + to_numpy(self.intercept_)
        if module_name(inp.data) == "cupy":
            import cupy

            return inp.data @ cupy.asarray(self.coef_).T + cupy.asarray(self.intercept_)
        G = inp.gdataset()
        coef, intercept = to_numpy(self.coef_), to_numpy(self.intercept_)
        K = coef.shape[0]
        dtype = np.result_type(G.dtype, coef.dtype)
        return to_numpy(G.map_blocks(checked_decision, coef, intercept, dtype=dtype, ncols=K,
                                     name="logreg-decision").compute())

    @in_task_scope
    def predict(self, X: Any) -> Any:
        """Class labels: ``classes_[argmax]`` of the scores. NumPy (CuPy for CuPy input and numeric
        classes; see ``output_type``); for a GDataSet or dask input with numeric classes, a lazy
        collection blocked like X."""
        self._check_fitted()
        inp = self._input(X, reset=False, accept_sparse="csr")
        if inp.kind.lazy and self.classes_.dtype.kind in "biuf":
            return self._lazy(inp, predict_block, self.classes_.dtype, self.classes_)
        scores = self._scores(inp)
        scores = scores.ravel() if scores.shape[1] == 1 else scores
        idx = (scores > 0).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)
        return self._to_output(self.classes_[to_numpy(idx)], inp.kind, inp.data)

    @in_task_scope
    def predict_proba(self, X: Any) -> Any:
        """Class probabilities, shape (n_samples, n_classes): sigmoid for two classes, softmax else.
        NumPy (CuPy for CuPy input; see ``output_type``); for a GDataSet or dask input a lazy
        collection blocked like X."""
        self._check_fitted()
        inp = self._input(X, reset=False, accept_sparse="csr")
        if inp.kind.lazy:
            return self._lazy(inp, proba_block, None)
        scores = self._scores(inp)
        return self._to_output(probabilities(scores.ravel() if scores.shape[1] == 1 else scores), inp.kind,
                               inp.data)

    def predict_log_proba(self, X: Any) -> Any:
        """Logarithm of :meth:`predict_proba` (lazy for a GDataSet or dask input)."""
        proba = self.predict_proba(X)
        if input_kind(proba).lazy:
            return np.log(proba)
        return array_namespace(proba).log(proba)

    @in_task_scope
    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Mean accuracy on ``X``, ``y`` (``y`` and weights may be GDataSets or dask arrays)."""
        from sklearn.metrics import accuracy_score

        return float(accuracy_score(host_array(y), host_array(self.predict(X)),
                                    sample_weight=host_array(sample_weight)))


def _not_converged(solver: str, iterations: int) -> str:
    """The first line of the ConvergenceWarning, as scikit-learn words it for ``solver`` (the names solved by
    gdask's lbfgs say so)."""
    by = "" if solver in _SOLVERS else " (solved by gdask's lbfgs)"
    if solver in ("sag", "saga"):
        return f"The max_iter was reached which means the coef_ did not converge after {iterations} iteration(s){by}"
    if solver == "newton-cholesky":
        return f"Newton solver did not converge after {iterations} iterations{by}"
    tail = ". Increase the number of iterations." if solver == "newton-cg" else ""
    return f"{solver} failed to converge after {iterations} iteration(s){by}{tail}"


def _convergence_warning(msg: str) -> None:
    from sklearn.exceptions import ConvergenceWarning

    warnings.warn(msg + "\nIncrease the number of iterations (max_iter) or scale the data "
                  "(e.g. sklearn.preprocessing.StandardScaler).", ConvergenceWarning, stacklevel=4)
