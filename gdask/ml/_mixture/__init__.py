"""Gaussian mixture models fitted by EM on the iteration engine (scikit-learn API)."""

from __future__ import annotations

from gdask.ml._mixture._gaussian_mixture import GaussianMixture

__all__ = ["GaussianMixture"]
