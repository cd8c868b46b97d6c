"""K-means over GDataSet blocks (scikit-learn API), in the iteration engine.

* ``_estimator``: :class:`KMeans` (parameters, input, the fit, predictions);
* ``_init``: the initial centers (k-means||, k-means++, random rows, callable or array);
* ``_loop``: the fit's typed state (:class:`LoopState`) and its driver on the engine;
* ``_blocks``: what runs in block tasks (the kernels of :mod:`gdask.ml.kernels` do the device work).
"""

from __future__ import annotations

from gdask.ml._kmeans._estimator import KMeans
from gdask.ml._kmeans._loop import LoopState

__all__ = ["KMeans", "LoopState"]
