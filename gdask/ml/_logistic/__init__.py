"""L2-penalised logistic regression over GDataSet blocks (scikit-learn API), on the iteration engine.

* ``_estimator``: :class:`LogisticRegression` (parameters, input, labels and weights, predictions);
* ``_loop``: the parameter layout, the fit's typed state (:class:`SolverState`), the solvers;
* ``_targets``: ``y`` and weights blocked like X, class codes;
* ``_blocks``: what runs in block tasks (the kernels of :mod:`gdask.ml.kernels` do the device work).
"""

from __future__ import annotations

from gdask.ml._lazy import exports

__all__ = ["LogisticRegression", "SolverState"]

# names resolved on first use: a worker that imports a block module does not import the estimator (gdask.ml._lazy)
__getattr__, __dir__ = exports(__name__, {"LogisticRegression": "._estimator", "SolverState": "._loop"})
