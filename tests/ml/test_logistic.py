import re
import warnings

import numpy as np
import pandas as pd
import pytest

import gdask
from gdask.ml import LogisticRegression

sk = pytest.importorskip("sklearn.linear_model")


def _data(n_classes, n=1500, d=6, seed=0):
    from sklearn.datasets import make_classification

    X, y = make_classification(n, d, n_informative=4, n_redundant=1, n_classes=n_classes, random_state=seed)
    return X, y


def _assert_matches(ours, ref, X, rtol=1e-6, atol=1e-8):
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=rtol, atol=atol)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=rtol, atol=atol)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), rtol=rtol, atol=atol)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    np.testing.assert_array_equal(ours.classes_, ref.classes_)


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("blocked", [False, True])
def test_lbfgs_matches_sklearn(n_classes, weighted, blocked):
    X, y = _data(n_classes)
    w = np.random.default_rng(1).uniform(0.1, 3.0, len(y)) if weighted else None
    ref = sk.LogisticRegression(C=0.3).fit(X, y, sample_weight=w)
    Xin = gdask.from_array(X, block_rows=400) if blocked else X
    ours = LogisticRegression(C=0.3).fit(Xin, y, sample_weight=w)
    _assert_matches(ours, ref, X)
    assert ours.n_iter_.tolist() == ref.n_iter_.tolist()
    assert ours.coef_.shape == ((1, 6) if n_classes == 2 else (n_classes, 6))
    assert len(ours.pass_times_) >= ours.n_iter_[0]
    scores = ours.decision_function(Xin)
    if blocked:  # GDataSet input: lazy, blocked like X
        assert isinstance(scores, gdask.GDataSet) and scores.row_blocks == Xin.row_blocks
        scores = scores.compute()
    np.testing.assert_allclose(scores, ref.decision_function(X), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kw", [{"fit_intercept": False}, {"C": np.inf}, {"C": 50.0, "tol": 1e-8},
                                {"class_weight": "balanced"}, {"class_weight": {0: 3.0, 2: 0.5}}])
def test_options_match_sklearn(kw):
    X, y = _data(3, seed=2)
    ref = sk.LogisticRegression(max_iter=300, **kw).fit(X, y)
    ours = LogisticRegression(max_iter=300, **kw).fit(gdask.from_array(X, block_rows=500), y)
    _assert_matches(ours, ref, X, rtol=1e-5, atol=1e-7)


def test_float32_matches_sklearn():
    X, y = _data(2, n=4000)
    X = X.astype(np.float32)
    ref = sk.LogisticRegression().fit(X, y)
    ours = LogisticRegression().fit(gdask.from_array(X, block_rows=1000), y)
    assert ours.coef_.dtype == np.float32 and ours.intercept_.dtype == np.float32
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-4)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_gd_converges_to_the_lbfgs_solution(n_classes, backend):
    X, y = _data(n_classes)
    ref = sk.LogisticRegression(C=0.5, tol=1e-10, max_iter=1000).fit(X, y)
    ours = LogisticRegression(C=0.5, solver="gd", tol=1e-7, max_iter=3000).fit(gdask.from_array(X, block_rows=400), y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-5)
    assert 0 < ours.n_iter_[0] < 3000
    assert len(ours.pass_times_) == ours.n_iter_[0] + 2  # the Gram pass and the converged evaluation


def test_gd_warns_when_not_converged():
    X, y = _data(2)
    with pytest.warns(Warning, match="gd failed to converge"):
        LogisticRegression(solver="gd", max_iter=2).fit(X, y)


def test_blocked_labels_and_weights(backend):
    """y and sample_weight as GDataSet columns / dask arrays blocked like X (or rechunked)."""
    import dask.array as da

    X, y = _data(3, n=1200)
    w = np.random.default_rng(3).uniform(0.5, 2.0, len(y))
    ref = sk.LogisticRegression().fit(X, y, sample_weight=w)
    data = gdask.from_array(np.column_stack([X, y, w]), block_rows=250)
    G, Y, W = data[:, :6], data[:, 6], data[:, 7]  # labels as a float column of the same GDataSet
    ours = LogisticRegression().fit(G, Y, sample_weight=W)
    _assert_matches(ours, ref, X)
    assert ours.classes_.dtype.kind == "f"
    # dask arrays with other chunks are rechunked to X's blocks
    ours2 = LogisticRegression().fit(G, da.from_array(y, chunks=333), sample_weight=da.from_array(w, chunks=500))
    _assert_matches(ours2, ref, X)
    assert ours.score(G, Y, sample_weight=W) == pytest.approx(ref.score(X, y, sample_weight=w))


