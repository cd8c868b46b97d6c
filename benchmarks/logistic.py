"""Logistic regression: gdask vs scikit-learn (lbfgs) and dask-ml (lbfgs), same data, one run.

Synthetic data: X ~ N(0, 1) float32, labels drawn from a logistic model. Every implementation fits
with C=1, tol=1e-4, max_iter=100 (gdask and dask-ml on the same LocalGPUCluster, data persisted
there; scikit-learn in this process). Each implementation runs in each ``--dtypes`` (default
float32 and float64), labelled; a float64 copy of X is made once, outside every timed region, so
no fit times a conversion of its input; the table's "computes in" column is the dtype of the
fitted coefficients (scikit-learn's lbfgs keeps float32 input in float32). Agreement is measured
against scikit-learn on float64 data. Time per iteration is the whole ``fit`` (validation, set-up,
iterations) divided by the iterations it reports, best of ``--repeat`` fits, the fits of the
implementations interleaved so that each sees about the same machine load; gdask also reports
the mean time of one pass over the data (one loss-and-gradient evaluation: one Dask round trip).
Agreement is measured against scikit-learn: largest coefficient difference, largest difference of
predicted probabilities, and training accuracy of each. ``--json PATH`` writes the table.

    python benchmarks/logistic.py                  # 1,000,000 x 32 float32, binary
    python benchmarks/logistic.py --classes 4      # multinomial (dask-ml skipped: binary only)
    python benchmarks/logistic.py --backend cuda   # on a GPU (larger default size)
"""

from __future__ import annotations

import argparse
import time
import warnings

import _common
import numpy as np

from gdask._compat import scheduler_workers


def make_data(n, d, classes, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d), dtype=np.float32)
    k = 1 if classes == 2 else classes
    W = rng.standard_normal((d, k)) / np.sqrt(d) * 2.0
    z = X @ W.astype(np.float32) + rng.standard_normal(k).astype(np.float32) * 0.5
    if k == 1:
        y = (rng.random(n) < 1 / (1 + np.exp(-z[:, 0]))).astype(np.int64)
    else:
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        y = (p.cumsum(1) > rng.random((n, 1))).argmax(1).astype(np.int64)
    return X, y


