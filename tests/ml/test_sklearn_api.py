"""scikit-learn's own estimator checks on gdask.ml.KMeans (drop-in means drop-in)."""

import numpy as np
import pytest

pytest.importorskip("sklearn")
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from gdask.ml import KMeans  # noqa: E402

# scikit-learn marks this check as an expected failure for its own KMeans, for the same reason
EXPECTED_FAILED = {
    "check_sample_weight_equivalence_on_dense_data":
        "sample_weight is not equivalent to removing/repeating samples (as in scikit-learn's KMeans)",
    "check_sample_weight_equivalence_on_sparse_data":  # the same check on sparse data (CSR blocks)
        "sample_weight is not equivalent to removing/repeating samples (as in scikit-learn's KMeans)",
}


@parametrize_with_checks([KMeans(n_clusters=3, max_iter=5, random_state=0)],
                         expected_failed_checks=lambda est: EXPECTED_FAILED)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


def test_sample_weight_equals_sklearn_weighted_lloyd():
    import sklearn.cluster as sk

    import gdask

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(c, 1.0, (300, 4)) for c in (0, 5, 10)]).astype(np.float32)
    w = rng.uniform(0.1, 3.0, x.shape[0])
    init = x[[0, 350, 700]] + 0.5
    ref = sk.KMeans(3, init=init, n_init=1, max_iter=20, tol=0, algorithm="lloyd").fit(x, sample_weight=w)
    for X in (x, gdask.from_array(x, block_rows=128)):
        km = KMeans(3, init=init, max_iter=20, tol=0).fit(X, sample_weight=w)
        np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=1e-4)
        np.testing.assert_allclose(km.inertia_, ref.inertia_, rtol=1e-4)
        np.testing.assert_allclose(km.score(x, sample_weight=w), ref.score(x, sample_weight=w), rtol=1e-4)


@pytest.mark.parametrize("w, match", [(np.zeros(10), "non-zero"), (-np.ones(10), "[Nn]egative"),
                                      (np.ones(9), "shape")])
def test_bad_sample_weight(w, match):
    with pytest.raises(ValueError, match=match):
        KMeans(2).fit(np.random.default_rng(0).random((10, 2)), sample_weight=w)
