"""Load balancing on unequal devices: gdask placement vs stock Dask placement, same run.

Four emulated devices with speeds 1.0, 1.0, 0.5, 0.25 (``--speeds``). Two GDataSet workloads over
many blocks and several iterations:

* ``synthetic``: a block kernel whose device time is ``--row-cost`` seconds per row at speed 1
  (a GIL-free sleep inside ``EmulatedDevice.run``, which stretches it by ``1 / speed``), reduced
  with ``reduce_blocks``: each block's task may run on any device.
* ``kmeans``: Lloyd iterations with gdask's fused Lloyd kernel (real arithmetic) plus the same
  emulated per-row device time, one ``reduce_groups`` task per worker's blocks per iteration
  (``block_groups`` asked again each iteration), as ``gdask.ml.KMeans`` does.

Per iteration: makespan (wall time of the iteration), two ideals, ratio = makespan / ideal, and
imbalance (max / mean device busy time):

* ``ideal busy``: total device work at speed 1 / total speed, from the devices' measured busy time.
  Exact on emulated devices, which do not contend; on CUDA the logical devices share one GPU, so
  their busy time includes the contention and this is no lower bound;
* ``ideal solo``: all rows / the sum of the devices' solo rates (rows per second), each measured
  before the run with that device running alone (the others idle), per workload. A lower bound as
  long as co-running only slows devices down. ``ratio`` uses it on CUDA, ``ideal busy`` on
  emulated devices (both are printed). By default gdask starts WITHOUT the configured speeds (it learns
them from measured task times; ``--use-configured-speeds`` seeds them). This machine has 2 cores:
the device time is emulated so that 4 worker processes do not distort the speeds by contending
for cores; the heterogeneity is a simulation and is labelled so.

    python benchmarks/load_balance.py [--speeds 1,1,0.5,0.25] [--iterations 6] [--json out.json] [--plot out.png]
    python benchmarks/load_balance.py --backend cuda     # logical devices on a GPU, real kernels
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import _common
import numpy as np

from gdask._compat import scheduler_workers


def _spin(blk, row_cost: float):
    """Device time of ``rows * row_cost`` seconds at speed 1. Emulated devices: a GIL-free sleep
    (the device stretches it by 1 / speed). CUDA (``--backend cuda``): real GEMMs on the block,
    repeated ``row_cost * 1e5 / speed`` times, the speed being this logical device's entry of
    ``--speeds`` (a slowed-down share of the GPU, since one GPU's logical devices are equal)."""
    if not hasattr(blk, "get"):
        time.sleep(blk.shape[0] * row_cost)
        return
    import cupy as cp
    from distributed import get_worker

    speed = _CUDA_SPEEDS[int(get_worker().name) % len(_CUDA_SPEEDS)]
    w = cp.ones((blk.shape[1], 256), blk.dtype)
    for _ in range(max(1, round(row_cost * 1e5 / speed))):
        (blk @ w).sum()
    cp.cuda.get_current_stream().synchronize()


#: --backend cuda: speeds of the logical devices, by worker name (set on the workers by main)
_CUDA_SPEEDS = [1.0]


def _set_cuda_speeds(speeds):
    global _CUDA_SPEEDS
    _CUDA_SPEEDS = list(speeds)


def synthetic_chunk(blk, row_cost, it):
    _spin(blk, row_cost)
    to_numpy = _common.to_numpy

    return to_numpy(blk.sum(axis=0, dtype=np.float64)) * 0 + blk.shape[0] + it * 0


def synthetic_combine(parts):
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def kmeans_chunk(blk, centers, row_cost):
    _spin(blk, row_cost)
    return _common.lloyd_partial(blk, centers)


def kmeans_combine(parts):
    return _common.lloyd_combine(parts)


def _warm_kmeans(centers):
    _common.lloyd_partial(np.asfortranarray(np.repeat(centers, 4, axis=0)), centers)


def _solo_rate(rows, cols, row_cost, workload, centers, reps=3):
    """Rows per second of this worker's device running ``workload``'s block kernel alone (median
    of ``reps`` runs on a device block of ``rows`` rows, after a warm-up run), through the
    device's own timed path (``compute``: emulated speed, CUDA stream sync)."""
    dev = _common.current_device()
    blk = dev.asarray(np.ones((rows, cols), np.float32))
    if workload == "synthetic":
        args = (synthetic_chunk, blk, row_cost, 0)
    else:
        args = (kmeans_chunk, blk, centers.astype(np.float32), row_cost)
    dev.compute(*args)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        dev.compute(*args)
        dev.synchronize()
        times.append(time.perf_counter() - t)
    return rows / statistics.median(times)


def solo_rates(client, args, workload, init):
    """``{worker: rows/s}`` measured one device at a time, the others idle (see :func:`_solo_rate`)."""
    out = {}
    for addr in sorted(scheduler_workers(client)):
        fut = client.submit(_solo_rate, args.block_rows, args.cols, args.row_cost, workload, init,
                            workers=[addr], allow_other_workers=False, pure=False)
        out[addr] = float(fut.result())
    return out


def _busy(client, speeds=None):
    """Worker -> (speed, device busy seconds); ``speeds`` (by worker name) replaces the devices'
    own on CUDA, where the heterogeneity is made by the kernels (see ``_spin``)."""
    def busy(dask_worker):
        from gdask.devices import context

        dev = context(dask_worker).device
        return dask_worker.name, dev.spec.speed, dev.busy_time

    out = client.run(busy)
    return {w: ((speeds[int(n) % len(speeds)] if speeds else sp), busy) for w, (n, sp, busy) in out.items()}


def _iteration_stats(before, after, makespan, ideal_solo, use_solo):
    busy = {w: after[w][1] - before[w][1] for w in after}
    speed = {w: after[w][0] for w in after}
    work = sum(busy[w] * speed[w] for w in busy)  # device-seconds at speed 1
    ideal_busy = work / sum(speed.values())
    ideal = ideal_solo if use_solo else ideal_busy
    mean = statistics.mean(busy.values())
    return {"makespan": makespan, "ideal": ideal, "ideal_busy": ideal_busy, "ideal_solo": ideal_solo,
            "ideal_used": "solo" if use_solo else "busy", "ratio": makespan / ideal if ideal else float("nan"),
            "ratio_solo": makespan / ideal_solo if ideal_solo else float("nan"),
            "imbalance": max(busy.values()) / mean if mean else float("nan")}


def run(placement: bool, args, data: np.ndarray, init: np.ndarray) -> dict:
    import dask
    from distributed import Client, wait

    import gdask
    block_workers = _common.block_workers

    speeds = [float(s) for s in args.speeds.split(",")]
    out: dict = {}
    cuda = args.backend == "cuda"
    with dask.config.set({"gdask.scheduling.use-configured-speeds": args.use_configured_speeds}):
        cluster = gdask.LocalGPUCluster(n_devices=len(speeds), backend=args.backend,
                                        device_speeds=None if cuda else speeds,
                                        device_memory="1GiB", placement=placement, dashboard_address=":0")
    kernel_speeds = speeds if cuda else None
    with cluster, Client(cluster) as client:
        if cuda:
            client.run(_set_cuda_speeds, speeds)
        out["worker_threads"] = sorted({w["nthreads"] for w in scheduler_workers(client).values()})
        for workload in args.workloads.split(","):
            if workload == "kmeans":  # compile the numba kernel outside the timed, device-timed region
                client.run(_warm_kmeans, init)
            solo = solo_rates(client, args, workload, init)  # before the run, one device at a time
            ideal_solo = len(data) / sum(solo.values())
            X = gdask.from_array(data, block_rows=args.block_rows).persist()
            wait(X)
            per_dev = {}
            where, _ = block_workers(X, client, wait_ready=True)
            for a in where.values():
                per_dev[a] = per_dev.get(a, 0) + 1
            names = {a: w["name"] for a, w in scheduler_workers(client).items()}
            iters = []
            centers = init.copy()
            result = None
            for it in range(args.iterations):
                before = _busy(client, kernel_speeds)
                t0 = time.perf_counter()
                if workload == "synthetic":
                    result = X.reduce_blocks(synthetic_chunk, synthetic_combine, args.row_cost, it).compute()
                else:
                    groups = X.block_groups(client)
                    parts = dask.compute(*X.reduce_groups(kmeans_chunk, kmeans_combine, centers, args.row_cost,
                                                          groups=groups))
                    tot = kmeans_combine(list(parts))
                    counts = np.maximum(tot["counts"], 1)[:, None]
                    centers = np.where(tot["counts"][:, None] > 0, tot["sums"] / counts, centers).astype(data.dtype)
                    result = centers
                makespan = time.perf_counter() - t0
                iters.append(_iteration_stats(before, _busy(client, kernel_speeds), makespan, ideal_solo, cuda))
            where, _ = block_workers(X, client, wait_ready=True)
            final = {}
            for a in where.values():
                final[names.get(a, a)] = final.get(names.get(a, a), 0) + 1
            out[workload] = {"iterations": iters, "result": np.asarray(result).tolist(),
                             "blocks_start": {names.get(a, a): n for a, n in sorted(per_dev.items())},
                             "blocks_end": dict(sorted(final.items())),
                             "solo_rows_per_s": {names.get(a, a): r for a, r in sorted(solo.items())},
                             "ideal_solo": ideal_solo}
            del X
        if placement:
            out["placement_stats"] = {k: v for k, v in client.sync(client.scheduler.gdask_placement_stats).items()
                                      if k in ("moves", "replaced")}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--speeds", default="1,1,0.5,0.25", help="emulated device speeds (comma separated)")
    p.add_argument("--backend", choices=["emulated", "cuda"], default="emulated",
                   help="cuda: one logical device per speed on the machine's GPUs, real GEMM kernels "
                        "repeated 1/speed times")
    p.add_argument("--rows", type=int, default=960_000)
    p.add_argument("--cols", type=int, default=8)
    p.add_argument("--block-rows", type=int, default=40_000)
    p.add_argument("--row-cost", type=float, default=1e-5, help="emulated device seconds per row at speed 1")
    p.add_argument("--clusters", type=int, default=8, help="K-means clusters")
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--workloads", default="synthetic,kmeans")
    p.add_argument("--use-configured-speeds", action="store_true",
                   help="seed gdask with the configured speeds instead of learning them")
    p.add_argument("--json", default=None, help="write results to this file")
    p.add_argument("--plot", default=None, help="write the figure (makespan / ideal, blocks per device) to this PNG")
    args = p.parse_args(argv)

    rng = np.random.default_rng(0)
    data = rng.standard_normal((args.rows, args.cols)).astype(np.float32)
    init = data[rng.choice(args.rows, args.clusters, replace=False)].copy()
    nblocks = -(-args.rows // args.block_rows)
    if args.backend == "cuda":
        print(f"device: cuda logical devices (heterogeneity made by the kernels: GEMMs repeated "
              f"{args.row_cost * 1e5:g}/speed times), speeds {args.speeds}")
    else:
        print(f"device: emulated (simulated heterogeneity; device time = {args.row_cost:g} s/row at speed 1, "
              f"a GIL-free sleep stretched by 1/speed), speeds {args.speeds}")
    print(f"data: {args.rows} x {args.cols} float32 in {nblocks} blocks of {args.block_rows} rows; "
          f"{args.iterations} iterations; gdask speeds "
          f"{'configured' if args.use_configured_speeds else 'learned from measurements'}")
    res = {"gdask": run(True, args, data, init), "stock": run(False, args, data, init)}
    setup = _common.setup(["numba", "cupy-cuda12x"] if args.backend == "cuda" else ["numba"], dtype="float32",
                          backend=args.backend, devices=len(args.speeds.split(",")),
                          worker_threads=res["gdask"]["worker_threads"],
                          baseline="stock Dask placement (placement=False) on the same devices",
                          ideal="solo rates (measured per device, alone, before the run)" if args.backend == "cuda"
                          else "device busy time (emulated devices do not contend); solo-rate ideal also shown")
    _common.print_setup(setup)
    ok = True
    for workload in args.workloads.split(","):
        g, s = res["gdask"][workload], res["stock"][workload]
        same = np.allclose(np.asarray(g["result"]), np.asarray(s["result"]), rtol=1e-5, atol=1e-6)
        print(f"\n== {workload}: results equal gdask vs stock: {same}")
        print(f"blocks per device  gdask start {g['blocks_start']} end {g['blocks_end']}; "
              f"stock {s['blocks_start']}")
        print("solo rates, rows/s, each device alone before the run: gdask cluster "
              + ", ".join(f"{k} {v:,.0f}" for k, v in g["solo_rows_per_s"].items()) + "; stock cluster "
              + ", ".join(f"{k} {v:,.0f}" for k, v in s["solo_rows_per_s"].items())
              + f"; ideal solo = {args.rows} rows / sum: gdask {g['ideal_solo']:.3f} s, stock {s['ideal_solo']:.3f} s")
        used = g["iterations"][0]["ideal_used"] if g["iterations"] else "busy"
        print(f"ratio = makespan / ideal {used}")
        print(f"{'iter':>4} | {'gdask s':>8} {'i.busy':>6} {'i.solo':>6} {'ratio':>6} {'imbal':>6} | "
              f"{'stock s':>8} {'i.busy':>6} {'i.solo':>6} {'ratio':>6} {'imbal':>6}")
        for i, (a, b) in enumerate(zip(g["iterations"], s["iterations"]), 1):
            print(f"{i:>4} | {a['makespan']:8.3f} {a['ideal_busy']:6.3f} {a['ideal_solo']:6.3f} {a['ratio']:6.3f} "
                  f"{a['imbalance']:6.2f} | {b['makespan']:8.3f} {b['ideal_busy']:6.3f} {b['ideal_solo']:6.3f} "
                  f"{b['ratio']:6.3f} {b['imbalance']:6.2f}")
        later = [a["ratio"] for a in g["iterations"][2:]]
        met = bool(later) and max(later) <= 1.10
        stock_later = [b["ratio"] for b in s["iterations"][2:]]
        mean_later = statistics.mean(later) if later else float("nan")
        print(f"bar (gdask <= 1.10x ideal {used} from iteration 3): {'MET' if met else 'NOT MET'} "
              f"(gdask max {max(later, default=float('nan')):.3f}, mean {mean_later:.3f}; "
              f"stock mean {statistics.mean(stock_later) if stock_later else float('nan'):.3f})")
        ok = ok and met and same
    if "placement_stats" in res["gdask"]:
        print(f"\ngdask placement: {res['gdask']['placement_stats']}")
    _common.write_json(args.json, {"args": vars(args), "device": args.backend, "setup": setup, **res})
    if args.plot:
        from gdask import plot

        print(f"figure: {plot.save(plot.load_balance({'args': vars(args), 'device': args.backend, **res}), args.plot)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
