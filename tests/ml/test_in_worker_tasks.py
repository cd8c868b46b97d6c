"""Estimators called from inside a worker task (issue #17, item 7): joblib's dask backend runs every
fit of a grid search in a task; the fit waited for tasks that needed the thread it held (forever)."""

from __future__ import annotations

import numpy as np
import pytest

import gdask.ml

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("cluster", ["plain", "gdask"])
def test_grid_search_under_joblibs_dask_backend(cluster):
    joblib = pytest.importorskip("joblib")
    from distributed import Client, LocalCluster
    from sklearn.model_selection import GridSearchCV

    make = (lambda: LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0")) if cluster == "plain" \
        else (lambda: gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="64MiB",
                                            dashboard_address=":0"))
    rng = np.random.default_rng(0)
    X = rng.random((600, 3))
    y = (X[:, 0] + X[:, 1] > 1).astype(int)
    with make() as lc, Client(lc):
        with joblib.parallel_backend("dask"):
            gs = GridSearchCV(gdask.ml.LogisticRegression(max_iter=30), {"C": [0.1, 1.0]}, cv=2).fit(X, y)
            km = GridSearchCV(gdask.ml.KMeans(2, n_init=1, random_state=0, max_iter=10), {"n_clusters": [2, 3]},
                              cv=2).fit(X)
    ref = gdask.ml.LogisticRegression(max_iter=30, C=gs.best_params_["C"]).fit(X, y)
    np.testing.assert_allclose(gs.best_estimator_.coef_, ref.coef_, rtol=1e-8)
    assert km.best_params_["n_clusters"] in (2, 3)
