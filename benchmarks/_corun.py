"""Real contention on this machine: CPU kernels co-running in separate processes, measured.

A kernel *kind* is a real NumPy kernel run over and over ("reps") by one worker process:

* ``gemm``: compute-bound, ``n x n`` float64 matrix products whose operands stay in the core's L2;
* ``stream``: bandwidth-bound, a triad ``a = b + s * c`` over float64 arrays larger than the L3;
* ``mixed``: half ``gemm``, half ``stream`` (on arrays half as long) in every rep;
* ``cache``: repeated sums over an array that fits in the L3 alone but not beside a stream.

Worker processes are spawned with BLAS / OpenMP threads pinned to 1 (environment variables set
before NumPy loads, and ``threadpoolctl`` in the worker); ``k`` of them start a kind each at the
same instant and run reps for ``duration`` seconds. A kind's time per rep is the mean over the
reps that started after ``warmup`` and ended before the window closed (all co-runners were running
then); its *slowdown* in a co-location is that time over its solo time of the same round, so the
load of the machine's other users drifts out. Solo runs and co-locations alternate, round by round.

Profiles (what ``JobProfile`` gets), measured per kernel kind: ``compute`` = the cores a solo run
keeps busy or waiting to run / cores, i.e. (seconds on a CPU + seconds runnable in the run queue) /
wall seconds / cores, from Linux's ``/proc/self/schedstat`` (so the machine's other users, who take
CPU time from the kernel, do not make it look lighter; elsewhere: CPU seconds / wall seconds);
``bandwidth`` = DRAM bytes per rep / solo seconds per rep / peak bandwidth, where the bytes per rep
are counted from the arrays each rep streams (arrays that fit in the L3 count 0) and the peak is the
larger of one and two ``stream`` processes' measured throughput.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

__all__ = ["KINDS", "CoRunner", "colocations"]

#: kind -> (GEMM products per rep, triad length in float64 (0: none), cached-sum array length, sums per rep)
KINDS: dict[str, dict[str, int]] = {
    "gemm": {"gemm": 10, "triad": 0, "cached": 0},
    "stream": {"gemm": 0, "triad": 4 << 20, "cached": 0},
    "mixed": {"gemm": 5, "triad": 2 << 20, "cached": 0},
    "cache": {"gemm": 0, "triad": 0, "cached": 1 << 20, "sums": 24},
}
GEMM_N = 160  # 3 x 160 x 160 x 8 B = 600 kB: in one core's L2
_PIN = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "NUMBA_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def dram_bytes_per_rep(kind: str) -> int:
    """Bytes a rep of ``kind`` moves to and from memory, counted from its arrays: the triad's two
    passes (``multiply(c, s, out=a)``: read c, write a; ``add(a, b, out=a)``: read a and b, write
    a) move 5 arrays' worth; GEMM operands (L2) and the cached array (L3) count 0."""
    return 5 * 8 * KINDS[kind]["triad"]


def _schedstat() -> tuple[float, float] | None:
    """(seconds on a CPU, seconds waiting in the run queue) of this process (Linux), else None."""
    try:
        with open("/proc/self/schedstat") as f:
            run, wait = f.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def _worker(conn, kinds: list[str]) -> None:  # runs in a spawned process
    import numpy as np

    try:
        from threadpoolctl import threadpool_info, threadpool_limits

        threadpool_limits(1)
        blas = {str(p.get("internal_api")): int(p.get("num_threads", 0)) for p in threadpool_info()}
    except ImportError:
        blas = {}
    rng = np.random.default_rng(os.getpid())
    arrays: dict[str, Any] = {}

    def need(name, n):
        if name not in arrays:
            arrays[name] = rng.random(n)
        return arrays[name]

    def rep(kind: str) -> None:
        spec = KINDS[kind]
        if spec["gemm"]:
            a = need("ga", (GEMM_N, GEMM_N))
            b = need("gb", (GEMM_N, GEMM_N))
            out = need("gc", (GEMM_N, GEMM_N))
            for _ in range(spec["gemm"]):
                np.matmul(a, b, out=out)
        if spec["triad"]:
            n = spec["triad"]
            a, b, c = need(f"ta{n}", n), need(f"tb{n}", n), need(f"tc{n}", n)
            np.multiply(c, 3.0, out=a)
            np.add(a, b, out=a)
        if spec["cached"]:
            x = need("cx", spec["cached"])
            for _ in range(spec["sums"]):
                x.sum()

    for k in kinds:  # allocate and touch everything once, before any timing
        rep(k)
    conn.send(("ready", blas))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        kind, start, duration, warmup = msg
        while time.time() < start:
            time.sleep(min(0.002, max(0.0, start - time.time())))
        end = start + duration
        times = []
        cpu0 = time.process_time()
        sched0 = _schedstat()
        t_first = time.time()
        while True:
            t0 = time.time()
            if t0 >= end:
                break
            rep(kind)
            t1 = time.time()
            if t0 >= start + warmup and t1 <= end:
                times.append(t1 - t0)
        cpu = time.process_time() - cpu0
        sched1 = _schedstat()
        wall = time.time() - t_first
        # cores demanded: on a CPU or runnable and waiting for one (None without schedstat)
        demand = None if sched0 is None or sched1 is None else (sum(sched1) - sum(sched0)) / wall
        conn.send({"kind": kind, "times": times, "cpu": cpu, "wall": wall, "demand": demand})


