"""Cluster life cycles with the CUDA libraries importable: no worker may die.

With RMM importable, distributed gives every worker an async ``rmm`` metric that its heartbeat awaits in
the middle of iterating ``worker.metrics``; anything that adds a metric meanwhile ends the worker with
"dictionary changed size during iteration". This runs ``--cycles`` times (default 20) "start a
LocalGPUCluster / persist a GDataSet / KMeans fit / close", each in a fresh process, and ``--sharing``
times (default 3) ``benchmarks/sharing.py --quick --jobs 4``, and counts in every log: worker deaths,
"dictionary changed size", "heartbeat" errors, and runs that failed. Prints one table; exit status 1 if
any count is not 0.

    python benchmarks/cycles.py                 # 20 cycles + 3 sharing runs
    python benchmarks/cycles.py --cycles 3 --sharing 0 --json out.json
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

import _common

CYCLE = r"""
import numpy as np, gdask
from distributed import Client
from gdask._compat import scheduler_workers
if __name__ == "__main__":
    x = np.random.default_rng({seed}).random(({rows}, 16), dtype=np.float32)
    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="256MiB", dashboard_address=":0",
                               silence_logs=False) as cluster, Client(cluster) as client:
        X = gdask.from_array(x, block_rows={rows} // 8).persist()
        km = gdask.ml.KMeans(8, random_state={seed}, max_iter=10).fit(X)
        assert km.fit_mode_ == "workers", km.fit_mode_
        n = len(scheduler_workers(client))
        print("WORKERS", n)
"""

PATTERNS = {
    "dict changed": re.compile(r"dictionary changed size during iteration"),
    "heartbeat errors": re.compile(r"heartbeat-error|Unexpected exception during heartbeat", re.I),
    "worker restarts": re.compile(r"Restarting worker|Worker process \d+ exited with status [1-9]"),
}
#: counted and shown, not a failure: a worker process that took more than the nanny's 4 s to exit at close
SLOW_CLOSE = re.compile(r"Worker process still alive after")


def _run(cmd: list[str], timeout: float) -> tuple[int | None, str, float]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        return None, out, time.perf_counter() - t0


def _count(text: str) -> dict[str, int]:
    return {**{k: len(p.findall(text)) for k, p in PATTERNS.items()}, "slow closes": len(SLOW_CLOSE.findall(text))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--sharing", type=int, default=3, help="runs of benchmarks/sharing.py --quick --jobs 4")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--timeout", type=float, default=300, help="seconds per run before it counts as a hang")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    setup = _common.setup(["rmm-cu12", "rmm-cu13", "cupy-cuda12x", "cupy-cuda13x", "nvidia-ml-py"],
                          note="the CUDA libraries must be importable (pip install -e '.[cuda12]') for this to test "
                               "the race")
    print("cluster life cycles with the CUDA libraries importable")
    _common.print_setup(setup)
    try:
        import rmm  # noqa: F401
        rmm_ok = True
    except Exception:  # noqa: BLE001 - any import failure: the race cannot happen, say so
        rmm_ok = False
    print(f"rmm importable: {rmm_ok}" + ("" if rmm_ok else "  (the race needs it: install gdask[cuda12])"))
    rows = []
    for i in range(a.cycles):
        code, out, sec = _run([sys.executable, "-c", CYCLE.format(seed=i, rows=a.rows)], a.timeout)
        ok = code == 0 and "WORKERS 2" in out
        rows.append({"run": f"cycle {i + 1}", "ok": ok, "returncode": code, "seconds": round(sec, 1), **_count(out)})
        if not ok:
            print(out[-2000:], file=sys.stderr)
    for i in range(a.sharing):
        code, out, sec = _run([sys.executable, os.path.join(here, "sharing.py"), "--quick", "--jobs", "4",
                               "--worlds", "emulated"], a.timeout * 2)
        rows.append({"run": f"sharing {i + 1}", "ok": code == 0, "returncode": code, "seconds": round(sec, 1),
                     **_count(out)})
        if code != 0:
            print(out[-2000:], file=sys.stderr)
    width = max(len(r["run"]) for r in rows) if rows else 10
    cols = ["ok", "seconds", *PATTERNS, "slow closes"]
    print(f"{'run':<{width}}  " + "  ".join(f"{c:>16}" for c in cols))
    for r in rows:
        print(f"{r['run']:<{width}}  " + "  ".join(f"{str(r[c]):>16}" for c in cols))
    totals = {k: sum(r[k] for r in rows) for k in PATTERNS}
    failed = sum(not r["ok"] for r in rows)
    slow = sum(r["slow closes"] for r in rows)
    print(f"runs {len(rows)}, failed {failed}, " + ", ".join(f"{k} {v}" for k, v in totals.items())
          + f" (slow closes, not failures: {slow})")
    if a.json:
        _common.write_json(a.json, {"setup": setup, "rmm_importable": rmm_ok, "runs": rows, "totals": totals,
                                    "failed": failed})
    return 0 if failed == 0 and not any(totals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
