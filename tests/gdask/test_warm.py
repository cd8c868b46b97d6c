"""The kernel warm-up (gdask.ml.warm_kernels, the WarmKernels worker plugin): it compiles what the fits
run, prints nothing and changes nothing that the process's other threads see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import dask
import pytest

from gdask.ml import WarmKernels, warm_kernels

pytestmark = pytest.mark.timeout(300)

#: numba's CPU dispatchers of gdask.ml and the type signatures each has compiled (or loaded) so far
_SIGNATURES = """
def signatures():
    import sys
    from numba.core.dispatcher import Dispatcher
    out = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("gdask.ml") or mod is None:
            continue
        for attr, obj in vars(mod).items():
            if isinstance(obj, Dispatcher):
                out[f"{name}.{attr}"] = sorted(map(str, obj.signatures))
    return out
"""


def _run(script: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_the_warm_up_compiles_every_kernel_the_fits_run():
    """In a fresh process: after warm_kernels(), K-means (Lloyd and bounds, weighted, every init,
    predict / transform / score) and logistic regression (binomial and multinomial, weighted, both
    solvers) in float32 and float64 compile no kernel signature the warm-up did not."""
    proc = _run(_SIGNATURES + textwrap.dedent("""
        import json
        import numpy as np
        import dask
        from gdask.ml import KMeans, LogisticRegression, warm_kernels

        warm_kernels()
        warmed = signatures()
        rng = np.random.default_rng(1)
        with dask.config.set({"gdask.backend": "emulated"}):
            for dt in ("float32", "float64"):
                x = rng.standard_normal((600, 8)).astype(dt)
                w = rng.uniform(0.5, 2, 600)
                for algorithm in ("lloyd", "elkan"):
                    for init in ("k-means||", "k-means++", "random"):
                        km = KMeans(4, init=init, algorithm=algorithm, n_init=1, max_iter=8, tol=0, random_state=0)
                        km.fit(x, sample_weight=w if init == "random" else None)
                    km.predict(x), km.transform(x), km.score(x)
                y2, y3 = (x[:, 0] > 0).astype(int), (x[:, 0] > 0).astype(int) + (x[:, 1] > 0)
                for y in (y2, y3):
                    for solver in ("lbfgs", "gd"):
                        LogisticRegression(solver=solver, max_iter=5, class_weight="balanced").fit(x, y, w)
        print(json.dumps({"warmed": warmed, "after": signatures()}))
    """), env={"NUMBA_ENABLE_CUDASIM": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert any(found["warmed"].values()), "the warm-up compiled nothing"
    missing = {k: sorted(set(v) - set(found["warmed"].get(k, ()))) for k, v in found["after"].items()}
    assert not {k: v for k, v in missing.items() if v}, "compiled by the fits, not by the warm-up"


def test_the_warm_up_compiles_every_kernel_pagerank_runs(tmp_path):
    """In a fresh process: after warm_kernels(), PageRank's order (sampled and full) and its sweeps on
    one block (pushed over the graph in both directions, renumbered and gathered) and on several,
    with weights all 1 and not (counts, float32 and float64 ones), from arrays as a worker gets them
    (scattered, or mapped from a shared-memory file), compile no kernel signature the warm-up did
    not."""
    proc = _run(_SIGNATURES + textwrap.dedent(f"""
        import json
        import numpy as np
        import scipy.sparse as sp
        from gdask.ml import warm_kernels
        from gdask import _shm
        from gdask.ml import powerlaw_graph
        from gdask.ml._pagerank import _clearly_orderless, _sweep_order
        from gdask.ml._pagerank_loop import _one_block, _rank_sweeps, direct, narrow, prepare
        from gdask.ml._pagerank_loop import OneRank

        warm_kernels()
        warmed = signatures()
        rng = np.random.default_rng(1)
        n, m = 4000, 2_100_000  # over the sampled order's minimum of edges
        ones = sp.csr_matrix((np.ones(m), (rng.integers(0, n, m), rng.integers(0, n, m))), shape=(n, n))
        ones.data[:] = 1.0
        counts = ones.copy()
        counts.data = rng.integers(1, 9, counts.nnz).astype(float)
        singles = ones.copy()
        singles.data = rng.uniform(1, 2, ones.nnz).astype(np.float32).astype(float)
        mostly = ones.copy()
        mostly.data[::100] = 2.0  # duplicate links summed: weights of 1 but a few
        graphs = (ones, powerlaw_graph(n, seed=0), sp.csr_matrix(ones.multiply(rng.uniform(1, 2, (n, 1)))), counts,
                  singles, mostly)
        for A in graphs:
            _clearly_orderless(A)
            order, perm, _ = _sweep_order(A)
            received = np.argsort(np.bincount(A.indices, minlength=n), kind="stable")  # receiving nothing first
            for perm in (None, rng.permutation(n), received):
                P = direct(A, perm)
                P.values = narrow(P.values)  # as the graph is sent
                shared = _shm.write(list(P.arrays), {str(tmp_path)!r})
                for graph in (P.arrays, shared):
                    for descending in (False, True):
                        _one_block(OneRank(), graph, P.order, 0.85, 1e-4, 3, descending and perm is None)
                _shm.remove(shared)
                Q = prepare(A, None if perm is None else np.argsort(perm), 2)
                _rank_sweeps(OneRank(), [Q.block(b) for b in range(2)], Q.out, Q.bounds, 0.85, 1e-4, 3, False)
        print(json.dumps({{"warmed": warmed, "after": signatures()}}))
    """), env={"NUMBA_ENABLE_CUDASIM": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert any(v for k, v in found["warmed"].items() if "pagerank" in k), "the warm-up compiled no PageRank kernel"
    missing = {k: sorted(set(v) - set(found["warmed"].get(k, ()))) for k, v in found["after"].items()}
    assert not {k: v for k, v in missing.items() if v}, "compiled by PageRank, not by the warm-up"


def test_the_warm_up_changes_no_global_state_while_it_runs():
    """Another thread of the process (a worker's task) sees the same Dask config and warnings
    filters during the warm-up as before; the warm-up warns nothing."""
    # compiled first: while numba compiles it holds its own warnings.catch_warnings for a moment in the
    # compiling thread (numba's, not gdask's; test_the_warm_up_code_sets_no_warnings_filters_or_config
    # checks that gdask sets none), so the run watched here is one that loads what is compiled
    warm_kernels()
    config_before = dask.config.get("scheduler", None), dask.config.get("gdask", None)
    seen: list[tuple] = []
    # the warm-up stops after its first kernel call until this thread has looked once: with the kernels
    # already compiled the whole warm-up may otherwise end before this thread runs again
    midway, looked = threading.Event(), threading.Event()

    def progress(done, total):
        if done == 1:
            midway.set()
            looked.wait(60)

    def look():
        seen.append((dask.config.get("scheduler", None), dask.config.get("gdask", None), list(warnings.filters)))

    with warnings.catch_warnings(record=True) as caught:  # process-wide: records the other thread's warnings
        warnings.simplefilter("always")
        filters = list(warnings.filters)
        t = threading.Thread(target=warm_kernels, kwargs={"progress": progress})
        t.start()
        assert midway.wait(120), "the warm-up made no kernel call"
        look()
        looked.set()
        while t.is_alive():
            look()
        t.join()
    assert seen and all(s == (*config_before, filters) for s in seen)
    assert not caught, [str(w.message) for w in caught]


@pytest.mark.timeout(600)  # the worker compiles every kernel from scratch
def test_a_cluster_start_prints_nothing_and_tasks_see_the_workers_config(tmp_path):
    """Workers compiling from scratch (an empty numba cache): a child process compiles and the
    worker's thread then only loads from numba's cache; a task that runs while they warm up
    sees its worker's config unchanged, the warnings filters are as before once it is done, and
    starting the cluster prints no warning. (While numba infers types it holds its own
    ``warnings.catch_warnings`` for a moment, in any thread that compiles; that is numba's, and
    test_the_warm_up_code_sets_no_warnings_filters_or_config checks that gdask adds none.)"""
    script = tmp_path / "start.py"
    script.write_text(textwrap.dedent("""
        import json, time, warnings
        import dask
        from distributed import Client
        import gdask
        from gdask._compat import scheduler_workers
        from gdask.ml import wait_for_warm_kernels

        def watch(dask_worker=None):
            from distributed import get_worker
            w = get_worker()
            plugin = w.plugins["gdask-warm-kernels"]
            seen, running = set(), 0
            filters = list(warnings.filters)
            while not plugin.status()["done"]:
                running += 1
                seen.add(repr(dask.config.get("scheduler", None)))
                time.sleep(0.001)
            after = repr(dask.config.get("scheduler", None))
            return {"seen": sorted(seen), "after": after, "running": running, "status": plugin.status(),
                    "filters_kept": list(warnings.filters) == filters}

        def dispatchers(dask_worker=None):
            # per kernel the worker's thread has: (cache hits, cache misses) and the children left
            import sys
            import psutil
            from numba.core.dispatcher import Dispatcher
            out = {}
            for name, mod in list(sys.modules.items()):
                if mod is None or not name.startswith(("gdask.ml", "gdask.gdataset")):
                    continue
                for attr, obj in vars(mod).items():
                    if isinstance(obj, Dispatcher) and obj.signatures:
                        st = obj.stats
                        out[f"{name}.{attr}"] = [sum(st.cache_hits.values()), sum(st.cache_misses.values())]
            return {"kernels": out, "children": len(psutil.Process().children())}

        if __name__ == "__main__":
            with gdask.LocalGPUCluster(n_devices=1, backend="emulated", dashboard_address=":0") as cluster, \\
                    Client(cluster) as client:
                futs = [client.submit(watch, pure=False, workers=[w]) for w in scheduler_workers(client)]
                out = client.gather(futs)
                wait_for_warm_kernels(client, timeout=500)
                loads = client.run(dispatchers)
            print(json.dumps({"watch": out, "loads": loads}))
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=540,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    out = found["watch"]
    for w in found["loads"].values():  # a child compiled: the worker's thread loaded gdask.ml's kernels from the cache
        assert w["kernels"], "the worker has no kernel"
        # the worker compiles one kernel itself, the warm-up's last (GDataSet's moments): it finds the cache cold
        compiled_here = {k: v for k, v in w["kernels"].items()
                         if (v[1] or not v[0]) and not k.startswith("gdask.gdataset._blocks.")}
        assert not compiled_here, f"compiled by the worker itself (cache hits, misses): {compiled_here}"
        assert w["children"] == 0, "the compiling child is still there"
    assert any(o["running"] > 0 for o in out), "no task ran during the warm-up: the test saw nothing"
    for o in out:
        assert all(s == o["after"] for s in o["seen"]) and o["filters_kept"], o
        assert o["status"]["error"] is None and o["status"]["compiled"] == o["status"]["total"] > 0
    assert "Warning" not in proc.stderr and "warning" not in proc.stderr.lower(), proc.stderr[-3000:]


def test_the_compiling_child_dies_with_its_worker(tmp_path):
    """A worker killed while its child process compiles the kernels (an empty numba cache) leaves
    no process behind: the child ends with it."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent("""
        import json, os, signal, time
        import psutil
        from distributed import Client
        import gdask

        def child_pid(dask_worker=None):
            child = dask_worker.plugins["gdask-warm-kernels"]._child
            return child.pid if child is not None else None

        def gone(pid):
            try:
                return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        if __name__ == "__main__":
            with gdask.LocalGPUCluster(n_devices=1, backend="emulated", dashboard_address=":0") as cluster, \\
                    Client(cluster) as client:
                pids, deadline = {}, time.monotonic() + 60
                while not any(pids.values()) and time.monotonic() < deadline:
                    pids = client.run(child_pid)
                    time.sleep(0.02)
                (worker, child), = pids.items()
                if child is not None:
                    os.kill(client.run(os.getpid)[worker], signal.SIGKILL)
                    deadline = time.monotonic() + 60
                    while not gone(child) and time.monotonic() < deadline:
                        time.sleep(0.05)
                print(json.dumps({"child": child, "left": child is not None and not gone(child)}))
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["child"] is not None, "no compiling child was seen in the worker"
    assert not out["left"], "the compiling child outlived its killed worker"


def test_a_worker_whose_kernels_are_cached_starts_no_child():
    """Once the kernels are in numba's cache the probe loads without compiling: no child runs."""
    from gdask.ml._warm import _loads_from_cache

    warm_kernels()  # compiled or loaded here: in the cache afterwards
    assert _loads_from_cache()


def test_strict_devices_skip_the_warm_up():
    """Strict devices run the array API code, not numba's kernels: nothing to compile."""
    from gdask.ml._warm import _numba_backend

    class Dev:
        backend, strict = "emulated", True

    class Plugin:
        device = Dev()

    class Worker:
        plugins = {"gdask-device": Plugin()}

    assert _numba_backend(Worker()) is None
    plugin = WarmKernels()
    plugin.setup(Worker())
    assert plugin.status() == {"done": True, "seconds": 0.0, "error": None, "compiled": 0, "total": 0,
                               "phase": "done"}
    assert not plugin.starting()


def test_the_warm_up_code_sets_no_warnings_filters_or_config():
    """gdask's warm-up (and the kernels it calls) neither filters warnings nor sets dask config: both
    are process-wide and would reach user tasks running on the worker meanwhile."""
    import ast
    from pathlib import Path

    import gdask.ml

    root = Path(gdask.ml.__file__).parent
    for path in [root / "_warm.py", *sorted((root / "kernels").glob("*.py"))]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("catch_warnings", "simplefilter",
                                                                  "filterwarnings"):
                raise AssertionError(f"{path.name}:{node.lineno}: warnings.{node.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "set" \
                    and getattr(node.func.value, "attr", None) == "config":
                raise AssertionError(f"{path.name}:{node.lineno}: dask.config.set")


def _loops_imported(dask_worker=None):
    from gdask.ml._warm import LOOP_MODULES

    return all(name in sys.modules for name in LOOP_MODULES)


def test_a_new_cluster_returns_once_its_kernels_are_loaded():
    """Kernels in numba's cache load in about half a second: LocalGPUCluster returns after that, so the
    first fit's tasks do not share the workers' CPUs with the warm-up."""
    from distributed import Client

    from gdask import LocalGPUCluster
    from gdask.ml._warm import _warm_status

    warm_kernels()  # in numba's cache from here on: the workers load them
    with LocalGPUCluster(n_devices=2, backend="emulated", dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        status = client.run(_warm_status)
        imported = client.run(_loops_imported)
    assert len(status) == 2
    assert all(imported.values()), imported  # what the fits' loops import: not in the first fit's time
    assert all(s["done"] and s["phase"] == "done" and s["compiled"] == s["total"] > 0 for s in status.values())


def test_a_warm_up_that_compiles_is_not_waited_for():
    """Only loading from numba's cache counts as getting ready: a compilation (kernels not cached yet,
    or CUDA kernels) can take minutes, and the fit may run beside it."""
    plugin = WarmKernels()
    plugin._done = threading.Event()
    for phase, starting in (("starting", True), ("checking", True), ("loading", True), ("compiling", False)):
        plugin.phase = phase
        assert plugin.starting() is starting
    plugin._done.set()
    plugin.phase = "done"
    assert not plugin.starting()


def test_the_cluster_waits_for_plugins_at_most_the_configured_time(caplog):
    """A worker plugin that never gets ready delays the cluster by config
    gdask.timeouts.worker-plugins-ready, then the cluster goes on and says so; 0 does not wait."""
    import logging
    import time

    from distributed import Client, WorkerPlugin

    from gdask import LocalGPUCluster, config
    from gdask._cluster import _plugins_starting

    class NeverReady(WorkerPlugin):
        name = "never-ready"

        def starting(self):
            return True

    with dask.config.set({"gdask.ml.warm-kernels": False}), \
            LocalGPUCluster(n_devices=1, backend="emulated", dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        assert list(client.run(_plugins_starting).values()) == [[]]
        client.register_plugin(NeverReady())
        assert list(client.run(_plugins_starting).values()) == [["never-ready"]]
        with dask.config.set({"gdask.timeouts.worker-plugins-ready": 0.3}), \
                caplog.at_level(logging.INFO, logger="gdask"):
            assert config.get("timeouts.worker-plugins-ready") == 0.3
            t0 = time.monotonic()
            cluster._wait_for_plugins()
            waited = time.monotonic() - t0
        assert waited >= 0.3
        assert "never-ready" in caplog.text and "gdask.timeouts.worker-plugins-ready" in caplog.text
        caplog.clear()
        with dask.config.set({"gdask.timeouts.worker-plugins-ready": 0}), \
                caplog.at_level(logging.INFO, logger="gdask"):
            cluster._wait_for_plugins()
        assert "never-ready" not in caplog.text
