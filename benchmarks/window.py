"""Window cache: K-means over a GDataSet twice as large as the devices' memory.

One run, same data, same initial centers, same loop (exact Lloyd: per-block partial sums, combined
in a fixed reduction tree, new centers on the client), one cluster per configuration:

  (a)  sliding window: WindowStore(policy="window"), alternating scan direction (task priorities)
       with the order hinted to the workers (gdask.window_cache.hint_order)
  (a') sliding window, the plain loop (no priorities, no hints): order learnt from the reads
  (b)  an LRU block store: WindowStore(policy="lru"), keeps host copies, no prefetch
  (c)  dask-cuda-style device->host spill: LRU, exclusive tiers (every eviction copies back)
  (d)  everything fits in device memory (upper bound): (a)'s loop with 2.5x the device memory

Emulated devices with a host<->device bandwidth (default 2 GB/s) so that copies cost time as over
PCIe. Each configuration runs the iterations ``--repeat`` times on its cluster (the fastest run
counts for time, for every configuration alike; hit rate and bytes are over all runs). (d) and (a)
are open at the same time and take turns run by run, so their time ratio sees the same machine load;
the table also gives the median of the run-by-run ratios (a)/(d). Reports device hit rate (reads served by blocks kept on the device, no copy), bytes moved per
pass (h2d + d2h) as a share of the dataset, time per iteration, and checks that every
configuration's centers are identical to (d)'s.

    python benchmarks/window.py            # 2 devices x 128 MiB, 512 MiB of data, 10 iterations
    python benchmarks/window.py --quick    # 2 devices x 32 MiB, 128 MiB of data
    python benchmarks/window.py --json out.json
    python benchmarks/window.py --backend cuda --quick   # logical devices with a memory limit on a GPU
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def make_data(n, d, k, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-10, 10, size=(k, d)).astype(np.float32)
    X = centers[rng.integers(0, k, n)] + rng.standard_normal((n, d), dtype=np.float32)
    init = X[rng.choice(n, k, replace=False)].astype(np.float64)
    return X, init


def _warm(dask_worker=None):
    """Compile the Lloyd kernel on a worker before timing (numba)."""
    from gdask.ml._kernels import lloyd_partial

    lloyd_partial(np.asfortranarray(np.ones((256, 4), np.float32)), np.ones((2, 4)))
    return True


def kmeans(G, init, iterations, *, scan_mode, hints, client):
    """Exact Lloyd iterations with one task per block; returns (centers, seconds per iteration)."""
    from gdask.ml._kernels import lloyd_combine, lloyd_partial
    from gdask.window_cache import scan

    centers = init.copy()
    keys = G.__dask_keys__()
    times = []
    for it in range(iterations):
        t0 = time.perf_counter()
        if scan_mode == "alternate":  # forward / backward passes, order hinted to the window stores
            with scan(keys, it, client=client, hint=hints):
                part = G.reduce_blocks(lloyd_partial, lloyd_combine, centers)
        else:  # the plain loop: Dask's own order
            part = G.reduce_blocks(lloyd_partial, lloyd_combine, centers)
        r = part.compute()
        nz = r["counts"] > 0
        centers = centers.copy()
        centers[nz] = r["sums"][nz] / r["counts"][nz, None]
        times.append(time.perf_counter() - t0)
    return centers, times


class Config:
    """One configuration's cluster, persisted dataset and runs (open while the benchmark runs)."""

    def __init__(self, name, X, init, a, *, store_kwargs, device_memory, scan, hints):
        self.name, self.X, self.init, self.a = name, X, init, a
        self.store_kwargs, self.device_memory, self.scan, self.hints = store_kwargs, device_memory, scan, hints
        self.runs = []

    def __enter__(self):
        import contextlib

        import dask
        from distributed import Client, wait

        import gdask
        from gdask.window_cache import WindowStore, stats

        a = self.a
        self._stack = stack = contextlib.ExitStack()
        # tasks run where their block is (no stealing, stock placement): the benchmark measures the store
        stack.enter_context(dask.config.set({"distributed.scheduler.work-stealing": False,
                                             "gdask.scheduling.placement": False}))
        cluster = stack.enter_context(gdask.LocalGPUCluster(
            n_devices=a.devices, backend=a.backend, device_memory=self.device_memory,
            bandwidth=a.bandwidth if a.backend == "emulated" else None,
            dashboard_address=":0", data=(WindowStore, self.store_kwargs)))
        self.client = client = stack.enter_context(Client(cluster, set_as_default=False))
        client.run(_warm)
        with client.as_current():
            t0 = time.perf_counter()
            self.G = gdask.from_array(self.X, block_rows=a.block_rows).persist()
            wait(self.G)
            self.t_persist = time.perf_counter() - t0
        self.setup = stats(client, reset=True)
        return self

    def run(self):
        """The same iterations again, from the same initial centers."""
        with self.client.as_current():
            self.runs.append(kmeans(self.G, self.init, self.a.iterations, scan_mode=self.scan, hints=self.hints,
                                    client=self.client))

    def __exit__(self, *exc):
        from gdask.window_cache import stats

        self.stats = stats(self.client)
        self._stack.close()
        return False

    def result(self):
        runs, s, a = self.runs, self.stats, self.a
        centers = runs[0][0]
        assert all(np.array_equal(c, centers) for c, _ in runs)
        times = min((t for _, t in runs), key=np.mean)  # the fastest run: every configuration alike
        passes = a.iterations * len(runs)
        nb = self.X.nbytes
        return {
            "name": self.name, "scan": self.scan + (" + hints" if self.hints else ""), "centers": centers,
            "ms_per_iter": 1e3 * float(np.mean(times)), "ms_per_iter_median": 1e3 * float(np.median(times)),
            "ms_per_iter_runs": [1e3 * float(np.mean(t)) for _, t in runs],
            "hit_rate": s["hit_rate"], "reads": s["reads"], "hits": s["hits"], "misses": s["misses"],
            "prefetch_hits": s["prefetch_hits"],
            "bytes_h2d": s["bytes_h2d"], "bytes_d2h": s["bytes_d2h"],
            "moved_per_pass": (s["bytes_h2d"] + s["bytes_d2h"]) / passes / nb,
            "stall_ms_per_iter": 1e3 * s["stall_time"] / passes, "iteration_ms": [1e3 * t for t in times],
            "persist_s": self.t_persist, "persist_bytes_d2h": self.setup["bytes_d2h"],
            "device_memory": self.device_memory,
            "window_bytes_end": s["window_bytes"], "capacity_bytes_end": s["capacity_bytes"],
            "window_samples": {w: v["window"][-50:] for w, v in s["workers"].items()},
        }


