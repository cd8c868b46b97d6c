"""PCA and TruncatedSVD: gdask vs scikit-learn and dask-ml, same data, one machine.

Synthetic low-rank data plus noise (float64, ``--rows`` x ``--features``), ``--components``
components. gdask and dask-ml run on the same LocalGPUCluster (data persisted there: a GDataSet for
gdask, a dask array in the same row blocks for dask-ml), scikit-learn in this process on every core.
Solvers: the exact one (gdask's Gram matrix in float64 / scikit-learn's "covariance_eigh" / dask-ml's
"full", a TSQR) and the randomized one (all three: scikit-learn's defaults, ``random_state=0``).
Agreement with scikit-learn's exact PCA: the largest relative difference of the explained variances,
and of the components (rows sign-aligned first: dask-ml's sign convention differs). ``--json PATH``
writes the table; ``--quick`` is a small run.

    python benchmarks/decomposition.py                # 400,000 x 64, 8 components
    python benchmarks/decomposition.py --quick
"""

from __future__ import annotations

import argparse
import importlib.util
import warnings

import _common
import _compare
import numpy as np


def make_data(n, d, rank=12, seed=0):
    rng = np.random.default_rng(seed)
    scales = np.geomspace(10.0, 1.0, rank)
    X = (rng.standard_normal((n, rank)) * scales) @ rng.standard_normal((rank, d)) / np.sqrt(d)
    return X + 0.1 * rng.standard_normal((n, d)) + rng.standard_normal(d)


def _aligned(C, R):
    C, R = np.asarray(C, dtype=np.float64), np.asarray(R, dtype=np.float64)
    signs = np.sign(np.sum(C * R, axis=1))
    return C * np.where(signs == 0, 1, signs)[:, None]


def compare(model, ref):
    ev, rev = np.asarray(model.explained_variance_), np.asarray(ref.explained_variance_)
    comp = _aligned(model.components_, ref.components_)
    return {"var rel diff": float(np.abs(ev - rev).max() / np.abs(rev).max()),
            "components diff": float(np.abs(comp - ref.components_).max())}


def fits(X, G, dX, k, skip):
    import sklearn.decomposition as skd

    import gdask.ml as gm

    out = {
        "gdask PCA exact": lambda: gm.PCA(k, svd_solver="covariance_eigh").fit(G),
        "gdask PCA randomized": lambda: gm.PCA(k, svd_solver="randomized", random_state=0).fit(G),
        "gdask TruncatedSVD randomized": lambda: gm.TruncatedSVD(k, random_state=0).fit(G),
    }
    if "sklearn" not in skip:
        def sk(est):
            def fit():
                with _common.all_cores():
                    return est().fit(X)
            return fit

        out["scikit-learn PCA covariance_eigh"] = sk(lambda: skd.PCA(k, svd_solver="covariance_eigh"))
        out["scikit-learn PCA randomized"] = sk(lambda: skd.PCA(k, svd_solver="randomized", random_state=0))
        out["scikit-learn TruncatedSVD"] = sk(lambda: skd.TruncatedSVD(k, random_state=0))
    if "dask-ml" not in skip and importlib.util.find_spec("dask_ml") is not None:  # gdask[bench]
        import dask_ml.decomposition as dmd

        out["dask-ml PCA full (tsqr)"] = lambda: dmd.PCA(k, svd_solver="full").fit(dX)
        out["dask-ml PCA randomized"] = lambda: dmd.PCA(k, svd_solver="randomized", random_state=0).fit(dX)
        out["dask-ml TruncatedSVD"] = lambda: dmd.TruncatedSVD(k, algorithm="randomized", random_state=0).fit(dX)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--features", type=int, default=None)
    p.add_argument("--components", type=int, default=8)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--skip", nargs="*", default=[], choices=["sklearn", "dask-ml"])
    p.add_argument("--quick", action="store_true", help="20,000 x 16, one repeat")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    n = a.rows or (20_000 if a.quick else 400_000)
    d = a.features or (16 if a.quick else 64)
    repeat = 1 if a.quick else a.repeat
    X = make_data(n, d)
    warnings.filterwarnings("ignore", message="Sending large graph")
    import dask.array as da
    from distributed import Client

    import gdask

    with gdask.LocalGPUCluster(n_devices=a.devices, backend="emulated", dashboard_address=":0") as cluster, \
            Client(cluster):
        _common.warmed()
        G = gdask.from_array(X).persist()
        dX = da.from_array(X, chunks=(G.row_blocks[0], d)).persist()
        gdask.ml.PCA(2).fit(G)  # warm-up (the workers' first tasks)
        results = _compare.timed_fits(fits(X, G, dX, a.components, a.skip), repeat)
        import sklearn.decomposition as skd

        refs = {"PCA": skd.PCA(a.components, svd_solver="full").fit(X),
                "TruncatedSVD": skd.TruncatedSVD(a.components, algorithm="arpack", tol=1e-12).fit(X)}
        setup = _common.setup(["scikit-learn", "dask-ml", "dask"], gdask=f"{a.devices} emulated devices",
                              data=f"{n:,} x {d} float64, rank 12 + noise")
        reference = "scikit-learn PCA covariance_eigh" if "sklearn" not in a.skip else "gdask PCA exact"
        rows = _compare.table(f"PCA / TruncatedSVD {n:,} x {d}, {a.components} components; best of {repeat} "
                              "(agreement: against scikit-learn's exact PCA (svd_solver='full') and exact truncated "
                              "SVD (ARPACK, tol 1e-12))", results, reference,
                              lambda m, r: compare(m, refs[type(m).__name__]), setup)
    _common.write_json(a.json, {"rows": n, "features": d, "components": a.components, "devices": a.devices,
                                "repeat": repeat, "setup": setup, "results": rows})


if __name__ == "__main__":
    main()
