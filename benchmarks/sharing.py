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

That world is the project's own: its slowdown terms are exactly the interference model's features,
so a fit there measures timing noise, not the model. The benchmark therefore also scores the model
and the policies on contention they were not written for (:mod:`_worlds`, :mod:`_corun`):

* ``real``: real CPU kernels (GEMM, STREAM triad, a mix, an L3-resident sum) co-running in
  separate processes on this machine's cores and memory bandwidth, measured (``_corun``);
* ``roofline``: a synthetic world outside the model's features (max of compute sharing and an M/M/1
  memory queue, thresholds on compute and on the cache's capacity);
* ``stated``: the emulator's model as a noise-free table (the control).

For each, the interference model learns from a seeded half of the co-locations (pairs and
triples) and its MAPE is reported on the other half, co-locations it sees for the first time, beside
two trivial predictors (no interference; the mean slowdown of co-locations of the same size). The
sharing policies then run seeded job mixes in each world (event simulation: a job progresses at
``1 / slowdown`` of its current co-location, taken from the world; for ``real``, the measured
slowdowns), with gdask's policy using the model trained on the training half.

    python benchmarks/sharing.py [--jobs 16] [--seed 0] [--scale 3] [--arrival 0.3] [--quick] [--json out.json]
        [--plot out.png]
    python benchmarks/sharing.py --worlds real,roofline,stated   # the worlds only (no cluster)
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import threading
import time

import _common
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
    from gdask.scheduling import current_job

    _common.current_device().kernel(work, compute, bandwidth, job=current_job())
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
        from gdask.devices import context

        dev = context(dask_worker).device
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


