"""``gdask`` command line: ``gdask demo``, ``gdask info``, ``gdask bench kmeans``."""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from pathlib import Path


def _demo(args: argparse.Namespace) -> int:
    import numpy as np
    from distributed import Client

    import gdask
    from gdask.ml._kmeans import KMeans

    rng = np.random.default_rng(0)
    n, d, k = args.rows, args.features, args.clusters
    print(f"gdask demo: K-means on synthetic blobs, {n:,} x {d} float32, {k} clusters")
    true_centers = rng.uniform(-10, 10, size=(k, d)).astype(np.float32)
    X = true_centers[rng.integers(0, k, n)] + rng.standard_normal((n, d), dtype=np.float32)
    t0 = time.perf_counter()
    with gdask.LocalGPUCluster(n_devices=args.devices, backend=args.backend, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        specs = cluster.device_specs
        print(f"cluster: {len(specs)} {cluster.backend} device(s), started in {time.perf_counter() - t0:.1f} s "
              f"(dashboard {client.dashboard_link})")
        G = gdask.from_array(X).persist()
        init = KMeans(k, random_state=0, max_iter=1)._init_centers(G, np.random.default_rng(0))
        km = KMeans(k, init=init, max_iter=args.iterations, tol=0, verbose=True).fit(G)
        per_iter = sorted(km.iteration_times_[1:] or km.iteration_times_)
        median = per_iter[len(per_iter) // 2]
        print(f"\nreport\n  devices: {len(specs)} x {cluster.backend}")
        print(f"  iterations: {km.n_iter_}, median time per iteration: {median * 1e3:.1f} ms")
        print(f"  inertia: {km.inertia_:.6g}")
    from sklearn.cluster import KMeans as SKKMeans  # a dependency of gdask.ml

    ref = SKKMeans(k, init=init, n_init=1, max_iter=km.n_iter_, tol=0, algorithm="lloyd").fit(X)
    err = float(np.abs(km.cluster_centers_ - ref.cluster_centers_).max())
    agree = float((km.labels_ == ref.labels_).mean())
    rel = abs(km.inertia_ - ref.inertia_) / ref.inertia_
    ok = err < 1e-3 and agree > 0.999 and rel < 1e-4
    print(f"  agreement with scikit-learn (same init): max |center diff| {err:.2e}, labels equal {agree:.4%}, "
          f"inertia rel. diff {rel:.1e} -> {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def _info(args: argparse.Namespace) -> int:
    from gdask._info import format_info, info

    print(format_info(info(args.backend)))
    return 0


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    script = root / f"{args.name}.py"
    if not script.exists():
        print(f"no benchmark {args.name!r}; available: {sorted(p.stem for p in root.glob('*.py'))}", file=sys.stderr)
        return 2
    sys.argv = [str(script), *rest]
    runpy.run_path(str(script), run_name="__main__")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gdask", description="gdask: iterative ML loops on GPUs with Dask")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run K-means on built-in synthetic data on a LocalGPUCluster")
    d.add_argument("--rows", type=int, default=1_000_000)
    d.add_argument("--features", type=int, default=32)
    d.add_argument("--clusters", type=int, default=16)
    d.add_argument("--iterations", type=int, default=10)
    d.add_argument("--devices", type=int, default=None)
    d.add_argument("--backend", default="auto", choices=["auto", "cuda", "emulated"])
    i = sub.add_parser("info", help="show the devices gdask finds and why CUDA is or is not used")
    i.add_argument("--backend", default=None, choices=["auto", "cuda", "emulated"])
    b = sub.add_parser("bench", help="run a benchmark from benchmarks/ (e.g. gdask bench kmeans --json out.json)")
    b.add_argument("name")
    args, rest = p.parse_known_args(argv)
    if args.cmd == "bench":
        return _bench(args, rest)
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    return {"demo": _demo, "info": _info}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
