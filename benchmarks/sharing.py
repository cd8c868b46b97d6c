"""Many jobs sharing 4 devices: whole-device allocation vs first-fit packing vs gdask, same run.

A mix of jobs arrives over time (seeded): K-means-like, logistic-regression-like, PageRank-like,
compute-bound and bandwidth-bound block kernels, of different sizes. Each job runs inside
``gdask.job(client, gpu=..., memory=..., name=..., kind=...)``: it creates its GDataSet (job-private
keys, placed on the job's devices only) and runs its iterations, one ``reduce_blocks`` per
iteration, each block task one device kernel. The three policies run the same jobs with the same
arrival times on a fresh 4-device LocalGPUCluster each (config ``gdask.scheduling.sharing.policy``):

* ``whole-device``: one job per device, the others queue (what clusters that hand out whole GPUs do);
* ``first-fit``: naive packing, each job on the first device with enough free share and memory;
* ``gdask``: interference-aware, multi-dimensional placement (:func:`gdask.scheduling.place`) with
  the interference model learned online from the workers' measurements.

Emulated devices and the stated contention model
-----------------------------------------------
No GPU here: a block kernel is *emulated device time* (``EmulatedDevice.kernel``, a GIL-free wait)
with a demand ``(compute, bandwidth)``, the fractions of the device it keeps busy alone. Kernels
that share a device slow each other down by the stated model of
:class:`gdask._devices._contention.ContentionModel` (processor sharing)::

    s_k = 1 + w_c * max(0, C - 1) + w_b * max(0, B - 1) + 0.04 * (n - 1)

(``C``, ``B``: total demand of the ``n`` running kernels; ``w_c``, ``w_b``: the kernel's own
compute / bandwidth weight). The kinds' demands are stated below; they stand in for the real
algorithms' profiles, which only a GPU could measure. The scheduler is never told the model or the
demands: each kind's profile is *measured* (device usage counters over one solo profiling job per
kind, run before the mix and not timed) and the interference model learns from measured task
slowdowns while the mix runs. Its error is the mean absolute percentage error of the prediction it
made for each clean co-location measurement *before* learning from it (prequential, i.e. held out).

    python benchmarks/sharing.py [--jobs 16] [--seed 0] [--scale 3] [--arrival 0.3] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time

import numpy as np

#: kind -> per-kernel device seconds alone (``work``, at ``--scale 1``), demand (compute, bandwidth),
#: share requested, memory requested (MiB). Jobs of one kind differ in size by their iterations.
KINDS = {
    "kmeans": {"work": 0.12, "compute": 0.30, "bandwidth": 0.15, "gpu": 0.5, "memory": 96},
    "logistic": {"work": 0.10, "compute": 0.20, "bandwidth": 0.22, "gpu": 0.5, "memory": 128},
    "pagerank": {"work": 0.15, "compute": 0.06, "bandwidth": 0.36, "gpu": 0.25, "memory": 160},
    "compute-bound": {"work": 0.14, "compute": 0.45, "bandwidth": 0.04, "gpu": 0.5, "memory": 64},
    "bandwidth-bound": {"work": 0.10, "compute": 0.04, "bandwidth": 0.45, "gpu": 0.25, "memory": 96},
}
POLICIES = ("whole-device", "first-fit", "gdask")
BLOCKS = 2  # blocks per job (their kernels run at once on the job's device)


def job_chunk(blk, it, work, compute, bandwidth):
    """One block's device kernel: ``work`` seconds at full speed alone, demand (compute, bandwidth)."""
    from gdask.devices import current_device
    from gdask.scheduling import current_job

    current_device().kernel(work, compute, bandwidth, job=current_job())
    return np.array([blk.shape[0] + 0.0 * it])


def job_combine(parts):
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def make_jobs(n: int, seed: int, scale: float, arrival: float) -> list[dict]:
    rng = random.Random(seed)
    kinds = list(KINDS)
    jobs, t = [], 0.0
    for i in range(n):
        kind = kinds[i % len(kinds)] if i < len(kinds) else rng.choice(kinds)
        jobs.append({
            "name": f"{kind}-{i}", "kind": kind, "arrival": round(t, 3),
            "iterations": rng.randint(6, 20), "work": round(KINDS[kind]["work"] * scale, 4),
        })
        t += rng.expovariate(1.0 / arrival)
    return jobs


def run_iterations(client, kind: str, iterations: int, work: float) -> None:
    """A job's body: its GDataSet (created inside the job: job-private keys), one reduction per iteration."""
    import gdask

    k = KINDS[kind]
    X = client.persist(gdask.from_array(np.ones((BLOCKS * 256, 8), dtype="f4"), block_rows=256))
    for it in range(iterations):
        client.compute(X.reduce_blocks(job_chunk, job_combine, it, work, k["compute"], k["bandwidth"])).result()


def run_job(client, spec: dict, t0: float, out: dict, errors: list) -> None:
    import gdask

    try:
        time.sleep(max(0.0, t0 + spec["arrival"] - time.time()))
        arrived = time.time()
        k = KINDS[spec["kind"]]
        with gdask.job(client, gpu=k["gpu"], memory=f"{k['memory']}MiB", name=spec["name"], kind=spec["kind"]) as j:
            started = time.time()
            run_iterations(client, spec["kind"], spec["iterations"], spec["work"])
        out[spec["name"]] = {"arrival": arrived - t0, "start": started - t0, "finish": time.time() - t0,
                             "devices": list(j.devices)}
    except BaseException as e:  # reported by the main thread
        errors.append((spec["name"], repr(e)))


