#!/usr/bin/env bash
# The one prepared run for a GPU machine (issues #16, #23): one GPU, no network, under 8 minutes in all.
#
#   bash benchmarks/gpu_check.sh                   on the GPU
#   bash benchmarks/gpu_check.sh --dry-run         the same steps on emulated devices, small sizes (no GPU)
#   bash benchmarks/gpu_check.sh --dry-run --tiny  the same at tiny sizes (tests/test_gpu_check.py, in CI)
#
# Steps (each with a time cap; the caps add up to under 8 minutes; a dry run's are 4 times longer,
# GPU_CHECK_CAP_SCALE):
#   install       offline: the wheels in ./.whl (made by ../shared/device/wheels.sh) into /tmp/site, then
#                 gdask itself without build isolation (the image's own setuptools); skipped without .whl
#                 and in a dry run (which uses the packages of its environment);
#   info          what gdask sees: GPUs, MIG instances, the logical devices, library versions;
#   gpu-tests     pytest -m "gpu or cudasim": on the GPU the numba.cuda kernels and CuPy paths (not the
#                 simulator) and the GPU-node checks of tests/gdask/test_gpu_node.py; in a dry run the
#                 kernels in the CUDA simulator;
#   roofline      K-means 100M x 32 float32, K=64, one block and fits on 1, 2 and 4 logical devices of the
#                 GPU: the fraction of the HBM roofline (benchmarks/gpu_roofline.py);
#   static-model  the K-means (K=8, 16) and logistic passes, 20M x 32 float32, rewritten and frozen kernels:
#                 the measured fraction of the roofline beside the one benchmarks/gpu_static.py predicts
#                 (its committed output, benchmarks/gpu_static.json, at 100M rows); a dry run prints the plan;
#   window        the window benchmark (benchmarks/window.py --quick);
#   load-balance  the load-balance benchmark (benchmarks/load_balance.py).
# To add a step: one `step NAME CAP COMMAND...` line below (sizes in the two blocks of settings), and, if
# it writes a JSON of its own, `--json "$work/NAME.json"`: it lands in gpu_check.json under its name.
#
# Output: $OUT (default ./gpu-check-out) gets two files only (the device tool returns few): gpu_check.json,
# rewritten after every step with each finished step's exit status, seconds, JSON and log tail (a run cut
# short keeps what finished), and gpu_check.log, every step's full log. The steps' own files go to a
# temporary folder. The script's exit status is 0 when every step that ran exited 0.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=gpu tiny=0
for arg in "$@"; do
  case $arg in
    --dry-run) mode=dry ;;
    --tiny) tiny=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
if [[ $tiny == 1 && $mode != dry ]]; then
  echo "gpu_check.sh: --tiny goes with --dry-run (a GPU run has its own sizes)" >&2
  exit 2
