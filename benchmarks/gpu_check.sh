#!/usr/bin/env bash
# The one script to run on a GPU machine: GPU tests, then the GPU benchmarks. Results go to $OUT
# when it is set (else ./gpu-check-out). Works when dask/distributed come from carried wheels
# (../shared/device/wheels.sh): install those first, then run this script.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -c "import gdask._info as i; print(i.format_info(i.info()))" 2>&1 | tee "$out/info.txt"
# caps sum to under 10 minutes (one device command); typical runs take a fraction of them
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$out/gpu-tests.txt"
timeout 150 python3 benchmarks/kmeans.py --backend cuda --rows 20000000 --skip dask-ml dask-array \
  --json "$out/kmeans-cuda.json" 2>&1 | tee "$out/kmeans-cuda.txt"
# one GPU split into logical devices: placement (issue 3) and the window cache (issue 4) on real CUDA
timeout 90 python3 benchmarks/load_balance.py --backend cuda --iterations 4 --json "$out/load-balance-cuda.json" \
  2>&1 | tee "$out/load-balance-cuda.txt"
timeout 60 python3 benchmarks/window.py --backend cuda --quick --json "$out/window-cuda.json" 2>&1 \
  | tee "$out/window-cuda.txt"
timeout 45 python3 benchmarks/overhead.py --backend cuda --tasks 2000 --repeats 3 --json "$out/overhead-cuda.json" \
  2>&1 | tee "$out/overhead-cuda.txt"
timeout 45 python3 benchmarks/logistic.py --backend cuda --skip dask-ml --json "$out/logistic-cuda.json" 2>&1 \
  | tee "$out/logistic-cuda.txt"
timeout 45 python3 benchmarks/streams.py --backend cuda --json "$out/streams-cuda.json" 2>&1 | tee "$out/streams-cuda.txt"
