"""Every benchmark script runs to its end at tiny sizes and writes its JSON (smoke tests).

The figures at these sizes mean nothing (a bar may or may not be met; load_balance and overhead exit 1 then),
so only a crash fails: a benchmark that stopped working would otherwise be found on the day its
numbers are needed, possibly on a GPU machine's scarce time. Baselines that need the ``bench``
extra (dask-ml) are skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "kmeans": ["--rows", "20000", "--features", "8", "--clusters", "4", "--iterations", "3", "--repeat", "1",
               "--skip", "dask-ml", "dask-array", "sklearn-elkan"],
    "logistic": ["--rows", "20000", "--features", "8", "--repeat", "1", "--skip", "dask-ml"],
    "load_balance": ["--rows", "16000", "--block-rows", "2000", "--iterations", "2", "--row-cost", "1e-6"],
    "overhead": ["--tasks", "40", "--blocks", "8", "--block-rows", "100", "--repeats", "1"],
    "streams": ["--max-streams", "3", "--static-rounds", "1", "--adaptive-rounds", "4", "--bar-rounds", "4",
                "--blocks", "4", "--work-ms", "2"],
    "window": ["--quick", "--device-memory", "4MiB", "--iterations", "2", "--repeat", "1", "--features", "8",
               "--clusters", "4"],
    "sharing": ["--quick", "--jobs", "4", "--scale", "0.2", "--arrival", "0.05"],
    "incremental": ["--rows", "4000", "--features", "4", "--blocks", "4", "--iterations", "3", "--refit-blocks", "8",
                    "--refit-block-rows", "100", "--nodes", "4000", "--graph-blocks", "2", "--p-back", "0.05"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_runs_at_tiny_size(name, tmp_path):
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *CASES[name], "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-3000:]).strip()
    assert proc.returncode in (0, 1), tail  # 1: a bar not met, at this size
    assert "Traceback" not in proc.stdout, tail
    data = json.loads(out.read_text())
    assert data, tail
