import subprocess
import sys


def test_import_without_cuda_is_fast_and_lazy():
    code = (
        "import sys, time; t=time.perf_counter(); import gdask; dt=time.perf_counter()-t;"
        "assert 'cupy' not in sys.modules and 'rmm' not in sys.modules and 'pynvml' not in sys.modules;"
        "assert 'gdask.gdataset' not in sys.modules; print(dt)"
    )
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 5.0


def test_public_names():
    import gdask

    for name in gdask.__all__:
        assert getattr(gdask, name) is not None


def test_every_public_subpackage_is_reachable_after_a_plain_import():
    code = ("import gdask, types; mods = [gdask.scheduling, gdask.gdataset, gdask.window_cache, gdask.ml, "
            "gdask.devices, gdask.protocol, gdask.config, gdask.testing]; "
            "assert all(isinstance(m, types.ModuleType) for m in mods); "
            "print(gdask.scheduling.device_table.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "gdask.scheduling._client"


def test_cli_version_and_info_errors_are_reasons():
    import gdask

    out = subprocess.run([sys.executable, "-m", "gdask._cli", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"gdask {gdask.__version__}"
    env = {"PATH": "/usr/bin:/bin", "DASK_GDASK__BACKEND": "auto"}
    out = subprocess.run([sys.executable, "-m", "gdask._cli", "info", "--backend", "cuda"], capture_output=True,
                         text=True, timeout=120, env=env)
    if out.returncode == 0:  # a machine with a usable GPU
        assert "gdask backend: cuda" in out.stdout
    else:
        assert out.returncode == 1 and "Traceback" not in out.stderr and "cuda" in out.stderr.lower()


def test_a_worker_loading_block_tasks_does_not_import_the_estimators():
    """A worker unpickling an estimator's block task or loop imports that module only: not the estimator,
    not scikit-learn (~1 s in every fresh worker's first task of a fit, before they were lazy)."""
    modules = ["gdask.ml._kmeans._blocks", "gdask.ml._kmeans._loop", "gdask.ml._kmeans._init",
               "gdask.ml._logistic._blocks", "gdask.ml._logistic._loop", "gdask.ml._linear_model._problem",
               "gdask.ml._decomposition._solvers", "gdask.ml._mixture._em", "gdask.ml._pagerank_loop"]
    code = (f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; "
            "print(sorted(m for m in sys.modules if m == 'sklearn' or m.endswith(('_estimator', '_pca', "
            "'_gaussian_mixture', '_least_squares', '_elastic_net', '_truncated_svd'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    # and the estimators are where they were
    import gdask.ml
    from gdask.ml._kmeans import KMeans
    from gdask.ml._linear_model import Ridge

    assert KMeans is gdask.ml.KMeans and Ridge is gdask.ml.Ridge and "LoopState" in dir(gdask.ml._kmeans)
