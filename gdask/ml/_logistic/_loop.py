"""Logistic regression on the iteration engine: the parameter layout, the fit's typed state
(:class:`SolverState`) and the solvers (scipy's L-BFGS-B, preconditioned gradient descent)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gdask.gdataset import IterativeAlgorithm, LoopContext, sum_parts
from gdask.ml import kernels as _k
from gdask.ml._base import NotFinite

__all__ = ["GRAM_MAX_FEATURES", "Layout", "LogisticLoop", "SolverState"]

#: gd computes the full weighted Gram matrix below this many features (else only its trace)
GRAM_MAX_FEATURES = 4096


class Layout:
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

    x: np.ndarray  # the parameters, laid out as Layout packs them
    passes: list[float] = field(default_factory=list)  # seconds of each pass over the data
    status: int = 0  # 0: converged; else why the solver stopped (1: max_iter reached)
    message: str = ""
    z: np.ndarray | None = None  # gd: the momentum point (None: x)
    t: float = 1.0  # gd: the momentum's step counter
    x0: np.ndarray | None = None  # lbfgs: where the solver started (a resume replays from there)
    memo: list = field(default_factory=list)  # lbfgs: (digest of x, f, g) of every evaluation so far


def _digest(x: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(x, dtype=np.float64).tobytes(), digest_size=16).digest()


class _Replay:
    """The objective as the solver sees it on a resumed fit: the evaluations the fit made before the
    failure answered from the memo (the solver is deterministic, so it asks for the same points in the
    same order), new ones computed by passes over the blocks. The solver's whole state (its curvature
    pairs, its line search) is rebuilt bit for bit, without checkpointing scipy's internals."""

    def __init__(self, memo: list, evaluate: Any) -> None:
        self.memo = list(memo)
        self.used = 0
        self.evaluate = evaluate

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        key = _digest(x)
        if self.used < len(self.memo) and self.memo[self.used][0] == key:
            _, f, g = self.memo[self.used]
            self.used += 1
            return f, g.copy()
        del self.memo[self.used:]  # off the recorded path (not expected): compute from here on
        f, g = self.evaluate(x)
        self.memo.append((key, f, g.copy()))
        self.used = len(self.memo)
        return f, g


