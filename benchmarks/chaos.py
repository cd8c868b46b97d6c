"""Chaos: worker processes killed at random moments, data larger than the devices, two jobs on one
device, and a soak of many fits. Every run is compared with an undisturbed run of the same seed.

Four parts, each on its own LocalGPUCluster of emulated devices:

* ``kill``: ``--runs`` kill runs per scenario (default 10; 2 with ``--quick``): KMeans (loop on the
  workers and loop from the client), LogisticRegression (capped at ``max_iter`` and converged), PCA,
  TruncatedSVD, Ridge, Lasso, GaussianMixture, LSTMRegressor, pagerank (Gauss-Seidel and Jacobi), a
  ``gdask.incremental`` loop and a ``gdask.iterate`` loop. A worker process dies by one of two
  triggers, alternating: ``timer`` (SIGKILL from here at a uniform random fraction of the
  undisturbed run's duration) or ``in-task`` (the worker exits a random 1-50 ms after its n-th task
  of the run starts, n random from 1 to 4: early inside a loop task on the workers, or inside the
  block tasks of a client loop). The nanny restarts it. A run counts as a kill only when the kill
  fell inside the run (else it is repeated). The result must have the same bits as the undisturbed
  run's (arrays compared with ``np.array_equal``).
* ``pressure``: persisted data 2x and 4x the devices' memory: GDataSet op chains
  (``((X - X.mean(0)) / X.std(0)).sum(0)``, ``X.T @ (X @ w - 1)``, a persisted chain) and the
  estimators (KMeans Lloyd, LogisticRegression); compared with the same computations on a cluster
  whose devices hold all of the data.
* ``jobs``: two jobs over-subscribing one device (the issue's case: job B asks 40 MiB and holds
  36 MiB, job A asks 24 MiB and persists 96 MiB): B's blocks must stay on the device, A's results
  right, A spilling only its own blocks.
* ``soak``: ``--soak`` fits (default 60) alternating KMeans and LogisticRegression on one cluster;
  after each, the RSS of this process (client and scheduler) and of each worker. Printed: memory
  after the first 10 fits and at the end, and the growth per fit (least squares over the fits after
  the 10th). It passes when no process grows by more than ``--soak-limit`` KiB per fit.
  distributed keeps bounded histories of its own that a soak of minutes is still filling: the last
  ``distributed.admin.low-level-log-length`` (1000) messages of every stream and transitions of
  every process, and a worker's profile of every second for an hour. They are the same with or
  without gdask, so the soak shortens the logs to ``--soak-log-length`` (default 20) and turns the
  workers' profiler off, and measures what gdask keeps (``--soak-log-length 1000`` measures both).

A run that does not end within ``--hang-timeout`` seconds is a hang. Printed: one table with, per
scenario, runs, survived (no error), wrong results, hangs, worker restarts (killed workers back
within 90 s) and the peak host memory (RSS of this process and its children, sampled every 0.1 s).
Exit status 1 unless there are 0 wrong results, 0 hangs, every run survived, every killed worker
was restarted and the soak stayed flat.

    python benchmarks/chaos.py [--runs 10] [--seed 0] [--json out.json]
    python benchmarks/chaos.py --quick        # 2 kills per scenario, smaller data, 20 soak fits
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

from gdask._compat import scheduler_workers

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
        workers = set(scheduler_workers(client))
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

    Xs = rng.standard_normal((2_000 if quick else 6_000, 12, 3)).astype(np.float32)
    ys = Xs[:, -4:, 0].mean(axis=1) + 0.1 * Xs[:, 0, 1]
    GS, YS = gdask.from_array(Xs, block_rows=len(Xs) // 4).persist(), gdask.from_array(ys, block_rows=len(Xs) // 4)

    def quiet(fit: Callable[[], Any]) -> Any:
        with warnings.catch_warnings():  # a capped fit warns (ConvergenceWarning): expected here
            warnings.simplefilter("ignore")
            return fit()

    def kmeans(worker_loop: bool) -> Callable[[], Any]:
        def run():
            with dask.config.set({"gdask.ml.worker-loop": worker_loop}):
                km = gdask.ml.KMeans(8, init=X[:8], max_iter=kmeans_iter, tol=0).fit(G)
            return km.cluster_centers_, km.labels_.compute(), km.inertia_, km.n_iter_

        return run

    def logistic(max_iter: int) -> Callable[[], Any]:
        def run():
            lr = quiet(lambda: gdask.ml.LogisticRegression(max_iter=max_iter).fit(GL, YL))
            return lr.coef_, lr.intercept_, int(lr.n_iter_[0])

        return run

    def pca():
        m = gdask.ml.PCA(4, svd_solver="randomized", random_state=0).fit(GL)
        return m.components_, m.explained_variance_, m.mean_

    def truncated_svd():
        m = gdask.ml.TruncatedSVD(3, n_iter=6, random_state=0).fit(GL)
        return m.components_, m.singular_values_

    def ridge():
        m = gdask.ml.Ridge(alpha=1.0).fit(GL, YL.astype(np.float64))
        return m.coef_, m.intercept_

    def lasso():
        m = quiet(lambda: gdask.ml.Lasso(alpha=0.01, max_iter=200).fit(GL, YL.astype(np.float64)))
        return m.coef_, m.intercept_, m.n_iter_

    def gaussian_mixture():
        m = quiet(lambda: gdask.ml.GaussianMixture(3, max_iter=20, random_state=0).fit(G))
        return m.means_, m.covariances_, m.weights_, m.lower_bound_, m.n_iter_

    def lstm():
        m = gdask.ml.LSTMRegressor(hidden_size=8, epochs=4, batch_size=256, random_state=0,
                                   early_stopping=False).fit(GS, YS)
        return np.asarray(m.loss_curve_), m.predict(Xs[:64])

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
            "logistic regression (capped)": logistic(5), "logistic regression (converged)": logistic(200),
            "pca (randomized)": pca, "truncated svd": truncated_svd, "ridge": ridge, "lasso": lasso,
            "gaussian mixture": gaussian_mixture, "lstm regressor": lstm,
            "pagerank (gauss-seidel)": pagerank("gauss-seidel"), "pagerank (jacobi)": pagerank("jacobi"),
            "incremental loop": incremental, "iterate loop": iterate}


class ExitInTask:
    """A worker plugin: the worker exits ``delay`` seconds after its ``n``-th task (counted from now)
    starts, unless a worker of this run died already (``marker``: one kill per run). Made a
    ``WorkerPlugin`` subclass where it is registered."""

    name = "chaos-exit-in-task"

    def __init__(self, n: int, delay: float, marker: str) -> None:
        self.n, self.delay, self.marker = n, delay, marker

    def setup(self, worker) -> None:
        self.started = 0

    def transition(self, key, start, finish, **kwargs) -> None:
        if finish != "executing":
            return
        self.started += 1
        if self.started == self.n:
            threading.Thread(target=self._exit, daemon=True).start()

    def _exit(self) -> None:
        time.sleep(self.delay)
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        os._exit(1)


def _one_kill(client, run: Callable[[], Any], trigger: str, rng: random.Random, duration: float,
              hang_timeout: float) -> tuple[bool, str, Any, dict]:
    """One run of a scenario with a kill by ``trigger``: (killed, status, result, details)."""
    import tempfile
    import uuid

    from distributed.diagnostics.plugin import WorkerPlugin

    if trigger == "timer":
        pids = worker_pids(client)
        victim = rng.choice(sorted(pids))
        delay = rng.uniform(0.05, 0.8) * duration
        killed = threading.Event()
        done = threading.Event()

        def kill():
            if not done.wait(delay):
                os.kill(pids[victim], signal.SIGKILL)
                killed.set()

        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        status, result = run_bounded(run, hang_timeout)
        done.set()
        killer.join()
        return killed.is_set(), status, result, {"victim": victim, "delay": round(delay, 3)}
    n, delay = rng.randint(1, 4), rng.uniform(0.001, 0.05)
    marker = os.path.join(tempfile.gettempdir(), f"gdask-chaos-{uuid.uuid4().hex}")
    before = set(worker_pids(client))
    client.register_plugin(type("ExitInTaskPlugin", (ExitInTask, WorkerPlugin), {})(n, delay, marker))
    try:
        status, result = run_bounded(run, hang_timeout)
    finally:
        try:
            client.unregister_worker_plugin(ExitInTask.name)
        except Exception:  # noqa: BLE001 - the plugin may be gone with its worker
            pass
    killed = os.path.exists(marker)
    if killed:
        os.remove(marker)
    victim = None
    if killed:  # the worker that exited (the first address missing from the cluster)
        gone = sorted(before - set(scheduler_workers(client)))
        victim = gone[0] if gone else "?"
    return killed, status, result, {"victim": victim, "task": n, "delay": round(delay, 3)}


def kill_part(args, rows: dict, log: list) -> None:
    from distributed import Client

    import gdask

    n_workers = 2
    with gdask.LocalGPUCluster(n_devices=n_workers, backend="emulated", device_memory="512MiB",
                               dashboard_address=":0") as cluster, Client(cluster) as client:
        scenarios = kill_scenarios(client, args.quick, args.seed)
        if args.scenarios:
            scenarios = {k: v for k, v in scenarios.items() if any(p in k for p in args.scenarios)}
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
        for name, run in scenarios.items():
            row = rows[name]
            kills = attempts = 0
            while kills < args.runs and attempts < 3 * args.runs:
                attempts += 1
                trigger = ("timer", "in-task")[kills % 2]
                with MemoryPeak() as mem:
                    killed, status, result, detail = _one_kill(client, run, trigger, rng, durations[name],
                                                               args.hang_timeout)
                row["host_peak"] = max(row["host_peak"], mem.peak)
                if not killed:
                    if not wait_for_workers(client, n_workers, None, 5):
                        raise RuntimeError("the cluster lost a worker without a kill")
                    continue  # the run ended before the kill: not a kill run
                kills += 1
                wrong = status == "ok" and not same_bits(result, refs[name])
                count_run(row, status, wrong)
                back = wait_for_workers(client, n_workers, detail["victim"])
                row["killed"] += 1
                row["restarted"] += back
                row[trigger] += 1
                log.append({"part": "kill", "scenario": name, "trigger": trigger, **detail, "status": status,
                            "wrong": wrong, "restarted": back, "error": None if status != "error" else repr(result)})
                print(f"  kill {kills}/{args.runs}: {name}, {trigger} {detail}: {status}"
                      f"{', WRONG RESULT' if wrong else ''}{'' if back else ', WORKER NOT RESTARTED'}"
                      + (f" ({result!r})" if status == "error" else ""), flush=True)
                if status == "hang":
                    return  # a hung fit keeps running in its thread: the cluster is no longer comparable
            if kills < args.runs:
                args.short = [*getattr(args, "short", []), name]


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


# -- soak ------------------------------------------------------------------------------------------------
def _rss(dask_worker=None) -> int:
    """This process's resident memory after a garbage collection (bytes)."""
    import gc

    import psutil

    gc.collect()
    return psutil.Process().memory_info().rss