def colocations(kinds: list[str], sizes: tuple[int, ...] = (2, 3)) -> list[tuple[str, ...]]:
    """Every multiset of ``kinds`` of the given sizes (sorted tuples), in a stable order."""
    out: list[tuple[str, ...]] = []
    for n in sizes:
        out.extend(itertools.combinations_with_replacement(sorted(kinds), n))
    return out


class CoRunner:
    """A pool of ``size`` worker processes that run kernel kinds at the same instant.

    Parameters
    ----------
    kinds : list of str
        Kinds from :data:`KINDS` the workers prepare.
    size : int
        Processes (the largest co-location measured).
    duration, warmup : float
        Seconds each run lasts, and seconds at its start not counted.
    """

    def __init__(self, kinds: list[str], size: int, duration: float = 0.4, warmup: float = 0.05) -> None:
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown kernel kinds {unknown}; known: {sorted(KINDS)}")
        if duration <= warmup:
            raise ValueError(f"duration ({duration} s) must be longer than warmup ({warmup} s)")
        self.kinds, self.size, self.duration, self.warmup = list(kinds), int(size), float(duration), float(warmup)
        self._procs: list = []
        self._conns: list = []
        self.blas: dict[str, int] = {}

    def __enter__(self) -> CoRunner:  # noqa: PYI034 - Python 3.10 has no typing.Self
        ctx = mp.get_context("spawn")
        saved = {k: os.environ.get(k) for k in _PIN}
        os.environ.update({k: "1" for k in _PIN})  # read by the BLAS when NumPy loads in the child
        try:
            for _ in range(self.size):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker, args=(child, self.kinds), daemon=True)
                p.start()
                self._procs.append(p)
                self._conns.append(parent)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        for c in self._conns:
            _, blas = c.recv()
            self.blas = blas
        return self

    def __exit__(self, *exc: object) -> None:
        for c in self._conns:
            try:
                c.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()

    def run(self, kinds: tuple[str, ...], attempts: int = 3) -> list[dict[str, Any]]:
        """Run ``kinds`` (one per process) at the same instant; per process its rep times (s),
        CPU seconds and wall seconds. A run in which some process finished no rep inside the
        window (a loaded machine) is repeated with a window twice as long, up to ``attempts`` runs.

        Raises
        ------
        RuntimeError
            If a process still finished no rep in the last attempt.
        """
        if len(kinds) > self.size:
            raise ValueError(f"{len(kinds)} co-runners need {len(kinds)} processes; the pool has {self.size}")
        duration = self.duration
        for _ in range(attempts):
            start = time.time() + 0.03
            for c, k in zip(self._conns, kinds):
                c.send((k, start, duration, self.warmup))
            out = [c.recv() for c in self._conns[:len(kinds)]]
            if all(r["times"] for r in out):
                return out
            duration *= 2
        empty = [r["kind"] for r in out if not r["times"]]
        raise RuntimeError(f"kinds {empty} finished no rep inside a {duration / 2:g} s window ({attempts} attempts): "
                           "the machine is too loaded for --corun-duration; make it longer")

    def measure(self, cols: list[tuple[str, ...]], rounds: int, log=None) -> dict[str, Any]:
        """Solo times and co-location slowdowns, ``rounds`` times, solo runs measured in every round.

        Returns
        -------
        dict
            ``solo``: kind -> list of seconds per rep (one per round); ``cpu``: kind -> cores it
            demands in its solo runs (on a CPU or waiting for one); ``obs``: list of ``(colocation,
            own kind, round, slowdown)``, one per distinct kind of each co-location and round;
            ``peak_bw``: bytes/s.
        """
        solo: dict[str, list[float]] = {k: [] for k in self.kinds}
        cpu: dict[str, list[float]] = {k: [] for k in self.kinds}
        obs: list[tuple[tuple[str, ...], str, int, float]] = []
        peak = []
        for rnd in range(rounds):
            t_round = time.perf_counter()
            base = {}
            for k in self.kinds:
                r = self.run((k,))[0]
                base[k] = statistics.mean(r["times"])
                solo[k].append(base[k])
                cpu[k].append(r["demand"] if r.get("demand") is not None else r["cpu"] / r["wall"])
            if "stream" in self.kinds:
                two = self.run(("stream", "stream"))
                peak.append(max(dram_bytes_per_rep("stream") / base["stream"],
                                sum(dram_bytes_per_rep("stream") / statistics.mean(r["times"]) for r in two)))
            for col in cols:
                res = self.run(col)
                per: dict[str, list[float]] = {}
                for r in res:
                    per.setdefault(r["kind"], []).append(statistics.mean(r["times"]))
                for k, ts in per.items():
                    obs.append((col, k, rnd, statistics.mean(ts) / base[k]))
            if log:
                log(f"  real co-runs: round {rnd + 1}/{rounds} ({len(cols)} co-locations) in "
                    f"{time.perf_counter() - t_round:.1f} s")
        return {"solo": solo, "cpu": {k: statistics.median(v) for k, v in cpu.items()}, "obs": obs,
                "peak_bw": max(peak) if peak else None}
