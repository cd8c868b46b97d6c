"""K-means Lloyd passes against the HBM roofline of one GPU (issue #16).

A Lloyd pass reads every row once: ``rows * features * itemsize`` bytes. This benchmark prints, for a
pass, the fraction of the device's peak memory bandwidth it reaches, ``bytes read / seconds / peak``,
with the peak from NVML (memory bus width x maximum memory clock x 2, double data rate) or, where
NVML does not say, from a table of datasheet figures by device name. Two levels:

* ``kernel``: gdask's per-block K-means function on one resident CuPy block (which runs the numba.cuda
  kernel and returns the small partials to the host), timed with CUDA events after a warm-up.
* ``fit``: ``gdask.ml.KMeans(algorithm="lloyd")`` on the whole dataset persisted on a LocalGPUCluster
  whose devices are 1, 2 or 4 logical devices of the one GPU (a share of its memory each); the
  seconds of an iteration come from ``KMeans.iteration_times_`` (the median after the first, which
  compiles the kernels).

The data (``--rows`` x ``--features`` float32 around ``--clusters`` centers) is generated on the
devices, block by block, never on the host. Needs a CUDA GPU with CuPy and numba.cuda;
``--backend emulated`` runs the same stages on emulated devices (``gpu_check.sh --dry-run``: the
figures mean nothing there, and there is no roofline).

usage: python benchmarks/gpu_roofline.py --rows 100000000 --features 32 --clusters 64 --logical 1,2,4 \\
           --json out.json
"""

from __future__ import annotations

import argparse
import sys
import time

import _common
import numpy as np

#: datasheet peak memory bandwidth (bytes/s) by a substring of the device name, when NVML gives no clock
PEAK_BY_NAME = {
    "H200": 4.8e12, "GH200": 4.0e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "H800": 3.35e12,
    "A100-SXM4-80GB": 2.039e12, "A100 80GB PCIe": 1.935e12, "A100": 1.555e12, "L40S": 0.864e12, "L4": 0.3e12,
    "A10G": 0.6e12, "V100": 0.9e12, "T4": 0.32e12,
}


