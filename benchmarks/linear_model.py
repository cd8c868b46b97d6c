"""LinearRegression, Ridge and Lasso: gdask vs scikit-learn and dask-ml, same data, one machine.

Synthetic regression data (float64, ``--rows`` x ``--features``, a sparse true coefficient vector
plus noise). gdask and dask-ml run on the same LocalGPUCluster (data persisted there: a GDataSet for
gdask, dask arrays in the same row blocks for dask-ml), scikit-learn in this process on every core.
Each problem is scikit-learn's objective: ``alpha`` for Ridge (``||y - Xw||^2 + alpha ||w||^2``) and
Lasso (``1/(2n) ||y - Xw||^2 + alpha ||w||_1``); dask-ml's ``LinearRegression`` (dask-glm) is given the
same problem where it has it: no penalty (``penalty=None``), L2 with ``C = 1 / alpha`` (its loss is
half the squared error: the same minimiser), L1 with ``C = 1 / (n alpha)``. Agreement: the largest
relative difference of the coefficients from scikit-learn's. ``--json PATH`` writes the table;
``--quick`` is a small run.

    python benchmarks/linear_model.py                 # 1,000,000 x 64
    python benchmarks/linear_model.py --quick
"""

from __future__ import annotations

import argparse
import importlib.util
import warnings

import _common
import _compare
import numpy as np


def make_data(n, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) + rng.standard_normal(d)
    w = np.where(rng.random(d) < 0.3, rng.standard_normal(d) * 3, 0.0)
    return X, X @ w + 2.0 + rng.standard_normal(n)


def compare(model, ref):
    c, r = np.ravel(np.asarray(model.coef_, dtype=np.float64)), np.ravel(ref.coef_)
    return {"coef rel diff": float(np.abs(c - r).max() / np.abs(r).max())}


def fits(X, y, G, Y, dX, dy, alpha, lasso_alpha, skip):
    import sklearn.linear_model as skl

    import gdask.ml as gm

    n = X.shape[0]
    out = {
        "gdask LinearRegression": lambda: gm.LinearRegression().fit(G, Y),
        "gdask Ridge": lambda: gm.Ridge(alpha).fit(G, Y),
        "gdask Lasso": lambda: gm.Lasso(lasso_alpha).fit(G, Y),
    }
    if "sklearn" not in skip:
        def sk(est):
            def fit():
                with _common.all_cores():
                    return est().fit(X, y)
            return fit

        out["scikit-learn LinearRegression"] = sk(skl.LinearRegression)
        out["scikit-learn Ridge"] = sk(lambda: skl.Ridge(alpha))
        out["scikit-learn Lasso"] = sk(lambda: skl.Lasso(lasso_alpha))
    if "dask-ml" not in skip and importlib.util.find_spec("dask_ml") is not None:  # gdask[bench]
        import dask_ml.linear_model as dml

        out["dask-ml LinearRegression (none)"] = lambda: dml.LinearRegression(penalty=None, solver="lbfgs",
                                                                             max_iter=200).fit(dX, dy)
        out["dask-ml LinearRegression (l2)"] = lambda: dml.LinearRegression(penalty="l2", C=1 / alpha,
                                                                           solver="lbfgs", max_iter=200).fit(dX, dy)
        out["dask-ml LinearRegression (l1)"] = lambda: dml.LinearRegression(
            penalty="l1", C=1 / (n * lasso_alpha), solver="proximal_grad", max_iter=100).fit(dX, dy)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--features", type=int, default=None)
    p.add_argument("--alpha", type=float, default=10.0, help="Ridge's alpha")
    p.add_argument("--lasso-alpha", type=float, default=0.05)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--skip", nargs="*", default=[], choices=["sklearn", "dask-ml"])
    p.add_argument("--quick", action="store_true", help="20,000 x 16, one repeat")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    n = a.rows or (20_000 if a.quick else 1_000_000)
    d = a.features or (16 if a.quick else 64)
    repeat = 1 if a.quick else a.repeat
    X, y = make_data(n, d)
    warnings.filterwarnings("ignore", message="Sending large graph")
    import dask.array as da
    import sklearn.linear_model as skl
    from distributed import Client

    import gdask

    with gdask.LocalGPUCluster(n_devices=a.devices, backend="emulated", dashboard_address=":0") as cluster, \
            Client(cluster):
        _common.warmed()
        G = gdask.from_array(X).persist()
        Y = gdask.from_array(y, block_rows=G.row_blocks).persist()
        dX = da.from_array(X, chunks=(G.row_blocks[0], d)).persist()
        dy = da.from_array(y, chunks=G.row_blocks[0]).persist()
        gdask.ml.Ridge().fit(G, Y)  # warm-up
        results = _compare.timed_fits(fits(X, y, G, Y, dX, dy, a.alpha, a.lasso_alpha, a.skip), repeat)
        refs = {"LinearRegression": skl.LinearRegression().fit(X, y), "Ridge": skl.Ridge(a.alpha).fit(X, y),
                "Lasso": skl.Lasso(a.lasso_alpha, tol=1e-10, max_iter=100_000).fit(X, y)}
        setup = _common.setup(["scikit-learn", "dask-ml", "dask-glm", "dask"], gdask=f"{a.devices} emulated devices",
                              data=f"{n:,} x {d} float64")

        def against(model, _):
            name = type(model).__name__
            if name == "LinearRegression" and getattr(model, "penalty", None) is not None:
                name = {"l2": "Ridge", "l1": "Lasso"}[model.penalty]
            return compare(model, refs[name])

        reference = "scikit-learn Ridge" if "sklearn" not in a.skip else "gdask Ridge"
        rows = _compare.table(f"Linear models {n:,} x {d}, Ridge alpha={a.alpha}, Lasso alpha={a.lasso_alpha}; best "
                              f"of {repeat} (agreement: with scikit-learn's fit of the same problem, its Lasso to "
                              "tol 1e-10)", results, reference, against, setup)
    _common.write_json(a.json, {"rows": n, "features": d, "alpha": a.alpha, "lasso_alpha": a.lasso_alpha,
                                "devices": a.devices, "repeat": repeat, "setup": setup, "results": rows})


if __name__ == "__main__":
    main()