class LogisticLoop(IterativeAlgorithm):
    """scikit-learn's objective ``f(w) = sum_i s_i loss_i / S + ||W||^2 / (2 C S)`` minimised on the
    iteration engine (``s_i`` the row weights, ``S`` their sum; intercepts not penalised): every
    evaluation of the loss and its gradient is one pass over the blocks, combined in block order.
    On the workers every worker runs the same solver on the all-gathered objective (L-BFGS is
    deterministic: all take the same steps). The state is a :class:`SolverState`; a resumed fit
    replays L-BFGS from its start point with the memo of evaluations (the same bits as an unbroken fit),
    and gradient descent from its checkpointed iterate and momentum."""

    name = "logistic-regression"

    def __init__(self, layout: Layout, weighted: bool, class_w: np.ndarray | None, sw_sum: float, C: float,
                 solver: str, max_iter: int, tol: float, gram_max_features: int, l1_ratio: float = 0.0) -> None:
        self.layout = layout
        self.weighted = weighted
        self.class_w = class_w
        self.sw_sum = float(sw_sum)
        strength = 0.0 if np.isinf(C) else 1.0 / (C * self.sw_sum)
        self.l2 = (1.0 - float(l1_ratio)) * strength
        self.l1 = float(l1_ratio) * strength  # > 0: the proximal solver (_prox)
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
        if self.l1 > 0:
            return self._prox(state, ctx)
        if self.solver == "lbfgs":
            return self._lbfgs(state, ctx)
        return self._gd(state, ctx)

    def _lbfgs(self, state: SolverState, ctx: LoopContext) -> SolverState:
        """scipy's L-BFGS-B from the start point. A resumed fit (``ctx.iteration`` > 0) replays the
        iterations already made from the memo of evaluations (no passes over the data) and goes on
        from there: the same steps, so the same bits as a fit that never failed."""
        from scipy.optimize import minimize

        if ctx.iteration >= self.max_iter:
            return replace(state, status=1, message="max_iter reached")
        x0 = state.x if state.x0 is None else state.x0
        done = ctx.iteration  # iterations the checkpoint holds: replayed, not checkpointed again
        last: dict[str, Any] = {"n": 0}
        passes = list(state.passes)
        replay = _Replay(state.memo if state.x0 is not None else [],
                         lambda x: self.objective(ctx, x, passes))

        def fun(x):
            f, g = replay(x)
            last["f"], last["g"] = f, g
            return f, g

        def callback(xk):
            last["n"] += 1
            if last["n"] <= done:
                return
            f, g = last["f"], last["g"]
            ctx.checkpoint(replace(state, x=np.array(xk, copy=True), x0=x0, memo=list(replay.memo),
                                   passes=list(passes)), loss=f, grad_max=float(np.abs(g).max()),
                           line=f"iteration {ctx.iteration + 1}: loss {f:.10g}, max |gradient| "
                                f"{np.abs(g).max():.3g}")

        res = minimize(fun, x0, method="L-BFGS-B", jac=True, callback=callback,
                       options={"maxiter": self.max_iter, "maxls": 50, "gtol": self.tol,
                                "ftol": 64 * np.finfo(float).eps})
        return replace(state, x=res.x, x0=x0, memo=[], status=int(res.status), message=str(res.message),
                       passes=passes)

    def _penalised(self) -> np.ndarray:
        """1 for the coefficients, 0 for the intercepts (not penalised), in the layout of ``x``."""
        L = self.layout
        return L.pack(np.ones((L.K, L.d)), np.zeros(L.K))

    def _prox(self, state: SolverState, ctx: LoopContext) -> SolverState:
        """Proximal gradient descent (FISTA, Beck & Teboulle 2009) with gradient-mapping adaptive
        restart (O'Donoghue & Candès 2015), for the L1 part of the penalty (scikit-learn's "l1" and
        "elasticnet"): the step ``1 / Lip`` with ``Lip`` the largest eigenvalue of the Hessian bound
        of :meth:`_gd` (one pass at the start), then per iteration one pass for the smooth part's
        gradient and a soft threshold of the coefficients (not the intercepts). Stops when the
        largest entry of the gradient mapping ``(z - x+) / step`` is at most ``tol``: zero exactly at
        the optimum, as the gradient is for a smooth objective."""
        passes = list(state.passes)
        step = 1.0 / self._lipschitz(ctx, passes)
        thr = step * self.l1 * self._penalised()
        x = state.x.copy()
        z = (x if state.z is None else state.z).copy()
        t = float(state.t)
        while ctx.iteration < self.max_iter:
            f, g = self.objective(ctx, z, passes)
            u = z - step * g
            x_new = np.sign(u) * np.maximum(np.abs(u) - thr, 0.0)
            gmap = (z - x_new) / step
            f += self.l1 * float(np.abs(z * (thr > 0)).sum())
            if np.abs(gmap).max() <= self.tol:
                return replace(state, x=x_new, z=None, status=0, message="converged", passes=passes)
            z, t = _accelerate(x, x_new, t, gmap)
            x = x_new
            ctx.checkpoint(replace(state, x=x, z=z, t=t, passes=list(passes)), loss=f,
                           grad_max=float(np.abs(gmap).max()),
                           line=f"iteration {ctx.iteration + 1}: loss {f:.10g}, max |gradient mapping| "
                                f"{np.abs(gmap).max():.3g}")
        return replace(state, x=x, status=1, message="max_iter reached", passes=passes)

    def _lipschitz(self, ctx: LoopContext, passes: list) -> float:
        """The largest eigenvalue of the Hessian bound ``B`` of the smooth part (one pass)."""
        H, curv, pen = self._hessian_bound(ctx, passes)
        if np.ndim(H) == 0:  # the trace: a bound on the largest eigenvalue
            return max(curv * float(H) + self.l2, 1e-300)
        return max(float(np.linalg.eigvalsh(curv * H + self.l2 * np.diag(pen))[-1]), 1e-300)

    def _hessian_bound(self, ctx: LoopContext, passes: list) -> tuple[Any, float, np.ndarray]:
        """``(H, c, pen)``: the weighted Gram matrix of ``[X, 1]`` over the weight sum (above
        ``gram_max_features`` features its trace; without an intercept the matrix of ``X``), the
        loss's curvature bound ``c`` and the penalty mask of one class's parameters. One pass."""
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
        if small and not L.fit_intercept:
            H = H[:-1, :-1]
        return (H if small else float(H)), curv, pen

    def _preconditioner(self, ctx: LoopContext, passes: list):
        """``g -> B^-1 g`` for the Hessian bound ``B`` (one pass over the data)."""
        L = self.layout
        H, curv, pen = self._hessian_bound(ctx, passes)
        if np.ndim(H) == 0:  # H = trace of the Gram matrix: a bound on its largest eigenvalue
            step = 1.0 / max(curv * float(H) + self.l2, 1e-300)
            return lambda g: step * g
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
            z, t = _accelerate(x, x_new, t, g)
            x = x_new
            ctx.checkpoint(replace(state, x=x, z=z, t=t, passes=list(passes)), loss=f,
                           grad_max=float(np.abs(g).max()),
                           line=f"iteration {ctx.iteration + 1}: loss {f:.10g}, max |gradient| {np.abs(g).max():.3g}")
        return replace(state, x=x, status=1, message="max_iter reached", passes=passes)


def _accelerate(x: np.ndarray, x_new: np.ndarray, t: float, direction: np.ndarray) -> tuple[np.ndarray, float]:
    """Nesterov's next point and momentum factor after the step ``x -> x_new``; restarted (no
    momentum, ``t = 1``) when the momentum points uphill along ``direction`` (the gradient, or the
    gradient mapping of a proximal step; O'Donoghue & Candès 2015)."""
    if direction @ (x_new - x) > 0:
        return x_new, 1.0
    t_new = 0.5 * (1 + np.sqrt(1 + 4 * t * t))
    return x_new + ((t - 1) / t_new) * (x_new - x), t_new
