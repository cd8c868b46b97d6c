"""PCA and TruncatedSVD on the iteration engine (scikit-learn API)."""

from __future__ import annotations

from gdask.ml._lazy import exports

__all__ = ["PCA", "TruncatedSVD"]

# names resolved on first use: a worker that imports a block module does not import the estimator (gdask.ml._lazy)
__getattr__, __dir__ = exports(__name__, {"PCA": "._pca", "TruncatedSVD": "._truncated_svd"})
