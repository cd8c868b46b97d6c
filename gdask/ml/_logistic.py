"""L2-penalised logistic regression over GDataSet blocks (scikit-learn API)."""

from __future__ import annotations

import numbers
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin

from gdask.devices import array_namespace, asarray_like, to_numpy
from gdask.gdataset import GDataSet, IterativeAlgorithm, LoopContext, Progress, from_array, run_loop, sum_parts
from gdask.gdataset import from_dask_array as gdask_from_dask_array
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
    require_finite,
    shared_docs,
)

__all__ = ["LogisticRegression"]

_SOLVERS = ("lbfgs", "gd")
#: gd computes the full weighted Gram matrix below this many features (else only its trace)
_GRAM_MAX_FEATURES = 4096


def _aligned(v: Any, G: GDataSet, what: str) -> GDataSet:
    """A 1-D GDataSet blocked exactly like ``G`` from a GDataSet, dask array or dask Series ``v``."""
    if isinstance(v, GDataSet):
        out = v
    else:
        import dask.array as da

        if hasattr(v, "to_dask_array"):  # dask Series / single-column DataFrame
            v = v.to_dask_array(lengths=True)
        if not isinstance(v, da.Array):
            raise TypeError(f"{what} must be an array, a pandas Series, a GDataSet or a dask array, "
                            f"got {type(v).__name__}")
        if v.ndim == 2 and v.shape[1] == 1:
            v = v[:, 0]
        if v.ndim == 1 and v.shape[0] == G.shape[0] and tuple(v.chunks[0]) != G.row_blocks:
            v = v.rechunk({0: G.row_blocks})
        out = gdask_from_dask_array(v) if v.ndim == 1 else None
        if out is None:
            raise ValueError(f"{what} must be 1-D, got shape {v.shape}")
    if out.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {out.shape}")
    if out.shape[0] != G.shape[0]:
        raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                         f"X has {G.shape[0]}, {what} has {out.shape[0]}")
    if out.row_blocks != G.row_blocks:
        raise ValueError(f"{what} as a GDataSet must be blocked like X (row_blocks {G.row_blocks[:4]}...); "
                         f"got {out.row_blocks[:4]}...; create it with block_rows=X.row_blocks")
    return out