def _timed(fit):
    """Run ``fit() -> (model, extra dict)`` with warnings silenced; its seconds, model and extras."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning from dask-ml; the table shows iterations
        t = time.perf_counter()
        model, extra = fit()
        return {"fit_s": time.perf_counter() - t, "model": model, **extra}


def setup_sklearn(X, y, C):
    from sklearn.linear_model import LogisticRegression

    def fit():
        with _common.all_cores() as threads:  # see all_cores: the cluster left OMP_NUM_THREADS=1 here
            clf = LogisticRegression(C=C).fit(X, y)
        return clf, {"n_iter": int(clf.n_iter_[0]), "computes_in": str(clf.coef_.dtype), "threads": threads}

    return fit


def setup_gdask(X, y, C, solver):
    import gdask
    from gdask.ml import LogisticRegression

    G = gdask.from_array(X).persist()  # the data lives on the devices, as a gdask user keeps it
    _timed(lambda: (LogisticRegression(C=C, max_iter=2, solver=solver).fit(G, y), {}))  # warm-up

    def fit():
        clf = LogisticRegression(C=C, solver=solver).fit(G, y)
        return clf, {"n_iter": int(clf.n_iter_[0]), "pass_ms": float(np.mean(clf.pass_times_)) * 1e3,
                     "passes": len(clf.pass_times_), "computes_in": str(np.asarray(clf.coef_).dtype)}

    return fit, G


def setup_dask_ml(X, y, C, block_rows):
    import dask.array as da
    from dask_glm import algorithms
    from dask_ml.linear_model import LogisticRegression

    dX = da.from_array(X, chunks=(block_rows, X.shape[1])).persist()
    dy = da.from_array(y, chunks=block_rows).persist()

    def fit():
        # dask-ml does not report its iterations: record the info dict scipy's L-BFGS returns to
        # dask_glm (the call and its arguments are unchanged)
        seen = {}
        original = algorithms.fmin_l_bfgs_b

        def recording(*args, **kwargs):
            out = original(*args, **kwargs)
            seen.update(nit=out[2]["nit"], funcalls=out[2]["funcalls"])
            return out

        algorithms.fmin_l_bfgs_b = recording
        try:
            clf = LogisticRegression(C=C, solver="lbfgs").fit(dX, dy)
        finally:
            algorithms.fmin_l_bfgs_b = original
        return clf, {"n_iter": int(seen.get("nit", 0)), "passes": int(seen.get("funcalls", 0)),
                     "computes_in": str(np.asarray(clf.coef_).dtype)}

    return fit


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="emulated", choices=["emulated", "cuda"])
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--classes", type=int, default=2)
    p.add_argument("--C", type=float, default=1.0)
    p.add_argument("--solver", default="lbfgs", choices=["lbfgs", "gd"], help="gdask's solver")
    p.add_argument("--devices", type=int, default=None)
    p.add_argument("--dtypes", default="float32,float64", help="dtypes of X each implementation is given")
    p.add_argument("--skip", nargs="*", default=[], choices=["sklearn", "dask-ml"])
    p.add_argument("--repeat", type=int, default=3, help="fits per implementation; the fastest counts")
    p.add_argument("--json", default=None, help="write results to this file")
    a = p.parse_args(argv)
    n = a.rows or (1_000_000 if a.backend == "emulated" else 20_000_000)
    X32, y = make_data(n, a.features, a.classes)
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    Xs = {d: X32 if d == "float32" else X32.astype(d) for d in dtypes}  # conversions outside every timer
    warnings.filterwarnings("ignore", message="Sending large graph")  # the data is sent once, at persist
    from distributed import Client

    import gdask

    fits = {}
    runs: dict[str, list] = {}
    with gdask.LocalGPUCluster(n_devices=a.devices, backend=a.backend, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        _common.warmed(client)
        kind = cluster.backend
        ndev = len(cluster.device_specs)
        threads = sorted({w["nthreads"] for w in scheduler_workers(client).values()})
        block_rows = None
        for d, X in Xs.items():
            fits[f"gdask {d}"], G = setup_gdask(X, y, a.C, a.solver)
            block_rows = block_rows or G.row_blocks[0]
        if "dask-ml" not in a.skip and a.classes == 2:
            for d, X in Xs.items():
                try:
                    fits[f"dask-ml {d}"] = setup_dask_ml(X, y, a.C, block_rows)
                except ImportError as e:
                    print(f"dask-ml not importable, skipped: {e}")
                    break
        if "sklearn" not in a.skip:
            for d, X in Xs.items():
                fits[f"scikit-learn {d}"] = setup_sklearn(X, y, a.C)
        # interleaved: every implementation's i-th fit runs under about the same machine load
        for _ in range(a.repeat):
            for name, fit in fits.items():
                runs.setdefault(name, []).append(_timed(fit))
    results = {name: min(rs, key=lambda r: r["fit_s"] / max(r["n_iter"], 1)) for name, rs in runs.items()}
    ref_name = next((k for k in ("scikit-learn float64", "scikit-learn float32") if k in results), next(iter(results)))
    ref = results[ref_name]
    ref_t = ref["fit_s"] / max(ref["n_iter"], 1)
    ref_proba = ref["model"].predict_proba(X32)
    sk_threads = next((r["threads"] for k, r in results.items() if k.startswith("scikit")), "n/a")
    setup = _common.setup(["scikit-learn", "scipy", "numba", "dask-ml"], data_dtypes=",".join(dtypes),
                          sklearn_threads=f"this process, {sk_threads}",
                          gdask=f"{ndev} {kind} devices, worker threads {threads}",
                          dtype_conversion="outside the timed region (one copy per dtype before any fit)")
    print(f"\nLogisticRegression {n:,} x {a.features}, {a.classes} classes, C={a.C}, tol=1e-4; gdask "
          f"({a.solver}) on {ndev} {kind} device(s){' (emulated: CPU figures)' if kind == 'emulated' else ''}; "
          f"best of {a.repeat}")
    _common.print_setup(setup)
    head = (f"{'implementation':<22}{'computes in':>12}{'fit s':>8}{'iters':>7}{'ms/iter':>10}"
            f"{'ratio to ' + ref_name:>32}{'max|coef diff|':>16}{'max|proba diff|':>17}{'accuracy':>10}")
    print(head)
    rows = []
    for name, r in results.items():
        m = r["model"]
        t_it = r["fit_s"] / max(r["n_iter"], 1)
        coef = np.asarray(m.coef_, dtype=np.float64).reshape(ref["model"].coef_.shape)
        cdiff = float(np.abs(coef - ref["model"].coef_).max())
        proba = np.asarray(m.predict_proba(X32))
        if proba.ndim == 1:  # dask-ml: probability of the positive class only
            proba = np.stack([1 - proba, proba], axis=1)
        pdiff = float(np.abs(proba - ref_proba).max())
        acc = float((np.asarray(m.predict(X32)) == y).mean())
        print(f"{name:<22}{r['computes_in']:>12}{r['fit_s']:>8.2f}{r['n_iter']:>7}{t_it * 1e3:>10.1f}"
              f"{t_it / ref_t:>32.3f}{cdiff:>16.2e}{pdiff:>17.2e}{acc:>10.4f}")
        rows.append({"name": name, "dtype": name.split()[-1], "computes_in": r["computes_in"], "fit_s": r["fit_s"],
                     "n_iter": r["n_iter"], "ms_per_iter": t_it * 1e3, "ratio": t_it / ref_t,
                     "fit_ratio": r["fit_s"] / ref["fit_s"], "coef_diff": cdiff, "proba_diff": pdiff, "accuracy": acc})
    for name, g in results.items():
        if name.startswith("gdask"):
            nbytes = Xs[name.split()[-1]].nbytes
            print(f"{name}: {g['passes']} passes over X, {g['pass_ms']:.1f} ms per pass (one Dask round trip); one "
                  f"pass reads {nbytes / 1e6:.0f} MB: {nbytes / g['pass_ms'] / 1e6:.2f} GB/s")
    for name, r in results.items():
        if name.startswith("dask-ml"):
            print(f"{name}: {r['passes']} loss/gradient evaluations, {r['fit_s'] / max(r['passes'], 1) * 1e3:.1f} ms "
                  "each (its own objective: X standardised, unscaled loss sum, so other iteration counts)")
    for d in dtypes:
        g, s_ = results.get(f"gdask {d}"), results.get(f"scikit-learn {d}")
        if g and s_:
            print(f"{d}: whole fit gdask / scikit-learn {g['fit_s'] / s_['fit_s']:.3f}, per iteration "
                  f"{(g['fit_s'] / max(g['n_iter'], 1)) / (s_['fit_s'] / max(s_['n_iter'], 1)):.3f}")
    first = results.get(f"gdask {dtypes[0]}")
    _common.write_json(a.json, {
        "backend": kind, "devices": ndev, "rows": n, "features": a.features, "classes": a.classes, "C": a.C,
        "solver": a.solver, "repeat": a.repeat, "dtypes": dtypes, "setup": setup, "reference": ref_name,
        "gdask_pass_ms": first["pass_ms"] if first else None, "gdask_passes": first["passes"] if first else None,
        "results": rows})


if __name__ == "__main__":
    main()