def peak_bandwidth(index: int = 0) -> tuple[float | None, str, str]:
    """(bytes/s, how it was found, device name) of CUDA device ``index``."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else str(name)
    except Exception as e:  # noqa: BLE001 - no NVML: no name, no peak
        return None, f"NVML unavailable ({type(e).__name__}: {e})", "unknown"
    try:
        bus = int(pynvml.nvmlDeviceGetMemoryBusWidth(h))  # bits
        mhz = int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM))
        if bus > 0 and mhz > 0:
            return bus / 8 * mhz * 1e6 * 2, f"NVML: {bus}-bit bus x {mhz} MHz x 2", name
    except Exception as e:  # noqa: BLE001 - older NVML: the table below
        why = f"NVML has no bus width / memory clock ({type(e).__name__})"
    else:
        why = "NVML reported no bus width / memory clock"
    for key, value in PEAK_BY_NAME.items():
        if key in name:
            return value, f"{why}; datasheet figure for {key!r}", name
    return None, f"{why}; {name!r} is not in the datasheet table", name


def _block(b, d, k, seed):
    """A device block of rows around ``k`` centers; ``b`` (int8, the block's index in every row) only
    gives the block its rows and its seed."""
    from gdask.devices import to_numpy

    n = b.shape[0]
    i = int(to_numpy(b[:1])[0]) if n else 0
    if isinstance(b, np.ndarray):  # emulated devices: the same kind of data with NumPy
        rs = np.random.RandomState(seed + 1 + i)
        centers = np.random.default_rng(seed).uniform(-10, 10, (k, d)).astype(np.float32)
        out = np.asfortranarray(centers[rs.randint(0, k, n)])
        out += rs.standard_normal((n, d)).astype(np.float32)
        return out
    import cupy as cp

    centers = cp.asarray(np.random.default_rng(seed).uniform(-10, 10, (k, d)).astype(np.float32))
    rs = cp.random.RandomState(seed + 1 + i)
    labels = rs.randint(0, k, n)
    out = cp.asfortranarray(centers[labels])
    out += rs.standard_normal((n, d), dtype=cp.float32)
    return out


def _kernel_seconds(rows, d, k, seed, reps, backend="cuda"):
    """Seconds of one block's Lloyd pass (gdask's block function on a resident CuPy block)."""
    if backend != "cuda":  # a NumPy block, timed on the host clock
        blk = _block(np.zeros(rows, np.int8), d, k, seed)
        centers = np.random.default_rng(seed).uniform(-10, 10, (k, d)).astype(np.float32)
        _common.lloyd_partial(blk, centers)  # compile
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            _common.lloyd_partial(blk, centers)
            times.append(time.perf_counter() - t0)
        return float(np.median(times)), int(blk.nbytes)
    import cupy as cp

    blk = _block(cp.zeros(rows, cp.int8), d, k, seed)
    centers = cp.asarray(np.random.default_rng(seed).uniform(-10, 10, (k, d)).astype(np.float32))
    _common.lloyd_partial(blk, centers)  # compile
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        _common.lloyd_partial(blk, centers)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return float(np.median(times)), int(blk.nbytes)


def _fit(n_devices, rows, d, k, iters, seed, block_rows, backend="cuda"):
    from distributed import Client, futures_of, wait

    import gdask
    from gdask.ml import KMeans

    nb = -(-rows // block_rows)
    t0 = time.perf_counter()
    with gdask.LocalGPUCluster(n_devices=n_devices, backend=backend, dashboard_address=":0") as cluster, \
            Client(cluster):
        idx = gdask.from_array(np.repeat(np.arange(nb, dtype=np.int8), block_rows)[:rows], block_rows=block_rows)
        X = idx.map_blocks(_block, d, k, seed, ncols=d, dtype=np.float32, name="roofline-data").persist()
        wait(futures_of(X))
        setup = time.perf_counter() - t0
        init = np.random.default_rng(seed).uniform(-10, 10, (k, d)).astype(np.float32)
        init += np.random.default_rng(seed + 99).normal(0, 0.5, init.shape).astype(np.float32)
        km = KMeans(k, init=init, algorithm="lloyd", max_iter=iters, tol=0).fit(X)
        times = km.iteration_times_[1:] or km.iteration_times_
        return {"logical_devices": n_devices, "blocks": nb, "block_rows": block_rows, "mode": km.fit_mode_,
                "iterations": km.n_iter_, "seconds_per_pass": float(np.median(times)),
                "first_pass_seconds": float(km.iteration_times_[0]), "setup_seconds": setup,
                "inertia": float(km.inertia_)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000_000)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--clusters", type=int, default=64)
    p.add_argument("--iterations", type=int, default=5, help="Lloyd passes per fit (the first compiles)")
    p.add_argument("--logical", default="1,2,4", help="logical devices of the GPU per fit, comma separated")
    p.add_argument("--blocks-per-device", type=int, default=4)
    p.add_argument("--kernel-rows", type=int, default=12_500_000, help="rows of the block timed alone")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=["cuda", "emulated"], default="cuda",
                   help="emulated: the same stages on emulated devices (a dry run: no GPU, no roofline)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.backend == "cuda":
        try:
            import cupy

            cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # noqa: BLE001
            print(f"gpu_roofline: needs a CUDA GPU with CuPy ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
        peak, source, name = peak_bandwidth(0)
    else:
        peak, source, name = None, "emulated devices have no memory bandwidth roofline", "emulated"
    itemsize = 4
    print(f"device: {name}; peak memory bandwidth: "
          f"{'unknown' if peak is None else f'{peak / 1e12:.2f} TB/s'} ({source})")
    result = {"backend": a.backend, "device": name, "peak_bandwidth": peak, "peak_source": source, "rows": a.rows,
              "features": a.features, "clusters": a.clusters, "dtype": "float32", "fits": []}

    def frac(nbytes, seconds):
        return None if peak is None or seconds <= 0 else nbytes / seconds / peak

    sec, nbytes = _kernel_seconds(a.kernel_rows, a.features, a.clusters, a.seed, reps=5, backend=a.backend)
    result["kernel"] = {"rows": a.kernel_rows, "bytes": nbytes, "seconds": sec, "bytes_per_second": nbytes / sec,
                        "roofline_fraction": frac(nbytes, sec)}
    _common.write_json(a.json, result)  # after every stage: a run cut short keeps what it measured
    f = result["kernel"]["roofline_fraction"]
    print(f"kernel: one block of {a.kernel_rows:,} rows x {a.features} float32, K={a.clusters}: {sec * 1e3:.2f} ms, "
          f"{nbytes / sec / 1e9:.0f} GB/s" + ("" if f is None else f", {100 * f:.1f}% of the HBM roofline"))
    data_bytes = a.rows * a.features * itemsize
    for n in [int(v) for v in a.logical.split(",") if v.strip()]:
        block_rows = -(-a.rows // (n * a.blocks_per_device))
        r = _fit(n, a.rows, a.features, a.clusters, a.iterations, a.seed, block_rows, backend=a.backend)
        r["bytes_per_pass"] = data_bytes
        r["bytes_per_second"] = data_bytes / r["seconds_per_pass"]
        r["roofline_fraction"] = frac(data_bytes, r["seconds_per_pass"])
        result["fits"].append(r)
        _common.write_json(a.json, result)
        f = r["roofline_fraction"]
        print(f"fit on {n} logical device(s) ({r['mode']}): a Lloyd pass over {a.rows:,} x {a.features} float32 in "
              f"{r['seconds_per_pass'] * 1e3:.1f} ms, {r['bytes_per_second'] / 1e9:.0f} GB/s"
              + ("" if f is None else f", {100 * f:.1f}% of the HBM roofline")
              + f" (first pass {r['first_pass_seconds']:.2f} s with compilation; data made in "
                f"{r['setup_seconds']:.1f} s)")
    _common.write_json(a.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
