"""``gdask`` command line: ``gdask demo``, ``gdask info``, ``gdask worker``, ``gdask bench kmeans``."""

from __future__ import annotations

import argparse
import os
import re
import runpy
import sys
import time
from pathlib import Path
from typing import Any, Callable

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


#: the kernel warm-up's worker plugin (gdask.ml's), read by name: the demo shows its progress
WARM_PLUGIN = "gdask-warm-kernels"


def _warm_status(dask_worker: Any = None) -> dict[str, Any] | None:
    """(on a worker) Its kernel warm-up's status: ``{"done", "seconds", "error"}`` and, where the
    warm-up counts them, ``"compiled"`` (kernels compiled or loaded so far) of ``"total"``."""
    plugin = dask_worker.plugins.get(WARM_PLUGIN)
    status = getattr(plugin, "status", None)
    return status() if callable(status) else None


def _compile_line(status: dict[str, dict], elapsed: float) -> str:
    """What the workers' warm-ups have done: kernels compiled of total where they count them."""
    counted = [s for s in status.values() if isinstance(s.get("total"), int) and s["total"] > 0]
    done = sum(1 for s in status.values() if s.get("done"))
    parts = [f"{elapsed:.0f} s"]
    if counted:
        compiled = sum(int(s.get("compiled") or 0) for s in counted)
        total = sum(int(s["total"]) for s in counted)
        parts.append(f"{compiled} of {total} kernels ({len(counted)} worker(s))")
    parts.append(f"{done} of {len(status)} worker(s) done")
    return ", ".join(parts)


def wait_for_compile(poll: Callable[[], dict[str, Any]], timeout: float, file: Any = None,
                     interval: float = 0.5) -> dict[str, float]:
    """Wait for the workers' kernel warm-ups, showing their progress on one line (rewritten in a
    terminal, printed every 15 seconds elsewhere); ``{worker: seconds it took}``.

    Parameters
    ----------
    poll : callable
        ``poll() -> {worker: status dict or None}`` (see :func:`_warm_status`); workers without a
        warm-up (None) are left out.
    timeout : float
        Seconds to wait at most.

    Raises
    ------
    TimeoutError
        A worker is still compiling after ``timeout`` seconds (``gdask demo --compile-timeout``).
    """
    file = sys.stdout if file is None else file
    tty = getattr(file, "isatty", lambda: False)()
    t0 = time.monotonic()
    shown: float | None = None
    while True:
        status = {w: s for w, s in poll().items() if s is not None}
        elapsed = time.monotonic() - t0
        finished = all(s.get("done") for s in status.values())
        if finished or shown is None or tty or elapsed - shown >= 15:  # a terminal: the line rewritten
            line = _compile_line(status, elapsed)
            print(("\r    " if tty and shown is not None else "\n    ") + line.ljust(70), end="", file=file,
                  flush=True)
            shown = elapsed
        if finished:
            print(file=file, flush=True)
            failed = {w: s["error"] for w, s in status.items() if s.get("error")}
            for w, e in failed.items():
                print(f"    worker {w}: compiling ahead failed ({e}); its first fit compiles", file=file)
            return {w: float(s.get("seconds") or 0.0) for w, s in status.items()}
        if elapsed > timeout:
            raise TimeoutError(f"workers still compiling gdask's kernels after {timeout:g} s: "
                               f"{sorted(w for w, s in status.items() if not s.get('done'))} "
                               "(gdask demo --compile-timeout)")
        time.sleep(interval)


def _blobs(n: int, d: int, k: int, spread: float) -> Any:
    """``n`` rows of ``k`` Gaussian blobs (unit variance) whose centers are uniform in
    ``[-spread, spread]^d``: at 2 they overlap, so K-means takes tens of iterations."""
    import numpy as np

    rng = np.random.default_rng(0)
    centers = rng.uniform(-spread, spread, size=(k, d)).astype(np.float32)
    return centers[rng.integers(0, k, n)] + rng.standard_normal((n, d), dtype=np.float32)