def table_worlds(args, log) -> dict:
    """Score the interference model and the sharing policies in the table worlds (stated,
    roofline, real); see the module docstring."""
    import _corun
    import _worlds

    from gdask.scheduling import (
        InterferenceModel,
        JobProfile,
        JobRequest,
        first_fit,
        place,
        whole_device,
    )

    out: dict = {}
    worlds = [w for w in args.worlds if w != "emulated"]
    policies = {"whole-device": whole_device, "first-fit": first_fit, "gdask": place}
    for world in worlds:
        t0 = time.perf_counter()
        if world == "stated":
            cm = _common.ContentionModel()
            dem = {k: (v["compute"], v["bandwidth"]) for k, v in KINDS.items()}

            def fn(own, others, cm=cm, dem=dem):
                return cm.slowdown(dem[own], [dem[own]] + [dem[o] for o in others])

            profiles = {k: JobProfile(c, b) for k, (c, b) in dem.items()}
            cols = _corun.colocations(list(KINDS))
            train, test = _worlds.split(cols, args.seed)
            train_obs, test_obs = _worlds.observations(train, fn), _worlds.observations(test, fn)
            requests = {k: JobRequest(k, gpu=v["gpu"], memory=f"{v['memory']}MiB", profile=profiles[k])
                        for k, v in KINDS.items()}
            info = {"form": "the emulator's s = 1 + wc*over_c + wb*over_b + 0.04(n-1) (the model's features)",
                    "noise": 0.0}
        elif world == "roofline":
            rl = _worlds.Roofline(_worlds.ROOFLINE_KINDS)
            fn = rl.slowdown
            profiles = {k: JobProfile(v["compute"], v["bandwidth"]) for k, v in rl.kinds.items()}
            cols = _corun.colocations(list(rl.kinds))
            train, test = _worlds.split(cols, args.seed)
            train_obs, test_obs = _worlds.observations(train, fn), _worlds.observations(test, fn)
            requests = {k: JobRequest(k, gpu=v["gpu"], memory=f"{v['memory']}MiB", profile=profiles[k])
                        for k, v in KINDS.items()}
            info = {"form": "max(compute sharing w/ threshold, M/M/1 memory queue), cache-capacity threshold",
                    "noise": 0.0, "kinds": rl.kinds}
        elif world == "real":
            kinds = args.corun_kinds
            cols = _corun.colocations(kinds)
            with _corun.CoRunner(kinds, 3, duration=args.corun_duration) as runner:
                m = runner.measure(cols, args.corun_rounds, log=log)
                blas = runner.blas
            peak = m["peak_bw"]
            cores = os.cpu_count() or 1
            solo = {k: statistics.median(v) for k, v in m["solo"].items()}
            profiles = {k: JobProfile(min(1.0, m["cpu"][k] / cores),
                                      min(1.0, _corun.dram_bytes_per_rep(k) / solo[k] / peak) if peak else 0.0)
                        for k in kinds}
            med: dict = {}
            for col, own, _, y in m["obs"]:
                med.setdefault((col, own), []).append(y)
            table = {key: statistics.median(v) for key, v in med.items()}
            fn = _worlds.TableWorld(table).slowdown
            train, test = _worlds.split(cols, args.seed)
            train_set = set(train)
            train_obs = [(col, own, y) for col, own, _, y in m["obs"] if col in train_set]
            test_obs = [(col, own, y) for (col, own), y in table.items() if col not in train_set]
            noise = statistics.mean(abs(y - table[(col, own)]) / table[(col, own)] for col, own, _, y in m["obs"])
            shares = {"gemm": 0.4, "stream": 0.3, "mixed": 0.3, "cache": 0.3}
            requests = {k: JobRequest(k, gpu=shares[k], memory="1GiB", profile=profiles[k]) for k in kinds}
            info = {"form": f"measured: {len(kinds)} CPU kernel kinds in up to 3 processes, {args.corun_rounds} "
                            f"rounds of {args.corun_duration:g} s runs", "noise": noise, "worker_blas_threads": blas,
                    "solo_ms_per_rep": {k: 1e3 * v for k, v in solo.items()},
                    "solo_ms_per_rep_rounds": {k: [1e3 * x for x in v] for k, v in m["solo"].items()},
                    "peak_bandwidth_gb_s": None if peak is None else peak / 1e9,
                    "slowdowns": [{"colocation": list(c), "kind": o, "median": y, "rounds": med[(c, o)]}
                                  for (c, o), y in table.items()]}
        else:
            raise ValueError(f"unknown world {world!r}; choose from emulated, stated, roofline, real")
        sc = _worlds.score(train_obs, test_obs, profiles, InterferenceModel)
        model = sc.pop("model")
        # the sharing policies on seeded job mixes in this world (gdask: the model trained above)
        kinds = list(requests)
        sims: dict = {p: [] for p in policies}
        for seed in range(args.mix_seeds):
            mix = _worlds.make_mix(kinds, args.mix_jobs, args.seed + seed, (2.0, 6.0), args.mix_gap)
            for pname, pol in policies.items():
                sims[pname].append(_worlds.simulate(mix, pol, fn, devices=args.sim_devices, requests=requests,
                                                    model=model))
        jct = {p: [r["mean_jct"] for r in v] for p, v in sims.items()}
        gain_whole = [w / g for w, g in zip(jct["whole-device"], jct["gdask"])]
        gain_ff = [f / g for f, g in zip(jct["first-fit"], jct["gdask"])]
        out[world] = {**info, "kinds": sorted(kinds), "profiles": {k: {"compute": p.compute, "bandwidth": p.bandwidth}
                                                                   for k, p in profiles.items()},
                      "colocations_train": len(train), "colocations_new": len(test), **sc,
                      "simulation": {"devices": args.sim_devices, "jobs": args.mix_jobs, "mixes": args.mix_seeds,
                                     "mean_gap_s": args.mix_gap, "solo_work_s": [2.0, 6.0],
                                     "mean_jct": {p: statistics.mean(v) for p, v in jct.items()},
                                     "jct_gain_vs_whole_device": statistics.mean(gain_whole),
                                     "jct_gain_vs_whole_device_range": [min(gain_whole), max(gain_whole)],
                                     "jct_gain_vs_first_fit": statistics.mean(gain_ff),
                                     "jct_gain_vs_first_fit_range": [min(gain_ff), max(gain_ff)]},
                      "seconds": time.perf_counter() - t0}
    return out


