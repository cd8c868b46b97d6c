"""K-means on the iteration engine: the fit's typed state (:class:`LoopState`), the step it takes
from one pass's statistics, and the driver (:class:`KMeansLoop`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gdask.gdataset import Blocks, GDataSet, IterativeAlgorithm, LoopContext
from gdask.ml import kernels
from gdask.ml._base import NotFinite
from gdask.ml._kmeans._blocks import bounds_labels_host, farthest_rows, labels_host

__all__ = ["KMeansLoop", "LoopState", "collect_finals", "next_centers"]

#: a center's largest squared move falling below this fraction of the previous iteration's (its
#: move below half the previous one) counts as settling: that pass builds the bounds
_SETTLING = 0.25

#: after a step on fresh bounds (the previous pass's) that failed on most blocks (each gave up its step
#: for a full pass: rows near many boundaries, e.g. data without clusters while the centers still move
#: much), Lloyd's passes again until the centers' largest squared move falls below this fraction of
#: that pass's (their move below 0.7 of it): a full pass that keeps bounds costs ~1.2x Lloyd's, and its
#: steps kept failing while the centers moved as much. A step on stale bounds (kept through Lloyd's
#: passes) that gives up is no such sign: the full pass it runs instead leaves fresh bounds to step on
_REARM = 0.5


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
    stepped: bool = False  # the last pass was a bounds pass: the blocks' bounds are one pass old (fresh)
    rearm: float = math.inf  # after the bounds failed: settling also needs the largest squared move below this
    n_iter: int = 0
    times: list[float] = field(default_factory=list)

    def copy(self) -> LoopState:
        """A copy that the loop's next steps leave alone (a checkpoint, a resumed loop's start)."""
        return replace(self, history=list(self.history), times=list(self.times))

    def __getstate__(self) -> dict:
        # the history pickled as one array: 280 small arrays took ~1 ms a pickle late in a fit, one
        # (280, 20, 24) array ~0.2 ms (the state is pickled when a rank sends its checkpoint, every
        # gdask.engine.checkpoint-interval, when the client asks a survivor for it, and with a rank's task)
        state = dict(self.__dict__)
        if self.history:
            state["history"] = np.stack(self.history)
        return state

    def __setstate__(self, state: dict) -> None:
        history = state.get("history")
        if isinstance(history, np.ndarray):
            state["history"] = list(history)
        self.__dict__.update(state)

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
        new = next_centers(stats, self.centers, self.dtype)
        if new is None:
            new = next_centers(stats, self.centers, self.dtype, farthest(self.centers, stats))
        if self.cargs:
            self.history.append(np.asarray(self.centers, dtype=np.float64))
        moves = ((new.astype(np.float64) - self.centers) ** 2).sum(1)
        shift = float(moves.sum())
        # a center's largest move falling below half the previous one bets on settling: that pass
        # builds the bounds (a little dearer than Lloyd's), so the next one can step on them. Once built
        # they are kept: a step whose rows mostly fail gives up early and runs the full pass, which
        # rebuilds them (going back to Lloyd's passes would throw them away and step on stale ones later)
        biggest = float(moves.max())
        fresh = self.stepped  # this pass stepped on the bounds the pass before left (else stale, or none yet)
        if self.cargs and fresh and 2 * stats.get("rebuilt", 0) > stats.get("bounded", 0):
            # most blocks' steps on fresh bounds gave up: back to Lloyd's passes until the centers move much less
            self.settled, self.rearm = False, _REARM * biggest
        else:
            self.settled = self.bounds and (self.settled or (
                (centers_settled(new, moves) or biggest < _SETTLING * self.last_move) and biggest < self.rearm))
        self.stepped = bool(self.cargs)
        self.last_move = biggest
        self.centers = new
        self.n_iter += 1
        self.times.append(time.perf_counter() - t0)
        record: dict[str, Any] = {"center_shift": shift}
        if not self.cargs:
            record["inertia"] = float(stats["inertia"])
            what = f"inertia {stats['inertia']:.6g}"
        elif stats["changed"] >= self.n:  # the pass that built the bounds: no earlier labels to compare with
            what = "bounds built"
        else:
            record["changed"] = int(stats["changed"])
            what = f"{stats['changed']} rows reassigned"
        record["line"] = (f"iteration {self.n_iter}: {self.times[-1] * 1e3:.1f} ms, {what}, "
                          f"center shift {shift:.3g}")
        return shift <= self.tol, record


class KMeansLoop(IterativeAlgorithm):
    """K-means on the iteration engine: one pass (Lloyd's, or a step on the bounds) per iteration."""

    name = "kmeans"
    checkpoint_copies = True  # run() checkpoints loop.copy(): a fresh state each iteration, never changed after

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
            rows = ctx.map(farthest_rows, X, centers, m, *wargs, name="kmeans-farthest")
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
        X = Blocks("X")
        wargs = (Blocks("W"),) if self.weighted else ()
        if state.cargs:  # the labels from the bounds when the last iteration stepped on them
            return bounds_labels_host, (X, state.centers, *state.cargs, *wargs), {"history": state.history,
                                                                                  "labels": self.labels}
        return labels_host, (X, state.centers, *wargs), {"labels": self.labels}


def centers_settled(centers: np.ndarray, moves: np.ndarray) -> bool:
    """Whether the last move of the centers (squared, per center) is small against their spacing:
    then most rows keep bounds that prove their cluster, and the bounds pass beats Lloyd's."""
    if len(centers) < 2:
        return True
    c = centers.astype(np.float64)
    d2 = ((c[:, None, :] - c[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    return float(np.sqrt(moves.max())) < 0.25 * float(np.sqrt(d2.min()))


def next_centers(stats: dict, centers: np.ndarray, dtype: Any, far: tuple | None = None) -> np.ndarray | None:
    """The new centers from one iteration's combined statistics, as scikit-learn computes them
    (:func:`gdask.ml.kernels.next_centers`): empty clusters take the rows farthest from their centers,
    those the pass reported or ``far`` = (squared distances, labels, rows, weights) from a separate
    pass. ``None`` when more clusters are empty than there are such rows, or the sums are not finite."""
    if not np.isfinite(stats["sums"]).all():
        return None
    far = far if far is not None else tuple(stats[k] for k in kernels.FAR)
    new = kernels.next_centers(stats["sums"], stats["counts"], centers, far)
    return None if new is None else new.astype(dtype)


def collect_finals(finals: list, G: GDataSet, labels: bool) -> tuple[np.ndarray | None, float]:
    """All rows' labels (or None when they stay lazy) and the inertia from per-block (labels, inertia)."""
    inertia = math.fsum(p[1] for p in finals)
    if not labels:
        return None, inertia
    return np.concatenate([p[0] for p in finals]).astype(np.int32, copy=False), inertia
