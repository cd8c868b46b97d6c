"""gdask.ml.PCA: scikit-learn's checks, agreement with scikit-learn on its digits data over two
devices (both backends), every input type, progress, device shares."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from sklearn import decomposition as skd
from sklearn.datasets import load_digits
from sklearn.utils.estimator_checks import parametrize_with_checks

import gdask
from gdask.ml import PCA


def assert_close(actual, expected, rtol=1e-4):
    """Agreement to ``rtol`` relative (entries far below the array's scale compared to that scale)."""
    expected = np.asarray(expected, dtype=np.float64)
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=rtol,
                               atol=rtol * 1e-4 * max(float(np.abs(expected).max(initial=0.0)), 1e-300))


@pytest.fixture(scope="module")
def digits():
    return load_digits().data


@parametrize_with_checks([PCA(), PCA(n_components=1, svd_solver="randomized", random_state=0)])
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


_ATTRS = ("components_", "explained_variance_", "explained_variance_ratio_", "singular_values_", "mean_",
          "noise_variance_")


@pytest.mark.parametrize("solver", ["auto", "full", "covariance_eigh", "arpack", "randomized"])
def test_digits_on_two_devices_agrees_with_sklearn(bclient, digits, solver):
    G = gdask.from_array(digits, block_rows=256).persist()
    ours = PCA(16, svd_solver=solver, random_state=0).fit(G)
    ref = skd.PCA(16, svd_solver=solver, random_state=0).fit(digits)
    assert ours.fit_mode_ == "workers"
    for a in _ATTRS:
        assert_close(getattr(ours, a), getattr(ref, a))
        assert type(getattr(ours, a)) in (np.ndarray, np.float64)
    T = ours.transform(G)
    assert isinstance(T, gdask.GDataSet) and T.row_blocks == G.row_blocks
    assert_close(np.asarray(gdask.ml._adapt.collect(T)), ref.transform(digits))


def test_default_pca_on_digits_over_two_devices(bclient, digits):
    G = gdask.from_array(digits, block_rows=300).persist()
    ours, ref = PCA().fit(G), skd.PCA().fit(digits)
    # the spectrum and the components of the leading (well separated) eigenvalues
    assert_close(ours.explained_variance_, ref.explained_variance_, rtol=1e-4)
    assert_close(ours.components_[:40], ref.components_[:40])
    assert ours.n_components_ == ref.n_components_ == 64


def test_same_bits_wherever_blocks_sit(client, digits):
    import dask

    G = gdask.from_array(digits, block_rows=200)
    on_workers = PCA(8).fit(G.persist())
    with dask.config.set({"gdask.ml.worker-loop": False}):  # the loop from the client, blocks as they come
        from_client = PCA(8).fit(G)
    assert on_workers.fit_mode_ == "workers" and from_client.fit_mode_ == "client"
    np.testing.assert_array_equal(on_workers.components_, from_client.components_)
    np.testing.assert_array_equal(on_workers.explained_variance_, from_client.explained_variance_)


def test_no_client_on_each_backend(backend, digits):
    ours = PCA(5).fit(gdask.from_array(digits, block_rows=400))
    assert_close(ours.components_, skd.PCA(5).fit(digits).components_)


@pytest.mark.parametrize("n_components", ["mle", 0.8, 0.95, 3, None])
def test_n_components_choices(n_components):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((500, 10)) @ rng.standard_normal((10, 10)) + rng.standard_normal((500, 10)) * 0.1
    X[:, :3] *= 5
    ours, ref = PCA(n_components).fit(X), skd.PCA(n_components).fit(X)
    assert ours.n_components_ == ref.n_components_
    for a in _ATTRS:
        assert_close(getattr(ours, a), getattr(ref, a))


@pytest.mark.parametrize("whiten", [False, True])
def test_transforms_scores_and_covariance(digits, whiten):
    X = digits[:600]
    ours, ref = PCA(12, whiten=whiten, svd_solver="full").fit(X), skd.PCA(12, whiten=whiten, svd_solver="full").fit(X)
    assert_close(ours.transform(X), ref.transform(X))
    assert_close(ours.fit_transform(X), ref.fit_transform(X))
    assert_close(ours.inverse_transform(ref.transform(X)), ref.inverse_transform(ref.transform(X)))
    assert_close(ours.get_covariance(), ref.get_covariance())
    assert_close(ours.get_precision(), ref.get_precision(), rtol=1e-3)
    assert_close(ours.score_samples(X), ref.score_samples(X))
    assert ours.score(X) == pytest.approx(ref.score(X), rel=1e-6)


def test_lazy_inputs_give_lazy_outputs(digits):
    X = da.from_array(digits, chunks=(500, 64))
    pca = PCA(4).fit(X)
    T = pca.transform(X)
    assert isinstance(T, da.Array) and T.chunks[0] == X.chunks[0]
    np.testing.assert_allclose(T.compute(), pca.transform(digits), rtol=1e-10, atol=1e-10)
    back = pca.inverse_transform(T)
    assert isinstance(back, da.Array) and back.shape == X.shape
    assert isinstance(pca.transform(digits), np.ndarray)
    assert pca.transform(digits[:3].astype(np.float32)).dtype == np.float32


def test_dask_dataframe_input(digits):
    dd = pytest.importorskip("dask.dataframe")
    import pandas as pd

    df = dd.from_pandas(pd.DataFrame(digits[:, :20], columns=[f"f{i}" for i in range(20)]), npartitions=3)
    pca = PCA(3).fit(df)
    assert list(pca.feature_names_in_) == [f"f{i}" for i in range(20)]
    assert_close(pca.components_, skd.PCA(3).fit(digits[:, :20]).components_)


def test_progress_callback_and_verbose(digits, capsys):
    records = []
    PCA(3, svd_solver="randomized", iterated_power=3, random_state=0, callback=records.append,
        verbose=2).fit(digits)
    assert len(records) == 1 + 3 + 1  # column moments, power iterations, range pass
    assert all({"iteration", "seconds", "mode"} <= set(r) for r in records)
    assert "power iteration 3" in capsys.readouterr().out


def test_fit_inside_a_device_share(client, digits):
    from gdask.scheduling import jobs

    plain = PCA(3).fit(digits)
    shared = PCA(3, gpu=0.5, memory="8MiB", job_name="t-pca").fit(digits)
    np.testing.assert_allclose(shared.components_, plain.components_, rtol=1e-10)
    row = jobs(client).loc["t-pca"]
    assert row["status"] == "done" and row["kind"] == "PCA"


def test_errors_name_the_problem(digits):
    with pytest.raises(ValueError, match="strictly less than"):
        PCA(64, svd_solver="arpack").fit(digits)
    with pytest.raises(ValueError, match="svd_solver"):
        PCA(svd_solver="lapack").fit(digits)
    with pytest.raises(ValueError, match="features"):
        PCA(3).fit(digits).transform(gdask.from_array(digits[:, :10]))
