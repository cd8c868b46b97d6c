"""Loops on the workers: the all-gather's latency and what it costs whole fits, with the tasks connected
directly (Unix sockets, ``gdask.collective.direct: true``, the default) and through distributed's worker
RPC (``false``), side by side.

Two parts, on one LocalGPUCluster of emulated devices (one worker process per device, all on this host):

* ``allgather``: a loop on the workers that only all-gathers, ``--steps`` steps per value size (a few
  bytes to megabytes: values over 64 MiB go by RPC in both modes); time per step (median and 90th
  percentile, rank 0's clock). Transports alternate, ``--repeat`` rounds.
* ``fits``: KMeans (``--rows`` x ``--features``, K=``--clusters``, 10 iterations, tol=0) and
  LogisticRegression (same rows, 32 features, lbfgs) on persisted data, the two transports alternating
  fit by fit; the fastest whole ``fit`` of ``--repeat`` per transport, and the ratio direct / RPC.

The floor of one step is a round trip between two processes (printed: a Unix socket pair's ping-pong
in this process, ~0.07 ms on an idle 2-core machine).

    python benchmarks/collective.py [--steps 200] [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import _common
import numpy as np

SIZES = (8, 4096, 262_144, 4_194_304)  # bytes of each rank's value


def _steps(comm, nbytes, steps):
    """(On a worker) ``steps`` all-gathers of an ``nbytes`` value; seconds per step and the transport."""
    value = np.zeros(max(nbytes // 8, 1))
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        comm.allgather(value)
        times.append(time.perf_counter() - t)
    return {"seconds": times, "direct": comm.direct is not None}


def ping_pong(rounds=2000):
    """Median seconds of a 32-byte round trip over a Unix socket pair to a child process."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child echoes
        try:
            for _ in range(rounds):
                b.sendall(b.recv(64))
        finally:
            os._exit(0)
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        a.sendall(b"x" * 32)
        a.recv(64)
        times.append(time.perf_counter() - t)
    os.waitpid(pid, 0)
    return float(np.median(times))


def run_allgather(client, peers, steps, repeat):
    import dask

    from gdask.gdataset.collective import run_on_workers

    rows = []
    for nbytes in SIZES:
        got = {True: [], False: []}
        used = {}
        for _ in range(repeat):
            for direct in (False, True):
                with dask.config.set({"gdask.collective.direct": direct}):
                    out = run_on_workers(client, _steps, peers, [(nbytes, steps)] * len(peers))
                got[direct] += out[0]["seconds"]
                used[direct] = out[0]["direct"]
        row = {"bytes": nbytes}
        for direct in (False, True):
            name = "direct" if direct else "rpc"
            a = np.asarray(got[direct]) * 1e3
            row[f"{name}_median_ms"] = float(np.median(a))
            row[f"{name}_p90_ms"] = float(np.percentile(a, 90))
            row[f"{name}_connected"] = bool(used[direct])
        row["ratio"] = row["direct_median_ms"] / row["rpc_median_ms"]
        rows.append(row)
    return rows


def run_fits(rows, features, clusters, repeat):
    import dask

    import gdask
    from gdask.ml import KMeans, LogisticRegression

    rng = np.random.default_rng(0)
    centers = rng.uniform(-10, 10, size=(clusters, features)).astype(np.float32)
    X = centers[rng.integers(0, clusters, rows)] + rng.standard_normal((rows, features), dtype=np.float32)
    init = X[rng.choice(rows, clusters, replace=False)].copy()
    Xl = rng.standard_normal((rows, 32)).astype(np.float32)
    yl = (Xl @ rng.standard_normal(32) + rng.standard_normal(rows) > 0).astype(np.int64)
    G, Gl, gy = gdask.from_array(X).persist(), gdask.from_array(Xl).persist(), gdask.from_array(yl).persist()
    fits = {
        "KMeans": lambda: KMeans(clusters, init=init, max_iter=10, tol=0).fit(G),
        "LogisticRegression": lambda: LogisticRegression(max_iter=100).fit(Gl, gy),
    }
    out = []
    for name, fit in fits.items():
        fit()  # compile on the workers
        best = {True: np.inf, False: np.inf}
        for _ in range(repeat):
            for direct in (False, True):
                with dask.config.set({"gdask.collective.direct": direct}):
                    t = time.perf_counter()
                    est = fit()
                    best[direct] = min(best[direct], time.perf_counter() - t)
        mode = getattr(est, "fit_mode_", None)
        out.append({"fit": name, "rpc_s": best[False], "direct_s": best[True], "ratio": best[True] / best[False],
                    "mode": mode})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="all-gathers per value size and round")
    p.add_argument("--repeat", type=int, default=3, help="rounds (all-gather) / fits per transport (fits)")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--features", type=int, default=24)
    p.add_argument("--clusters", type=int, default=20)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--skip", nargs="*", default=[], choices=["allgather", "fits"])
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    from distributed import Client

    import gdask
    from gdask._compat import scheduler_workers

    floor = ping_pong()
    with gdask.LocalGPUCluster(n_devices=a.devices, backend="emulated", dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        _common.warmed(client)
        peers = sorted(scheduler_workers(client))
        gather = [] if "allgather" in a.skip else run_allgather(client, peers, a.steps, a.repeat)
        fits = [] if "fits" in a.skip else run_fits(a.rows, a.features, a.clusters, a.repeat)
    setup = _common.setup(["numpy", "dask", "distributed"], devices=f"{len(peers)} emulated (one worker process each)",
                          steps=a.steps, repeat=a.repeat)
    print(f"\nAll-gather between {len(peers)} worker processes on one host: direct (Unix sockets) vs distributed's "
          f"worker RPC, alternating; floor: a Unix socket round trip takes {floor * 1e3:.3f} ms here")
    _common.print_setup(setup)
    if gather:
        print(f"{'value bytes':>12}{'rpc median ms':>15}{'rpc p90':>9}{'direct median ms':>18}{'direct p90':>12}"
              f"{'direct / rpc':>14}")
        for r in gather:
            print(f"{r['bytes']:>12,}{r['rpc_median_ms']:>15.2f}{r['rpc_p90_ms']:>9.2f}{r['direct_median_ms']:>18.2f}"
                  f"{r['direct_p90_ms']:>12.2f}{r['ratio']:>14.2f}")
    if fits:
        print(f"\n{'fit':<20}{'rpc s':>8}{'direct s':>10}{'direct / rpc':>14}  (fastest of {a.repeat}; "
              f"{a.rows:,} rows)")
        for r in fits:
            print(f"{r['fit']:<20}{r['rpc_s']:>8.3f}{r['direct_s']:>10.3f}{r['ratio']:>14.2f}  mode {r['mode']}")
    _common.write_json(a.json, {"setup": setup, "floor_ms": floor * 1e3, "allgather": gather, "fits": fits})


if __name__ == "__main__":
    main()