def _device_busy(client) -> dict:
    def busy(dask_worker):
        dev = dask_worker.gdask_device
        return dev.clock.busy if getattr(dev, "_clock", None) is not None else 0.0

    return client.run(busy)


def profile_kinds(client, iterations: int, scale: float) -> None:
    """One solo job per kind (not timed): the scheduler measures each kind's profile and solo times."""
    import gdask

    for kind, k in KINDS.items():
        with gdask.job(client, gpu=1.0, memory=f"{k['memory']}MiB", name=f"profile-{kind}", kind=kind):
            run_iterations(client, kind, iterations, k["work"] * scale)


def run_policy(policy: str, jobs: list[dict], args) -> dict:
    import dask
    from distributed import Client

    import gdask
    from gdask.scheduling import jobs as jobs_table

    with dask.config.set({"gdask.scheduling.sharing.policy": policy}):
        cluster = gdask.LocalGPUCluster(n_devices=4, backend="emulated", device_memory=args.device_memory,
                                        streams=8)
    with cluster, Client(cluster) as client:
        profile_kinds(client, 3, args.scale)
        before = _device_busy(client)
        out: dict = {}
        errors: list = []
        t0 = time.time() + 0.5
        threads = [threading.Thread(target=run_job, args=(client, s, t0, out, errors), daemon=True) for s in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(f"{policy}: jobs failed: {errors}")
        after = _device_busy(client)
        table = jobs_table(client)
    jct = [r["finish"] - r["arrival"] for r in out.values()]
    makespan = max(r["finish"] for r in out.values()) - min(r["arrival"] for r in out.values())
    util = {w: (after[w] - before.get(w, 0.0)) / makespan for w in after}
    mix = table.loc[[s["name"] for s in jobs]]
    return {
        "policy": policy, "makespan": makespan, "mean_jct": statistics.mean(jct), "max_jct": max(jct),
        "mean_wait": statistics.mean(r["start"] - r["arrival"] for r in out.values()),
        "utilisation": statistics.mean(util.values()), "utilisation_per_device": sorted(util.values()),
        "measured_slowdown": float(np.nanmean(mix["measured_slowdown"].to_numpy(dtype=float)))
        if mix["measured_slowdown"].notna().any() else 1.0,
        "model_error": table.attrs.get("model_error"), "model_error_new": table.attrs.get("model_error_new"),
        "observations": table.attrs.get("observations"), "profiles": table.attrs.get("profiles"),
        "jobs": out,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=16, help="jobs in the mix (default 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=3.0, help="multiplies the kernels' device times (default 3)")
    p.add_argument("--arrival", type=float, default=0.3, help="mean seconds between job arrivals (default 0.3)")
    p.add_argument("--device-memory", default="512MiB", help="memory per emulated device (default 512MiB)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--quick", action="store_true", help="8 jobs")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.jobs = 8
    jobs = make_jobs(args.jobs, args.seed, args.scale, args.arrival)
    print(f"{len(jobs)} jobs on 4 emulated devices ({args.device_memory} each), arrivals over "
          f"{jobs[-1]['arrival']:.1f} s; stated contention model: s = 1 + wc*max(0,C-1) + wb*max(0,B-1) + 0.04*(n-1)")
    print("kinds (per-kernel demand stated to the emulator, never to the scheduler): " + ", ".join(
        f"{k} c={v['compute']} b={v['bandwidth']} gpu={v['gpu']} mem={v['memory']}MiB" for k, v in KINDS.items()))
    results = []
    for policy in args.policies.split(","):
        r = run_policy(policy, jobs, args)
        results.append(r)
        print(f"  {policy:13s} done: makespan {r['makespan']:.2f} s, mean JCT {r['mean_jct']:.2f} s", flush=True)
    base = next((r for r in results if r["policy"] == "whole-device"), results[0])
    print()
    print(f"{'policy':14s} {'makespan s':>10s} {'mean JCT s':>10s} {'JCT gain':>9s} {'mean wait s':>11s} "
          f"{'utilisation':>11s} {'slowdown':>9s}")
    for r in results:
        print(f"{r['policy']:14s} {r['makespan']:10.2f} {r['mean_jct']:10.2f} {base['mean_jct'] / r['mean_jct']:8.2f}x "
              f"{r['mean_wait']:11.2f} {r['utilisation']:10.1%} {r['measured_slowdown']:9.2f}")
    g = next((r for r in results if r["policy"] == "gdask"), None)
    if g is not None:
        err, new = g["model_error"], g["model_error_new"]
        fmt = (lambda x: "n/a" if x is None else f"{100 * x:.1f}%")
        print(f"\ninterference model (gdask run): {g['observations']} clean co-location measurements, "
              f"prequential MAPE {fmt(err)}, on co-locations seen for the first time {fmt(new)}")
        print("measured profiles: " + ", ".join(f"{k} c={v['compute']:.2f} b={v['bandwidth']:.2f}"
                                               for k, v in (g["profiles"] or {}).items()))
        ff = next((r for r in results if r["policy"] == "first-fit"), None)
        bars = [f"mean JCT {base['mean_jct'] / g['mean_jct']:.2f}x better than whole-device (bar 1.3x)"]
        if ff is not None:
            bars.append(f"{ff['mean_jct'] / g['mean_jct']:.2f}x better than first-fit (bar > 1)")
        bars.append(f"model error {fmt(err)} (bar <= 15%)")
        print("bars: " + "; ".join(bars))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"jobs": jobs, "results": results}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
