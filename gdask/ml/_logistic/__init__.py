"""L2-penalised logistic regression over GDataSet blocks (scikit-learn API), on the iteration engine.

* ``_estimator``: :class:`LogisticRegression` (parameters, input, labels and weights, predictions);
* ``_loop``: the parameter layout, the fit's typed state (:class:`SolverState`), the solvers;
* ``_targets``: ``y`` and weights blocked like X, class codes;
* ``_blocks``: what runs in block tasks (the kernels of :mod:`gdask.ml.kernels` do the device work).
"""

from __future__ import annotations

from gdask.ml._logistic._estimator import LogisticRegression
from gdask.ml._logistic._loop import SolverState

__all__ = ["LogisticRegression", "SolverState"]