def test_labels_as_strings_and_dataframe_input():
    X, y = _data(3)
    labels = np.array(["cat", "dog", "emu"])[y]
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(6)])
    ref = sk.LogisticRegression().fit(df, labels)
    ours = LogisticRegression().fit(df, pd.Series(labels))
    _assert_matches(ours, ref, df)
    np.testing.assert_array_equal(ours.feature_names_in_, df.columns)
    assert ours.n_features_in_ == 6
    # lists work too
    ours_list = LogisticRegression().fit(X.tolist(), labels.tolist())
    np.testing.assert_allclose(ours_list.coef_, ref.coef_, rtol=1e-6)


def test_dask_dataframe_input():
    dd = pytest.importorskip("dask.dataframe")
    X, y = _data(2, n=1000)
    df = pd.DataFrame(X, columns=list("abcdef"))
    df["label"] = y
    ddf = dd.from_pandas(df, npartitions=3)
    ours = LogisticRegression().fit(ddf[list("abcdef")], ddf["label"])
    np.testing.assert_array_equal(ours.feature_names_in_, list("abcdef"))
    _assert_matches(ours, sk.LogisticRegression().fit(df[list("abcdef")], y), df[list("abcdef")])


def test_xp_input_matches_sklearn(xp):
    """One body for NumPy and (on a GPU) CuPy input: predictions come back in the input's array module."""
    X, y = _data(3)
    Xd, yd = xp.asarray(X), xp.asarray(y)
    ours = LogisticRegression().fit(Xd, yd)
    ref = sk.LogisticRegression().fit(X, y)
    proba = ours.predict_proba(Xd)
    assert type(proba) is type(Xd)
    np.testing.assert_allclose(gdask.to_numpy(proba), ref.predict_proba(X), rtol=1e-6, atol=1e-8)


def test_with_client_matches_local(bclient):
    X, y = _data(3, n=2000)
    w = np.random.default_rng(5).uniform(0.1, 2.0, len(y))
    G = gdask.from_array(X, block_rows=250).persist()
    ours = LogisticRegression(C=2.0).fit(G, y, sample_weight=w)
    ref = sk.LogisticRegression(C=2.0).fit(X, y, sample_weight=w)
    _assert_matches(ours, ref, X)
    lazy = ours.predict(G)
    assert isinstance(lazy, gdask.GDataSet)
    np.testing.assert_array_equal(gdask.to_numpy(lazy.compute()), ref.predict(X))
    np.testing.assert_allclose(gdask.to_numpy(ours.predict_proba(G).compute()), ref.predict_proba(X), rtol=1e-6,
                               atol=1e-8)
    assert ours.score(G, y) == pytest.approx(ref.score(X, y))
    gd = LogisticRegression(C=2.0, solver="gd").fit(X, y, sample_weight=w)  # host input through the cluster
    assert gd.n_iter_[0] < 100
    np.testing.assert_allclose(gd.predict_proba(X), ref.predict_proba(X), atol=1e-3)


def test_one_task_per_worker_thread_per_pass(bclient):
    """From the client each loss/gradient pass is one task per worker thread holding blocks (not one
    per block); on the workers (the default) a pass is no task at all."""
    import dask

    client = bclient
    X, y = _data(2, n=2000)
    G = gdask.from_array(X, block_rows=100).persist()  # 20 blocks
    groups = G.block_groups(client)
    assert len(groups) <= sum(client.nthreads().values()) < G.nblocks
    before = _loss_tasks_done(client)
    with dask.config.set({"gdask.ml.worker-loop": False}):
        clf = LogisticRegression().fit(G, y)
    assert clf.fit_mode_ == "client"
    assert _loss_tasks_done(client) - before == len(clf.pass_times_) * len(groups)
    on_workers = LogisticRegression().fit(G, y)
    assert on_workers.fit_mode_ == "workers" and _loss_tasks_done(client) - before == len(clf.pass_times_) * len(groups)
    np.testing.assert_array_equal(on_workers.coef_, clf.coef_)  # the same bits either way


def _loss_tasks_done(client) -> int:
    def count(dask_scheduler):
        tp = dask_scheduler.task_prefixes.get("logreg-loss-grad")
        return 0 if tp is None else tp.state_counts["memory"]

    return client.run_on_scheduler(count)


def test_warm_start_continues():
    X, y = _data(2)
    clf = LogisticRegression(max_iter=3, warm_start=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, y)
        first = clf.coef_.copy()
        clf.fit(X, y)
    ref = sk.LogisticRegression().fit(X, y)
    assert np.abs(clf.coef_ - ref.coef_).max() < np.abs(first - ref.coef_).max()


