"""Interference model: the slowdown of a job's task when it shares a device with other jobs.

Pure object: observed co-execution slowdowns in, predicted slowdowns out. No clocks, no I/O, no
Dask. The model is not told how devices contend. It keeps two predictors and uses the one that
predicts co-locations it has not seen better:

* ``"mean-by-size"``: the mean slowdown observed for co-locations of the same size (the default:
  it needs nothing but the count of co-runners);
* ``"linear"``: a linear model over interaction features of the jobs' profiles (own compute x
  others' compute, own bandwidth x others' bandwidth, the cross terms, over-subscription of each
  resource, number of co-runners), fitted by recursive least squares, one observation at a time.

Which one is better is measured the way it is used: each co-location seen so far is left out in
turn, both predictors are fitted on the others' observations and predict its mean slowdown
(:meth:`InterferenceModel.held_out_errors`); the linear model is used when it saves more than one
standard error of that difference (the one-standard-error rule: a tie keeps the simpler predictor).
The errors of the predictions made before each observation (prequential,
:meth:`InterferenceModel.online_errors`) are reported too, but do not choose: they mostly score
co-locations already seen, whose round-to-round noise hides how a predictor generalises, and they
keep the linear model's first, untrained predictions for ever. On contention its features describe
the linear model wins (it tells a compute-bound pair from a mixed pair); where the measured
slowdowns depend on nothing its features see, it does not, and the simpler
predictor stays in use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

__all__ = ["FEATURES", "PREDICTORS", "InterferenceModel", "JobProfile"]


def _fraction(value: float, name: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"JobProfile.{name} must be a number, got {value!r}") from e
    if not (math.isfinite(x) and x >= 0):
        raise ValueError(f"JobProfile.{name} must be a finite fraction of a device >= 0, got {value!r}")
    return x


@dataclass(frozen=True)
class JobProfile:
    """What a job uses of a device when it runs alone on it.

    Parameters
    ----------
    compute : float
        Fraction of the device's compute throughput (SM time) the job keeps busy alone, usually in
        [0, 1]. Values above 1 mean the job would over-subscribe the device by itself (e.g. a
        profile measured on a faster device).
    bandwidth : float
        Fraction of the device's memory bandwidth the job uses alone.
    memory : float
        Fraction of the device's memory the job's resident blocks take.

    Examples
    --------
    >>> JobProfile(compute=0.8, bandwidth=0.2).bottleneck
    'compute'
    """

    compute: float
    bandwidth: float
    memory: float = 0.0

    def __post_init__(self) -> None:
        for name in ("compute", "bandwidth", "memory"):
            object.__setattr__(self, name, _fraction(getattr(self, name), name))

    @property
    def bottleneck(self) -> str:
        """``"compute"`` or ``"bandwidth"``: the resource the job uses most (ties: compute)."""
        return "compute" if self.compute >= self.bandwidth else "bandwidth"

    def scaled(self, compute: float = 1.0, bandwidth: float = 1.0, memory: float = 1.0) -> JobProfile:
        """The profile on a device with the given relative capacities (2.0 = twice as much)."""
        return JobProfile(self.compute / compute, self.bandwidth / bandwidth, self.memory / memory)


#: Names of the interaction features, in the order of :meth:`InterferenceModel.features`.
FEATURES = (
    "wc*over_c",   # own compute weight x compute over-subscription of the device
    "wb*over_b",   # own bandwidth weight x bandwidth over-subscription
    "wc*over_b",   # cross terms
    "wb*over_c",
    "c*C",         # own compute x others' compute
    "b*B",         # own bandwidth x others' bandwidth
    "c*B",
    "b*C",
    "n",           # number of co-runners
    "over_m",      # memory over-subscription
)
#: The predictors an :class:`InterferenceModel` chooses from (see the module's description).
PREDICTORS = ("mean-by-size", "linear")

#: co-locations whose observations a model keeps to choose its predictor (the least recently
#: observed are dropped first); each costs a k x k solve when the choice is made again
MAX_COLOCATIONS = 256


class _Colocation:
    """The observations of one co-location (own profile, the others' profiles): the sums a
    least-squares fit and a mean need, forgetting-weighted like the model's."""

    __slots__ = ("gram", "moment", "weight", "excess", "size", "phi")

    def __init__(self, phi: np.ndarray, size: int) -> None:
        self.phi, self.size = phi, size
        self.gram = np.zeros((phi.size, phi.size))
        self.moment = np.zeros(phi.size)
        self.weight = self.excess = 0.0

    def add(self, y: float) -> None:
        self.gram += np.outer(self.phi, self.phi)
        self.moment += self.phi * (y - 1.0)
        self.weight += 1.0
        self.excess += y - 1.0

    def forget(self, lam: float) -> None:
        self.gram *= lam
        self.moment *= lam
        self.weight *= lam
        self.excess *= lam


def _key(p: JobProfile) -> tuple[float, float, float]:
    return (p.compute, p.bandwidth, p.memory)


class InterferenceModel:
    """Predicts the slowdown (>= 1) of a job's task when co-located with other jobs on a device.

    Two predictors (:data:`PREDICTORS`), both learned online from every observation:

    * ``"mean-by-size"``: ``1 + max(0, mean(slowdown - 1))`` over the observations with as many
      co-runners (the default);
    * ``"linear"``: ``1 + max(0, theta . phi(own, others))`` where ``phi`` are the interaction
      features listed in :data:`FEATURES` (all zero for a job alone) and ``theta`` is learned by
      recursive least squares (ridge prior, optional forgetting).

    :meth:`predict` uses the linear model once it has ``min_observations`` observations and its
    error on co-locations left out of its fit (:meth:`held_out_errors`) is lower than the size
    mean's by more than one standard error; :attr:`predictor` says which is in use. A job alone is
    always predicted 1.0. Profiles are fractions of one device (see :class:`JobProfile`); scale them
    with :meth:`JobProfile.scaled` for devices of other capacities.

    Parameters
    ----------
    ridge : float
        Ridge prior strength (> 0): how strongly ``theta`` is held at 0 (no interference) before
        observations accumulate.
    forgetting : float
        Weight kept by past observations at each update, in (0, 1]; 1.0 never forgets, 0.99
        tracks drifting behaviour (both predictors and their errors forget alike).
    min_observations : int, optional
        Observations before the linear model may be used (default: twice its feature count).

    Examples
    --------
    >>> m = InterferenceModel()
    >>> a, b = JobProfile(0.9, 0.1), JobProfile(0.8, 0.2)
    >>> m.predict(a, [])
    1.0
    >>> for _ in range(20):
    ...     _ = m.observe(a, [b], 1.6)
    >>> round(m.predict(a, [b]), 2)
    1.6
    """

    def __init__(self, ridge: float = 1e-2, forgetting: float = 1.0, min_observations: int | None = None) -> None:
        if not (math.isfinite(ridge) and ridge > 0):
            raise ValueError(f"ridge must be a finite number > 0, got {ridge!r}")
        if not 0 < forgetting <= 1:
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting!r}")
        self.ridge = float(ridge)
        self.forgetting = float(forgetting)
        k = len(FEATURES)
        self.min_observations = 2 * k if min_observations is None else int(min_observations)
        self.theta = np.zeros(k)
        self._p = np.eye(k) / self.ridge
        self.n_observations = 0
        self._abs_pct = 0.0  # sum of prequential absolute percentage errors of what predict() returned
        #: per predictor: (forgetting-weighted sum of prequential absolute percentage errors, weight)
        self._errors = {name: [0.0, 0.0] for name in PREDICTORS}
        #: co-runners -> (forgetting-weighted sum of slowdown - 1, weight)
        self._by_size: dict[int, list[float]] = {}
        #: (own, others) profiles -> their observations, least recently observed first
        self._colocations: dict[tuple, _Colocation] = {}
        self._choice: tuple[int, str, dict] | None = None  # (n_observations, predictor, held-out errors)

    # -- features -------------------------------------------------------------------------------
    @staticmethod
    def features(own: JobProfile, others: Iterable[JobProfile]) -> np.ndarray:
        """Interaction features of ``own`` running with ``others`` on one device (see FEATURES)."""
        others = list(others)
        c, b = own.compute, own.bandwidth
        cc = sum(o.compute for o in others)
        bb = sum(o.bandwidth for o in others)
        mm = sum(o.memory for o in others)
        s = c + b
        wc, wb = (c / s, b / s) if s > 0 else (0.5, 0.5)
        over_c = max(0.0, c + cc - 1.0)
        over_b = max(0.0, b + bb - 1.0)
        over_m = max(0.0, own.memory + mm - 1.0) if others else 0.0
        return np.array([wc * over_c, wb * over_b, wc * over_b, wb * over_c,
                         c * cc, b * bb, c * bb, b * cc, float(len(others)), over_m])

    # -- events ---------------------------------------------------------------------------------
    def observe(self, own: JobProfile, others: Sequence[JobProfile], slowdown: float) -> float:
        """Learn from one measured slowdown (co-located time / time alone) of ``own``'s task.

        Returns
        -------
        float
            The prediction made for this co-location *before* learning from it (for online error).

        Raises
        ------
        ValueError
            If ``slowdown`` is not a finite number > 0.
        """
        y = float(slowdown)
        if not (math.isfinite(y) and y > 0):
            raise ValueError(f"slowdown must be a finite number > 0 (time together / time alone), got {slowdown!r}")
        others = list(others)
        phi = self.features(own, others)
        before = self.predict(own, others)
        self._abs_pct += abs(before - y) / y
        lam = self.forgetting
        for name in PREDICTORS:  # each predictor's own error, whichever was in use
            err = self._errors[name]
            err[0] = lam * err[0] + abs(self.predict_with(name, own, others) - y) / y
            err[1] = lam * err[1] + 1.0
        p_phi = self._p @ phi
        gain = p_phi / (lam + phi @ p_phi)
        self.theta = self.theta + gain * ((y - 1.0) - self.theta @ phi)
        self._p = (self._p - np.outer(gain, p_phi)) / lam
        self._p = (self._p + self._p.T) / 2.0  # keep it symmetric against round-off
        size = self._by_size.setdefault(len(others), [0.0, 0.0])
        size[0] = lam * size[0] + (y - 1.0)
        size[1] = lam * size[1] + 1.0
        self._keep_colocation(own, others, phi, y)
        self.n_observations += 1
        return before

    def _keep_colocation(self, own: JobProfile, others: list[JobProfile], phi: np.ndarray, y: float) -> None:
        """Add the observation to its co-location's sums (for :meth:`held_out_errors`)."""
        if self.forgetting < 1.0:
            for c in self._colocations.values():
                c.forget(self.forgetting)
        key = (_key(own), tuple(sorted(_key(o) for o in others)))
        c = self._colocations.pop(key, None) or _Colocation(phi, len(others))
        c.add(y)
        self._colocations[key] = c  # the most recently observed last
        if len(self._colocations) > MAX_COLOCATIONS:
            del self._colocations[next(iter(self._colocations))]

    # -- decisions ------------------------------------------------------------------------------
    def _from(self, phi: np.ndarray) -> float:
        return 1.0 + max(0.0, float(self.theta @ phi))

    @property
    def predictor(self) -> str:
        """The predictor :meth:`predict` uses now: ``"linear"`` once it has ``min_observations``
        observations and the lower error on co-locations left out of its fit, by more than one
        standard error (:meth:`held_out_errors`), else ``"mean-by-size"``."""
        if self.n_observations < self.min_observations:
            return "mean-by-size"
        return self._choose()[0]

    def _choose(self) -> tuple[str, dict[str, float | None]]:
        if self._choice is None or self._choice[0] != self.n_observations:
            per = self._held_out()
            errs = {name: (float(np.mean(v)) if v else None) for name, v in per.items()}
            gain = np.subtract(per["mean-by-size"], per["linear"])  # per co-location: what the linear model saves
            # the simpler predictor unless the linear one is better by more than one standard error of
            # that saving (the one-standard-error rule): a tie in the noise keeps the size mean
            better = gain.size > 1 and gain.mean() > gain.std(ddof=1) / np.sqrt(gain.size)
            self._choice = (self.n_observations, "linear" if better else "mean-by-size", errs)
        return self._choice[1], self._choice[2]

    def held_out_errors(self) -> dict[str, float | None]:
        """Each predictor's error on co-locations it was not fitted on: every co-location kept
        (:data:`MAX_COLOCATIONS`, the most recent) is left out in turn, the linear model is fitted
        (ridge least squares, as the recursive fit) and the size means are taken on the others'
        observations, and both predict its mean slowdown. The mean absolute percentage error over
        those co-locations (a fraction; None before two co-locations are known): what
        :attr:`predictor` compares (the linear model must be better by more than the standard error
        of the difference)."""
        return dict(self._choose()[1])

    def _held_out(self) -> dict[str, list[float]]:
        """Each predictor's absolute percentage error on each co-location left out in turn (one
        batched solve for all of them)."""
        cols = [c for c in self._colocations.values() if c.size > 0 and c.weight > 0]
        if len(cols) < 2:
            return {name: [] for name in PREDICTORS}
        gram_each = np.stack([c.gram for c in cols])
        moment_each = np.stack([c.moment for c in cols])
        gram = self.ridge * np.eye(self.theta.size) + gram_each.sum(axis=0)
        theta = np.linalg.solve(gram - gram_each, (moment_each.sum(axis=0) - moment_each)[..., None])[..., 0]
        phi = np.stack([c.phi for c in cols])
        linear = 1.0 + np.maximum(0.0, np.einsum("ij,ij->i", theta, phi))
        weight = np.array([c.weight for c in cols])
        excess = np.array([c.excess for c in cols])
        sizes = np.array([c.size for c in cols])
        size = linear.copy()  # a size seen in no other co-location: predict_with falls back to the linear model
        for n in np.unique(sizes):
            same = sizes == n
            rest_w = weight[same].sum() - weight[same]
            rest_x = excess[same].sum() - excess[same]
            ok = rest_w > 1e-12
            size[np.flatnonzero(same)[ok]] = 1.0 + np.maximum(0.0, rest_x[ok] / rest_w[ok])
        y = 1.0 + excess / weight
        return {"linear": list(np.abs(linear - y) / y), "mean-by-size": list(np.abs(size - y) / y)}

    def predict_with(self, predictor: str, own: JobProfile, others: Iterable[JobProfile]) -> float:
        """The slowdown ``predictor`` (one of :data:`PREDICTORS`) predicts, whichever is in use.
        The size mean of a co-location size never observed is the linear model's prediction."""
        others = list(others)
        if not others:
            return 1.0
        if predictor == "mean-by-size":
            size = self._by_size.get(len(others))
            if size is not None and size[1] > 0:
                return 1.0 + max(0.0, size[0] / size[1])
        elif predictor != "linear":
            raise ValueError(f"predictor must be one of {PREDICTORS}, got {predictor!r}")
        return self._from(self.features(own, others))

    def predict(self, own: JobProfile, others: Iterable[JobProfile]) -> float:
        """Predicted slowdown (>= 1) of ``own``'s tasks when ``others`` share its device (by the
        predictor in use, :attr:`predictor`)."""
        return self.predict_with(self.predictor, own, others)

    def error(self, samples: Iterable[tuple[JobProfile, Sequence[JobProfile], float]]) -> float:
        """Mean absolute percentage error on ``(own, others, measured slowdown)`` samples, as a
        fraction (0.15 = 15 %). Does not learn from them.

        Raises
        ------
        ValueError
            If ``samples`` is empty.
        """
        errs = [abs(self.predict(own, others) - y) / y for own, others, y in samples]
        if not errs:
            raise ValueError("error() needs at least one (own, others, slowdown) sample")
        return float(np.mean(errs))

    @property
    def online_error(self) -> float | None:
        """Mean absolute percentage error of the predictions made before each observation
        (prequential error of what :meth:`predict` returned, a fraction), or None before the
        first observation."""
        return self._abs_pct / self.n_observations if self.n_observations else None

    def online_errors(self) -> dict[str, float | None]:
        """Each predictor's prequential error (forgetting-weighted mean, a fraction; None before
        the first observation), whichever was in use (reported; :attr:`predictor` compares
        :meth:`held_out_errors`)."""
        return {name: (e[0] / e[1] if e[1] > 0 else None) for name, e in self._errors.items()}

    def coefficients(self) -> dict[str, float]:
        """Learned weight of each feature (for reports)."""
        return {name: float(w) for name, w in zip(FEATURES, self.theta)}
