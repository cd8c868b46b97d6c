#!/usr/bin/env bash
# The one prepared run for a GPU machine (issue #16), under 8 minutes in all:
#   1. install offline: the wheels in ./.whl (../shared/device/wheels.sh array-api-compat array-api-extra
#      array-api-strict pytest-timeout), then gdask itself (editable);
#   2. the GPU tests: pytest -m "gpu or cudasim" on the GPU (the numba.cuda kernels on CuPy arrays, the
#      CuPy variants of the array tests);
#   3. K-means 100M x 32 float32, K=64 on the GPU, and on 2 and 4 logical devices of it: for a Lloyd pass,
#      the fraction of the HBM roofline (bytes read / time / peak bandwidth from NVML)
#      (benchmarks/gpu_roofline.py);
#   4. the window benchmark and the load-balance benchmark with --backend cuda.
# Every step has a time cap and its own log; one JSON with every result goes to $OUT/gpu_check.json
# ($OUT defaults to ./gpu-check-out). A step that fails or times out is recorded with its exit status
# and the run goes on.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
start=$(date +%s)
declare -A status seconds

step() {  # step NAME CAP_SECONDS COMMAND...: run with a cap, log to $out/NAME.txt, keep status and time
  local name=$1 cap=$2
  shift 2
  local t0
  t0=$(date +%s)
  echo "== $name (cap ${cap}s)"
  timeout --kill-after=10 "$cap" "$@" > "$out/$name.txt" 2>&1
  status[$name]=$?
  seconds[$name]=$(( $(date +%s) - t0 ))
  tail -n 25 "$out/$name.txt"
  echo "== $name: exit ${status[$name]} after ${seconds[$name]}s"
}

# 1. offline install (the GPU image has numpy, cupy, numba(-cuda), nvidia-ml-py, pytest, scikit-learn, ...)
if compgen -G ".whl/*.whl" > /dev/null; then
  step install 60 bash -c 'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps \
      --no-build-isolation -e .'
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
step info 20 python3 -c "import gdask._info as i; print(i.format_info(i.info()))"

# 2. GPU tests (not the simulator: the cudasim tests run their kernels on CuPy arrays here)
step gpu-tests 100 env -u NUMBA_ENABLE_CUDASIM python3 -m pytest -m "gpu or cudasim" -q -p no:cacheprovider \
  --junitxml="$out/gpu-tests.xml"

# 3. K-means at full size against the HBM roofline, on the GPU and on 2 and 4 logical devices of it
step roofline 170 python3 benchmarks/gpu_roofline.py --rows 100000000 --features 32 --clusters 64 \
  --iterations 5 --logical 1,2,4 --json "$out/roofline.json"

# 4. the window cache and the load balance on CUDA (logical devices of the one GPU)
step window 45 python3 benchmarks/window.py --backend cuda --quick --json "$out/window-cuda.json"
step load-balance 55 python3 benchmarks/load_balance.py --backend cuda --iterations 4 \
  --json "$out/load-balance-cuda.json"

# one JSON with everything
runs=()
for n in "${!status[@]}"; do runs+=("$n=${status[$n]}=${seconds[$n]}"); done
python3 - "$out" "$(( $(date +%s) - start ))" "${runs[@]}" <<'PY'
import json, os, sys, xml.etree.ElementTree as ET
out, total = sys.argv[1], int(sys.argv[2])
steps = {n: {"exit": int(e), "seconds": int(s)} for n, e, s in (a.split("=") for a in sys.argv[3:])}
names = list(steps)
def load(name):
    p = os.path.join(out, name)
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"missing": f"{name}: {e}"}
def tail(name, n=40):
    try:
        with open(os.path.join(out, name + ".txt")) as f:
            return f.read().splitlines()[-n:]
    except OSError:
        return []
tests = {}
try:
    root = ET.parse(os.path.join(out, "gpu-tests.xml")).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    tests = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    tests["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                       if c.find("failure") is not None or c.find("error") is not None]
except (OSError, ET.ParseError, AttributeError) as e:
    tests = {"missing": str(e)}
result = {"total_seconds": total, "steps": steps, "gpu_tests": tests, "roofline": load("roofline.json"),
          "window": load("window-cuda.json"), "load_balance": load("load-balance-cuda.json"),
          "logs": {n: tail(n) for n in names}}
with open(os.path.join(out, "gpu_check.json"), "w") as f:
    json.dump(result, f, indent=1, default=str)
r = result["roofline"]
print(f"gpu_check: {total} s; tests {tests.get('tests')} run, {tests.get('failures')} failed, "
      f"{tests.get('errors')} errors, {tests.get('skipped')} skipped")
if "kernel" in r:
    print(f"  kernel pass: {r['kernel']['bytes_per_second'] / 1e9:.0f} GB/s, roofline fraction "
          f"{r['kernel']['roofline_fraction']}")
for fit in r.get("fits", []):
    print(f"  fit on {fit['logical_devices']} logical device(s): {fit['seconds_per_pass'] * 1e3:.1f} ms per pass, "
          f"roofline fraction {fit['roofline_fraction']}")
PY
