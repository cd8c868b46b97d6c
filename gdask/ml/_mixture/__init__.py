"""Gaussian mixture models fitted by EM on the iteration engine (scikit-learn API)."""

from __future__ import annotations

from gdask.ml._lazy import exports

__all__ = ["GaussianMixture"]

# names resolved on first use: a worker that imports a block module does not import the estimator (gdask.ml._lazy)
__getattr__, __dir__ = exports(__name__, {"GaussianMixture": "._gaussian_mixture"})
