"""scikit-learn's own estimator checks on gdask.ml.LogisticRegression (drop-in means drop-in)."""

import pytest

pytest.importorskip("sklearn")
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from gdask.ml import LogisticRegression  # noqa: E402

# the checks fit with max_iter=5 on purpose: not converging is expected there
pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

# scikit-learn marks check_sample_weight_equivalence_on_dense_data as an expected failure for its
# own LogisticRegression ("sample_weight is not equivalent to removing/repeating samples"). It
# passes here (the objective is the weighted sum, accumulated in float64), so nothing is xfailed.


@parametrize_with_checks([LogisticRegression(max_iter=5), LogisticRegression(solver="gd", max_iter=5)])
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)