def report_worlds(worlds: dict, emulated: dict | None) -> None:
    fmt = (lambda x: "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%")
    print("\ninterference model on co-locations it sees for the first time (MAPE; trained on the other half)")
    print(f"{'world':<10}{'train/new':>10}{'model':>8}{'uses':>13}{'linear':>8}{'in-sample':>10}{'no-interf.':>11}"
          f"{'mean-by-n':>10}{'noise':>7}  {'JCT gain vs whole-device':>25}{'vs first-fit':>14}  form")
    for name, w in worlds.items():
        sim = w["simulation"]
        print(f"{name:<10}{w['colocations_train']:>5}/{w['colocations_new']:<4}{fmt(w['mape_new']):>8}"
              f"{w['predictor']:>13}{fmt(w['mape_linear']):>8}"
              f"{fmt(w['mape_train']):>10}{fmt(w['mape_none']):>11}{fmt(w['mape_mean_by_size']):>10}"
              f"{fmt(w['noise']):>7}  {sim['jct_gain_vs_whole_device']:>8.2f}x "
              f"({sim['jct_gain_vs_whole_device_range'][0]:.2f}-{sim['jct_gain_vs_whole_device_range'][1]:.2f})"
              f"{'':>4}{sim['jct_gain_vs_first_fit']:>6.2f}x "
              f"({sim['jct_gain_vs_first_fit_range'][0]:.2f}-{sim['jct_gain_vs_first_fit_range'][1]:.2f})  {w['form']}")
    if emulated is not None:
        print(f"{'emulated':<10}{'online':>10}{fmt(emulated.get('model_error_new')):>8}"
              f"{fmt(emulated.get('model_error')):>10}{'':>28}  {emulated['gain_whole']:>8.2f}x{'':>17}"
              f"{emulated['gain_ff']:>6.2f}x  the cluster run above (stated model + timing noise), measured JCT")
    print("model = InterferenceModel trained on the training half, by the predictor it chose (its errors on "
          "co-locations left out of its fit) (uses: linear = its feature model, mean-by-size = the default); linear = "
          "its feature model's MAPE, used or not; in-sample = on its own training data; no-interf. = predicting 1.0; "
          "mean-by-n = mean training slowdown of co-locations of the same size; noise = mean deviation of a round's "
          "slowdown from the median of its "
          "rounds (real world only): no predictor can be expected to err much less than the measurements vary")
    if worlds:
        w0 = next(iter(worlds.values()))["simulation"]
        print(f"JCT: event simulation, {w0['mixes']} seeded mixes of {w0['jobs']} jobs (solo 2-6 s, mean arrival gap "
              f"{w0['mean_gap_s']:g} s) on {w0['devices']} devices; gain = whole-device (or first-fit) mean JCT / "
              "gdask's, mean (min-max) over mixes")
    if "real" in worlds:
        r = worlds["real"]
        print("real world: solo ms/rep " + ", ".join(f"{k} {v:.2f}" for k, v in r["solo_ms_per_rep"].items())
              + f"; peak bandwidth {r['peak_bandwidth_gb_s'] or float('nan'):.1f} GB/s; measured profiles "
              + ", ".join(f"{k} c={v['compute']:.2f} b={v['bandwidth']:.2f}" for k, v in r["profiles"].items()))
        worst = sorted(r["predictions"], key=lambda p: -abs(p["predicted"] - p["measured"]) / p["measured"])[:3]
        print("real world, largest errors on new co-locations: " + "; ".join(
            f"{p['kind']} in {'+'.join(p['colocation'])}: measured {p['measured']:.2f}, predicted {p['predicted']:.2f}"
            for p in worst))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=None, help="jobs in the emulated cluster's mix (default 16, --quick 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=None,
                   help="multiplies the emulated kernels' device times (default 3, --quick 1)")
    p.add_argument("--arrival", type=float, default=0.3, help="mean seconds between job arrivals (default 0.3)")
    p.add_argument("--device-memory", default="512MiB", help="memory per emulated device (default 512MiB)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--worlds", default="emulated,stated,roofline,real",
                   help="emulated (the 4-device cluster run), stated, roofline, real (comma separated)")
    p.add_argument("--corun-kinds", default=None,
                   help="real world: kernel kinds (default gemm,stream,mixed,cache; --quick gemm,stream,mixed)")
    p.add_argument("--corun-rounds", type=int, default=None, help="real world: rounds (default 3, --quick 2)")
    p.add_argument("--corun-duration", type=float, default=None,
                   help="real world: seconds per co-run (default 0.5, --quick 0.3)")
    p.add_argument("--mix-jobs", type=int, default=None, help="simulated mixes: jobs (default 20, --quick 12)")
    p.add_argument("--mix-seeds", type=int, default=None, help="simulated mixes per world (default 5, --quick 3)")
    p.add_argument("--mix-gap", type=float, default=1.0, help="simulated mixes: mean arrival gap, s (default 1)")
    p.add_argument("--sim-devices", type=int, default=2, help="simulated mixes: devices (default 2)")
    p.add_argument("--quick", action="store_true", help="8 jobs on the cluster, smaller worlds (under ~1 min)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--plot", default=None, help="write the figure (JCT, makespan, utilisation per policy) to this PNG")
    args = p.parse_args(argv)
    q = args.quick
    args.jobs = args.jobs or (8 if q else 16)
    args.scale = args.scale if args.scale is not None else (1.0 if q else 3.0)
    args.corun_kinds = (args.corun_kinds or ("gemm,stream,mixed" if q else "gemm,stream,mixed,cache")).split(",")
    args.corun_rounds = args.corun_rounds or (2 if q else 3)
    args.corun_duration = args.corun_duration or (0.3 if q else 0.5)
    args.mix_jobs = args.mix_jobs or (12 if q else 20)
    args.mix_seeds = args.mix_seeds or (3 if q else 5)
    args.worlds = [w.strip() for w in args.worlds.split(",") if w.strip()]
    setup = _common.setup(["scikit-learn", "threadpoolctl"], worlds=",".join(args.worlds),
                          emulated="4 emulated devices, kernels = GIL-free waits under the stated model",
                          real="CPU kernels in separate processes, BLAS threads pinned to 1 per process")
    _common.print_setup(setup)

    def log(msg):
        print(msg, flush=True)

    results = []
    emulated = None
    if "emulated" in args.worlds:
        jobs = make_jobs(args.jobs, args.seed, args.scale, args.arrival)
        print(f"{len(jobs)} jobs on 4 emulated devices ({args.device_memory} each), arrivals over "
              f"{jobs[-1]['arrival']:.1f} s; stated contention model: s = 1 + wc*max(0,C-1) + wb*max(0,B-1) + "
              "0.04*(n-1)")
        print("kinds (per-kernel demand stated to the emulator, never to the scheduler): " + ", ".join(
            f"{k} c={v['compute']} b={v['bandwidth']} gpu={v['gpu']} mem={v['memory']}MiB" for k, v in KINDS.items()))
        for policy in args.policies.split(","):
            r = run_policy(policy, jobs, args)
            results.append(r)
            print(f"  {policy:13s} done: makespan {r['makespan']:.2f} s, mean JCT {r['mean_jct']:.2f} s", flush=True)
        emulated = report_emulated(results)
    worlds = table_worlds(args, log)
    report_worlds(worlds, emulated)
    if "real" in worlds:
        r = worlds["real"]
        print(f"real-contention world, new co-locations, same run: interference model MAPE {100 * r['mape_new']:.1f}% "
              f"(uses {r['predictor']}; its linear feature model {100 * r['mape_linear']:.1f}%), mean-by-size "
              f"{100 * r['mape_mean_by_size']:.1f}%, measurement noise {100 * r['noise']:.1f}%")
    out = {"setup": setup, "jobs": make_jobs(args.jobs, args.seed, args.scale, args.arrival)
           if "emulated" in args.worlds else [], "results": results, "worlds": worlds}
    _common.write_json(args.json, out)
    if args.plot and results:
        from gdask import plot

        print(f"figure: {plot.save(plot.sharing(out), args.plot)}")
    return 0


