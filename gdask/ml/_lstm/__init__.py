"""LSTM regression and classification over sequence GDataSets, trained data-parallel with PyTorch.

* ``_estimator``: :class:`LSTMRegressor`, :class:`LSTMClassifier` (scikit-learn API; no torch import);
* ``_torch``: the model, the data-parallel trainer on the iteration engine (its :class:`TrainState`),
  prediction on blocks (imported when an estimator fits or predicts);
* ``_parallel``: the process group of a fit, the epochs' batch plans, malloc settings while training.
"""

from __future__ import annotations

from gdask.ml._lazy import exports

__all__ = ["LSTMClassifier", "LSTMRegressor"]

# names resolved on first use: a worker that imports a block module does not import the estimator (gdask.ml._lazy)
__getattr__, __dir__ = exports(__name__, {"LSTMClassifier": "._estimator", "LSTMRegressor": "._estimator"})
