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

__all__ = ["WarmKernels", "wait_for_warm_kernels", "warm_kernels", "warm_kernels_plugin"]

logger = logging.getLogger("gdask.ml")

#: rows, features and clusters (or classes) of the warm-up's blocks: 8 features, as a fit from 8
#: features up steps on Hamerly's bounds
_N, _D, _K = 64, 8, 4


def _cpu_calls(dtype: np.dtype, rng: np.random.Generator) -> list[Callable[[], Any]]:
    """The numba CPU kernels a fit on NumPy blocks of ``dtype`` runs, each called once on a tiny
    feature-major block (the layout of gdask's blocks), with the argument types the fits use."""
    from gdask.ml import _bounds, _kernels
    from gdask.ml import _logistic_kernels as lk

    x = np.asfortranarray(rng.standard_normal((_N, _D)).astype(dtype))
    xt = x.T
    c = np.ascontiguousarray(x[:_K])
    c2 = np.ascontiguousarray(x[_K:2 * _K]).astype(np.float64)
    none = _kernels._NO_WEIGHTS
    norms = np.empty(_N, np.float64)
    q = min(_kernels.N_FARTHEST, _N)

    def top() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return np.full(q, -1.0), np.zeros(q, np.int64), np.zeros(q, np.int64)

    def lloyd() -> None:  # the Lloyd pass (as lloyd_partial, without its per-block cache of row norms)
        topv, topi, topl = top()
        _kernels._lloyd_numba(xt, none, c, np.zeros((_K, _D)), np.zeros(_K), topi, topv, False, topv, topi, topl,
                              _kernels._NO_SEC, norms)

    def bounds() -> None:  # the first bounds pass, a Hamerly step, the exact inertia (as _bounds' passes)
        buf = np.empty(2 * _N + (_N + 1) // 2, np.float64)
        ul, labels = buf[:2 * _N].reshape(2, _N), buf[2 * _N:].view(np.int32)[:_N]
        sums, counts = np.zeros((_K, _D)), np.zeros(_K)
        topv, topi, topl = top()
        cf = c.astype(np.float64)
        _kernels._lloyd_numba(xt, none, c, sums, counts, labels, labels, False, topv, topi, topl, ul, norms)
        drift, half, m1, d1, d2, cc = _bounds._center_geometry(c2, cf)
        _bounds._hamerly_numba(xt, none, c2, labels, ul[0], ul[1], sums, counts, drift, half, m1, d1, d2, cc,
                               int(_bounds.FULL_PASS_FRACTION * _N))
        _bounds._assigned_sqdist(xt, c2, labels, np.empty(_N, np.float64))

    y2 = (x[:, 0] > 0).astype(np.int32)
    y3 = (np.arange(_N) % 3).astype(np.int32)
    return [
        lambda: _kernels._row_norms_numba(xt, norms),
        lloyd,
        lambda: _kernels.assign(x, c),  # labels and distances (stateless)
        bounds,
        lambda: lk.loss_grad(x, y2, np.zeros((1, _D)), np.zeros(1)),  # binomial
        lambda: lk.loss_grad(x, y3, np.zeros((3, _D)), np.zeros(3)),  # multinomial
    ]


def _cuda_calls(dtype: np.dtype, rng: np.random.Generator, asarray: Callable[[Any], Any]) -> list[Callable[[], Any]]:
    """The numba.cuda kernels a fit on CUDA blocks of ``dtype`` runs, each called once on a tiny
    feature-major device block (``asarray``: host -> device; NumPy under numba's simulator)."""
    from gdask.ml import _cuda_kernels as ck

    host = np.asfortranarray(rng.standard_normal((_N, _D)).astype(dtype))
    x = asarray(host)
    c = np.ascontiguousarray(host[:_K])
    c2 = np.ascontiguousarray(host[_K:2 * _K]).astype(np.float64)
    y2 = asarray((host[:, 0] > 0).astype(np.int32))
    y3 = asarray((np.arange(_N) % 3).astype(np.int32))

    def bounds() -> None:
        st = ck.first_pass_cuda(x, c)
        ck.bounds_step_cuda(x, c2, st)

    return [
        lambda: ck.lloyd_partial_cuda(x, c),
        lambda: ck.assign_cuda(x, c),
        bounds,
        lambda: ck.loss_grad_cuda(x, y2, np.zeros((1, _D)), np.zeros(1)),
        lambda: ck.loss_grad_cuda(x, y3, np.zeros((3, _D)), np.zeros(3)),
    ]


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
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    if backend == "cuda":
        from gdask.ml import _cuda_kernels

        if not _cuda_kernels.usable():
            return time.perf_counter() - t0
        import cupy

        calls = [f for dt in dtypes for f in _cuda_calls(np.dtype(dt), rng, cupy.asfortranarray)]
    else:
        calls = [f for dt in dtypes for f in _cpu_calls(np.dtype(dt), rng)]
    for i, call in enumerate(calls):
        call()
        if progress is not None:
            progress(i + 1, len(calls))
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