fi
out=${OUT:-gpu-check-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
start=$(date +%s)
: > "$out/gpu_check.log"
: > "$work/steps.tsv"

# -- settings: the GPU run, and the dry run on emulated devices (same steps, smaller sizes) ---------------
if [[ $mode == gpu ]]; then
  backend=cuda
  cap_scale=1
  unset NUMBA_ENABLE_CUDASIM                # the kernels on the GPU, not in the simulator
  tests=(-m "gpu or cudasim")
  roofline=(--rows 100000000 --features 32 --clusters 64 --iterations 5 --logical 1,2,4)
  static_model=(--measure --predicted benchmarks/gpu_static.json --rows 20000000 --features 32 --clusters 8,16)
  window=(--quick)
  load_balance=(--iterations 4)
else
  backend=emulated
  cap_scale=${GPU_CHECK_CAP_SCALE:-4}        # emulated devices on a small shared CPU machine start slower
  export NUMBA_ENABLE_CUDASIM=1 DASK_GDASK__BACKEND=emulated
  tests=(-m "gpu or cudasim" tests/ml/test_cuda_kernels.py)
  roofline=(--rows 400000 --features 8 --clusters 8 --iterations 3 --logical 1,2 --kernel-rows 100000)
  static_model=(--measure --dry-run)
  window=(--quick)
  load_balance=(--rows 160000 --block-rows 20000 --iterations 2 --row-cost 1e-6)
  if [[ $tiny == 1 ]]; then
    tests=(-m "gpu or cudasim" tests/ml/test_cuda_kernels.py -k "bad_inputs or empty_clusters")
    roofline=(--rows 20000 --features 4 --clusters 3 --iterations 2 --logical 2 --kernel-rows 5000)
    window=(--quick --device-memory 4MiB --iterations 2 --repeat 1 --features 8 --clusters 4)
    load_balance=(--rows 16000 --block-rows 2000 --iterations 2 --row-cost 1e-6)
  fi
fi

summarize() {  # rewrite $out/gpu_check.json from the steps finished so far (atomically)
  "$py" - "$out" "$work" "$mode" "$(( $(date +%s) - start ))" <<'PY'
import json, os, sys, xml.etree.ElementTree as ET
out, work, mode, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"missing": f"{os.path.basename(path)}: {e}"}

def tests(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        return {"missing": str(e)}
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    got = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    got["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                     if c.find("failure") is not None or c.find("error") is not None]
    return got

steps = {}
with open(os.path.join(work, "steps.tsv")) as f:
    for line in f:
        name, code, seconds = line.rstrip("\n").split("\t")
        step = {"exit": int(code), "seconds": int(seconds), "timed_out": int(code) in (124, 137)}
        for suffix, reader in ((".json", load), (".xml", tests)):
            if os.path.exists(os.path.join(work, name + suffix)):
                step["result"] = reader(os.path.join(work, name + suffix))
        try:
            with open(os.path.join(work, name + ".txt"), errors="replace") as g:
                step["log_tail"] = g.read().splitlines()[-40:]
        except OSError:
            step["log_tail"] = []
        steps[name] = step
result = {"mode": mode, "total_seconds": total, "steps": steps}
tmp = os.path.join(out, "gpu_check.json.tmp")
with open(tmp, "w") as f:
    json.dump(result, f, indent=1, default=str)
os.replace(tmp, os.path.join(out, "gpu_check.json"))
PY
}

status=0
step() {  # step NAME CAP_SECONDS COMMAND...: run with a cap, log to $work/NAME.txt, record, summarize
  local name=$1 cap=$(( $2 * cap_scale )) t0 code
  shift 2
  t0=$(date +%s)
  echo "== $name (cap ${cap}s): $*" | tee -a "$out/gpu_check.log"
  timeout --kill-after=10 "$cap" "$@" > "$work/$name.txt" 2>&1
  code=$?
  [[ $code == 0 ]] || status=1
  printf '%s\t%s\t%s\n' "$name" "$code" "$(( $(date +%s) - t0 ))" >> "$work/steps.tsv"
  cat "$work/$name.txt" >> "$out/gpu_check.log"
  tail -n 15 "$work/$name.txt"
  echo "== $name: exit $code after $(( $(date +%s) - t0 ))s" | tee -a "$out/gpu_check.log"
  summarize
}

# -- the steps --------------------------------------------------------------------------------------------
if [[ $mode == gpu ]] && compgen -G ".whl/*.whl" > /dev/null; then
  step install 35 bash -c '"$0" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site "$0" -m pip install -q --no-index --no-deps \
      --no-build-isolation -e .' "$py"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
step info 20 "$py" -c "import json, sys, gdask._info as i; d = i.info(); print(i.format_info(d)); \
json.dump(d, open(sys.argv[1], 'w'), indent=1, default=str)" "$work/info.json"
step gpu-tests 125 "$py" -m pytest "${tests[@]}" -q -p no:cacheprovider --junitxml="$work/gpu-tests.xml"
step roofline 130 "$py" benchmarks/gpu_roofline.py --backend "$backend" "${roofline[@]}" --json "$work/roofline.json"
step static-model 40 "$py" benchmarks/gpu_static.py "${static_model[@]}" --json "$work/static-model.json"
step window 45 "$py" benchmarks/window.py --backend "$backend" "${window[@]}" --json "$work/window.json"
step load-balance 55 "$py" benchmarks/load_balance.py --backend "$backend" "${load_balance[@]}" \
  --json "$work/load-balance.json"

summarize
"$py" - "$out/gpu_check.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"gpu_check ({r['mode']}): {r['total_seconds']} s; " + ", ".join(
    f"{n} exit {s['exit']} ({s['seconds']} s)" for n, s in r["steps"].items()))
t = r["steps"].get("gpu-tests", {}).get("result", {})
if "tests" in t:
    print(f"  tests: {t['tests']} run, {t['failures']} failed, {t['errors']} errors, {t['skipped']} skipped "
          + " ".join(t["failed"]))
roof = r["steps"].get("roofline", {}).get("result", {})
if "kernel" in roof:
    print(f"  kernel pass: {roof['kernel']['bytes_per_second'] / 1e9:.0f} GB/s, roofline fraction "
          f"{roof['kernel']['roofline_fraction']}")
for m in r["steps"].get("static-model", {}).get("result", {}).get("measured", []):
    pf = m["predicted_fraction"]
    print(f"  {m['variant']} k={m['shape']['k']}: measured {m['measured_fraction']:.0%} of the roofline, predicted "
          f"{'n/a' if pf is None else f'{pf:.0%}'}")
for fit in roof.get("fits", []):
    print(f"  fit on {fit['logical_devices']} logical device(s): {fit['seconds_per_pass'] * 1e3:.1f} ms per pass, "
          f"roofline fraction {fit['roofline_fraction']}")
PY
rm -rf "$work"
exit $status
