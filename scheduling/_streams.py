"""How many streams (CUDA streams; threads on emulated devices) a worker should use: a pure
feedback policy. Throughput measurements in, stream count out; no clocks, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class StreamController:
    """Hill climbing on the stream count ``k`` in ``[1, max_streams]`` from measured throughput.

    Call :meth:`observe` once per feedback round with the throughput measured while running ``k``
    streams (any unit, higher is better); it returns the count to use next. The controller probes
    one neighbour at a time, moves when the neighbour is better by more than ``tolerance``
    (relative), and otherwise stays. Throughput per count is smoothed (exponential moving average
    with weight ``alpha``) so that noise does not make it wander; every ``reprobe`` rounds at the
    best count it probes a neighbour again, so it follows a workload whose best count drifts.

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
    """

    max_streams: int
    start: int = 1
    tolerance: float = 0.03
    alpha: float = 0.5
    reprobe: int = 8
    k: int = field(init=False)
    history: list[tuple[int, float]] = field(init=False, default_factory=list)
    _est: dict[int, float] = field(init=False, default_factory=dict)
    _home: int = field(init=False)
    _dir: int = field(init=False, default=1)
    _settled: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not isinstance(self.max_streams, int) or self.max_streams < 1:
            raise ValueError(f"max_streams must be an integer >= 1, got {self.max_streams!r}")
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha!r}")
        if self.tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance!r}")
        if self.reprobe < 1:
            raise ValueError(f"reprobe must be >= 1, got {self.reprobe!r}")
        self.k = min(max(int(self.start), 1), self.max_streams)
        self._home = self.k

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
        self._est[k] = throughput if old is None else (1 - self.alpha) * old + self.alpha * throughput
        home = self._home
        if k != home:  # we were probing a neighbour: move there if clearly better, else go back
            if self._est[k] > self._est.get(home, 0.0) * (1 + self.tolerance):
                self._home = k  # keep climbing in the same direction
                self._settled = 0
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
        if self._settled >= self.reprobe:
            self._settled = 0
            n = self._neighbour(home)
            self._dir = -self._dir  # alternate sides on the next re-probe
            if n is not None:
                self.k = n
        return self.k
