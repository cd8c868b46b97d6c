"""The block kernels of gdask.ml: what runs on one device block per pass.

One package, one choice of implementation per block (:func:`backend_for`, in ``_dispatch``), and per
algorithm one module per backend with the same op names, as scikit-learn keeps its
``_k_means_lloyd`` / ``_k_means_elkan`` / ``_k_means_common``:

=============  ===================  ===================  ==================
algorithm      ``cpu`` (NumPy,      ``cuda`` (CuPy,      ``xp`` (array API:
               numba)               numba.cuda)          strict, fallback)
=============  ===================  ===================  ==================
K-means pass   ``_kmeans_cpu``      ``_kmeans_cuda``     ``_kmeans_xp``
Hamerly        ``_hamerly_cpu``     ``_hamerly_cuda``    ``_hamerly_xp``
logistic       ``_logistic_cpu``    ``_logistic_cuda``   ``_logistic_xp``
=============  ===================  ===================  ==================

``_common`` holds what every backend shares (constants, the bounds state, host helpers),
``_cpu_common`` the numba helpers inlined into the CPU kernels, ``_cuda_common`` the numba.cuda
plumbing (lazy import, streams, launch shapes, compiled-kernel cache, fixed-order reductions).
``_kmeans``, ``_hamerly`` and ``_logistic`` are the ops the estimators call, exported here. Imports
point one way: ops -> ``_dispatch`` -> backend modules -> ``_common`` / ``_*_common``.

Blocks are feature-major (``blk.T`` is a C-contiguous ``(d, n)`` array), so the inner loops walk
consecutive rows of one feature: SIMD lanes on CPU (numba), threads on GPU.
"""

from __future__ import annotations

from gdask.ml.kernels._common import FAR, N_FARTHEST, BlockBounds, host, row_weights, weighted_total
from gdask.ml.kernels._cpu_common import NORMS_SPACE, row_norms
from gdask.ml.kernels._dispatch import backend_for, kernels_for
from gdask.ml.kernels._hamerly import MISSING, bounds_labels, bounds_partial
from gdask.ml.kernels._kmeans import (
    assign,
    labels_block,
    lloyd_combine,
    lloyd_partial,
    min_sqdist,
    nearest_update,
    next_centers,
)
from gdask.ml.kernels._kmeans_xp import cluster_sums
from gdask.ml.kernels._logistic import (
    decision,
    encode_labels,
    gram,
    label_counts,
    label_counts_combine,
    loss_grad,
    loss_grad_combine,
    sq_norms,
)

__all__ = [
    "FAR", "MISSING", "NORMS_SPACE", "N_FARTHEST", "BlockBounds", "assign", "backend_for", "bounds_labels",
    "bounds_partial", "cluster_sums", "decision", "encode_labels", "gram", "host", "kernels_for", "label_counts",
    "label_counts_combine", "labels_block", "lloyd_combine", "lloyd_partial", "loss_grad", "loss_grad_combine",
    "min_sqdist", "nearest_update", "next_centers", "row_norms", "row_weights", "sq_norms", "weighted_total",
]