class _Layout:
    """The parameter vector as scikit-learn lays it out: binary ``[coef..., intercept]``;
    multinomial ``(K, d + 1)`` raveled in Fortran order."""

    def __init__(self, K: int, d: int, fit_intercept: bool) -> None:
        self.K, self.d, self.fit_intercept = K, d, fit_intercept

    @property
    def n_dof(self) -> int:
        return self.d + int(self.fit_intercept)

    def unpack(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = x.reshape(self.K, self.n_dof, order="F") if self.K > 1 else x[None, :]
        if self.fit_intercept:
            return w[:, :-1], w[:, -1].copy()
        return w, np.zeros(self.K)

    def pack(self, coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
        w = np.concatenate([coef, intercept[:, None]], axis=1) if self.fit_intercept else coef
        return w.ravel(order="F") if self.K > 1 else w[0].copy()


@dataclass
class SolverState:
    """A fit's state between iterations (plain data: also its checkpoint): the parameters and what the
    solver carries over, the seconds of each pass so far, and how the solver ended."""

    x: np.ndarray  # the parameters, laid out as _Layout packs them
    passes: list[float] = field(default_factory=list)  # seconds of each pass over the data
    status: int = 0  # 0: converged; else why the solver stopped (1: max_iter reached)
    message: str = ""
    z: np.ndarray | None = None  # gd: the momentum point (None: x)
    t: float = 1.0  # gd: the momentum's step counter


class _LogisticLoop(IterativeAlgorithm):
    """scikit-learn's objective ``f(w) = sum_i s_i loss_i / S + ||W||^2 / (2 C S)`` minimised on the
    iteration engine (``s_i`` the row weights, ``S`` their sum; intercepts not penalised): every
    evaluation of the loss and its gradient is one pass over the blocks, combined in block order.
    On the workers every worker runs the same solver on the all-gathered objective (L-BFGS is
    deterministic: all take the same steps). The state is a :class:`SolverState`; a resumed fit
    restarts the solver from the last finished iteration's parameters."""

    name = "logistic-regression"

    def __init__(self, layout: _Layout, weighted: bool, class_w: np.ndarray | None, sw_sum: float, C: float,
                 solver: str, max_iter: int, tol: float, gram_max_features: int) -> None:
        self.layout = layout
        self.weighted = weighted
        self.class_w = class_w
        self.sw_sum = float(sw_sum)
        self.l2 = 0.0 if np.isinf(C) else 1.0 / (C * self.sw_sum)
        self.solver = solver
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.gram_max_features = gram_max_features

    def _w(self, ctx: LoopContext) -> Any:
        return ctx.data["W"] if self.weighted else None

    def objective(self, ctx: LoopContext, x: np.ndarray, passes: list) -> tuple[float, np.ndarray]:
        """The objective and its gradient at ``x``: one pass over the blocks (its seconds appended to
        ``passes``)."""
        L = self.layout
        coef, intercept = L.unpack(x)
        t0 = time.perf_counter()
        parts = ctx.map(_k.loss_grad, ctx.data["X"], ctx.data["Y"], np.ascontiguousarray(coef, dtype=np.float64),
                        np.asarray(intercept, dtype=np.float64), self._w(ctx), self.class_w,
                        name="logreg-loss-grad")
        passes.append(time.perf_counter() - t0)
        loss, gc, gi = _k.loss_grad_combine(parts)
        f = loss / self.sw_sum + 0.5 * self.l2 * float((coef * coef).sum())
        gc = gc / self.sw_sum + self.l2 * coef
        if not np.isfinite(f) or not np.isfinite(gc).all():
            raise NotFinite("the logistic loss overflowed")
        gi = gi / self.sw_sum if L.fit_intercept else np.zeros(L.K)
        return f, L.pack(gc, gi)

    def run(self, state: SolverState, ctx: LoopContext) -> SolverState:
        if self.solver == "lbfgs":
            return self._lbfgs(state, ctx)
        return self._gd(state, ctx)

    def _lbfgs(self, state: SolverState, ctx: LoopContext) -> SolverState:
        from scipy.optimize import minimize

        last: dict[str, Any] = {}
        passes = list(state.passes)

        def fun(x):
            f, g = self.objective(ctx, x, passes)
            last["f"], last["g"] = f, g
            return f, g

        def callback(xk):
            f, g = last["f"], last["g"]
            ctx.checkpoint(replace(state, x=np.array(xk, copy=True), passes=list(passes)), loss=f,
                           grad_max=float(np.abs(g).max()),
                           line=f"iteration {ctx.iteration + 1}: loss {f:.10g}, max |gradient| "
                                f"{np.abs(g).max():.3g}")

        left = self.max_iter - ctx.iteration
        if left <= 0:
            return replace(state, status=1, message="max_iter reached")
        res = minimize(fun, state.x, method="L-BFGS-B", jac=True, callback=callback,
                       options={"maxiter": left, "maxls": 50, "gtol": self.tol, "ftol": 64 * np.finfo(float).eps})
        return replace(state, x=res.x, status=int(res.status), message=str(res.message), passes=passes)

    def _preconditioner(self, ctx: LoopContext, passes: list):
        """``g -> B^-1 g`` for the Hessian bound ``B`` (one pass over the data)."""
        L = self.layout
        t0 = time.perf_counter()
        curv = 0.25 if L.K == 1 else 0.5  # largest Hessian eigenvalue of the binomial / softmax loss
        pen = np.ones(L.n_dof)
        if L.fit_intercept:
            pen[-1] = 0.0  # the intercept is not penalised
        small = L.d < self.gram_max_features
        chunk = _k.gram if small else _k.sq_norms
        H = sum_parts(ctx.map(chunk, ctx.data["X"], self._w(ctx), self.class_w, ctx.data["Y"],
                              name="logreg-gram")) / self.sw_sum
        passes.append(time.perf_counter() - t0)
        if not np.all(np.isfinite(H)):
            raise NotFinite("X is too large in magnitude for gradient descent")
        if not small:  # H = trace of the Gram matrix: a bound on its largest eigenvalue
            step = 1.0 / max(curv * float(H) + self.l2, 1e-300)
            return lambda g: step * g
        if not L.fit_intercept:
            H = H[:-1, :-1]
        lam, V = np.linalg.eigh(curv * H + self.l2 * np.diag(pen))
        lam = np.maximum(lam, max(lam[-1], 1e-300) * 1e-10)  # singular Gram (constant/duplicate columns)
        Vs = V / lam

        def apply(g: np.ndarray) -> np.ndarray:
            Gm = g.reshape(L.K, L.n_dof, order="F") if L.K > 1 else g[None, :]
            out = (Gm @ Vs) @ V.T
            return out.ravel(order="F") if L.K > 1 else out[0]

        return apply

    def _gd(self, state: SolverState, ctx: LoopContext) -> SolverState:
        """Full-batch gradient descent, preconditioned by a fixed bound on the Hessian, with Nesterov
        momentum and gradient-based adaptive restart (O'Donoghue & Candès 2015).

        The Hessian of the mean log-loss is at most ``c [X, 1]^T diag(s) [X, 1] / S`` (``c`` = 1/4
        binomial, 1/2 multinomial; Böhning 1992), so the step ``x - B^-1 g`` with ``B`` that bound
        plus the penalty never increases the loss, whatever the scaling of the features. One pass
        at the start computes the weighted Gram matrix (above ``gram_max_features`` features only
        its trace, and the step becomes the plain ``g / L``); then each iteration is one pass.
        """
        passes = list(state.passes)
        precond = self._preconditioner(ctx, passes)
        x = state.x.copy()
        z = (x if state.z is None else state.z).copy()
        t = float(state.t)
        while ctx.iteration < self.max_iter:
            f, g = self.objective(ctx, z, passes)
            if np.abs(g).max() <= self.tol:
                return replace(state, x=z, status=0, message="converged", passes=passes)
            x_new = z - precond(g)
            if g @ (x_new - x) > 0:  # momentum points uphill: restart
                t = 1.0
                z = x_new
            else:
                t_new = 0.5 * (1 + np.sqrt(1 + 4 * t * t))
                z = x_new + ((t - 1) / t_new) * (x_new - x)
                t = t_new
            x = x_new
            ctx.checkpoint(replace(state, x=x, z=z, t=t, passes=list(passes)), loss=f,
                           grad_max=float(np.abs(g).max()),
                           line=f"iteration {ctx.iteration + 1}: loss {f:.10g}, max |gradient| {np.abs(g).max():.3g}")
        return replace(state, x=x, status=1, message="max_iter reached", passes=passes)


@shared_docs
class LogisticRegression(DeviceEstimatorMixin, ClassifierMixin, BaseEstimator):
    """L2-penalised logistic regression over device-resident blocks, scikit-learn API.

    Minimises scikit-learn's objective ``sum_i s_i logloss_i / S + ||W||^2 / (2 C S)`` (``s_i``
    the sample weights, ``S`` their sum; the intercept is not penalised): binary problems with the
    binomial loss, three or more classes with the multinomial (softmax) loss, as scikit-learn's
    default. Each evaluation of the loss and its gradient is one pass over the blocks: one task per
    worker thread over the blocks it holds, combined on the client (one Dask round trip).

    Accepts NumPy / CuPy arrays, pandas DataFrames, lists and GDataSets; ``y`` as an array, list
    or Series, or as a GDataSet / dask array blocked like ``X``. Works with a ``distributed.Client``
    (blocks on the cluster's devices) or without one (local threads).

    Parameters
    ----------
    penalty : {"l2", None}, default "l2"
        The L2 penalty (scikit-learn's default), or None for no penalty (``C`` is then ignored).
        "l1" and "elasticnet" are not supported (ValueError).
    C : float, default 1.0
        Inverse of the regularisation strength (``np.inf``: no penalty).
    l1_ratio : float, default 0.0
        scikit-learn's mix of L1 in the penalty; only 0.0 (or None), a pure L2 penalty, is supported.
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
    solver : {"lbfgs", "gd"}, default "lbfgs"
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

    Examples
    --------
    >>> X = gdask.from_array(x, block_rows=250_000)
    >>> clf = gdask.ml.LogisticRegression(C=1.0).fit(X, y)
    >>> clf.predict_proba(X[:10])     # doctest: +SKIP
    """

    def __init__(self, penalty: str | None = "l2", *, C: float = 1.0, l1_ratio: float | None = 0.0,
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
        tags.input_tags.sparse = False
        return tags

    # -- validation ------------------------------------------------------------------------------
    def _check_params(self) -> None:
        if isinstance(self.C, bool) or not isinstance(self.C, numbers.Real) or not self.C > 0:
            raise ValueError(f"C must be a positive float (np.inf for no penalty), got {self.C!r}")
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, numbers.Integral) or self.max_iter < 0:
            raise ValueError(f"max_iter must be a non-negative integer, got {self.max_iter!r}")
        if isinstance(self.tol, bool) or not isinstance(self.tol, numbers.Real) or not self.tol >= 0:
            raise ValueError(f"tol must be a non-negative float, got {self.tol!r}")
        if self.solver not in _SOLVERS:
            raise ValueError(f"solver must be one of {_SOLVERS} (the solvers gdask supports), got {self.solver!r}")
        if self.penalty not in ("l2", None, "deprecated"):
            raise ValueError(f"penalty {self.penalty!r} is not supported; supported: 'l2' and None (no penalty)")
        if self.l1_ratio not in (None, 0, 0.0):
            raise ValueError(f"l1_ratio={self.l1_ratio!r} is not supported: only a pure L2 penalty (l1_ratio=0.0 "
                             "or None) is")
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

    def _labels(self, y: Any, G: GDataSet, W: GDataSet | None, w_host: np.ndarray | None
                ) -> tuple[GDataSet, np.ndarray, np.ndarray]:
        """(class codes blocked like G, classes, weighted class counts) from ``y``; ``W`` the
        weights blocked like G (``w_host``: their host copy when they came from the host)."""
        from sklearn.utils.multiclass import check_classification_targets
        from sklearn.utils.validation import column_or_1d

        if input_kind(y).container == "gdataset" or (input_kind(y).lazy and np.dtype(y.dtype).kind in "biuf"):
            Yl = _aligned(y, G, "y")
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
        check_classification_targets(y)
        classes, codes = _encode(y)
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
            W = _aligned(sample_weight, G, "sample_weight").astype(np.float64)
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
                counts = Y.reduce_blocks(_weighted_bincount, sum_parts, len(classes), W,
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
        X : array-like, DataFrame, CuPy array or GDataSet of shape (n_samples, n_features)
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
        inp, y = self._input_xy(X, y)
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
            sw_sum = float(Y.reduce_blocks(_weight_sum, sum_parts, W, class_w, name="logreg-wsum").compute())
        if not sw_sum > 0:
            raise ValueError(f"the sample weights must have a positive sum, got {sw_sum}")
        layout = _Layout(K, d, self.fit_intercept)
        C = np.inf if self.penalty is None else self.C
        algo = _LogisticLoop(layout, W is not None, class_w, sw_sum, C, self.solver, self.max_iter, self.tol,
                             _GRAM_MAX_FEATURES)
        progress = Progress(self.verbose, self.callback, total=self.max_iter, desc="LogisticRegression")
        try:
            res = run_loop(algo, {"X": G, "Y": Y, "W": W}, SolverState(self._initial(layout)), progress=progress)
        except NotFinite as e:
            check_finite(G)
            raise ValueError(f"{e}; scale the features down (e.g. StandardScaler)") from None
        if res.state.status != 0:
            _convergence_warning(f"{self.solver} failed to converge after {res.iterations} iteration(s) "
                                 f"(status={res.state.status}): {res.state.message}")
        coef, intercept = layout.unpack(res.state.x)
        dtype = G.dtype
        self.coef_ = self._to_output(coef.astype(dtype), inp.kind, G)
        self.intercept_ = self._to_output(intercept.astype(dtype), inp.kind, G)
        self.n_iter_ = np.array([min(res.iterations, self.max_iter)], dtype=np.int32)
        self.history_ = res.history
        self.fit_mode_ = res.mode
        self.pass_times_ = list(res.state.passes)
        return self

    def _initial(self, layout: _Layout) -> np.ndarray:
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
        inp = self._input(X, reset=False)
        if inp.kind.lazy:
            return self._lazy(inp, _decision_block, None)
        scores = self._scores(inp)
        return self._to_output(scores.ravel() if scores.shape[1] == 1 else scores, inp.kind, inp.data)

    def _lazy(self, inp: Input, func: Any, dtype: Any, *extra: Any) -> Any:
        """``func(block, coef, intercept, *extra)`` per block of a GDataSet / dask input, as a lazy
        GDataSet (dask array for dask input)."""
        G = inp.gdataset()
        coef, intercept = to_numpy(self.coef_), to_numpy(self.intercept_)
        K = coef.shape[0]
        score_dtype = np.result_type(G.dtype, coef.dtype)
        ncols = {_decision_block: None if K == 1 else K, _proba_block: max(K, 2), _predict_block: None}[func]
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
        return to_numpy(G.map_blocks(_checked_decision, coef, intercept, dtype=dtype, ncols=K,
                                     name="logreg-decision").compute())

    @in_task_scope
    def predict(self, X: Any) -> Any:
        """Class labels: ``classes_[argmax]`` of the scores. NumPy (CuPy for CuPy input and numeric
        classes; see ``output_type``); for a GDataSet or dask input with numeric classes, a lazy
        collection blocked like X."""
        self._check_fitted()
        inp = self._input(X, reset=False)
        if inp.kind.lazy and self.classes_.dtype.kind in "biuf":
            return self._lazy(inp, _predict_block, self.classes_.dtype, self.classes_)
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
        inp = self._input(X, reset=False)
        if inp.kind.lazy:
            return self._lazy(inp, _proba_block, None)
        scores = self._scores(inp)
        return self._to_output(_probabilities(scores.ravel() if scores.shape[1] == 1 else scores), inp.kind,
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


def _probabilities(scores: Any) -> Any:
    """Class probabilities from decision scores ((n,) binary or (n, K)), in the scores' namespace."""
    xp = array_namespace(scores)
    if scores.ndim == 1:
        p1 = _expit(scores, xp)
        return xp.stack([1 - p1, p1], axis=1)
    m = xp.max(scores, axis=1, keepdims=True)
    e = xp.exp(scores - m)
    return e / xp.sum(e, axis=1, keepdims=True)


def _decision_block(X, coef, intercept):
    z = _checked_decision(X, coef, intercept)
    return z[:, 0] if z.shape[1] == 1 else z


def _proba_block(X, coef, intercept):
    return _probabilities(_decision_block(X, coef, intercept))


def _predict_block(X, coef, intercept, classes):
    z = _decision_block(X, coef, intercept)
    xp = array_namespace(z)
    idx = xp.astype(z > 0, xp.int64) if z.ndim == 1 else xp.argmax(z, axis=1)
    return xp.take(asarray_like(classes, z), idx)


def _checked_decision(X, coef, intercept):
    """:func:`gdask.ml.kernels.decision` of one block; NaN or infinity in it raises, as for NumPy
    input (scikit-learn's check)."""
    require_finite(X)
    return _k.decision(X, coef, intercept)


def _encode(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(y, return_inverse=True)``; integer labels of a small range by counting (no sort)."""
    if y.dtype.kind in "iu" and y.size:
        lo, hi = int(y.min()), int(y.max())
        if hi - lo < max(1 << 16, y.size):
            off = y.astype(np.int64) - lo
            present = np.bincount(off, minlength=hi - lo + 1) > 0
            classes = (np.flatnonzero(present) + lo).astype(y.dtype)
            return classes, (np.cumsum(present) - 1)[off]
    classes, codes = np.unique(y, return_inverse=True)
    return classes, codes.ravel()


def _expit(z: Any, xp) -> Any:
    e = xp.exp(-xp.abs(z))
    q = 1 / (1 + e)
    return xp.where(z >= 0, q, e * q)


def _convergence_warning(msg: str) -> None:
    from sklearn.exceptions import ConvergenceWarning

    warnings.warn(msg + "\nIncrease the number of iterations (max_iter) or scale the data "
                  "(e.g. sklearn.preprocessing.StandardScaler).", ConvergenceWarning, stacklevel=4)


def _weighted_bincount(y, k, w=None):
    """Weighted count of each class code ``0..k-1`` in a block, on the host."""
    if isinstance(y, np.ndarray):
        return np.bincount(y, weights=w, minlength=k).astype(np.float64)
    import array_api_extra as xpx

    xp = array_namespace(y)
    oh = xpx.one_hot(xp.astype(y, xp.int64), k, dtype=xp.float64, xp=xp)
    return to_numpy(xp.sum(oh if w is None else oh * xp.astype(w, xp.float64)[:, None], axis=0))


def _weight_sum(y, w=None, class_w=None):
    s = _k.row_weights(y, w, class_w)
    if s is None:
        return float(y.shape[0])
    return float(s.sum() if isinstance(s, np.ndarray) else array_namespace(s).sum(s))
