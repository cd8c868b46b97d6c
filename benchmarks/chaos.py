"""Chaos: worker processes killed at random moments, data larger than the devices, two jobs on one
device. Every run is compared with an undisturbed run of the same seed.

Three parts, each on its own LocalGPUCluster of emulated devices:

* ``kill``: ``--kills`` runs (default 20), round robin over KMeans (loop on the workers and loop
  from the client), LogisticRegression, pagerank (Gauss-Seidel and Jacobi), a ``gdask.incremental``
  loop and a ``gdask.iterate`` loop. In each run one worker process is SIGKILLed at a random moment
  (a uniform fraction of the undisturbed run's duration); the nanny restarts it. A run counts as a
  kill only when the kill fell inside the run (else it is repeated). The result must have the same
  bits as the undisturbed run's (arrays compared with ``np.array_equal``).
* ``pressure``: persisted data 2x and 4x the devices' memory: GDataSet op chains
  (``((X - X.mean(0)) / X.std(0)).sum(0)``, ``X.T @ (X @ w - 1)``, a persisted chain) and the
  estimators (KMeans Lloyd, LogisticRegression); compared with the same computations on a cluster
  whose devices hold all of the data.
* ``jobs``: two jobs over-subscribing one device (the issue's case: job B asks 40 MiB and holds
  36 MiB, job A asks 24 MiB and persists 96 MiB): B's blocks must stay on the device, A's results
  right, A spilling only its own blocks.

A run that does not end within ``--hang-timeout`` seconds is a hang. Printed: one table with, per
scenario, runs, survived (no error), wrong results, hangs, worker restarts (killed workers back
within 90 s) and the peak host memory (RSS of this process and its children, sampled every 0.1 s).
Exit status 1 unless there are 0 wrong results, 0 hangs, every run survived and every killed worker
was restarted.

    python benchmarks/chaos.py [--kills 20] [--seed 0] [--json out.json]
    python benchmarks/chaos.py --quick        # 6 kills, smaller data
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
import warnings
from collections import defaultdict
from typing import Any, Callable

import _common
import numpy as np

MiB = 2**20


# -- block functions of the iterate / incremental loops (pickled by value: this is __main__) --------
def jacobi_block(b, x):
    return 0.5 * x + b


def expand(b):
    return np.concatenate([b, b * b], axis=1)


# -- comparing results -------------------------------------------------------------------------------
def same_bits(a: Any, b: Any) -> bool:
    """Whether two results are identical: arrays bit for bit (dtype and shape included)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_bits(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return a == b


# -- host memory -------------------------------------------------------------------------------------
class MemoryPeak:
    """Samples the RSS of this process and its children (the cluster's nanny and worker processes)."""

    def __init__(self, interval: float = 0.1) -> None:
        import psutil

        self._proc = psutil.Process()
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-memory")

    def sample(self) -> int:
        total = 0
        for p in [self._proc, *self._proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except Exception:  # noqa: BLE001 - a process that just ended (a killed worker)
                pass
        self.peak = max(self.peak, total)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> MemoryPeak:
        self.peak = 0
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()


# -- running with a hang bound -----------------------------------------------------------------------
def count_run(row: dict, status: str, wrong: bool) -> None:
    """Count one finished run ("ok", "hang" or an error) in its scenario's row of the table."""
    row["runs"] += 1
    row["survived"] += status == "ok"
    row["hangs"] += status == "hang"
    row["wrong"] += wrong


def run_bounded(func: Callable[[], Any], timeout: float) -> tuple[str, Any]:
    """``("ok", result)``, ``("error", exception)`` or ``("hang", None)`` when ``func`` did not end
    within ``timeout`` seconds (it is left running in its daemon thread)."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["result"] = func()
        except BaseException as e:  # noqa: BLE001 - reported in the table
            out["error"] = e

    t = threading.Thread(target=target, daemon=True, name="chaos-run")
    t.start()
    t.join(timeout)
    if t.is_alive():
        return "hang", None
    if "error" in out:
        return "error", out["error"]
    return "ok", out["result"]


def worker_pids(client) -> dict[str, int]:
    return client.run(os.getpid)


def wait_for_workers(client, n: int, gone: str | None, timeout: float = 90.0) -> bool:
    """Whether the cluster has ``n`` workers again, ``gone`` not among them, within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = set(client.scheduler_info(n_workers=-1)["workers"])
        if len(workers) == n and gone not in workers:
            return True
        time.sleep(0.2)
    return False


# -- the kill scenarios ------------------------------------------------------------------------------
def kill_scenarios(client, quick: bool, seed: int) -> dict[str, Callable[[], Any]]:
    """name -> ``run()`` returning the result to compare (the data is made and persisted here)."""
    import dask

    import gdask
    import gdask.ml

    rng = np.random.default_rng(seed)
    n = 60_000 if quick else 200_000
    centers = rng.uniform(-6, 6, (8, 8))
    X = (centers[rng.integers(0, 8, n)] + rng.standard_normal((n, 8))).astype(np.float32)
    G = gdask.from_array(X, block_rows=n // 8).persist()
    Xl = rng.standard_normal((n, 6))
    yl = (Xl @ rng.standard_normal(6) + 0.5 * rng.standard_normal(n) > 0).astype(np.int64)
    GL, YL = gdask.from_array(Xl, block_rows=n // 8).persist(), gdask.from_array(yl, block_rows=n // 8).persist()
    A = gdask.ml.powerlaw_graph(40_000 if quick else 150_000, avg_degree=6, seed=seed)
    bh = rng.random(16 * 2_000)
    b = gdask.from_array(bh, block_rows=2_000)
    Xi = gdask.from_array(rng.random((16_000, 3)), block_rows=2_000)
    yi = gdask.from_array(rng.random(16_000), block_rows=2_000)
    kmeans_iter = 15 if quick else 40

    def kmeans(worker_loop: bool) -> Callable[[], Any]:
        def run():
            with dask.config.set({"gdask.ml.worker-loop": worker_loop}):
                km = gdask.ml.KMeans(8, init=X[:8], max_iter=kmeans_iter, tol=0).fit(G)
            return km.cluster_centers_, km.labels_.compute(), km.inertia_, km.n_iter_

        return run

    def logistic():
        lr = gdask.ml.LogisticRegression(max_iter=40).fit(GL, YL)
        return lr.coef_, lr.intercept_, int(lr.n_iter_[0])

    def pagerank(method: str) -> Callable[[], Any]:
        return lambda: gdask.ml.pagerank(A, tol=1e-10, nblocks=4, method=method)

    def iterate():
        def step(data, state, ctx):
            outs = [dask.delayed(jacobi_block)(data.block(i), ctx.refs[i]) for i in range(data.nblocks)]
            return list(dask.compute(*outs))

        res = gdask.iterate(step, [np.zeros(2_000) for _ in range(16)], data=b, max_iter=40, tol=0, client=client)
        return res.state, res.n_iter

    def incremental():
        w = np.zeros(6)
        with gdask.incremental(client):
            for _ in range(8):
                Z = ((Xi - Xi.mean(axis=0)) / Xi.std(axis=0)).map_blocks(expand)
                w = w - 0.1 * (Z.T @ ((Z @ w) - yi)).compute() / len(Xi)
        return w

    return {"kmeans (loop on workers)": kmeans(True), "kmeans (loop from client)": kmeans(False),
            "logistic regression": logistic, "pagerank (gauss-seidel)": pagerank("gauss-seidel"),
            "pagerank (jacobi)": pagerank("jacobi"), "incremental loop": incremental, "iterate loop": iterate}


def kill_part(args, rows: dict, log: list) -> None:
    from distributed import Client

    import gdask

    n_workers = 2
    with gdask.LocalGPUCluster(n_devices=n_workers, backend="emulated", device_memory="512MiB",
                               dashboard_address=":0") as cluster, Client(cluster) as client:
        scenarios = kill_scenarios(client, args.quick, args.seed)
        refs, durations = {}, {}
        for name, run in scenarios.items():  # undisturbed runs (the second one: kernels compiled)
            run()
            t0 = time.perf_counter()
            status, refs[name] = run_bounded(run, args.hang_timeout)
            durations[name] = time.perf_counter() - t0
            if status != "ok":
                raise RuntimeError(f"the undisturbed run of {name} did not finish: {status} {refs[name]!r}")
            print(f"  reference {name}: {durations[name]:.2f} s", flush=True)
        rng = random.Random(args.seed)
        names = list(scenarios)
        kills = attempts = 0
        while kills < args.kills and attempts < 3 * args.kills:
            name = names[kills % len(names)]
            attempts += 1
            row = rows[name]
            pids = worker_pids(client)
            victim = rng.choice(sorted(pids))
            delay = rng.uniform(0.05, 0.8) * durations[name]
            killed = threading.Event()
            done = threading.Event()

            def kill(victim=victim, delay=delay, killed=killed, done=done, pids=pids):
                if not done.wait(delay):
                    os.kill(pids[victim], signal.SIGKILL)
                    killed.set()

            killer = threading.Thread(target=kill, daemon=True)
            with MemoryPeak() as mem:
                killer.start()
                status, result = run_bounded(scenarios[name], args.hang_timeout)
                done.set()
                killer.join()
            row["host_peak"] = max(row["host_peak"], mem.peak)
            if not killed.is_set():
                if not wait_for_workers(client, n_workers, None, 5):
                    raise RuntimeError("the cluster lost a worker without a kill")
                continue  # the run ended before the kill: not a kill run
            kills += 1
            wrong = status == "ok" and not same_bits(result, refs[name])
            count_run(row, status, wrong)
            back = wait_for_workers(client, n_workers, victim)
            row["killed"] += 1
            row["restarted"] += back
            log.append({"part": "kill", "scenario": name, "delay": round(delay, 3), "status": status,
                        "wrong": wrong, "restarted": back, "error": None if status != "error" else repr(result)})
            print(f"  kill {kills}/{args.kills}: {name}, after {delay:.2f} s: {status}"
                  f"{', WRONG RESULT' if wrong else ''}{'' if back else ', WORKER NOT RESTARTED'}"
                  + (f" ({result!r})" if status == "error" else ""), flush=True)
            if status == "hang":
                break  # a hung fit keeps running in its thread: the cluster is no longer comparable


# -- memory pressure ---------------------------------------------------------------------------------
def pressure_runs(quick: bool, seed: int) -> dict[str, Callable[[], Any]]:
    """name -> ``run()``: the same computations on whichever cluster is the current one."""
    import gdask
    import gdask.ml

    device = 8 * MiB if quick else 16 * MiB  # per device, 2 devices
    block_rows = (device // 8) // 64  # 8 blocks per device's worth of float64 x 8 columns
    out = {}
    for factor in (2, 4):
        rng = np.random.default_rng(seed + factor)
        n = factor * 2 * device // 64
        X = rng.random((n, 8))
        y = (X[:, 0] + X[:, 1] + 0.1 * rng.standard_normal(n) > 1).astype(np.int64)

        def chains(X=X):
            G = gdask.from_array(X, block_rows=block_rows).persist()
            P = ((G - 0.5) * 3.0).persist()
            return (G.sum(axis=0).compute(), ((G - G.mean(axis=0)) / G.std(axis=0)).sum(axis=0).compute(),
                    (G.T @ ((G @ np.ones(8)) - 1.0)).compute(), P.mean(axis=0).compute())

        def kmeans(X=X):
            G = gdask.from_array(X, block_rows=block_rows)
            km = gdask.ml.KMeans(6, init=X[:6], max_iter=6, tol=0, algorithm="lloyd").fit(G)
            return km.cluster_centers_, km.inertia_

        def logistic(X=X, y=y):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ConvergenceWarning at max_iter
                lr = gdask.ml.LogisticRegression(max_iter=15).fit(gdask.from_array(X, block_rows=block_rows),
                                                                  gdask.from_array(y, block_rows=block_rows))
            return lr.coef_, lr.intercept_

        out[f"pressure {factor}x: op chains"] = chains
        out[f"pressure {factor}x: kmeans"] = kmeans
        out[f"pressure {factor}x: logistic"] = logistic
    return out


def pressure_part(args, rows: dict, log: list) -> None:
    from distributed import Client

    import gdask

    runs = pressure_runs(args.quick, args.seed)
    device = 8 * MiB if args.quick else 16 * MiB
    refs = {}
    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="1GiB",
                               dashboard_address=":0") as cluster, Client(cluster):
        for name, run in runs.items():  # undisturbed: the devices hold all of the data
            status, refs[name] = run_bounded(run, args.hang_timeout)
            if status != "ok":
                raise RuntimeError(f"the undisturbed run of {name} did not finish: {status} {refs[name]!r}")
    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory=device,
                               dashboard_address=":0") as cluster, Client(cluster) as client:
        for name, run in runs.items():
            row = rows[name]
            with MemoryPeak() as mem:
                status, result = run_bounded(run, args.hang_timeout)
            row["host_peak"] = max(row["host_peak"], mem.peak)
            wrong = status == "ok" and not same_bits(result, refs[name])
            count_run(row, status, wrong)
            metrics = client.run(lambda dask_worker: dask_worker.data.metrics()).values()
            reads = sum(m["host_reads"] + m["misses"] for m in metrics)
            log.append({"part": "pressure", "scenario": name, "status": status, "wrong": wrong,
                        "window_misses_and_host_reads": reads, "error": None if status != "error" else repr(result)})
            print(f"  {name}: {status}{', WRONG RESULT' if wrong else ''}"
                  + (f" ({result!r})" if status == "error" else ""), flush=True)
            if status == "hang":
                break


# -- two jobs on one device --------------------------------------------------------------------------
def jobs_part(args, rows: dict, log: list) -> None:
    from distributed import Client, futures_of, wait

    import gdask

    name = "two jobs on one device"
    row = rows[name]
    scale = 0.5 if args.quick else 1.0
    rows_per_block = int(4.5 * MiB * scale) // 32  # 4.5 MiB blocks of 4 float64 columns
    rng = np.random.default_rng(args.seed)
    b_data = rng.random((8 * rows_per_block, 4))  # 36 MiB
    a_data = rng.random((21 * rows_per_block, 4))  # ~96 MiB

    def usage(client, job):
        return sum(client.run(lambda dask_worker: dask_worker.plugins["gdask-job-monitor"].usage(job)).values())

    def run():
        with gdask.LocalGPUCluster(n_devices=1, backend="emulated", device_memory=int(64 * MiB * scale),
                                   dashboard_address=":0") as cluster, Client(cluster) as client:
            with gdask.job(client, gpu=0.5, memory=int(40 * MiB * scale), name="chaos-B"):
                B = gdask.from_array(b_data, block_rows=rows_per_block).persist()
                wait(futures_of(B))
                with gdask.job(client, gpu=0.5, memory=int(24 * MiB * scale), name="chaos-A"):
                    A = gdask.from_array(a_data, block_rows=rows_per_block).persist()
                    wait(futures_of(A))
                    a_sum = A.sum(axis=0).compute()
                    b_held = usage(client, "chaos-B")
                    a_held = usage(client, "chaos-A")
                b_sum = B.sum(axis=0).compute()
            table = gdask.scheduling.jobs(client)
            return {"a_sum": a_sum, "b_sum": b_sum, "b_on_device": b_held, "a_on_device": a_held,
                    "b_spilled": int(table.loc["chaos-B", "spilled_bytes"])}

    with MemoryPeak() as mem:
        status, result = run_bounded(run, args.hang_timeout)
    row["host_peak"] = max(row["host_peak"], mem.peak)
    wrong = False
    if status == "ok":
        wrong = not (np.allclose(result["a_sum"], a_data.sum(axis=0))
                     and np.allclose(result["b_sum"], b_data.sum(axis=0))
                     and result["b_on_device"] == b_data.nbytes and result["a_on_device"] <= int(24 * MiB * scale)
                     and result["b_spilled"] == 0)
    count_run(row, status, wrong)
    log.append({"part": "jobs", "scenario": name, "status": status, "wrong": wrong,
                "result": {k: v for k, v in result.items() if not isinstance(v, np.ndarray)} if status == "ok" else
                repr(result)})
    print(f"  {name}: {status}{', WRONG (B evicted or sums wrong)' if wrong else ''}"
          + (f" B on device {result['b_on_device'] / MiB:.1f} MiB, A on device {result['a_on_device'] / MiB:.1f} MiB"
             if status == "ok" else f" ({result!r})"), flush=True)


# -- main ----------------------------------------------------------------------------------------------
COLUMNS = ("runs", "survived", "wrong", "hangs", "killed", "restarted", "host_peak")


def print_table(rows: dict) -> None:
    head = f"{'scenario':34} {'runs':>5} {'survived':>9} {'wrong':>6} {'hangs':>6} {'restarts':>10} {'host peak':>10}"
    print(head)
    print("-" * len(head))
    total = defaultdict(int)
    for name, r in rows.items():
        if not r["runs"]:
            continue
        restarts = f"{r['restarted']}/{r['killed']}" if r["killed"] else "-"
        print(f"{name:34} {r['runs']:>5} {r['survived']:>9} {r['wrong']:>6} {r['hangs']:>6} {restarts:>10} "
              f"{r['host_peak'] / MiB:>7.0f} MiB")
        for k in COLUMNS:
            total[k] = max(total[k], r[k]) if k == "host_peak" else total[k] + r[k]
    print("-" * len(head))
    restarts = f"{total['restarted']}/{total['killed']}"
    print(f"{'total':34} {total['runs']:>5} {total['survived']:>9} {total['wrong']:>6} {total['hangs']:>6} "
          f"{restarts:>10} {total['host_peak'] / MiB:>7.0f} MiB")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=None, help="kill runs (default 20; 6 with --quick)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="6 kills, smaller data and devices")
    p.add_argument("--hang-timeout", type=float, default=300.0, help="seconds after which a run counts as hung")
    p.add_argument("--skip", nargs="*", default=[], choices=["kill", "pressure", "jobs"])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.kills is None:
        args.kills = 6 if args.quick else 20
    setup = _common.setup(["psutil"], kills=args.kills, seed=args.seed, quick=args.quick, devices="emulated")
    _common.print_setup(setup)
    rows: dict[str, dict] = defaultdict(lambda: dict.fromkeys(COLUMNS, 0))
    log: list[dict] = []
    t0 = time.perf_counter()
    for part, func in (("kill", kill_part), ("pressure", pressure_part), ("jobs", jobs_part)):
        if part in args.skip:
            continue
        print(f"{part}:", flush=True)
        func(args, rows, log)
    print(f"\nchaos: {time.perf_counter() - t0:.0f} s, emulated devices\n")
    print_table(rows)
    total = {k: sum(r[k] for r in rows.values()) for k in COLUMNS if k != "host_peak"}
    ok = (total["wrong"] == 0 and total["hangs"] == 0 and total["survived"] == total["runs"]
          and total["restarted"] == total["killed"] and total["killed"] >= (args.kills if "kill" not in args.skip
                                                                             else 0))
    print("\nresult:", "PASS" if ok else "FAIL", "(0 wrong results, 0 hangs, every run survived, every killed worker "
          "restarted)")
    _common.write_json(args.json, {"setup": setup, "rows": [{"scenario": k, **v} for k, v in rows.items()],
                                   "runs": log, "pass": ok})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
