"""Compile gdask.ml's kernels before they are timed: numba compiles a kernel on its first call.

The kernels are ``cache=True``: the first process that compiles them writes numba's on-disk cache,
and every later process loads them from it (milliseconds instead of seconds). :func:`warm_kernels`
runs tiny K-means and logistic-regression fits in this process (float32 and float64, the Lloyd and
the bounds passes, labels, loss and gradient), which compiles or loads every hot kernel;
:class:`WarmKernels` does it in a background thread when a worker starts (``LocalGPUCluster``
installs it, config ``gdask.ml.warm-kernels``), so the first fit's iterations do not include
compile time; :func:`wait_for_warm_kernels` waits for the workers' warm-ups and says how long they took.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from typing import Any

from distributed import WorkerPlugin

__all__ = ["WarmKernels", "wait_for_warm_kernels", "warm_kernels"]

logger = logging.getLogger("gdask.ml")


def warm_kernels(dtypes: tuple[str, ...] = ("float32", "float64")) -> float:
    """Run tiny fits here so that their kernels are compiled (or loaded from numba's cache).

    Runs with Dask's synchronous scheduler (never on a cluster), on NumPy data. Returns the seconds
    it took.
    """
    import dask
    import numpy as np

    import gdask
    from gdask.ml import KMeans, LogisticRegression

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    with dask.config.set(scheduler="sync"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 iterations do not converge: that is not the point here
        for dt in dtypes:
            x = rng.standard_normal((512, 8)).astype(dt)
            y = (x[:, 0] > 0).astype(int)
            X = gdask.from_array(x, block_rows=256)
            for algorithm in ("lloyd", "auto"):  # "auto" steps on Hamerly bounds at 8 features
                KMeans(4, random_state=0, max_iter=6, tol=0, algorithm=algorithm, n_init=1).fit(X)
            LogisticRegression(max_iter=3).fit(X, y)
    return time.perf_counter() - t0


def _device_runs_numba(worker: Any) -> bool:
    """Whether the worker's device runs gdask's numba / numba.cuda kernels (NumPy or CuPy blocks)."""
    from gdask import protocol

    plugin = worker.plugins.get(protocol.PLUGIN_DEVICE)
    dev = getattr(plugin, "device", None)
    return dev is None or (getattr(dev, "backend", None) in ("emulated", "cuda") and not getattr(dev, "strict", False))


class WarmKernels(WorkerPlugin):
    """Compile gdask.ml's kernels in a background thread when the worker starts.

    The first fit's first calls wait for the compilation that is under way rather than starting
    their own (numba compiles one function at a time), so this never costs a fit time; it takes
    the compilation out of the timed iterations.
    """

    name = "gdask-warm-kernels"
    idempotent = True

    def __init__(self) -> None:
        self.seconds: float | None = None
        self.error: str | None = None
        self._done: threading.Event | None = None

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def setup(self, worker: Any) -> None:
        self._done = threading.Event()
        if not _device_runs_numba(worker):
            self.seconds = 0.0
            self._done.set()
            return
        threading.Thread(target=self._run, name="gdask-warm-kernels", daemon=True).start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            warm_kernels()
        except Exception as e:  # noqa: BLE001 - a failed warm-up costs only time: the fit compiles then
            self.error = repr(e)
            logger.warning("gdask: compiling the kernels ahead failed (%r); the first fit compiles them", e)
        finally:
            self.seconds = time.perf_counter() - t0
            self._done.set()

    def status(self) -> dict[str, Any]:
        done = self._done is not None and self._done.is_set()
        return {"done": done, "seconds": self.seconds, "error": self.error}


def _warm_status(dask_worker: Any = None) -> dict[str, Any] | None:
    plugin = dask_worker.plugins.get(WarmKernels.name)
    return plugin.status() if isinstance(plugin, WarmKernels) else None


def wait_for_warm_kernels(client: Any, timeout: float = 300.0) -> dict[str, float]:
    """Wait until every worker's :class:`WarmKernels` finished; ``{worker: seconds it took}``
    (workers without the plugin are left out).

    Raises
    ------
    TimeoutError
        If a worker is still compiling after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        status = {w: s for w, s in client.run(_warm_status).items() if s is not None}
        if all(s["done"] for s in status.values()):
            return {w: float(s["seconds"] or 0.0) for w, s in status.items()}
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers still compiling gdask's kernels after {timeout:g} s: "
                               f"{sorted(w for w, s in status.items() if not s['done'])}")
        time.sleep(0.1)
