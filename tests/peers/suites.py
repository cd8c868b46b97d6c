"""The peers' own test suites run against gdask.ml (the table read by ``tests/peers/conftest.py``).

Each suite: the test module of an installed peer package (imported by its module name, never
copied), the estimator names swapped for gdask's while it imports (its subject only: estimators it
uses as references stay the peer's), and the tests that cannot pass, each marked xfail with its
reason. Tests whose code never reaches a swapped name (directly, through a module-level helper, or
as a parametrized value) test the peer itself and are deselected. Add a suite by adding a ``Suite``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rule:
    """Tests matching any of ``patterns`` (the test's name with its parameters; ``*`` matches anything, brackets
    are literal) are
    expected to fail for ``reason``; ``strict``: an unexpected pass fails the run."""

    patterns: tuple[str, ...]
    reason: str
    strict: bool = True


@dataclass(frozen=True)
class Suite:
    """One peer test module: ``swap`` maps a module the tests import from to ``{name: gdask object path}``."""

    module: str
    swap: dict[str, dict[str, str]]
    xfail: tuple[Rule, ...] = ()
    #: tests left out to keep CI's cost down (fnmatch patterns), with why
    skip: tuple[Rule, ...] = ()
    requires: tuple[str, ...] = field(default=("sklearn",))
    #: for a peer whose wheel ships no tests: the environment variable naming a folder of its test files
    #: (a checkout's ``tests/``); ``module``'s last part is the file's name; unset: the suite is not collected
    source: str | None = None


SPARSE = ("sparse input: gdask's PCA, TruncatedSVD and linear models take dense data (NumPy, CuPy, dask, GDataSet) "
          "and refuse sparse matrices (only KMeans and LogisticRegression take CSR); not strict: the parametrizations "
          "scikit-learn densifies before the estimator sees them pass")
ARRAY_API = ("scikit-learn's array-API dispatch (array_api_dispatch=True with torch / array-api-strict inputs): gdask "
             "takes NumPy, CuPy, dask and GDataSets and runs its own array-API code on its devices")
PRECOMPUTE = ("a precomputed Gram matrix given as an array: gdask always all-gathers its own from the blocks and "
              "refuses the array with a ValueError")
NO_COPY = "copy_X=False: the test expects X centered in place; gdask never modifies its input (blocks are immutable)"
PRIVATE = "uses a private scikit-learn helper of the estimator (not part of the public API gdask reproduces)"
RANDOMIZED = ("randomized solver: gdask never forms the tall range basis; its Cholesky-QR of the range (from d x l "
              "matrices) differs from scikit-learn's Householder QR by up to ~1e-3 relative on the test's nearly "
              "rank-deficient data, above the test's rtol 1e-7")
#: parameters naming a sparse container (scikit-learn's CSR_CONTAINERS, CSC_CONTAINERS, ...)
SPARSE_PARAMS = ("*csr_*", "*csc_*", "*coo_*", "*lil_*", "*dok_*", "*bsr_*", "*dia_*", "*sparse]", "*-sparse-*",
                 "*[sparse-*")
#: (some of these parametrizations hand the estimator data scikit-learn densified first, and pass: not strict)

_LEFT_OUT_ARRAY_API = Rule(("*array_api*",), "left out (CI cost): " + ARRAY_API)

SUITES: tuple[Suite, ...] = (
    Suite("sklearn.decomposition.tests.test_pca", {"sklearn.decomposition": {"PCA": "gdask.ml.PCA"}},
          xfail=(Rule(SPARSE_PARAMS + ("test_pca_sparse_fit_transform*", "test_sparse_pca_*"), SPARSE, strict=False),
                 Rule(("test_pca_explained_variance_empirical[randomized*", "test_pca_singular_values[randomized]"),
                      RANDOMIZED, strict=False)),
          skip=(_LEFT_OUT_ARRAY_API, Rule(("test_pca_sparse[*",), "left out (CI cost, 216 cases): " + SPARSE))),
    Suite("sklearn.decomposition.tests.test_truncated_svd",
          {"sklearn.decomposition": {"TruncatedSVD": "gdask.ml.TruncatedSVD"}},
          xfail=(Rule(SPARSE_PARAMS + ("test_attributes*", "test_too_many_components*", "test_inverse_transform*",
                                       "test_integers", "test_sparse_formats*",
                                       "test_explained_variance_components_10_20"),
                      SPARSE + " (the module's X is a sparse matrix)", strict=False),
                 Rule(("test_explained_variance[randomized*", "test_singular_values_expected[*randomized]"), RANDOMIZED,
                      strict=False))),
    Suite("sklearn.linear_model.tests.test_base",
          {"sklearn.linear_model": {"LinearRegression": "gdask.ml.LinearRegression"}},
          xfail=(Rule(SPARSE_PARAMS + ("test_linear_regression_sparse*",), SPARSE, strict=False),
                 Rule(("test_inplace_data_preprocessing*",), NO_COPY),
                 Rule(("test_linear_regression_positive",),
                      "positive=True is solved by NNLS on the square root of the Gram matrix: not within the test's "
                      "rtol 1e-7 of scipy's NNLS on X"))),
    Suite("sklearn.linear_model.tests.test_ridge", {"sklearn.linear_model": {"Ridge": "gdask.ml.Ridge"}},
          xfail=(Rule(SPARSE_PARAMS + ("test_ridge_fit_intercept_sparse*", "test_sparse_design_with_sample_weights*"),
                      SPARSE, strict=False),
                 Rule(("test_regularization_limits_ridge*",),
                      "the limits alpha=0 and alpha -> inf on wide or collinear data: gdask's solution from the Gram "
                      "matrix (which squares the condition number) misses the test's tolerance for some cases",
                      strict=False),
                 Rule(("test_lbfgs_solver_error",),
                      "positive=True is solved by projected coordinate descent on the Gram matrix, with its own "
                      "stopping rule: the ConvergenceWarning the test expects of L-BFGS at max_iter=1 is not raised",
                      strict=False)),
          skip=(_LEFT_OUT_ARRAY_API,
                Rule(("*-sag]", "*-saga]", "*-lsqr]", "*-sag-*", "*-saga-*", "*-lsqr-*", "*[sag-*", "*[saga-*",
                      "*[lsqr-*", "*[sag]", "*[saga]", "*[lsqr]"),
                     "left out (CI cost): gdask solves 'sag', 'saga' and 'lsqr' with the conjugate gradients of "
                     "'sparse_cg' (kept)"),
                Rule(("test_ridge_cv_results_predictions*", "test_ridge_gcv_*", "test_ridge_loo_*"),
                     "left out (CI cost): RidgeCV's cross-validation refits Ridge many times"))),
    Suite("sklearn.linear_model.tests.test_coordinate_descent",
          {"sklearn.linear_model": {"Lasso": "gdask.ml.Lasso", "ElasticNet": "gdask.ml.ElasticNet"}},
          xfail=(Rule(SPARSE_PARAMS, SPARSE, strict=False),
                 Rule(("test_enet_toy", "test_elasticnet_precompute_*", "test_overridden_gram_matrix",
                       "test_enet_float_precision"), PRECOMPUTE),
                 Rule(("test_enet_copy_X_False_check_input_False",), NO_COPY),
                 Rule(("test_check_input_false",),
                      "check_input=False with data of the wrong layout: gdask always validates and converts its input, "
                      "so the ValueError the test expects is not raised"),
                 Rule(("test_enet_nonfinite_params",),
                      "values near float64's largest overflow the float64 Gram matrix: gdask reports non-finite input "
                      "(ValueError) before coordinate descent, not scikit-learn's message about non-finite "
                      "coefficients"))),
    Suite("sklearn.mixture.tests.test_gaussian_mixture",
          {"sklearn.mixture": {"GaussianMixture": "gdask.ml.GaussianMixture"}},
          xfail=(Rule(("test_gaussian_mixture_precisions_init[*", "test_gaussian_mixture_all_init_does_not_estimate*"),
                      PRIVATE + " (_set_parameters, _estimate_gaussian_parameters)"),
                 Rule(("test_check_weights",), "scikit-learn's range message prints the minimum as 'max value' and "
                      "the maximum as 'min value' and the test matches that; gdask prints them the right way round")),
          skip=(_LEFT_OUT_ARRAY_API,)),
)

KMEANS_VERBOSE = ("verbose levels: gdask's verbose=1 is a progress bar and a summary line (gdask.gdataset.Progress, "
                  "shared by every estimator); per-iteration lines, in gdask's format (time, inertia, center shift), "
                  "from verbose=2: scikit-learn's 'Initialization complete' / 'Converged at iteration' lines are not "
                  "printed")
KMEANS_WEIGHT_EQUIVALENCE = ("check_estimator's check_sample_weight_equivalence_on_dense_data: weights are not "
                             "equivalent to repeated rows for K-means' random init; scikit-learn marks the same check "
                             "xfail for its own KMeans (PER_ESTIMATOR_XFAIL_CHECKS), dask-ml's test lists only its own "
                             "failure")

LIBLINEAR = ("solver='liblinear' solves another problem (it penalises the intercept, fits one-vs-rest): gdask "
             "refuses it with a ValueError naming the solvers it takes (the tests fit or expect liblinear's own "
             "messages)")
ENET_TOLERANCE = ("compares LogisticRegressionCV's scores (scikit-learn's saga, stopped at tol=1e-4 on the change of "
                  "the coefficients) with gdask's elastic-net fit (proximal gradient, stopped at tol=1e-4 on the "
                  "gradient mapping) at rtol 1e-3: the two stopping rules leave the scores ~2e-3 apart")
NEWTON_WARM_START = ("'newton-cg' / 'newton-cholesky' are solved by gdask's L-BFGS: the test checks that two "
                     "warm-started single steps equal two steps, true of Newton's memoryless steps but not of L-BFGS, "
                     "whose curvature memory restarts with each fit")
LBFGS_PRECISION = ("compares gdask's L-BFGS solution with scikit-learn's own fits (LogisticRegressionCV's saga / lbfgs "
                   "path) at rtol 1e-7: two solvers stopping at tol=1e-4 agree to ~3e-6 relative")
SKLEARN_CALLBACKS = ("scikit-learn's experimental callback API (set_callbacks, sklearn.callback) is not implemented: "
                     "gdask's estimators take a callback parameter instead")
DEPRECATIONS = ("scikit-learn 1.8's deprecations (the penalty parameter, l1_ratio=None, n_jobs) warn with a "
                "FutureWarning; gdask keeps these parameters (penalty='auto' reads l1_ratio as scikit-learn's default "
                "does, a named penalty is used as named) and does not warn")

SUITES += (
    Suite("sklearn.cluster.tests.test_k_means", {"sklearn.cluster": {"KMeans": "gdask.ml.KMeans"}},
          xfail=(Rule(("test_kmeans_verbose[*",), KMEANS_VERBOSE),
                 Rule(("test_sample_weight_init[*", "test_sample_weight_zero[*"), PRIVATE + " (_init_centroids)"))),
    # dask-ml's wheel ships no tests: set GDASK_PEERS_DASK_ML_TESTS to a dask-ml checkout's tests/ folder (same
    # version as installed) to run its K-means module
    Suite("dask_ml_tests.test_kmeans", {"dask_ml.cluster": {"KMeans": "gdask.ml.KMeans"}},
          xfail=(Rule(("test_check_estimator",), KMEANS_WEIGHT_EQUIVALENCE),),
          requires=("sklearn", "dask_ml"), source="GDASK_PEERS_DASK_ML_TESTS"),
    Suite("sklearn.linear_model.tests.test_logistic",
          {"sklearn.linear_model": {"LogisticRegression": "gdask.ml.LogisticRegression"}},
          xfail=(Rule(("*liblinear*", "test_consistency_path[*", "test_logistic_cv[*",
                       "test_logistic_regression_solvers[*",
                       "test_logistic_regression_class_weights[*", "test_logreg_l1[*", "test_check_solver_option[*"),
                      LIBLINEAR, strict=False),
                 Rule(("test_scores_attribute_layout_elasticnet",), ENET_TOLERANCE),
                 Rule(("test_warm_start_newton_solver[*",), NEWTON_WARM_START),
                 Rule(("test_logistic_regression_cv_refit[*-0]", "test_LogisticRegressionCV_on_folds"), LBFGS_PRECISION,
                      strict=False),
                 Rule(("test_newton_cholesky_fallback_to_lbfgs",),
                      "scikit-learn's newton-cholesky falls back to its lbfgs on a rank-deficient Hessian, then warns "
                      "with lbfgs's message and counts the Newton attempt; gdask solves 'newton-cholesky' with its "
                      "L-BFGS from the start and words the ConvergenceWarning for the solver name given"),
                 Rule(("test_logreg_predict_proba_multinomial[*",), PRIVATE + " (_predict_proba_lr)"),
                 Rule(("test_logistic_cv_multinomial_score[*",), PRIVATE + " (_log_reg_scoring_path)"),
                 Rule(("test_logistic_regression_callback_*",), SKLEARN_CALLBACKS),
                 Rule(("test_sparsify[*",), "sparsify(): gdask's coef_ stays a dense array (no SparseCoefMixin)"),
                 Rule(("test_penalty_deprecated[*", "test_l1_ratio_None_deprecated",
                       "test_logisticregression_warns_with_n_jobs"), DEPRECATIONS),
                 Rule(("test_large_sparse_matrix[*-sag]", "test_large_sparse_matrix[*-saga]"),
                      "'sag' / 'saga' are solved by gdask's own solvers on CSR blocks, which take 64-bit sparse "
                      "indices: the ValueError scikit-learn's sag/saga raise for them does not apply")),
          skip=(_LEFT_OUT_ARRAY_API,
                Rule(("test_multinomial_cv_iris[*", "test_logistic_regression_solvers_multiclass[*"),
                     "left out (CI cost): GridSearchCV / every solver name over many C values fit gdask's "
                     "LogisticRegression hundreds of times on iris (over 25 s each on 2 cores)"))),
)
