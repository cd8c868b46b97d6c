"""PCA and TruncatedSVD on the iteration engine (scikit-learn API)."""

from __future__ import annotations

from gdask.ml._decomposition._pca import PCA
from gdask.ml._decomposition._truncated_svd import TruncatedSVD

__all__ = ["PCA", "TruncatedSVD"]
