"""Iterative solvers on the engine for linear models with many features (no Gram matrix formed).

Every iteration applies ``A = Xc^T S Xc`` to a ``(n_features, n_targets)`` matrix in one pass over
the blocks (:func:`gdask.ml._gram.gram_apply_block`, partials added in block order), the rest runs
on ``d x t`` host matrices:

* :class:`ConjugateGradient`: ``(A + alpha I) w = Xc^T S yc`` per target (Ridge; with ``alpha = 0``,
  started from 0, the minimum-norm least-squares solution of LinearRegression);
* :class:`Fista`: the elastic net (Beck & Teboulle's accelerated proximal gradient, restarted when
  the momentum points uphill), stopped on scikit-learn's duality gap; the step from the largest
  eigenvalue of ``A`` found by power iteration (more passes).
"""

from __future__ import annotations

import time

import numpy as np

from gdask.gdataset import IterativeAlgorithm, LoopContext
from gdask.ml._gram import gram_apply_block, sum_in_order
from gdask.ml._linear_model._cd import enet_gap

__all__ = ["ConjugateGradient", "Fista"]


class _Operator(IterativeAlgorithm):
    """``V -> scale * A V`` as one pass (``mu`` the column means; None: no centering)."""

    def __init__(self, weighted: bool, mu: np.ndarray | None, scale: float = 1.0) -> None:
        self.weighted = weighted
        self.mu = mu
        self.scale = float(scale)

    def apply(self, ctx: LoopContext, V: np.ndarray) -> np.ndarray:
        W = ctx.data["W"] if self.weighted else None
        return self.scale * sum_in_order(ctx.map(gram_apply_block, ctx.data["X"], self.mu, V, W,
                                                 name="linear-gram-apply"))


class ConjugateGradient(_Operator):
    """CG on ``(A + alpha I) w = b`` for every column of ``b`` at once (each column its own steps);
    stops a column at ``||r|| <= tol ||b||``. State: ``w, r, p, rr, it, n_iter``."""

    name = "linear-cg"

    def __init__(self, weighted: bool, mu: np.ndarray | None, alpha: np.ndarray, b: np.ndarray, tol: float,
                 max_iter: int) -> None:
        super().__init__(weighted, mu)
        self.alpha = np.asarray(alpha, dtype=np.float64)
        self.b_norm = np.linalg.norm(b, axis=0)
        self.tol = float(tol)
        self.max_iter = int(max_iter)

    def run(self, state: dict, ctx: LoopContext) -> dict:
        st = dict(state)
        while st["it"] < self.max_iter:
            active = np.sqrt(st["rr"]) > self.tol * self.b_norm
            if not active.any():
                break
            t0 = time.perf_counter()
            p = st["p"]
            Ap = self.apply(ctx, p) + self.alpha * p
            pAp = np.einsum("ij,ij->j", p, Ap)
            a = np.where(active & (pAp > 0), st["rr"] / np.where(pAp > 0, pAp, 1.0), 0.0)
            w = st["w"] + a * p
            r = st["r"] - a * Ap
            rr = np.einsum("ij,ij->j", r, r)
            beta = np.where(active, rr / np.where(st["rr"] > 0, st["rr"], 1.0), 0.0)
            st = {"w": w, "r": r, "p": np.where(active, r + beta * p, p), "rr": np.where(active, rr, st["rr"]),
                  "it": st["it"] + 1, "n_iter": st["n_iter"] + active}
            res = float(np.max(np.sqrt(st["rr"]) / np.where(self.b_norm > 0, self.b_norm, 1.0)))
            ctx.checkpoint(st, residual=res,
                           line=f"CG iteration {st['it']}: relative residual {res:.3g}, "
                                f"{time.perf_counter() - t0:.3f} s")
        return st

    @staticmethod
    def start(b: np.ndarray) -> dict:
        w = np.zeros_like(b)
        return {"w": w, "r": b.copy(), "p": b.copy(), "rr": np.einsum("ij,ij->j", b, b), "it": 0,
                "n_iter": np.zeros(b.shape[1], dtype=np.int64)}


class Fista(_Operator):
    """The elastic net ``1/2 w^T Q w - q^T w + l1 ||w||_1 + l2/2 ||w||^2`` (``Q = scale * A``) by
    accelerated proximal gradient. State: ``L`` (step bound, after the power iterations), ``x``,
    ``z``, ``t``, ``it``, ``gap``, ``done`` (per column)."""

    name = "linear-fista"

    def __init__(self, weighted: bool, mu: np.ndarray | None, scale: float, q: np.ndarray, yy: np.ndarray,
                 l1: float, l2: float, tol: float, max_iter: int, positive: bool) -> None:
        super().__init__(weighted, mu, scale)
        self.q, self.yy = q, yy
        self.l1, self.l2 = float(l1), float(l2)
        self.tol = float(tol)
        self.max_iter = int(max_iter)
        self.positive = bool(positive)

    def _lipschitz(self, ctx: LoopContext, d: int) -> float:
        v = np.random.default_rng(0).standard_normal((d, 1))
        v /= np.linalg.norm(v)
        lam = 0.0
        for _ in range(50):
            u = self.apply(ctx, v)
            new = float(np.linalg.norm(u))
            if new == 0:
                return 1.0 + self.l2
            v = u / new
            if abs(new - lam) <= 1e-6 * new:
                lam = new
                break
            lam = new
        return 1.05 * lam + self.l2

    def _prox(self, v: np.ndarray, step: float) -> np.ndarray:
        out = np.sign(v) * np.maximum(np.abs(v) - self.l1 * step, 0.0)
        return np.maximum(out, 0.0) if self.positive else out

    def run(self, state: dict, ctx: LoopContext) -> dict:
        st = dict(state)
        if "L" not in st:
            st["L"] = self._lipschitz(ctx, self.q.shape[0])
            ctx.checkpoint(st, line=f"step bound {st['L']:.6g}")
        XtA = np.empty(self.q.shape[0])
        while st["it"] < self.max_iter and not st["done"].all():
            z = st["z"]
            Qz = self.apply(ctx, z)
            gaps = np.array([enet_gap(z[:, k].copy(), self.l1, self.l2, Qz[:, k].copy(), self.q[:, k].copy(),
                                      float(self.yy[k]), XtA, self.positive)[0] for k in range(z.shape[1])])
            done = st["done"] | (gaps <= self.tol * self.yy)
            g = Qz - self.q + self.l2 * z
            x_new = np.where(done, z, self._prox(z - g / st["L"], 1.0 / st["L"]))
            restart = np.einsum("ij,ij->j", g, x_new - st["x"]) > 0
            t_new = 0.5 * (1 + np.sqrt(1 + 4 * st["t"] ** 2))
            mom = np.where(restart, 0.0, (st["t"] - 1) / t_new)
            z_new = np.where(done, z, x_new + mom * (x_new - st["x"]))
            st = {**st, "x": np.where(done, z, x_new), "z": z_new, "t": np.where(restart, 1.0, t_new),
                  "it": st["it"] + 1, "gap": gaps, "done": done}
            ctx.checkpoint(st, gap=float(gaps.max()),
                           line=f"iteration {st['it']}: duality gap {gaps.max():.3g}")
        return st

    @staticmethod
    def start(w0: np.ndarray) -> dict:
        t = w0.shape[1]
        return {"x": w0.copy(), "z": w0.copy(), "t": np.ones(t), "it": 0, "gap": np.full(t, np.inf),
                "done": np.zeros(t, dtype=bool)}
