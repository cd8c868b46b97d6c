"""How many streams (CUDA streams; threads on emulated devices) a worker should use: a pure
feedback policy. Throughput measurements in, stream count out; no clocks, no I/O."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

_NOISE_WEIGHT = 0.2  # weight of the newest deviation in the noise estimate
_HISTORY_LEN = 1000  # rounds kept in ``history`` (a worker lives long)


@dataclass
class StreamController:
    """Hill climbing on the stream count ``k`` in ``[1, max_streams]`` from measured throughput.

    Call :meth:`observe` once per feedback round with the throughput measured while running ``k``
    streams (any unit, higher is better); it returns the count to use next. The controller probes
    one neighbour at a time, moves when the neighbour is better by more than ``tolerance``
    (relative; more when measurements are noisy: their typical relative deviation at the
    settled count, see :attr:`margin`), and otherwise stays. Throughput per count is smoothed
    (exponential moving average with weight ``alpha``) so that noise does not make it wander.
    Settled at the best count, it probes a neighbour again after ``reprobe`` rounds, then after
    twice as many each time the probe confirms the count (up to ``max_reprobe``), so a stable
    workload pays less and less for
    probing; a measurement at the settled count that differs from its estimate by more than
    ``drift`` (relative, and more than three times the noise) means the workload changed: the other
    counts' estimates are forgotten and the neighbours are probed at once, so it follows a workload
    whose best count moves.

    Parameters
    ----------
    max_streams : int
        Upper bound for ``k`` (>= 1).
    start : int
        Initial count (clipped to the range).
    tolerance : float
        Relative gain a neighbour needs to win.
    alpha : float
        Weight of the newest measurement in the moving average, in (0, 1].
    reprobe : int
        Rounds spent at a settled count before probing a neighbour again.
    max_reprobe : int
        Longest interval between re-probes (the interval doubles from ``reprobe`` up to it).
    drift : float or None
        Relative change at the settled count taken as a new workload; None never resets.
    """

    max_streams: int
    start: int = 1
    tolerance: float = 0.03
    alpha: float = 0.5
    reprobe: int = 8
    max_reprobe: int = 64
    drift: float | None = 0.25
    k: int = field(init=False)
    history: deque[tuple[int, float]] = field(init=False, default_factory=lambda: deque(maxlen=_HISTORY_LEN))
    _est: dict[int, float] = field(init=False, default_factory=dict)
    _home: int = field(init=False)
    _dir: int = field(init=False, default=1)
    _settled: int = field(init=False, default=0)
    _interval: int = field(init=False)
    _noise: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if not isinstance(self.max_streams, int) or self.max_streams < 1:
            raise ValueError(f"max_streams must be an integer >= 1, got {self.max_streams!r}")
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha!r}")
        if self.tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance!r}")
        if self.reprobe < 1:
            raise ValueError(f"reprobe must be >= 1, got {self.reprobe!r}")
        if self.max_reprobe < self.reprobe:
            raise ValueError(f"max_reprobe must be >= reprobe ({self.reprobe}), got {self.max_reprobe!r}")
        if self.drift is not None and not self.drift > 0:
            raise ValueError(f"drift must be > 0 or None, got {self.drift!r}")
        self._interval = self.reprobe
        self.k = min(max(int(self.start), 1), self.max_streams)
        self._home = self.k

    @property
    def noise(self) -> float:
        """Typical relative deviation of a measurement at the settled count (smoothed)."""
        return self._noise

    @property
    def margin(self) -> float:
        """Relative gain a probed count needs to win: ``tolerance``, or the noise if larger."""
        return max(self.tolerance, self._noise)

    @property
    def home(self) -> int:
        """The count the controller has settled on (``k`` differs from it while probing)."""
        return self._home

    def estimate(self, k: int) -> float | None:
        """Smoothed throughput seen at ``k`` streams (None if never measured)."""
        return self._est.get(k)

    def _neighbour(self, home: int) -> int | None:
        for d in (self._dir, -self._dir):
            n = home + d
            if 1 <= n <= self.max_streams:
                self._dir = d
                return n
        return None

    def observe(self, throughput: float) -> int:
        """Record the throughput of the current count; return the count to run next."""
        if not math.isfinite(throughput) or throughput < 0:
            raise ValueError(f"throughput must be a finite number >= 0, got {throughput!r}")
        k = self.k
        self.history.append((k, throughput))
        old = self._est.get(k)
        home = self._home
        if k == home and old:
            dev = abs(throughput - old) / old
            if self.drift is not None and dev > max(self.drift, 3 * self._noise):
                # the workload changed: what was measured at other counts no longer holds
                self._est = {}
                self._settled = 0
                self._interval = self.reprobe
                old = None
            else:
                self._noise += _NOISE_WEIGHT * (dev - self._noise)
        self._est[k] = throughput if old is None else (1 - self.alpha) * old + self.alpha * throughput
        if k != home:  # we were probing a neighbour: move there if clearly better, else go back
            if self._est[k] > self._est.get(home, 0.0) * (1 + self.margin):
                self._home = k  # keep climbing in the same direction
                self._dir = 1 if k > home else -1
                self._settled = 0
                self._interval = self.reprobe
                nxt = k + self._dir
                self.k = nxt if 1 <= nxt <= self.max_streams else k
            else:
                self._dir = -self._dir if self._settled == 0 and k == home + self._dir else self._dir
                self.k = home
                self._settled += 1
            return self.k
        # at home: probe an unmeasured neighbour first, later re-probe now and then
        self._settled += 1
        for d in (self._dir, -self._dir):
            n = home + d
            if 1 <= n <= self.max_streams and n not in self._est:
                self._dir = d
                self.k = n
                return n
        if self._settled >= self._interval:
            self._settled = 0
            self._interval = min(2 * self._interval, self.max_reprobe)
            n = self._neighbour(home)
            self._dir = -self._dir  # alternate sides on the next re-probe
            if n is not None:
                self.k = n
        return self.k
