"""GaussianMixture: gdask vs scikit-learn, same data, same initialisation, one machine.

dask-ml has no Gaussian mixture: the table says so. Synthetic data: ``--components`` Gaussian blobs
in ``--features`` dimensions (float64). Both fit with the same ``means_init`` (the blob centers,
jittered), ``random_state=0``, ``tol=1e-3``, ``max_iter=100``, for each ``--covariance-types``;
gdask on a LocalGPUCluster (data persisted there as a GDataSet), scikit-learn in this process on
every core. Agreement: EM iterations of each, and the largest relative differences of the means,
weights and lower bound from scikit-learn's. ``--json PATH`` writes the table; ``--quick`` is a
small run.

    python benchmarks/mixture.py                      # 500,000 x 16, 5 components
    python benchmarks/mixture.py --quick
"""

from __future__ import annotations

import argparse
import warnings

import _common
import _compare
import numpy as np


def make_data(n, d, k, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((k, d)) * 4
    labels = rng.integers(0, k, n)
    scales = rng.uniform(0.5, 2.0, (k, d))
    X = centers[labels] + rng.standard_normal((n, d)) * scales[labels]
    return X, centers + rng.standard_normal((k, d)) * 0.5


def compare(model, ref):
    rel = lambda a, b: float(np.abs(np.asarray(a) - b).max() / np.abs(b).max())  # noqa: E731
    return {"iterations": f"{model.n_iter_} / {ref.n_iter_}", "means rel diff": rel(model.means_, ref.means_),
            "weights rel diff": rel(model.weights_, ref.weights_),
            "lower bound diff": abs(float(model.lower_bound_) - float(ref.lower_bound_))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--features", type=int, default=None)
    p.add_argument("--components", type=int, default=5)
    p.add_argument("--covariance-types", default="full,diag")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--skip", nargs="*", default=[], choices=["sklearn"])
    p.add_argument("--quick", action="store_true", help="20,000 x 4, one repeat")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    n = a.rows or (20_000 if a.quick else 500_000)
    d = a.features or (4 if a.quick else 16)
    repeat = 1 if a.quick else a.repeat
    X, M = make_data(n, d, a.components)
    types = [t.strip() for t in a.covariance_types.split(",") if t.strip()]
    warnings.filterwarnings("ignore", message="Sending large graph")
    import sklearn.mixture as skm
    from distributed import Client

    import gdask
    import gdask.ml as gm

    params = dict(means_init=M, random_state=0, tol=1e-3, max_iter=100)
    with gdask.LocalGPUCluster(n_devices=a.devices, backend="emulated", dashboard_address=":0") as cluster, \
            Client(cluster):
        _common.warmed()
        G = gdask.from_array(X).persist()
        gm.GaussianMixture(a.components, means_init=M, max_iter=1).fit(G)  # warm-up
        fits = {}
        for t in types:
            fits[f"gdask {t}"] = lambda t=t: gm.GaussianMixture(a.components, covariance_type=t, **params).fit(G)
            if "sklearn" not in a.skip:
                def sk(t=t):
                    with _common.all_cores():
                        return skm.GaussianMixture(a.components, covariance_type=t, **params).fit(X)
                fits[f"scikit-learn {t}"] = sk
        results = _compare.timed_fits(fits, repeat)
        refs = {t: results[f"scikit-learn {t}"]["model"] if "sklearn" not in a.skip else results[f"gdask {t}"]["model"]
                for t in types}
        setup = _common.setup(["scikit-learn", "dask"], gdask=f"{a.devices} emulated devices",
                              data=f"{n:,} x {d} float64, {a.components} blobs", dask_ml="has no Gaussian mixture")
        reference = f"scikit-learn {types[0]}" if "sklearn" not in a.skip else f"gdask {types[0]}"
        rows = _compare.table(f"GaussianMixture {n:,} x {d}, {a.components} components, same means_init; best of "
                              f"{repeat} (agreement: with scikit-learn's fit of the same covariance type; dask-ml: "
                              "n/a)", results, reference, lambda m, _: compare(m, refs[m.covariance_type]), setup)
    _common.write_json(a.json, {"rows": n, "features": d, "components": a.components, "covariance_types": types,
                                "devices": a.devices, "repeat": repeat, "setup": setup, "results": rows})


if __name__ == "__main__":
    main()