def report_emulated(results: list[dict]) -> dict:
    """The emulated cluster's table; returns its gains and model errors for the worlds table."""
    base = next((r for r in results if r["policy"] == "whole-device"), results[0])
    print()
    print(f"{'policy':14s} {'makespan s':>10s} {'mean JCT s':>10s} {'JCT gain':>9s} {'mean wait s':>11s} "
          f"{'utilisation':>11s} {'slowdown':>9s}")
    for r in results:
        print(f"{r['policy']:14s} {r['makespan']:10.2f} {r['mean_jct']:10.2f} {base['mean_jct'] / r['mean_jct']:8.2f}x "
              f"{r['mean_wait']:11.2f} {r['utilisation']:10.1%} {r['measured_slowdown']:9.2f}")
    g = next((r for r in results if r["policy"] == "gdask"), None)
    if g is None:
        return None
    err, new = g["model_error"], g["model_error_new"]
    fmt = (lambda x: "n/a" if x is None else f"{100 * x:.1f}%")
    print(f"\ninterference model (gdask run): {g['observations']} clean co-location measurements, "
          f"prequential MAPE {fmt(err)}, on co-locations seen for the first time {fmt(new)}")
    print("measured profiles: " + ", ".join(f"{k} c={v['compute']:.2f} b={v['bandwidth']:.2f}"
                                           for k, v in (g["profiles"] or {}).items()))
    ff = next((r for r in results if r["policy"] == "first-fit"), None)
    out = {"model_error": err, "model_error_new": new, "gain_whole": base["mean_jct"] / g["mean_jct"],
           "gain_ff": ff["mean_jct"] / g["mean_jct"] if ff else math.nan}
    bars = [f"mean JCT {out['gain_whole']:.2f}x better than whole-device (bar 1.3x)"]
    if ff is not None:
        bars.append(f"{out['gain_ff']:.2f}x better than first-fit (bar > 1)")
    bars.append(f"model error {fmt(err)} (bar <= 15%; this world's terms are the model's features)")
    print("bars (emulated world): " + "; ".join(bars))
    return out


if __name__ == "__main__":
    sys.exit(main())
