"""Compile gdask.ml's kernels before they are timed: numba compiles a kernel on its first call.

The kernels are ``cache=True``: the first process that compiles them writes numba's on-disk cache,
and every later process loads them from it (milliseconds instead of seconds). :func:`warm_kernels`
calls each hot kernel once on tiny blocks, in float32 and float64 (K-means' Lloyd pass, labels and
bounds passes; the logistic loss and gradient, binomial and multinomial), which compiles it or loads
it from the cache. It calls the kernels directly: no estimator, no Dask scheduler, no device, no
config or warnings filter is touched, so it prints nothing and changes nothing that the process's
other threads (a worker's tasks) see.

:class:`WarmKernels` does it in a background thread when a device worker starts (installed through
config ``gdask.plugins.worker``, entry ``gdask.ml:warm_kernels_plugin``; config
``gdask.ml.warm-kernels: false`` turns it off), so the first fit's iterations do not include compile
time; :func:`wait_for_warm_kernels` waits for the workers' warm-ups and says how long they took.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import numpy as np
from distributed import WorkerPlugin

from gdask import config, protocol
from gdask.devices import asarray_like

__all__ = ["WarmKernels", "wait_for_warm_kernels", "warm_kernels", "warm_kernels_plugin"]

logger = logging.getLogger("gdask.ml")

#: rows, features and clusters (or classes) of the warm-up's blocks: 8 features, as a fit from 8
#: features up steps on Hamerly's bounds
_N, _D, _K = 64, 8, 4


def _calls(x: Any, host: np.ndarray) -> list[Callable[[], Any]]:
    """Each kernel a fit runs on blocks like ``x`` (a tiny feature-major block: NumPy for the numba
    CPU kernels, CuPy for the numba.cuda ones; ``host`` its host copy), called once, without and
    with row weights (numba compiles each case)."""
    from gdask.ml import kernels

    on_host = isinstance(x, np.ndarray)
    w = np.ones(_N) if on_host else asarray_like(np.ones(_N), x)  # row weights, float64 on the block's device
    km = kernels.kernels_for("kmeans", x, clusters=_K)
    hm = kernels.kernels_for("hamerly", x, clusters=_K)
    c = np.ascontiguousarray(host[:_K])
    c2 = np.ascontiguousarray(host[_K:2 * _K]).astype(np.float64)
    limit = _N  # a bounds step that never gives up for a full pass
    y2 = (host[:, 0] > 0).astype(np.int32)
    y3 = (np.arange(_N) % 3).astype(np.int32)
    if not on_host:
        y2, y3 = asarray_like(y2, x), asarray_like(y3, x)

    def bounds(wv: Any) -> None:  # the first bounds pass, a Hamerly step, the exact inertia
        st = hm.first_pass(x, c.astype(np.float64), wv)
        hm.step(x, c2, st, wv, limit)
        hm.assigned_sqdist(x, c2, st.labels)

    calls: list[Callable[[], Any]] = []
    for wv in (None, w):
        calls += [
            lambda wv=wv: km.lloyd_partial(x, c, wv),
            lambda wv=wv: bounds(wv),
            lambda wv=wv: kernels.kernels_for("logistic", x, classes=1).loss_grad(x, y2, np.zeros((1, _D)),
                                                                                 np.zeros(1), wv),
            lambda wv=wv: kernels.kernels_for("logistic", x, classes=3).loss_grad(x, y3, np.zeros((3, _D)),
                                                                                 np.zeros(3), wv),
        ]
    return [lambda: km.assign(x, c), *calls]


def _blocks(dtypes: tuple[str, ...], backend: str) -> list[tuple[Any, np.ndarray]]:
    """Tiny feature-major blocks of each dtype, with their host copies: NumPy ("emulated"), CuPy
    ("cuda"; none when the numba.cuda kernels cannot run in this process)."""
    rng = np.random.default_rng(0)
    hosts = [np.asfortranarray(rng.standard_normal((_N, _D)).astype(dt)) for dt in dtypes]
    if backend != "cuda":
        return [(h, h) for h in hosts]
    import cupy

    from gdask.ml import kernels

    blocks = [(cupy.asfortranarray(h), h) for h in hosts]
    return blocks if kernels.backend_for(blocks[0][0]) == "cuda" else []  # else the array API code: no compiling


def warm_kernels(dtypes: tuple[str, ...] = ("float32", "float64"), backend: str = "emulated",
                 progress: Callable[[int, int], None] | None = None) -> float:
    """Call gdask.ml's kernels once on tiny blocks here, so that they are compiled (or loaded from
    numba's cache); returns the seconds it took.

    Parameters
    ----------
    dtypes : tuple of str
        Block dtypes to compile the kernels for.
    backend : {"emulated", "cuda"}
        The numba CPU kernels (NumPy blocks), or the numba.cuda kernels (CuPy blocks; nothing when
        they cannot run in this process).
    progress : callable, optional
        ``progress(done, total)`` after each kernel call.
    """
    from gdask.devices import context
    from gdask.ml import kernels

    t0 = time.perf_counter()
    calls = [f for x, host in _blocks(dtypes, backend) for f in _calls(x, host)]
    state = context().state  # this thread runs no task: the process's own context
    had_norms = kernels.NORMS_SPACE in state
    try:
        for i, call in enumerate(calls):
            call()
            if progress is not None:
                progress(i + 1, len(calls))
    finally:
        if not had_norms:  # the row norms of the tiny blocks were cached there: leave no trace
            state.drop(kernels.NORMS_SPACE)
    return time.perf_counter() - t0


def _numba_backend(worker: Any) -> str | None:
    """Which of gdask's numba kernels the worker's device runs: "emulated" (NumPy blocks), "cuda"
    (CuPy blocks), or None (strict devices run the array API code)."""
    plugin = worker.plugins.get(protocol.PLUGIN_DEVICE)
    dev = getattr(plugin, "device", None)
    if dev is None:
        return "emulated"
    backend = getattr(dev, "backend", None)
    if backend == "emulated" and not getattr(dev, "strict", False):
        return "emulated"
    return "cuda" if backend == "cuda" else None


class WarmKernels(WorkerPlugin):
    """Compile gdask.ml's kernels in a background thread when the worker starts.

    The first fit's first calls wait for the compilation that is under way rather than starting
    their own (numba compiles one function at a time), so this never costs a fit time; it takes
    the compilation out of the timed iterations. :meth:`status` says how far it is.
    """

    name = "gdask-warm-kernels"
    idempotent = True

    def __init__(self) -> None:
        self.seconds: float | None = None
        self.error: str | None = None
        self.compiled = 0
        self.total: int | None = None
        self._done: threading.Event | None = None

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def setup(self, worker: Any) -> None:
        self._done = threading.Event()
        backend = _numba_backend(worker)
        if backend is None:
            self.seconds, self.total = 0.0, 0
            self._done.set()
            return
        threading.Thread(target=self._run, args=(backend,), name="gdask-warm-kernels", daemon=True).start()

    def _progress(self, done: int, total: int) -> None:
        self.compiled, self.total = done, total

    def _run(self, backend: str) -> None:
        t0 = time.perf_counter()
        try:
            warm_kernels(backend=backend, progress=self._progress)
        except Exception as e:  # noqa: BLE001 - a failed warm-up costs only time: the fit compiles then
            self.error = repr(e)
            logger.warning("gdask: compiling the kernels ahead failed (%r); the first fit compiles them", e)
        finally:
            self.seconds = time.perf_counter() - t0
            self._done.set()

    def status(self) -> dict[str, Any]:
        """``done``, ``seconds`` (when done), ``error``, ``compiled`` kernel calls of ``total``."""
        done = self._done is not None and self._done.is_set()
        return {"done": done, "seconds": self.seconds, "error": self.error, "compiled": self.compiled,
                "total": self.total}


def warm_kernels_plugin(**options: Any) -> WarmKernels | None:
    """The worker-plugin factory of config ``gdask.plugins.worker`` (entry
    ``gdask.ml:warm_kernels_plugin``): a :class:`WarmKernels`, or None when config
    ``gdask.ml.warm-kernels`` is false. ``options`` (the cluster's device options) are not used."""
    return WarmKernels() if config.get("ml.warm-kernels", True) else None


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
