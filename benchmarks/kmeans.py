"""K-means: gdask vs scikit-learn (Lloyd and Elkan), dask-ml KMeans and a plain dask.array Lloyd loop.

gdask runs its default algorithm ("auto": Hamerly bounds from 8 features up, the same assignments
as Lloyd) and, as "gdask (lloyd)", plain Lloyd; both run their loop on the workers (one task per
worker, partials exchanged between workers), and "gdask (client loop)" is the default algorithm
with one graph per iteration from the client (config ``gdask.ml.worker-loop: false``). Same data,
same initial centers, same number of iterations (tol=0), one run. Time per iteration is
the whole ``fit`` (validation, set-up, iterations, final labels) divided by the iterations, the same
definition for every implementation, best of ``--repeat`` fits (shared machines are noisy), the fits of
gdask and scikit-learn interleaved so that each sees about the same load. Prints a
table with time per iteration, ratio to scikit-learn and agreement of centers; ``--json PATH``
writes it.

    python benchmarks/kmeans.py                 # 2,000,000 x 32 float32, K=16, 10 iterations
    python benchmarks/kmeans.py --backend cuda  # on a GPU (larger default size)
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import _common
import numpy as np

from gdask._compat import scheduler_workers


def make_data(n, d, k, seed=0, kind="blobs"):
    """``kind`` "blobs": k unit-variance clusters around centers in [-10, 10]^d; "uniform": no clusters
    (uniform in [-1, 1]^d: rows near many boundaries, the centers creep for hundreds of iterations)."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        X = rng.uniform(-1, 1, size=(n, d)).astype(np.float32)
    else:
        centers = rng.uniform(-10, 10, size=(k, d)).astype(np.float32)
        X = centers[rng.integers(0, k, n)] + rng.standard_normal((n, d), dtype=np.float32)
    init = X[rng.choice(n, k, replace=False)].copy()
    return X, init


def read_bandwidth(X, repeat=5):
    """Bytes per second of one thread streaming through ``X`` (a vectorised sum, best of ``repeat``):
    the memory limit of one pass over the data on one device (CPU figures)."""
    from numba import njit

    @njit(fastmath=True, nogil=True)
    def stream(v):
        s = np.float32(0)
        for i in range(v.shape[0]):
            s += v[i]
        return s

    flat = X.reshape(-1)
    stream(flat[:64])
    best = min(_timed(stream, flat) for _ in range(repeat))
    return X.nbytes / best


def _timed(f, *args):
    t = time.perf_counter()
    f(*args)
    return time.perf_counter() - t


def best_of(repeat, fit):
    """Run ``fit() -> (seconds, centers, n_iter)`` ``repeat`` times; keep the fastest per iteration."""
    runs = [fit() for _ in range(repeat)]
    return min(runs, key=lambda r: r[0] / max(r[2], 1))


def interleaved(fits, repeat):
    """Run every ``fits[name]() -> (seconds, centers, n_iter)`` in turn, ``repeat`` rounds (so each
    implementation sees about the same load of a shared machine); the fastest per iteration of each."""
    runs = {name: [] for name in fits}
    for _ in range(repeat):
        for name, fit in fits.items():
            runs[name].append(fit())
    return {name: min(r, key=lambda x: x[0] / max(x[2], 1)) for name, r in runs.items()}


SKLEARN_THREADS: dict = {}


def sklearn_fit(X, init, iters, algorithm="lloyd"):
    """scikit-learn in this process on every core (:func:`_common.all_cores`: the cluster left
    ``OMP_NUM_THREADS=1`` in this process's environment, which would pin its OpenMP loop to one)."""
    from sklearn.cluster import KMeans

    def fit():
        km = KMeans(len(init), init=init, n_init=1, max_iter=iters, tol=0, algorithm=algorithm)
        with _common.all_cores() as threads:
            t = time.perf_counter()
            km.fit(X)
            dt = time.perf_counter() - t
        SKLEARN_THREADS.update(threads)
        return dt, km.cluster_centers_, km.n_iter_

    return fit