@pytest.mark.parametrize(
    "kw, X, y, match",
    [({}, np.array([[1.0, np.nan], [0.0, 1.0]]), [0, 1], "NaN"),
     ({}, np.ones((4, 2)), [1, 1, 1, 1], "only one class"),
     ({}, np.ones((4, 2)), [0.1, 0.5, 1.2, 3.3], "Unknown label type"),
     ({}, np.ones((4, 2)), [0, 1, 0], "inconsistent numbers of samples"),
     ({"C": 0}, np.ones((4, 2)), [0, 1, 0, 1], "C must be"),
     ({"solver": "liblinear"}, np.ones((4, 2)), [0, 1, 0, 1], "solver must be"),
     ({"max_iter": -1}, np.ones((4, 2)), [0, 1, 0, 1], "max_iter"),
     ({"class_weight": {7: 2.0}}, np.ones((4, 2)), [0, 1, 0, 1], "not in class_weight")],
)
def test_bad_input(kw, X, y, match):
    with pytest.raises(ValueError, match=match):
        LogisticRegression(**kw).fit(X, y)


def test_bad_blocked_input():
    X, y = _data(2, n=400)
    G = gdask.from_array(X, block_rows=100)
    with pytest.raises(ValueError, match="blocked like X"):
        LogisticRegression().fit(G, gdask.from_array(y, block_rows=150))
    Xn = X.copy()
    Xn[5, 2] = np.inf
    with pytest.raises(ValueError, match="NaN or infinity"):
        LogisticRegression().fit(gdask.from_array(Xn, block_rows=100), y)
    with pytest.raises(ValueError, match="continuous"):
        LogisticRegression().fit(G, gdask.from_array(X[:, 0], block_rows=100))
    with pytest.raises(ValueError, match="non-zero"):  # host weights: scikit-learn's check and message
        LogisticRegression().fit(X, y, sample_weight=np.zeros(len(y)))
    with pytest.raises(ValueError, match="positive sum"):  # blocked weights: checked on the devices
        LogisticRegression().fit(G, y, sample_weight=gdask.from_array(np.zeros(len(y)), block_rows=100))
    clf = LogisticRegression().fit(G, y)
    with pytest.raises(ValueError, match="expecting 6 features"):
        clf.predict(gdask.from_array(X[:, :4], block_rows=100))  # checked when the lazy result is made


@pytest.mark.parametrize("solver", ["newton-cg", "newton-cholesky", "sag", "saga"])
def test_sklearn_solver_names_solved_by_lbfgs(solver):
    """scikit-learn's solvers of the same problem are accepted by name and give lbfgs's solution."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 3))
    y = (X @ [1.0, -2.0, 0.5] + rng.normal(size=200) > 0).astype(int)
    ref = LogisticRegression().fit(X, y)
    got = LogisticRegression(solver=solver).fit(X, y)
    np.testing.assert_array_equal(got.coef_, ref.coef_)
    np.testing.assert_array_equal(got.intercept_, ref.intercept_)


def test_sparse_input_fits_as_dense():
    import scipy.sparse as sp

    rng = np.random.default_rng(2)
    X = rng.normal(size=(100, 4)) * (rng.random((100, 4)) < 0.5)
    y = (X[:, 0] > 0).astype(int)
    ref = LogisticRegression().fit(X, y)
    got = LogisticRegression().fit(sp.csr_matrix(X), y)
    np.testing.assert_allclose(got.coef_, ref.coef_)
    np.testing.assert_allclose(got.predict_proba(sp.csr_array(X)), ref.predict_proba(X))


def test_penalty_none_with_C_warns_as_sklearn():
    X = np.random.default_rng(0).normal(size=(40, 2))
    y = (X[:, 0] > 0).astype(int)
    with pytest.warns(UserWarning, match="Setting penalty=None will ignore the C"):
        LogisticRegression(penalty=None, C=4).fit(X, y)


def test_label_kinds_are_checked_as_scikit_learn_does():
    """Labels are checked on their distinct values (cheaper than all of y): every kind scikit-learn
    refuses is refused with its error, and every kind it takes gives its classes."""
    X = np.random.default_rng(8).random((6, 2))
    refused = [[0.5, 1.0, 0.5, 1.0, 2.5, 1.0], [0, 1, np.nan, 1, 0, 1], [0, 1, np.inf, 1, 0, 1],
               np.array(["a", 1, "b", 2, "a", 1], dtype=object), np.array([0, 1, None, 1, 0, 1], dtype=object)]
    for y in refused:
        with pytest.raises(Exception) as theirs:
            sk.LogisticRegression().fit(X, y)
        with pytest.raises(type(theirs.value), match=re.escape(str(theirs.value)[:40])):
            LogisticRegression().fit(X, y)
    taken = [[0.0, 1.0, 0.0, 1.0, 2.0, 1.0], [True, False, True, True, False, False], ["b", "a", "c", "a", "b", "c"],
             np.array([3, 7, 3, 7, 3, 7], dtype=np.uint8), np.array(["x", "y", "x", "y", "x", "y"], dtype=object)]
    for y in taken:
        ours, theirs = LogisticRegression().fit(X, y), sk.LogisticRegression().fit(X, y)
        np.testing.assert_array_equal(ours.classes_, theirs.classes_)
