"""``gdask`` command line: ``gdask demo``, ``gdask info``, ``gdask worker``, ``gdask bench kmeans``."""

from __future__ import annotations

import argparse
import os
import re
import runpy
import sys
import time
from pathlib import Path

from gdask import NoDeviceError


def plain_text(doc: str) -> str:
    """A docstring's reStructuredText as plain text for ``--help``: ``x``, :role:`x` and `x` become x,
    lines are joined into one paragraph."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"`([^`]+)`", r"\1", text)
    return " ".join(text.split())


def _step(text: str) -> float:
    """Print what the demo is doing now (it may take seconds) and return the start time."""
    print(f"  {text} ...", end="", flush=True)
    return time.perf_counter()


def _done(t0: float, extra: str = "") -> float:
    dt = time.perf_counter() - t0
    print(f" {dt:.1f} s{extra}", flush=True)
    return dt


def _demo(args: argparse.Namespace) -> int:
    import numpy as np
    from distributed import Client

    import gdask
    from gdask._warm import wait_for_warm_kernels
    from gdask.ml import KMeans

    rng = np.random.default_rng(0)
    n, d, k = args.rows, args.features, args.clusters
    print(f"gdask demo: K-means on synthetic blobs, {n:,} x {d} float32, {k} clusters")
    t = _step("making the data")
    true_centers = rng.uniform(-10, 10, size=(k, d)).astype(np.float32)
    X = true_centers[rng.integers(0, k, n)] + rng.standard_normal((n, d), dtype=np.float32)
    _done(t)
    t = _step(f"starting a LocalGPUCluster ({args.backend} backend)")
    with gdask.LocalGPUCluster(n_devices=args.devices, backend=args.backend, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        specs = cluster.device_specs
        start = _done(t, f": {len(specs)} {cluster.backend} device(s)")
        t = _step("compiling the kernels on the workers (numba; loaded from its cache after the first run)")
        compiled = wait_for_warm_kernels(client)
        compile_s = _done(t)
        t = _step("moving the data to the devices")
        G = gdask.from_array(X).persist()
        from distributed import wait

        wait(G)
        _done(t, f": {G.nblocks} blocks")
        print(f"  dashboard: {client.dashboard_link} (gdask page: {client.dashboard_link.rsplit('/', 1)[0]}/gdask)")
        init = KMeans(k, random_state=0, max_iter=1)._init_centers(G, np.random.default_rng(0))
        km = KMeans(k, init=init, max_iter=args.iterations, tol=0, verbose=args.verbose).fit(G)
        per_iter = sorted(km.iteration_times_[1:] or km.iteration_times_)
        median = per_iter[len(per_iter) // 2]
        print(f"\nreport\n  devices: {len(specs)} x {cluster.backend}")
        print(f"  cluster start: {start:.1f} s; kernel compilation: {compile_s:.1f} s (per worker: "
              + ", ".join(f"{v:.1f} s" for v in compiled.values()) + "), not in the iteration times")
        print(f"  iterations: {km.n_iter_} (loop: {km.fit_mode_}), first {km.iteration_times_[0] * 1e3:.1f} ms, "
              f"median of the others {median * 1e3:.1f} ms per iteration")
        print(f"  inertia: {km.inertia_:.6g}")
        labels = gdask.to_numpy(km.labels_.compute())  # lazy labels of a GDataSet: computed while the cluster runs
    from sklearn.cluster import KMeans as SKKMeans  # a dependency of gdask.ml

    ref = SKKMeans(k, init=init, n_init=1, max_iter=km.n_iter_, tol=0, algorithm="lloyd").fit(X)
    err = float(np.abs(km.cluster_centers_ - ref.cluster_centers_).max())
    agree = float((labels == ref.labels_).mean())
    rel = abs(km.inertia_ - ref.inertia_) / ref.inertia_
    ok = err < 1e-3 and agree > 0.999 and rel < 1e-4
    print(f"  agreement with scikit-learn (same init): max |center diff| {err:.2e}, labels equal {agree:.4%}, "
          f"inertia rel. diff {rel:.1e} -> {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def _info(args: argparse.Namespace) -> int:
    from gdask._info import format_info, info

    try:
        print(format_info(info(args.backend)))
    except (NoDeviceError, ValueError) as e:  # e.g. --backend cuda on a machine without a usable GPU
        print(f"gdask info: {e}", file=sys.stderr)
        return 1
    return 0


def benchmarks_dir() -> Path | None:
    """Where the benchmark scripts are: ``GDASK_BENCHMARKS``, the source checkout of an editable
    install, or ``./benchmarks`` (a regular install does not ship them)."""
    candidates = [os.environ.get("GDASK_BENCHMARKS"), Path(__file__).resolve().parent.parent / "benchmarks",
                  Path.cwd() / "benchmarks"]
    for c in candidates:
        if c and (Path(c) / "kmeans.py").exists():
            return Path(c)
    return None


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    root = benchmarks_dir()
    if root is None:
        print("gdask bench: the benchmark scripts are not part of an installed gdask; they are in the source "
              "repository's benchmarks/ folder. Run gdask bench from a checkout (or set GDASK_BENCHMARKS to that "
              "folder).", file=sys.stderr)
        return 2
    script = root / f"{args.name}.py"
    if not script.exists():
        names = sorted(p.stem for p in root.glob("*.py") if not p.stem.startswith("_"))
        print(f"no benchmark {args.name!r} in {root}; available: {names}", file=sys.stderr)
        return 2
    sys.argv = [str(script), *rest]
    sys.path.insert(0, str(root))
    runpy.run_path(str(script), run_name="__main__")
    return 0


def main(argv: list[str] | None = None) -> int:
    from gdask import __version__

    p = argparse.ArgumentParser(prog="gdask", description="gdask: iterative ML loops on GPUs with Dask")
    p.add_argument("--version", action="version", version=f"gdask {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run K-means on built-in synthetic data on a LocalGPUCluster")
    d.add_argument("--rows", type=int, default=1_000_000)
    d.add_argument("--features", type=int, default=32)
    d.add_argument("--clusters", type=int, default=16)
    d.add_argument("--iterations", type=int, default=10)
    d.add_argument("--devices", type=int, default=None)
    d.add_argument("--backend", default="auto", choices=["auto", "cuda", "emulated", "emulated-strict"])
    d.add_argument("--verbose", type=int, default=1, help="0 quiet, 1 a progress bar (default), 2 a line per iteration")
    i = sub.add_parser("info", help="show the devices gdask finds and why CUDA is or is not used")
    i.add_argument("--backend", default=None, choices=["auto", "cuda", "emulated", "emulated-strict"])
    from gdask import _worker_cli

    w = sub.add_parser("worker", help="start one Dask worker per device of this node (like dask cuda worker)",
                       description=plain_text((_worker_cli.__doc__ or "").split("\n\n")[0]))
    _worker_cli.add_arguments(w)
    b = sub.add_parser("bench", help="run a benchmark from benchmarks/ (e.g. gdask bench kmeans --json out.json)")
    b.add_argument("name")
    args, rest = p.parse_known_args(argv)
    if args.cmd == "bench":
        return _bench(args, rest)
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    return {"demo": _demo, "info": _info, "worker": _worker_cli.main}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