def _demo(args: argparse.Namespace) -> int:
    import numpy as np
    from distributed import Client, wait

    import gdask
    from gdask._compat import run_sync
    from gdask.ml import KMeans

    n, d, k = args.rows, args.features, args.clusters
    print(f"gdask demo: K-means on {k} overlapping blobs, {n:,} x {d} float32 (max {args.max_iter} iterations)")
    t = _step("making the data")
    X = _blobs(n, d, k, args.spread)
    _done(t)
    t = _step(f"starting a LocalGPUCluster ({args.backend} backend)")
    with gdask.LocalGPUCluster(n_devices=args.devices, backend=args.backend, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        specs = cluster.device_specs
        start = _done(t, f": {len(specs)} {cluster.backend} device(s)")
        t = _step("compiling the kernels on the workers (numba; loaded from its cache after the first run)")
        compiled = wait_for_compile(lambda: run_sync(client, _warm_status, timeout=60), args.compile_timeout)
        compile_s = time.perf_counter() - t
        t = _step("moving the data to the devices")
        G = gdask.from_array(X).persist()
        wait(G)
        _done(t, f": {G.nblocks} blocks")
        print(f"  dashboard: {client.dashboard_link} (gdask page: {client.dashboard_link.rsplit('/', 1)[0]}/gdask)")
        init = KMeans(k, random_state=0, max_iter=1)._init_centers(G, np.random.default_rng(0))
        km = KMeans(k, init=init, max_iter=args.max_iter, verbose=args.verbose).fit(G)
        per_iter = sorted(km.iteration_times_[1:] or km.iteration_times_)
        median = per_iter[len(per_iter) // 2]
        print(f"\nreport\n  devices: {len(specs)} x {cluster.backend}")
        print(f"  cluster start: {start:.1f} s; kernel compilation: {compile_s:.1f} s (per worker: "
              + ", ".join(f"{v:.1f} s" for v in compiled.values()) + "), not in the iteration times")
        print(f"  iterations: {km.n_iter_} (loop: {km.fit_mode_}), first {km.iteration_times_[0] * 1e3:.1f} ms, "
              f"median of the others {median * 1e3:.1f} ms per iteration")
        print(f"  inertia: {km.inertia_:.6g}")
        labels = gdask.to_numpy(km.labels_.compute())  # lazy labels of a GDataSet: computed while the cluster runs
    return _agreement(X, k, init, km, labels)


def _agreement(X: Any, k: int, init: Any, km: Any, labels: Any) -> int:
    """Compare with scikit-learn's Lloyd iterations from the same initial centers, as many of them.

    In float32 two exact Lloyd fits part ways: a row at almost the same distance from two centers goes
    to either by the last bit of its distances, the centers then differ a little, and over tens of
    iterations on overlapping blobs that grows (scikit-learn's own float32 centers end ~1e-2 from its
    float64 ones on the default data). So both float32 fits are measured against scikit-learn in
    float64 from the same centers: gdask agrees when it is within the bars (centers 1e-3, labels
    99.9%, inertia 1e-4 relative) or no further from that answer than scikit-learn's float32 fit is.
    Data in float64 is compared with float64 directly."""
    import numpy as np
    from sklearn.cluster import KMeans as SKKMeans  # a dependency of gdask.ml

    def fit(data: Any) -> Any:
        return SKKMeans(k, init=np.asarray(init, data.dtype), n_init=1, max_iter=km.n_iter_, tol=0,
                        algorithm="lloyd").fit(data)

    def gaps(centers: Any, labs: Any, inertia: float, ref: Any) -> tuple[float, float, float]:
        return (float(np.abs(np.asarray(centers, np.float64) - ref.cluster_centers_).max()),
                float((np.asarray(labs) == ref.labels_).mean()), abs(inertia - ref.inertia_) / ref.inertia_)

    print(f"  checking against scikit-learn ({km.n_iter_} Lloyd iterations from the same centers) ...", flush=True)
    ref = fit(np.asarray(X, np.float64))
    err, agree, rel = gaps(km.cluster_centers_, labels, km.inertia_, ref)
    ok = err < 1e-3 and agree > 0.999 and rel < 1e-4
    line = (f"  agreement with scikit-learn in float64 (same init, {km.n_iter_} iterations): max |center diff| "
            f"{err:.2e}, labels equal {agree:.4%}, inertia rel. diff {rel:.1e}")
    if np.asarray(X).dtype != np.float64:
        single = fit(X)
        s_err, s_agree, s_rel = gaps(single.cluster_centers_, single.labels_, single.inertia_, ref)
        ok = ok or (err <= max(s_err, 1e-3) and agree >= min(s_agree, 0.999) and rel <= max(s_rel, 1e-4))
        line += (f"\n  scikit-learn's own {np.asarray(X).dtype} fit against it: max |center diff| {s_err:.2e}, labels "
                 f"equal {s_agree:.4%}, inertia rel. diff {s_rel:.1e}")
    print(f"{line} -> {'OK' if ok else 'MISMATCH'}")
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


def parser() -> argparse.ArgumentParser:
    """The ``gdask`` command's argument parser."""
    from gdask import __version__

    p = argparse.ArgumentParser(prog="gdask", description="gdask: iterative ML loops on GPUs with Dask")
    p.add_argument("--version", action="version", version=f"gdask {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run K-means on built-in synthetic data on a LocalGPUCluster",
                       description="K-means on synthetic overlapping blobs on a LocalGPUCluster, with a progress "
                                   "bar, timings and a check against scikit-learn from the same initial centers")
    d.add_argument("--rows", type=int, default=1_000_000, help="rows of the data (default 1,000,000)")
    d.add_argument("--features", type=int, default=32, help="features (columns) of the data (default 32)")
    d.add_argument("--clusters", type=int, default=16, help="clusters in the data and in the model (default 16)")
    d.add_argument("--spread", type=float, default=2.0,
                   help="the blobs' centers are uniform in [-spread, spread] per feature, the blobs have unit "
                        "variance: 2 (default) overlaps them (tens of iterations), 10 separates them (2 iterations)")
    d.add_argument("--max-iter", "--iterations", dest="max_iter", type=int, default=100,
                   help="iterations at most (default 100; the fit stops earlier when it converges)")
    d.add_argument("--devices", type=int, default=None, help="devices (workers): default every GPU, or 2 emulated")
    d.add_argument("--backend", default="auto", choices=["auto", "cuda", "emulated", "emulated-strict"],
                   help="device backend (default auto: CUDA where a GPU and CuPy exist, else emulated)")
    d.add_argument("--verbose", type=int, default=1, help="0 quiet, 1 a progress bar (default), 2 a line per iteration")
    d.add_argument("--compile-timeout", type=float, default=600.0,
                   help="seconds to wait for the workers to compile the kernels (default 600)")
    i = sub.add_parser("info", help="show the devices gdask finds and why CUDA is or is not used")
    i.add_argument("--backend", default=None, choices=["auto", "cuda", "emulated", "emulated-strict"],
                   help="the backend to check (default: config gdask.backend)")
    from gdask import _worker_cli

    w = sub.add_parser("worker", help="start one Dask worker per device of this node (like dask cuda worker)",
                       description=plain_text((_worker_cli.__doc__ or "").split("\n\n")[0]))
    _worker_cli.add_arguments(w)
    b = sub.add_parser("bench", help="run a benchmark from benchmarks/ (e.g. gdask bench kmeans --json out.json)")
    b.add_argument("name", help="the benchmark: a script of benchmarks/ (kmeans, logistic, window, ...)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, rest = p.parse_known_args(argv)
    if args.cmd == "bench":
        return _bench(args, rest)
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    from gdask import _worker_cli

    return {"demo": _demo, "info": _info, "worker": _worker_cli.main}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
