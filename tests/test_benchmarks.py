"""Every benchmark script runs to its end at tiny sizes and writes its JSON (smoke tests), and the
pure pieces the benchmarks score with (Belady's optimum, the contention worlds, the job-mix
simulation) are correct.

The figures at these sizes mean nothing (a bar may or may not be met; load_balance and overhead exit 1 then),
so a smoke test checks that the benchmark ran and that its JSON holds the rows and columns the
issue asks for (and relations that hold at any size), never a timing. Baselines that need the
``bench`` extra (dask-ml) are skipped.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

CASES = {
    "kmeans": ["--rows", "20000", "--features", "8", "--clusters", "4", "--iterations", "3", "--repeat", "1",
               "--skip", "dask-ml", "dask-array", "sklearn-elkan", "--fresh-cluster-fits", "1"],
    "logistic": ["--rows", "20000", "--features", "8", "--repeat", "1", "--skip", "dask-ml"],
    "load_balance": ["--rows", "16000", "--block-rows", "2000", "--iterations", "2", "--row-cost", "1e-6"],
    "overhead": ["--tasks", "40", "--blocks", "8", "--block-rows", "100", "--repeats", "1"],
    "streams": ["--max-streams", "3", "--static-rounds", "1", "--adaptive-rounds", "4", "--bar-rounds", "4",
                "--blocks", "4", "--work-ms", "2"],
    "window": ["--quick", "--device-memory", "4MiB", "--iterations", "2", "--repeat", "1", "--features", "8",
               "--clusters", "4"],
    "sharing": ["--quick", "--jobs", "4", "--scale", "0.2", "--arrival", "0.05", "--corun-rounds", "1",
                "--corun-duration", "0.25", "--mix-seeds", "1", "--mix-jobs", "6"],
    "cycles": ["--cycles", "1", "--sharing", "0", "--rows", "20000"],
    "lstm": ["--tasks", "sine", "--rows", "600", "--test-rows", "100", "--timesteps", "6", "--hidden", "4",
             "--epochs", "2", "--batch-size", "64"],
    "chaos": ["--quick", "--runs", "2", "--scenarios", "logistic regression (capped)", "--soak", "6",
              "--soak-limit", "100000"],
    "decomposition": ["--quick", "--rows", "3000", "--features", "8", "--components", "3"],
    "linear_model": ["--quick", "--rows", "3000", "--features", "8"],
    "mixture": ["--quick", "--rows", "3000", "--features", "3", "--components", "3"],
    "collective": ["--steps", "5", "--repeat", "1", "--rows", "4000", "--features", "4", "--clusters", "3"],
    "incremental": ["--rows", "4000", "--features", "4", "--blocks", "4", "--iterations", "3", "--refit-blocks", "8",
                    "--refit-block-rows", "100", "--nodes", "4000", "--graph-blocks", "2", "--p-back", "0.05"],
}


def _check_cycles(d):
    assert d["failed"] == 0 and not any(d["totals"].values()), d  # no worker died, no heartbeat error
    assert d["runs"][0]["ok"]


def _check_window(d):
    rows = {r["id"]: r for r in d["results"]}
    assert {"all-fits", "window", "lru-alternating", "optimal", "bound", "lru-cyclic", "lru-exclusive"} <= set(rows)
    for r in rows.values():
        assert 0.0 <= r["hit_rate"] <= 1.0
        assert {"moved_per_pass", "ms_per_iter"} <= set(r)
    opt, win = rows["optimal"], rows["window"]
    assert opt["measured"] is False and opt["reads"] == win["reads"]  # Belady ran on (a)'s whole read trace
    assert opt["hits"] >= win["hits"]  # no policy beats the optimum on its own trace and slots
    assert rows["lru-alternating"]["scan"] == win["scan"]  # same scan order and hints as the window
    assert all(r["identical_to_d"] for r in rows.values() if r["measured"])
    b = d["bound"]  # the bandwidth bound: never below the all-fits time; the bus was measured on each worker
    assert b["ms_per_iter"] >= rows["all-fits"]["ms_per_iter"] and b["ratio"] > 0
    assert len(b["bus_bytes_per_s"]) == d["devices"] and all(v > 0 for v in b["bus_bytes_per_s"].values())
    assert rows["bound"]["measured"] is False and rows["bound"]["ms_per_iter"] == b["ms_per_iter"]  # the bound's row
    # iteration by iteration: one ratio per iteration of every run, (d) and (a) in turns
    assert len(b["ratio_per_iteration"]) == d["iterations"] * d["repeat"]
    for r in rows.values():  # the workers' CPU per iteration by thread (clock ticks of 10 ms: no group is sure > 0)
        if r["measured"]:
            cpu = r["worker_cpu_ms_per_iter"]
            assert r["worker_cpu_ms_per_iter_total"] > 0 and set(cpu) <= {"event loop", "tasks", "copies", "other"}


def _check_sharing(d):
    worlds = d["worlds"]
    assert {"stated", "roofline", "real"} <= set(worlds)
    for w in worlds.values():
        assert math.isfinite(w["mape_new"]) and w["colocations_new"] > 0
        sim = w["simulation"]
        assert set(sim["mean_jct"]) == {"whole-device", "first-fit", "gdask"}
        assert all(v > 0 for v in sim["mean_jct"].values())
    # the control world has the model's own form, noise-free: the scoring must find it (near) exact
    assert worlds["stated"]["mape_new"] < 0.05
    real = worlds["real"]
    assert real["slowdowns"] and all(s["median"] > 0 for s in real["slowdowns"])
    assert set(real["profiles"]) == {"gemm", "stream", "mixed"}
    assert {r["policy"] for r in d["results"]} == {"whole-device", "first-fit", "gdask"}


def _check_chaos(d):
    rows = {r["scenario"]: r for r in d["rows"]}
    kills = [r for r in d["runs"] if r["part"] == "kill"]
    assert len(kills) == 2 and all(r["restarted"] for r in kills)  # each run had its kill, the worker came back
    assert {r["trigger"] for r in kills} == {"timer", "in-task"}
    assert {"pressure 2x: op chains", "pressure 4x: kmeans", "two jobs on one device"} <= set(rows)
    soak = rows.pop("soak")
    assert soak["fits"] == 6 and {r["process"] for r in soak["table"]} == {"client + scheduler", "worker 0", "worker 1"}
    for r in rows.values():  # correctness holds at any size: the figures that are not timings
        assert r["wrong"] == 0 and r["hangs"] == 0 and r["survived"] == r["runs"], r
        assert r["host_peak"] > 0
    assert d["pass"] is True


def _check_logistic(d):
    rows = {r["name"]: r for r in d["results"]}
    assert {"gdask float32", "gdask float64", "scikit-learn float32", "scikit-learn float64"} <= set(rows)
    assert d["reference"] == "scikit-learn float64"
    assert rows["gdask float64"]["computes_in"] == "float64"
    assert rows["gdask float32"]["computes_in"] == "float32"
    for r in rows.values():
        assert r["coef_diff"] < 1e-3, r


def _check_kmeans(d):
    rows = {r["name"]: r for r in d["results"]}
    assert {"gdask", "scikit-learn"} <= set(rows) and rows["gdask"]["center_diff"] < 1e-3
    fits = d["default_fits"]  # whole fits with default parameters, side by side
    assert len(fits) == 2 and all(f["gdask_s"] > 0 and f["sklearn_s"] > 0 for f in fits)
    for f in fits:  # both converge to a clustering about as good (the 4 clusters of the data)
        assert f["gdask_inertia"] <= 1.05 * f["sklearn_inertia"], f
    fresh = d["fresh_cluster_fits"]  # first fits on a fresh cluster, both transfers, and scikit-learn's
    assert len(fresh) == 1 and all(fresh[0][k] > 0 for k in ("gdask_s", "gdask_graph_s", "sklearn_s"))
    assert fresh[0]["gdask_inertia"] <= 1.05 * fresh[0]["sklearn_inertia"], fresh


def _check_incremental(d):
    loop = d["loop"]
    assert len(loop["dask.array persisted"]) == len(loop["dask.array"]) == len(loop["gdask"])
    for naive, kept in zip(loop["dask.array"], loop["dask.array persisted"]):
        assert kept["executed"] < naive["executed"]  # the persisted loop no longer recomputes the static part
    assert loop["max_weight_diff_persisted"] < 1e-9
    orders = {r["order"] for r in d["pagerank"]}
    assert orders == {"link", "shuffled"}
    for r in d["pagerank"]:
        assert r["scipy"]["max_rank_diff"] < 1e-5 and r["networkx"]["max_rank_diff"] < 1e-5
        assert r["max_rank_diff"] < 1e-5


def _check_load_balance(d):
    for side in ("gdask", "stock"):
        for workload in ("synthetic", "kmeans"):
            w = d[side][workload]
            assert len(w["solo_rows_per_s"]) == 4 and all(v > 0 for v in w["solo_rows_per_s"].values())
            assert w["ideal_solo"] > 0
            for it in w["iterations"]:
                assert it["ideal_used"] == "busy" and it["ideal_solo"] == w["ideal_solo"]
    # how far apart the measured solo rates are (speeds 1, 1, 0.5, 0.25) is a timing, reported by the
    # benchmark and not asserted here: at this size on a shared machine other processes' load sets it


#: benchmarks with a --plot figure (gdask.plot)
PLOTS = ("load_balance", "window", "sharing")


def _check_lstm(d):
    rows = {r["impl"]: r for r in d["results"] if r["task"] == "sine"}
    assert set(rows) == {"a", "b", "c"}
    assert all(len(r["epochs"]) == d["epochs"] for r in rows.values())
    assert all(e["h2d_bytes"] == 0 for e in rows["a"]["epochs"])  # the data stays on the devices
    assert all(e["h2d_bytes"] > 0 for e in rows["b"]["epochs"])  # the DataLoader moves every batch
    assert all(e["h2d_bytes"] > 0 for e in rows["c"]["epochs"])  # the window brings blocks back
    assert rows["c"]["data_bytes"] >= 2 * rows["c"]["device_memory"] * 0.99
    ag = d["agreement"]["sine"]
    assert ag["a_b_first_epoch_loss"] is True and ag["a_b_max_rel_loss_diff"] < 1e-3  # the same batches


def _check_collective(d):
    sizes = [r["bytes"] for r in d["allgather"]]
    assert sizes == sorted(sizes) and len(sizes) >= 3
    for r in d["allgather"]:  # each transport was the one asked for
        assert r["direct_connected"] is True and r["rpc_connected"] is False
        assert r["ratio"] == r["direct_median_ms"] / r["rpc_median_ms"] > 0
    assert {r["fit"] for r in d["fits"]} == {"KMeans", "LogisticRegression"}
    assert all(r["mode"] == "workers" and r["rpc_s"] > 0 and r["direct_s"] > 0 for r in d["fits"])


def _check_agreement(column, bound):
    def check(d):
        names = {r["name"].split()[0] for r in d["results"]}
        assert {"gdask", "scikit-learn"} <= names
        for r in d["results"]:
            if not r["name"].startswith("dask-ml"):  # dask-ml solves its own variant (see the scripts)
                assert r[column] < bound, r
    return check


CHECKS = {"decomposition": _check_agreement("var rel diff", 1e-6),
          "linear_model": _check_agreement("coef rel diff", 1e-4),
          "mixture": _check_agreement("means rel diff", 1e-6),
          "window": _check_window, "lstm": _check_lstm, "sharing": _check_sharing, "logistic": _check_logistic,
          "incremental": _check_incremental, "load_balance": _check_load_balance, "cycles": _check_cycles,
          "chaos": _check_chaos, "collective": _check_collective, "kmeans": _check_kmeans}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_runs_at_tiny_size(name, tmp_path):
    out = tmp_path / f"{name}.json"
    png = tmp_path / f"{name}.png"
    plot = ["--plot", str(png)] if name in PLOTS else []
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *CASES[name], "--json", str(out), *plot],
                          check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-3000:]).strip()
    assert proc.returncode in (0, 1), tail  # 1: a bar not met, at this size
    assert "Traceback" not in proc.stdout, tail
    assert "setup: " in proc.stdout, tail  # every benchmark states its baselines' setup
    data = json.loads(out.read_text())
    assert data, tail
    setup = data.get("setup") or data.get("setup_info")
    assert setup and setup["versions"]["numpy"], tail
    if name in CHECKS:
        CHECKS[name](data)
    if plot:  # --plot wrote a PNG figure
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, tail


# -- the pure pieces ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bench_modules():
    sys.path.insert(0, str(BENCH))
    try:
        import _corun
        import _worlds
        import window

        yield window, _worlds, _corun
    finally:
        sys.path.remove(str(BENCH))


def _brute_force_hits(trace, slots):
    """The most hits over every eviction choice (exhaustive), from an empty cache."""
    @lru_cache(None)
    def best(i, cache):
        if i == len(trace):
            return 0
        k = trace[i]
        if k in cache:
            return 1 + best(i + 1, cache)
        if len(cache) < slots:
            return best(i + 1, cache | {k})
        if not slots:
            return best(i + 1, cache)
        return max(best(i + 1, (cache - {v}) | {k}) for v in cache)

    return best(0, frozenset())


def test_belady_is_optimal_on_random_traces(bench_modules):
    window = bench_modules[0]
    rng = random.Random(0)
    for _ in range(200):
        trace = [rng.randrange(5) for _ in range(rng.randrange(1, 11))]
        slots = rng.randrange(0, 4)
        assert window.belady_hits(trace, slots, warm=False) == _brute_force_hits(trace, slots), (trace, slots)


def test_belady_on_scans(bench_modules):
    window = bench_modules[0]
    cyclic = list(range(10)) * 3
    alternating = (list(range(10)) + list(range(9, -1, -1))) * 2
    assert window.belady_hits(cyclic, 5, warm=False) == 10  # 30 reads, 10 compulsory misses
    # alternating scans keep the blocks just read: only the far half of each pass misses
    assert window.belady_hits(alternating, 5, warm=False) == 15
    assert window.belady_hits(cyclic, 10, warm=True) == 30
    with pytest.raises(ValueError, match="slots"):
        window.belady_hits(cyclic, -1)


def test_worlds_alone_is_one_and_unmeasured_colocation_raises(bench_modules):
    _, worlds, corun = bench_modules
    rl = worlds.Roofline(worlds.ROOFLINE_KINDS)
    for k in rl.kinds:
        assert rl.slowdown(k, []) == pytest.approx(1.0)
    # two bandwidth-bound kernels below saturation still queue in the roofline world (the stated model says 1.04)
    assert rl.slowdown("bandwidth-bound", ["bandwidth-bound"]) > 1.5
    table = worlds.TableWorld({(("gemm", "stream"), "gemm"): 1.3})
    assert table.slowdown("gemm", []) == 1.0
    assert table.slowdown("gemm", ["stream"]) == 1.3
    with pytest.raises(KeyError, match="not measured"):
        table.slowdown("gemm", ["gemm"])
    cols = corun.colocations(["a", "b", "c"])
    assert len(cols) == 6 + 10 and len(set(cols)) == len(cols)
    train, test = worlds.split(cols, seed=0)
    assert set(train).isdisjoint(test) and set(train) | set(test) == set(cols)
    assert {len(c) for c in test} == {2, 3}


def test_score_fits_the_stated_world_and_not_trivially(bench_modules):
    _, worlds, corun = bench_modules
    from gdask.scheduling import InterferenceModel, JobProfile

    dem = {"x": (0.6, 0.1), "y": (0.1, 0.6), "z": (0.4, 0.4)}

    def stated(own, others):  # the emulator's form: the model's own features
        cc = sum(dem[o][0] for o in [own, *others])
        bb = sum(dem[o][1] for o in [own, *others])
        c, b = dem[own]
        return 1 + c / (c + b) * max(0, cc - 1) + b / (c + b) * max(0, bb - 1) + 0.04 * len(others)

    cols = corun.colocations(list(dem), sizes=(2, 3, 4))
    train, test = worlds.split(cols, seed=1)
    prof = {k: JobProfile(*v) for k, v in dem.items()}
    sc = worlds.score(worlds.observations(train, stated), worlds.observations(test, stated), prof, InterferenceModel)
    assert sc["mape_new"] < 0.02 < sc["mape_none"]


def test_simulate_sharing_helps_without_interference(bench_modules):
    _, worlds, _ = bench_modules
    from gdask.scheduling import JobRequest, first_fit, place, whole_device

    jobs = [{"name": f"j{i}", "kind": "k", "arrival": 0.0, "work": 1.0} for i in range(4)]
    req = {"k": JobRequest("k", gpu=0.5, memory="1GiB")}
    free = (lambda own, others: 1.0)
    r_whole = worlds.simulate(jobs, whole_device, free, devices=1, requests=req)
    r_ff = worlds.simulate(jobs, first_fit, free, devices=1, requests=req)
    assert r_whole["makespan"] == pytest.approx(4.0)  # one job at a time
    assert r_ff["makespan"] == pytest.approx(2.0)  # two at a time, no slowdown
    # with a slowdown of 2 beside any co-runner, sharing gains nothing in makespan
    slow = (lambda own, others: 2.0 if others else 1.0)
    r = worlds.simulate(jobs, place, slow, devices=1, requests=req)
    assert r["makespan"] == pytest.approx(4.0)
    mix = worlds.make_mix(["a", "b"], 5, seed=3, work=(1.0, 2.0), gap=0.5)
    assert [j["kind"] for j in mix[:2]] == ["a", "b"] and all(1.0 <= j["work"] <= 2.0 for j in mix)
    assert all(x["arrival"] <= y["arrival"] for x, y in itertools.pairwise(mix))