def gdask_fit(X, init, iters, algorithm="auto", worker_loop=True, loop=None):
    """A fit of gdask's KMeans on ``X`` persisted once on the cluster (after a warm-up fit that
    compiles the kernels on the workers); ``loop`` collects each fit's mean iteration time."""
    import dask

    import gdask
    from gdask.ml import KMeans

    G = gdask.from_array(X).persist()
    with dask.config.set({"gdask.ml.worker-loop": worker_loop}):
        KMeans(len(init), init=init, max_iter=2, tol=0, algorithm=algorithm).fit(G)  # warm-up: compile on workers

    def fit():
        with dask.config.set({"gdask.ml.worker-loop": worker_loop}):
            t = time.perf_counter()
            km = KMeans(len(init), init=init, max_iter=iters, tol=0, algorithm=algorithm).fit(G)
            dt = time.perf_counter() - t
        if loop is not None:
            loop.append(float(np.mean(km.iteration_times_)))
        return dt, np.asarray(km.cluster_centers_), km.n_iter_

    return fit


def default_fits(G, X, k, repeat):
    """Whole fits with every parameter at its default (what a user's ``KMeans(k).fit(X)`` does: gdask's
    k-means|| init, scikit-learn's greedy k-means++; tol 1e-4; both stop when converged), seeds 0 ..
    repeat - 1, gdask and scikit-learn in turn: ``[(seed, gdask s, its iterations, inertia, sklearn s,
    its iterations, inertia)]``."""
    from sklearn.cluster import KMeans as SK

    from gdask.ml import KMeans

    out = []
    for seed in range(repeat):
        t = time.perf_counter()
        g = KMeans(k, random_state=seed).fit(G)
        tg = time.perf_counter() - t
        with _common.all_cores():
            t = time.perf_counter()
            s = SK(k, random_state=seed).fit(X)
            ts = time.perf_counter() - t
        out.append((seed, tg, g.n_iter_, float(g.inertia_), ts, s.n_iter_, float(s.inertia_)))
    return out


def fresh_cluster_fits(X, k, repeat, devices, backend):
    """A script's first ``KMeans(k).fit(X)`` on a NumPy ``X`` right after it started its cluster (the rows
    travel to the workers inside the fit), with the blocks sent through shared memory (config
    ``gdask.gdataset.same-host-transfer``, the default) and through the scheduler in the graph, a new
    cluster for each fit, and scikit-learn's fit in turn: ``[(seed, shared-memory s, its iterations' s,
    graph s, its iterations' s, sklearn s, gdask inertia, sklearn inertia)]`` (a fit's time besides its
    iterations is what the transfer changes; the iterations' time varies with the machine's load)."""
    import dask
    from distributed import Client
    from sklearn.cluster import KMeans as SK

    import gdask
    from gdask.ml import KMeans

    out = []
    for seed in range(repeat):
        times, loops, inertia = {}, {}, None
        for shared in (True, False):
            with dask.config.set({"gdask.gdataset.same-host-transfer": shared}), \
                    gdask.LocalGPUCluster(n_devices=devices, backend=backend, dashboard_address=":0") as cluster, \
                    Client(cluster):
                t = time.perf_counter()
                g = KMeans(k, random_state=seed).fit(X)
                times[shared] = time.perf_counter() - t
                loops[shared] = sum(g.iteration_times_)
                inertia = float(g.inertia_)
        with _common.all_cores():
            t = time.perf_counter()
            s = SK(k, random_state=seed).fit(X)
            ts = time.perf_counter() - t
        out.append((seed, times[True], loops[True], times[False], loops[False], ts, inertia, float(s.inertia_)))
    return out


def run_dask_ml(X, init, iters, repeat):
    import dask.array as da
    from dask_ml.cluster import KMeans

    dX = da.from_array(X, chunks=(250_000, X.shape[1])).persist()

    def fit():
        km = KMeans(len(init), init=init, max_iter=iters, tol=0, oversampling_factor=2)
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            km.fit(dX)
        return time.perf_counter() - t, km.cluster_centers_, max(km.n_iter_, 1)

    t, c, it = best_of(repeat, fit)
    return t / it, c, it


def run_dask_array(X, init, iters, repeat):
    import dask.array as da

    dX = da.from_array(X, chunks=(250_000, X.shape[1])).persist()

    def fit():
        t = time.perf_counter()
        c = _dask_array_lloyd(dX, init, iters)
        return time.perf_counter() - t, c, iters

    t, c, it = best_of(repeat, fit)
    return t / it, c, it


