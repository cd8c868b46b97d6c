"""Drop-in estimators that run over GDataSet blocks (scikit-learn API)."""

from __future__ import annotations

from gdask.ml._kmeans import KMeans

__all__ = ["KMeans"]
