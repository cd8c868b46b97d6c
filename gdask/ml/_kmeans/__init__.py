"""K-means over GDataSet blocks (scikit-learn API), in the iteration engine.

* ``_estimator``: :class:`KMeans` (parameters, input, the fit, predictions);
* ``_init``: the initial centers (k-means||, k-means++, random rows, callable or array);
* ``_loop``: the fit's typed state (:class:`LoopState`) and its driver on the engine;
* ``_blocks``: what runs in block tasks (the kernels of :mod:`gdask.ml.kernels` do the device work).
"""

from __future__ import annotations

from gdask.ml._lazy import exports

__all__ = ["KMeans", "LoopState"]

# names resolved on first use: a worker that imports a block module does not import the estimator (gdask.ml._lazy)
__getattr__, __dir__ = exports(__name__, {"KMeans": "._estimator", "LoopState": "._loop"})