PROFILE = "distributed.worker.profile.enabled"


def soak_part(args, rows: dict, log: list) -> None:
    """``--soak`` fits on one cluster; the memory of each process after each fit (see the docstring)."""
    import dask
    from distributed import Client

    import gdask
    import gdask.ml

    rng = np.random.default_rng(args.seed)
    n = 40_000 if args.quick else 120_000
    X = rng.standard_normal((n, 8)).astype(np.float32)
    y = (X @ rng.standard_normal(8) > 0).astype(np.int64)
    histories = {"distributed.admin.low-level-log-length": args.soak_log_length, PROFILE: args.soak_log_length >= 1000}
    with dask.config.set(histories), gdask.LocalGPUCluster(
            n_devices=2, backend="emulated", device_memory="512MiB", dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        G, Y = gdask.from_array(X, block_rows=n // 8).persist(), gdask.from_array(y, block_rows=n // 8).persist()
        series: dict[str, list[int]] = defaultdict(list)
        t0 = time.perf_counter()
        for i in range(args.soak):
            if i % 2 == 0:
                km = gdask.ml.KMeans(8, init=X[:8], max_iter=15, tol=0).fit(G)
                del km
            else:
                lr = gdask.ml.LogisticRegression(max_iter=30).fit(G, Y)
                del lr
            series["client + scheduler"].append(_rss())
            for k, (addr, v) in enumerate(sorted(client.run(_rss).items())):
                series[f"worker {k}"].append(v)
        seconds = time.perf_counter() - t0
    start = min(10, args.soak // 2)
    table = []
    for proc, values in series.items():
        xs = np.arange(start, len(values))
        slope = float(np.polyfit(xs, np.asarray(values[start:], float), 1)[0]) if len(xs) > 1 else 0.0
        table.append({"process": proc, "after_first": values[start - 1], "end": values[-1], "per_fit": slope})
    rows["soak"] = {"fits": args.soak, "seconds": seconds, "table": table, "log_length": args.soak_log_length,
                    "flat": all(r["per_fit"] <= args.soak_limit * 1024 for r in table)}
    log.append({"part": "soak", **rows["soak"]})
    print(f"  {args.soak} fits (KMeans and LogisticRegression alternating) in {seconds:.0f} s; distributed's "
          f"low-level logs {args.soak_log_length} long, workers' profiler {'on' if histories[PROFILE] else 'off'}")
    print(f"  {'process':20} {f'after {start} fits':>14} {'at the end':>12} {'growth per fit':>15}")
    for r in table:
        print(f"  {r['process']:20} {r['after_first'] / MiB:>10.1f} MiB {r['end'] / MiB:>8.1f} MiB "
              f"{r['per_fit'] / 1024:>11.1f} KiB")


# -- main ----------------------------------------------------------------------------------------------
COLUMNS = ("runs", "survived", "wrong", "hangs", "killed", "restarted", "host_peak", "timer", "in-task")


def print_table(rows: dict) -> None:
    head = (f"{'scenario':34} {'runs':>5} {'timer/in-task':>14} {'survived':>9} {'wrong':>6} {'hangs':>6} "
            f"{'restarts':>10} {'host peak':>10}")
    print(head)
    print("-" * len(head))
    total = defaultdict(int)
    for name, r in rows.items():
        if name == "soak" or not r["runs"]:
            continue
        restarts = f"{r['restarted']}/{r['killed']}" if r["killed"] else "-"
        triggers = f"{r['timer']}/{r['in-task']}"
        print(f"{name:34} {r['runs']:>5} {triggers:>14} {r['survived']:>9} {r['wrong']:>6} {r['hangs']:>6} "
              f"{restarts:>10} {r['host_peak'] / MiB:>7.0f} MiB")
        for k in COLUMNS:
            total[k] = max(total[k], r[k]) if k == "host_peak" else total[k] + r[k]
    print("-" * len(head))
    restarts = f"{total['restarted']}/{total['killed']}"
    triggers = f"{total['timer']}/{total['in-task']}"
    print(f"{'total':34} {total['runs']:>5} {triggers:>14} {total['survived']:>9} {total['wrong']:>6} "
          f"{total['hangs']:>6} {restarts:>10} {total['host_peak'] / MiB:>7.0f} MiB")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=None, help="kill runs per scenario (default 10; 2 with --quick)")
    p.add_argument("--scenarios", nargs="*", default=[],
                   help="only the kill scenarios whose names contain one of these")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="2 kills per scenario, smaller data and devices, 20 soak fits")
    p.add_argument("--hang-timeout", type=float, default=300.0, help="seconds after which a run counts as hung")
    p.add_argument("--soak", type=int, default=None, help="fits of the soak part (default 60; 20 with --quick)")
    p.add_argument("--soak-limit", type=float, default=64.0, help="KiB per fit a process may grow in the soak")
    p.add_argument("--soak-log-length", type=int, default=20,
                   help="distributed's low-level log length in the soak (1000, its default, also keeps the workers' "
                        "profiler on: then the soak measures distributed's own histories filling up too)")
    p.add_argument("--skip", nargs="*", default=[], choices=["kill", "pressure", "jobs", "soak"])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.runs is None:
        args.runs = 2 if args.quick else 10
    if args.soak is None:
        args.soak = 20 if args.quick else 60
    setup = _common.setup(["psutil"], runs=args.runs, soak=args.soak, seed=args.seed, quick=args.quick,
                          devices="emulated")
    _common.print_setup(setup)
    rows: dict[str, dict] = defaultdict(lambda: dict.fromkeys(COLUMNS, 0))
    log: list[dict] = []
    t0 = time.perf_counter()
    for part, func in (("kill", kill_part), ("pressure", pressure_part), ("jobs", jobs_part), ("soak", soak_part)):
        if part in args.skip:
            continue
        print(f"{part}:", flush=True)
        func(args, rows, log)
    print(f"\nchaos: {time.perf_counter() - t0:.0f} s, emulated devices\n")
    print_table(rows)
    runs = {k: v for k, v in rows.items() if k != "soak"}
    total = {k: sum(r[k] for r in runs.values()) for k in COLUMNS if k != "host_peak"}
    soak_ok = "soak" in args.skip or rows["soak"]["flat"]
    ok = (total["wrong"] == 0 and total["hangs"] == 0 and total["survived"] == total["runs"]
          and total["restarted"] == total["killed"] and soak_ok)
    short = getattr(args, "short", [])  # kill scenarios whose runs ended before every kill could fall inside
    if short:
        print(f"\nfewer than {args.runs} kills inside the run: {', '.join(short)}")
    ok = ok and not short
    print("\nresult:", "PASS" if ok else "FAIL", "(0 wrong results, 0 hangs, every run survived, every killed worker "
          "restarted, the soak flat)")
    _common.write_json(args.json, {"setup": setup, "rows": [{"scenario": k, **v} for k, v in rows.items()],
                                   "runs": log, "pass": ok})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
