"""Scheduling overhead of gdask's placement plugin: per-task time with the plugin vs without.

Two LocalGPUClusters with the same emulated devices run side by side, one with
:class:`gdask.scheduling.GPUPlacement` (the default) and one with ``placement=False`` (stock Dask);
repetitions alternate between them so that machine noise hits both alike. Workloads:

* ``tiny``: 5,000 tiny plain Dask tasks (``client.map(inc)``): non-GPU work the plugin must leave
  alone at no cost;
* ``gdataset``: a 200-block GDataSet reduction (``X.sum(axis=0)``), GPU tasks the plugin places.

Reported: median wall time per task (over ``--repeats``) and the ratio plugin / stock.
Bar: ratio <= 1.15.

    python benchmarks/overhead.py [--repeats 5] [--json out.json]
    python benchmarks/overhead.py --backend cuda      # logical devices on a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import _common
import numpy as np


def inc(x):
    return x + 1


def _tiny(client, n):
    t0 = time.perf_counter()
    futs = client.map(inc, range(n), pure=False)
    client.gather(futs)
    dt = time.perf_counter() - t0
    del futs
    return dt, n


def _gdataset(client, X, expected):
    to_numpy = _common.to_numpy

    t0 = time.perf_counter()
    out = X.sum(axis=0).compute()
    dt = time.perf_counter() - t0
    out = to_numpy(out)  # CuPy on --backend cuda
    if not np.allclose(out, expected):
        raise AssertionError("GDataSet reduction gave a wrong result")
    # block partials + tree combines + the result task
    ntasks = X.nblocks + -(-X.nblocks // 8) + 2
    return dt, ntasks


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=5000)
    p.add_argument("--blocks", type=int, default=200)
    p.add_argument("--block-rows", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--backend", choices=["emulated", "cuda"], default="emulated",
                   help="cuda: logical devices on the machine's GPUs (one GPU splits into --devices)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from distributed import Client, wait

    import gdask

    data = np.random.default_rng(0).random((args.blocks * args.block_rows, 4))
    expected = data.sum(axis=0)
    print(f"device: {args.backend}, {args.devices} devices (1 stream each); {args.tasks} tiny tasks; GDataSet of "
          f"{args.blocks} blocks x {args.block_rows} rows x 4; {args.repeats} alternating repeats, median")
    setup = _common.setup(dtype="float64 (GDataSet), Python ints (tiny tasks)",
                          baseline="the same devices with placement=False (stock Dask scheduling)",
                          clusters="2 LocalGPUClusters side by side, repetitions alternate")
    _common.print_setup(setup)
    kw = dict(n_devices=args.devices, backend=args.backend, device_memory="512MiB", dashboard_address=":0")
    with gdask.LocalGPUCluster(placement=True, **kw) as cg, gdask.LocalGPUCluster(placement=False, **kw) as cs, \
            Client(cg) as gc, Client(cs) as sc:
        _common.warmed(gc, sc)
        sides = {"gdask": gc, "stock": sc}
        Xs = {}
        for name, c in sides.items():
            with c.as_current():
                X = gdask.from_array(data, block_rows=args.block_rows).persist()
                wait(X)
                Xs[name] = X
                _tiny(c, 500)  # warm-up
                _gdataset(c, X, expected)
        times: dict = {w: {n: [] for n in sides} for w in ("tiny", "gdataset")}
        for _ in range(args.repeats):
            for name, c in sides.items():
                with c.as_current():
                    dt, n = _tiny(c, args.tasks)
                    times["tiny"][name].append(dt / n)
                    dt, n = _gdataset(c, Xs[name], expected)
                    times["gdataset"][name].append(dt / n)
        stats = gc.sync(gc.scheduler.gdask_placement_stats)
    ok = True
    print(f"\n{'workload':>9} | {'gdask us/task':>13} | {'stock us/task':>13} | {'ratio':>6} | bar <= 1.15")
    result = {}
    for w, by in times.items():
        g, s = statistics.median(by["gdask"]), statistics.median(by["stock"])
        ratio = g / s
        met = ratio <= 1.15
        ok = ok and met
        result[w] = {"gdask_s_per_task": g, "stock_s_per_task": s, "ratio": ratio, "runs": by}
        print(f"{w:>9} | {g * 1e6:13.1f} | {s * 1e6:13.1f} | {ratio:6.3f} | {'MET' if met else 'NOT MET'}")
    placed = sum(v["placed"] for v in stats["workers"].values())
    print(f"\ngdask plugin placed {placed} GPU tasks (plain tasks are left to Dask), moved {stats['moves']} blocks")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "device": args.backend, "setup": setup, **result}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