def run_configs(configs, X, init, a):
    """Run ``configs`` with ``a.repeat`` runs each. The first two ((d) and (a)) are open at the same
    time and run in turns, (d), (a), (d), (a), ..., so that their time ratio sees the same machine
    load (this machine is shared); the others run one after the other."""
    def make(c):
        name, kw, m, scan, hints = c
        return Config(name, X, init, a, store_kwargs=kw, device_memory=m, scan=scan, hints=hints)

    pair, rest = [make(c) for c in configs[:2]], [make(c) for c in configs[2:]]
    with pair[0], pair[1]:
        for _ in range(a.repeat):
            for c in pair:
                c.run()
    for c in rest:
        with c:
            for _ in range(a.repeat):
                c.run()
    return [c.result() for c in pair + rest]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--backend", choices=["emulated", "cuda"], default="emulated",
                   help="cuda: logical devices on the machine's GPUs, each limited to --device-memory; "
                        "copies go over the real bus (--bandwidth is ignored)")
    p.add_argument("--device-memory", default=None, help="per device (default 128MiB, --quick 32MiB)")
    p.add_argument("--data-factor", type=float, default=2.0, help="dataset size / total device memory")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--clusters", type=int, default=16)
    p.add_argument("--block-bytes", default=None, help="bytes per block (default device memory / 64)")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--bandwidth", default="2GB", help="emulated host<->device bandwidth per device")
    p.add_argument("--reserve", default="0", help="window reserve (bytes or fraction); one block is always kept")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--repeat", type=int, default=None,
                   help="runs of the iterations per configuration, the fastest counts (default 3)")
    p.add_argument("--quick", action="store_true", help="small sizes, skips (a')")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    from dask.utils import format_bytes, parse_bytes

    mem = parse_bytes(a.device_memory or ("32MiB" if a.quick else "128MiB"))
    a.repeat = a.repeat or 3
    bw = parse_bytes(a.bandwidth)
    block = parse_bytes(a.block_bytes) if a.block_bytes else mem // 64
    row = a.features * 4
    a.block_rows = max(1, block // row)
    n = int(a.data_factor * a.devices * mem) // row // a.block_rows * a.block_rows
    X, init = make_data(n, a.features, a.clusters)
    reserve = float(a.reserve) if "." in a.reserve else int(parse_bytes(a.reserve))
    window = {"policy": "window", "reserve": reserve, "prefetch": a.prefetch}
    lru = {"policy": "lru", "reserve": reserve}
    spill = {"policy": "lru", "reserve": reserve, "host_copy": False}
    big = int(mem * a.data_factor * 1.25)
    # (d) and (a) run next to each other: on a shared machine their time ratio is the least noisy
    configs = [
        ("(d) all fits (upper bound)", window, big, "alternate", True),  # (a)'s loop, memory to spare
        ("(a) sliding window", window, mem, "alternate", True),
        ("(a') window, plain loop", window, mem, "natural", False),
        ("(b) LRU store", lru, mem, "natural", False),
        ("(c) dask-cuda-style spill", spill, mem, "natural", False),
    ]
    if a.quick:
        configs = [c for c in configs if not c[0].startswith("(a')")]
    results = run_configs(configs, X, init, a)
    ref = results[0]
    bus = (f"host<->device {bw / 1e9:g} GB/s (emulated: CPU figures)" if a.backend == "emulated"
           else "host<->device over the GPU's bus")
    print(f"\nK-means {n:,} x {a.features} float32 = {format_bytes(X.nbytes)}, K={a.clusters}, {a.iterations} "
          f"iterations, {a.devices} {a.backend} devices x {format_bytes(mem)} (data = {a.data_factor:g}x device "
          f"memory), {bus}, blocks of {a.block_rows} rows "
          f"({format_bytes(a.block_rows * row)}), window reserve {a.reserve}, prefetch {a.prefetch}; hit rate and "
          f"bytes over {a.repeat} x {a.iterations} iterations, ms/iter = mean of the fastest of {a.repeat} runs")
    hdr = (f"{'configuration':<28}{'scan':<20}{'hit rate':>9}{'moved/pass':>11}{'ms/iter':>9}{'vs (d)':>8}"
           f"{'stall ms/it':>12}{'identical':>10}")
    print(hdr)
    for r in results:
        same = bool(np.array_equal(r["centers"], ref["centers"]))
        r["identical_to_d"] = same
        r["ratio_to_d"] = r["ms_per_iter"] / ref["ms_per_iter"]
        print(f"{r['name']:<28}{r['scan']:<20}{r['hit_rate']:>9.1%}{r['moved_per_pass']:>11.1%}"
              f"{r['ms_per_iter']:>9.1f}{r['ratio_to_d']:>8.2f}{r['stall_ms_per_iter']:>12.1f}{str(same):>10}")
    win = results[1]
    paired = [x / y for x, y in zip(win["ms_per_iter_runs"], ref["ms_per_iter_runs"])]
    win["paired_ratio_median"] = float(np.median(paired))
    print(f"(a)/(d) run by run (taking turns): {', '.join(f'{r:.2f}' for r in paired)}; median "
          f"{win['paired_ratio_median']:.2f}; (a) stall {win['stall_ms_per_iter']:.1f} ms/iter")
    lru_r = next(r for r in results if r["name"].startswith("(b)"))
    bars = {
        "hit_rate>=45%": win["hit_rate"] >= 0.45,
        "lru_hit_rate<5%": lru_r["hit_rate"] < 0.05,
        "moved_per_pass<=55%": win["moved_per_pass"] <= 0.55,
        "time_within_1.3x_of_d": win["ratio_to_d"] <= 1.3,
        "identical_results": all(r["identical_to_d"] for r in results),
    }
    print("bars (a): " + ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in bars.items()))
    if a.json:
        out = {"backend": a.backend, "devices": a.devices, "repeat": a.repeat, "device_memory": mem, "bandwidth": bw, "rows": n, "features": a.features,
               "k": a.clusters, "iterations": a.iterations, "block_rows": a.block_rows, "data_bytes": X.nbytes,
               "bars": bars,
               "results": [{k: v for k, v in r.items() if k != "centers"} for r in results]}
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2, default=str)


if __name__ == "__main__":
    main()
