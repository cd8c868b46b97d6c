"""A linear model's data on the engine: X, y and sample weights blocked alike, and the
(centered, weighted) normal equations all-gathered from the blocks in float64.

Few features (``n_features <= GRAM_MAX_FEATURES``): one pass gives the Gram matrix ``X^T S X``,
``X^T S y`` and ``y^T S y`` (:mod:`gdask.ml._gram`), and the models solve on the host. Many
features: one pass gives the column means (and ``X^T S y`` a second one), and the solvers of
:mod:`gdask.ml._linear_model._iterative` apply ``X^T S X`` as one pass per iteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gdask.devices import array_namespace, to_numpy
from gdask.gdataset import GDataSet, IterativeAlgorithm, LoopContext, from_array
from gdask.ml._adapt import aligned, as_gdataset, sample_weights
from gdask.ml._base import is_host_input, module_name
from gdask.ml._gram import Moments, _f64, _stacked, run_passes, sum_in_order

__all__ = ["GRAM_MAX_FEATURES", "Data", "Problem", "prepare", "problem"]

#: above this many features the Gram matrix is not formed: the iterative solvers run instead
GRAM_MAX_FEATURES = 2048


@dataclass
class Data:
    """X, y (float64, ``(n,)`` or ``(n, t)``) and weights (or None) blocked alike."""

    X: GDataSet
    Y: GDataSet
    W: GDataSet | None
    kind: str
    y_1d: bool

    @property
    def d(self) -> int:
        return self.X.shape[1]

    @property
    def t(self) -> int:
        return 1 if self.y_1d else self.Y.shape[1]

    def arrays(self) -> dict:
        return {"X": self.X, "Y": self.Y, "W": self.W}


@dataclass
class Problem:
    """The weighted least-squares problem: ``Q = Xc^T S Xc`` (None with many features),
    ``q = Xc^T S yc`` (d, t), ``yy = diag(yc^T S yc)`` (t), the weight sum and the offsets (zero
    without an intercept: then nothing is centered)."""

    Q: np.ndarray | None
    q: np.ndarray
    yy: np.ndarray
    sw: float
    x_mean: np.ndarray
    y_mean: np.ndarray
    diag: np.ndarray  # diag of Q (column sums of squares)
    mode: str


def _y_host(y: Any, n: int) -> np.ndarray:
    from sklearn.utils import check_array

    y = to_numpy(y) if module_name(y) == "cupy" else y
    y = check_array(y, ensure_2d=False, dtype=np.float64, input_name="y")
    if y.ndim not in (1, 2):
        raise ValueError(f"y must have shape (n_samples,) or (n_samples, n_targets), got {y.shape}")
    if y.shape[0] != n:
        raise ValueError(f"Found input variables with inconsistent numbers of samples: [{n}, {y.shape[0]}]")
    return y


def prepare(est: Any, X: Any, y: Any, sample_weight: Any, *, non_negative: bool = False) -> Data:
    """Validate and block X, y and the weights (scikit-learn's checks for host input)."""
    if y is None:
        raise ValueError(f"{type(est).__name__} requires y to be passed, but the target y is None")
    if is_host_input(X) and is_host_input(y) and module_name(y) != "cupy":
        from sklearn.utils.validation import validate_data

        Xh, yh = validate_data(est, X, y, dtype=[np.float64, np.float32], multi_output=True, y_numeric=True)
        G = from_array(Xh)
        kind = "numpy"
        yh = np.asarray(yh, dtype=np.float64)
    else:
        G, kind = as_gdataset(est, X, reset=True)
        yh = None if isinstance(y, GDataSet) or hasattr(y, "__dask_graph__") else _y_host(y, G.shape[0])
    Y = aligned(yh if yh is not None else y, G, "y", ndim=(1, 2))
    W, _ = sample_weights(sample_weight, G, non_negative=non_negative)
    return Data(G, Y, W, kind, Y.ndim == 1)


def _check(problem_arrays: tuple) -> None:
    if not all(np.isfinite(a).all() for a in problem_arrays):
        raise ValueError("Input X or y contains NaN or infinity (or values too large for float64); remove or "
                         "impute them, or scale the data")


def problem(est: Any, data: Data, fit_intercept: bool, gram: bool | None = None) -> Problem:
    """The normal equations of ``data`` (one pass; two with many features)."""
    d = data.d
    if gram is None:
        gram = d <= GRAM_MAX_FEATURES
    weighted = data.W is not None
    if gram:
        res = run_passes(est, Moments(weighted, targets=True), data.arrays(), {}, total=1)
        sw, mean, m2 = res.state["moments"]
        _check((mean, m2))
        if not fit_intercept:
            m2 = m2 + sw * np.outer(mean, mean)
            mean = np.zeros_like(mean)
        return Problem(np.ascontiguousarray(m2[:d, :d]), np.ascontiguousarray(m2[:d, d:]), np.diag(m2)[d:].copy(),
                       sw, mean[:d], mean[d:], np.diag(m2)[:d].copy(),
                       res.mode)
    res = run_passes(est, _CrossProducts(weighted, fit_intercept, d), data.arrays(), {}, total=2)
    sw, mean, m2diag = res.state["col"]
    q = res.state["q"]
    _check((mean, m2diag, q))
    return Problem(None, q, m2diag[d:], sw, mean[:d], mean[d:], m2diag[:d], res.mode)


def wcol_moments_block(X: Any, W: Any = None, Y: Any = None) -> tuple[float, Any, Any]:
    """``(weight sum, mean, weighted column sums of squared deviations)`` of one block of ``[X, Y]``."""
    Z = _stacked(X, Y)
    xp = array_namespace(Z)
    if Z.shape[0] == 0:
        return 0.0, None, None
    w = None if W is None else _f64(W)
    sw = float(Z.shape[0]) if w is None else float(to_numpy(xp.sum(w)))
    if sw == 0:
        return 0.0, None, None
    mean = (xp.sum(Z, axis=0) if w is None else xp.sum(Z * w[:, None], axis=0)) / sw
    C = Z - mean
    return sw, mean, xp.sum(C * C if w is None else C * C * w[:, None], axis=0)


def xty_block(X: Any, Y: Any, mu: Any, y_mu: Any, W: Any = None) -> Any:
    """``(X - mu)^T diag(W) (Y - y_mu)`` of one block, float64, shape (d, t)."""
    Z = _f64(X) - mu
    Yf = _f64(Y)
    R = (Yf if Yf.ndim == 2 else Yf[:, None]) - y_mu
    if W is not None:
        R = R * _f64(W)[:, None]
    return Z.T @ R


class _CrossProducts(IterativeAlgorithm):
    """Many features: the weighted column moments of ``[X, y]``, then ``X^T S y`` (two passes)."""

    name = "linear-cross-products"

    def __init__(self, weighted: bool, fit_intercept: bool, d: int) -> None:
        self.weighted = weighted
        self.fit_intercept = fit_intercept
        self.d = d

    def run(self, state: dict, ctx: LoopContext) -> dict:
        from gdask.ml._decomposition._solvers import combine_col_moments

        W = ctx.data["W"] if self.weighted else None
        if "col" not in state:
            col = combine_col_moments(ctx.map(wcol_moments_block, ctx.data["X"], W, ctx.data["Y"],
                                              name="linear-column-moments"))
            sw, mean, m2 = col
            if not self.fit_intercept:  # nothing centered: sums of squares about 0
                m2 = m2 + sw * mean * mean
                mean = np.zeros_like(mean)
            state = {**state, "col": (sw, mean, m2)}
            ctx.checkpoint(state, line="column moments")
        if "q" not in state:
            sw, mean, _ = state["col"]
            d = self.d
            q = sum_in_order(ctx.map(xty_block, ctx.data["X"], ctx.data["Y"], mean[:d], mean[d:], W,
                                     name="linear-xty"))
            state = {**state, "q": q}
            ctx.checkpoint(state, line="X^T y")
        return state
