"""Drop-in estimators that run over GDataSet blocks (scikit-learn API).

What every entry point runs on is loaded when ``gdask.ml`` is imported, not inside the first fit or
call: the GDataSet engine (``gdask.gdataset``, ~1 s of imports with dask.array and distributed) and
numba's CPU target (:func:`~gdask.ml.kernels._cpu_common.start_numba`, ~0.25 s), which a device worker
loads anyway. Measured: the first ``pagerank`` of a 1M-node graph in a process took 1.1 s, the next
0.26 s. The estimators are imported lazily, here and in their packages (:mod:`gdask.ml._lazy`): a
worker that loads a kernel or block module of ``gdask.ml`` does not import scikit-learn and every
estimator with it.
"""

from __future__ import annotations

import gdask.gdataset  # noqa: F401  (see above)
from gdask.ml._lazy import exports
from gdask.ml.kernels._cpu_common import start_numba as _start_numba

_start_numba()

__all__ = ["ElasticNet", "GaussianMixture", "KMeans", "LSTMClassifier", "LSTMRegressor", "Lasso", "LinearRegression",
           "LogisticRegression", "PCA", "Ridge", "TruncatedSVD", "WarmKernels", "pagerank", "powerlaw_graph",
           "wait_for_warm_kernels", "warm_kernels", "warm_kernels_plugin"]

_WHERE = {
    "KMeans": "gdask.ml._kmeans",
    "LogisticRegression": "gdask.ml._logistic",
    "LSTMClassifier": "gdask.ml._lstm",   # PyTorch (gdask[torch]) is imported when they fit
    "LSTMRegressor": "gdask.ml._lstm",
    "pagerank": "gdask.ml._pagerank",
    "powerlaw_graph": "gdask.ml._graphs",
    # the kernel warm-up of device workers (config gdask.plugins.worker: gdask.ml:warm_kernels_plugin)
    "WarmKernels": "gdask.ml._warm",
    "wait_for_warm_kernels": "gdask.ml._warm",
    "warm_kernels": "gdask.ml._warm",
    "warm_kernels_plugin": "gdask.ml._warm",
    # more estimators: decomposition, linear models, mixtures
    "PCA": "gdask.ml._decomposition",
    "TruncatedSVD": "gdask.ml._decomposition",
    "LinearRegression": "gdask.ml._linear_model",
    "Ridge": "gdask.ml._linear_model",
    "Lasso": "gdask.ml._linear_model",
    "ElasticNet": "gdask.ml._linear_model",
    "GaussianMixture": "gdask.ml._mixture",
}


__getattr__, __dir__ = exports(__name__, _WHERE)
