"""Blocked second moments on the engine, for PCA / TruncatedSVD and the linear models.

One pass gives, per block, the (weighted) row count, column means and centered cross products of
``[X, Y]`` in float64 (array-API code: the blocks' own namespace, on their device); the partials
are combined in block order with the parallel formula of Chan et al., so the result has the same
bits wherever the blocks sit, and centering is exact (no ``X^T X - n mu mu^T`` cancellation).
A Gram operator pass ``V -> (X - mu)^T diag(w) (X - mu) V`` serves the power iterations of the
randomized SVD and the iterative solvers for many features.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gdask.devices import array_namespace, to_numpy
from gdask.gdataset import IterativeAlgorithm, LoopContext, Progress, run_loop
from gdask.ml._base import estimator_job

__all__ = ["Moments", "combine_moments", "gram_apply_block", "moments_block", "run_passes", "sum_in_order"]


def _f64(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x.astype(np.float64, copy=False)
    xp = array_namespace(x)
    return x if x.dtype == xp.float64 else xp.astype(x, xp.float64)


def _stacked(X: Any, Y: Any) -> Any:
    Z = _f64(X)
    if Y is None:
        return Z
    xp = array_namespace(Z)
    Yf = _f64(Y)
    return xp.concat([Z, Yf if Yf.ndim == 2 else Yf[:, None]], axis=1)


def moments_block(X: Any, W: Any = None, Y: Any = None) -> tuple[float, Any, Any]:
    """``(weight sum, mean, M2)`` of one block of ``Z = [X, Y]`` in float64: ``mean`` the weighted
    column means, ``M2 = (Z - mean)^T diag(W) (Z - mean)``."""
    Z = _stacked(X, Y)
    xp = array_namespace(Z)
    if Z.shape[0] == 0:
        return 0.0, None, None
    if W is None:
        sw = float(Z.shape[0])
        mean = xp.sum(Z, axis=0) / sw
        C = Z - mean
        return sw, mean, C.T @ C
    w = _f64(W)
    sw = float(to_numpy(xp.sum(w)))
    if sw == 0:
        return 0.0, None, None
    mean = xp.sum(Z * w[:, None], axis=0) / sw
    C = Z - mean
    return sw, mean, (C * w[:, None]).T @ C


def combine_moments(parts: list) -> tuple[float, np.ndarray, np.ndarray]:
    """Chan et al.'s parallel combination of :func:`moments_block` partials, in the order given."""
    n, mean, m2 = 0.0, None, None
    for nb, mb, m2b in parts:
        if nb == 0:
            continue
        if mean is None:
            n, mean, m2 = nb, np.array(mb, dtype=np.float64), np.array(m2b, dtype=np.float64)
            continue
        tot = n + nb
        delta = mb - mean
        mean = mean + delta * (nb / tot)
        m2 = m2 + m2b + np.outer(delta, delta) * (n * nb / tot)
        n = tot
    if mean is None:
        raise ValueError("the sample weights sum to zero: nothing to fit")
    return n, mean, m2


def gram_apply_block(X: Any, mu: Any, V: Any, W: Any = None) -> Any:
    """``(X - mu)^T diag(W) ((X - mu) V)`` of one block in float64 (``mu`` None: no centering)."""
    Z = _f64(X)
    if mu is not None:
        Z = Z - mu
    P = Z @ V
    if W is not None:
        P = P * _f64(W)[:, None]
    return Z.T @ P


def sum_in_order(parts: list) -> Any:
    """The sum of per-block results, added in block order (the same bits wherever blocks sit)."""
    out = None
    for p in parts:
        if p is None:
            continue
        out = np.array(p, dtype=np.float64) if out is None else out + p
    return out


class Moments(IterativeAlgorithm):
    """One pass: the combined moments of ``[X, Y]`` (weights ``W``) as the state's ``"moments"``."""

    name = "moments"

    def __init__(self, weighted: bool = False, targets: bool = False) -> None:
        self.weighted = weighted
        self.targets = targets

    def run(self, state: dict, ctx: LoopContext) -> dict:
        if "moments" in state:
            return state
        t0 = time.perf_counter()
        parts = ctx.map(moments_block, ctx.data["X"], ctx.data["W"] if self.weighted else None,
                        ctx.data["Y"] if self.targets else None, name="gram-moments")
        state = {**state, "moments": combine_moments(parts)}
        ctx.checkpoint(state, line=f"moments pass: {time.perf_counter() - t0:.3f} s")
        return state


def run_passes(est: Any, algorithm: IterativeAlgorithm, data: dict, state: Any, *, total: int | None = None):
    """Run ``algorithm`` on the engine with ``est``'s progress (``verbose`` / ``callback``) and device
    share (``gpu`` / ``memory`` / ``job_name``); the :class:`~gdask.gdataset.EngineResult`."""
    progress = Progress(getattr(est, "verbose", 0), getattr(est, "callback", None), total=total,
                        desc=type(est).__name__)
    with estimator_job(est):
        return run_loop(algorithm, data, state, progress=progress)