def _dask_array_lloyd(dX, init, iters):
    import dask.array as da

    c = init.astype(np.float64)
    for _ in range(iters):
        d2 = (dX ** 2).sum(1)[:, None] - 2 * dX @ c.T + (c ** 2).sum(1)[None, :]
        lab = d2.argmin(1)
        onehot = (lab[:, None] == np.arange(len(c))[None, :]).astype(np.float64)
        sums, counts = da.compute(onehot.T @ dX, onehot.sum(0))
        nz = counts > 0
        c[nz] = sums[nz] / counts[nz, None]
    return c


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="emulated", choices=["emulated", "cuda"])
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--clusters", type=int, default=16)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--devices", type=int, default=None)
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["sklearn", "sklearn-elkan", "dask-ml", "dask-array", "gdask-lloyd", "gdask-client-loop"])
    p.add_argument("--repeat", type=int, default=3, help="fits per implementation; the fastest counts")
    p.add_argument("--json", default=None, help="write results to this file")
    p.add_argument("--data", default="blobs", choices=["blobs", "uniform"],
                   help="clustered rows (default) or uniform rows without clusters")
    p.add_argument("--default-fits", type=int, default=2,
                   help="whole fits with default parameters (k-means|| / k-means++, tol 1e-4), gdask and "
                        "scikit-learn in turn (0: none)")
    p.add_argument("--fresh-cluster-fits", type=int, default=0,
                   help="first fits of the NumPy array on a freshly started cluster (the transfer included), "
                        "blocks through shared memory and through the scheduler, scikit-learn in turn (0: none)")
    a = p.parse_args(argv)
    n = a.rows or (2_000_000 if a.backend == "emulated" else 50_000_000)
    X, init = make_data(n, a.features, a.clusters, kind=a.data)
    from distributed import Client

    import gdask

    results = {}
    with gdask.LocalGPUCluster(n_devices=a.devices, backend=a.backend, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        _common.warmed(client)
        kind = cluster.backend
        threads = sorted({w["nthreads"] for w in scheduler_workers(client).values()})
        # gdask and scikit-learn fits in turn (the machine may be shared); dask-ml and the dask.array
        # loop after them (slow, and not what the ratios are taken against)
        loop: list = []
        fits = {"gdask": gdask_fit(X, init, a.iterations, loop=loop)}
        if "gdask-lloyd" not in a.skip:
            fits["gdask (lloyd)"] = gdask_fit(X, init, a.iterations, "lloyd")
        if "gdask-client-loop" not in a.skip:
            fits["gdask (client loop)"] = gdask_fit(X, init, a.iterations, worker_loop=False)
        if "sklearn" not in a.skip:
            fits["scikit-learn"] = sklearn_fit(X, init, a.iterations)
        if "sklearn-elkan" not in a.skip:
            fits["sklearn (elkan)"] = sklearn_fit(X, init, a.iterations, "elkan")
        best = interleaved(fits, a.repeat)
        results = {name: (t / it, c, it) for name, (t, c, it) in best.items()}
        gdask_loop = min(loop)
        defaults = []
        if a.default_fits and "sklearn" not in a.skip:
            defaults = default_fits(gdask.from_array(X).persist(), X, a.clusters, a.default_fits)
        if "dask-ml" not in a.skip:
            results["dask-ml"] = run_dask_ml(X, init, a.iterations, a.repeat)
        if "dask-array" not in a.skip:
            results["dask.array loop"] = run_dask_array(X, init, a.iterations, a.repeat)
        ndev = len(cluster.device_specs)
    fresh = []
    if a.fresh_cluster_fits and "sklearn" not in a.skip:
        fresh = fresh_cluster_fits(X, a.clusters, a.fresh_cluster_fits, a.devices, a.backend)
    ref_name = "scikit-learn" if "scikit-learn" in results else "gdask"
    ref_t, ref_c, _ = results[ref_name]
    print(f"\nK-means {n:,} x {a.features} float32 ({a.data}), K={a.clusters}, {a.iterations} iterations (tol=0), "
          f"gdask on {ndev} {kind} device(s){' (emulated: CPU figures)' if kind == 'emulated' else ''}; "
          f"whole fit / iterations, best of {a.repeat}")
    setup = _common.setup(["scikit-learn", "numba", "dask-ml"], dtype="float32 (every implementation)",
                          sklearn=f"this process, threads {SKLEARN_THREADS or 'n/a'}",
                          cluster=f"{ndev} {kind} devices, worker threads {threads} (gdask, dask-ml, dask.array)",
                          dask_chunks="250,000 rows (dask-ml, dask.array)")
    _common.print_setup(setup)
    print(f"{'implementation':<21}{'ms/iter':>10}{'ratio to ' + ref_name:>26}{'max |center diff|':>20}{'iters':>7}")
    rows = []
    for name, (t, c, it) in results.items():
        diff = float(np.abs(np.asarray(c, dtype=np.float64) - ref_c).max())
        print(f"{name:<21}{t * 1e3:>10.1f}{t / ref_t:>26.3f}{diff:>20.2e}{it:>7}")
        rows.append({"name": name, "ms_per_iter": t * 1e3, "ratio": t / ref_t, "center_diff": diff, "n_iter": it})
    print(f"gdask iterations alone (without set-up and final labels): {gdask_loop * 1e3:.1f} ms/iter")
    for name in ("dask-ml", "dask.array loop", "gdask (client loop)"):
        if name in results:
            print(f"{name} / gdask: {results[name][0] / results['gdask'][0]:.2f}x")
    if defaults:
        print("\nwhole fits, default parameters (seed = random_state; the same data, in turn):")
        print(f"{'seed':>4}{'gdask s':>10}{'iters':>7}{'inertia':>14}{'sklearn s':>11}{'iters':>7}{'inertia':>14}"
              f"{'ratio':>8}")
        for seed, tg, ig, eg, ts, is_, es in defaults:
            print(f"{seed:>4}{tg:>10.3f}{ig:>7}{eg:>14.6g}{ts:>11.3f}{is_:>7}{es:>14.6g}{tg / ts:>8.3f}")
    if fresh:
        print("\nfirst fit of the NumPy array on a freshly started cluster, default parameters (the rows travel "
              "inside the fit; a new cluster per fit; in turn):")
        print(f"{'seed':>4}{'shared memory s':>17}{'(iterations)':>14}{'graph s':>9}{'(iterations)':>14}"
              f"{'sklearn s':>11}{'ratio':>8}{'ratio (graph)':>15}{'gdask inertia':>15}{'sklearn inertia':>17}")
        for seed, tm, lm, tg, lg, ts, eg, es in fresh:
            print(f"{seed:>4}{tm:>17.3f}{lm:>14.3f}{tg:>9.3f}{lg:>14.3f}{ts:>11.3f}{tm / ts:>8.3f}{tg / ts:>15.3f}"
                  f"{eg:>15.6g}{es:>17.6g}")
        print("a fit's time besides its iterations, shared memory / graph (median): "
              f"{np.median([tm - lm for _, tm, lm, *_ in fresh]):.3f} / "
              f"{np.median([tg - lg for _, _, _, tg, lg, *_ in fresh]):.3f} s")
    bytes_pass = X.nbytes
    print(f"one pass over X reads {bytes_pass / 1e6:.0f} MB; at gdask's time that is "
          f"{bytes_pass / results['gdask'][0] / 1e9:.2f} GB/s")
    bw = read_bandwidth(X) if kind == "emulated" else None
    if bw:
        floor = bytes_pass / (bw * ndev)
        print(f"memory limit: one thread streams {bw / 1e9:.1f} GB/s, so a pass over X on {ndev} devices takes "
              f">= {floor * 1e3:.1f} ms (if the bandwidth scaled with devices); gdask's iteration is "
              f"{results['gdask'][0] / floor:.1f}x that")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"setup": setup, "backend": kind, "devices": ndev, "rows": n, "features": a.features,
                       "k": a.clusters,
                       "iterations": a.iterations, "repeat": a.repeat,
                       "gdask_loop_ms_per_iter": gdask_loop * 1e3,
                       "read_bandwidth_gb_s": None if bw is None else bw / 1e9, "results": rows, "data": a.data,
                       "default_fits": [dict(zip(("seed", "gdask_s", "gdask_iter", "gdask_inertia", "sklearn_s",
                                                  "sklearn_iter", "sklearn_inertia"), r)) for r in defaults],
                       "fresh_cluster_fits": [dict(zip(("seed", "gdask_s", "gdask_iterations_s", "gdask_graph_s",
                                                        "gdask_graph_iterations_s", "sklearn_s", "gdask_inertia",
                                                        "sklearn_inertia"), r)) for r in fresh]},
                      f, indent=2)


if __name__ == "__main__":
    main()
