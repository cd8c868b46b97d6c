"""Compile gdask.ml's kernels before they are timed: numba compiles a kernel on its first call.

The kernels are ``cache=True``: the first process that compiles them writes numba's on-disk cache,
and every later process loads them from it (milliseconds instead of seconds). :func:`warm_kernels`
calls each hot kernel once on tiny blocks, in float32 and float64 (K-means' Lloyd pass, labels and
bounds passes; the logistic loss and gradient, binomial and multinomial; PageRank's sweep order,
transpose and sweeps on a tiny graph), which compiles it or loads it from the cache. It calls the
kernels directly: no estimator, no Dask scheduler, no device, no config or warnings filter is touched,
so it prints nothing and changes nothing that the process's other threads (a worker's tasks) see.

:class:`WarmKernels` does it in a background thread when a device worker starts (installed through
config ``gdask.plugins.worker``, entry ``gdask.ml:warm_kernels_plugin``; config
``gdask.ml.warm-kernels: false`` turns it off), so the first fit's iterations do not include compile
time; :func:`wait_for_warm_kernels` waits for the workers' warm-ups and says how long they took. It
also imports what the estimators' loops on the workers import (:data:`LOOP_MODULES`) before the
worker's first task.

numba compiles under one process-wide lock. A worker compiling its kernels in a thread would hold it
for seconds at a time (tens of seconds on a busy machine), and every task that needs a kernel not
yet loaded, such as a GDataSet's ``mean``, would wait behind it. So a worker of NumPy blocks whose
kernels are not in numba's on-disk cache yet (its last kernel compiles instead of loading) has a
child process (``python -m gdask.ml._warm``) compile them into that cache, and then loads them in
its thread, a few milliseconds of the lock per kernel. The child dies with its worker; when it fails
or runs past ``gdask.timeouts.warm-kernels`` the thread compiles.
"""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
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


#: what the estimators' loops import on a worker (scipy.optimize, for the logistic regression's L-BFGS
#: on the workers, takes ~0.1 s): imported as the worker starts, not in its first fit's iterations
LOOP_MODULES = ("gdask.ml._kmeans._loop", "gdask.ml._kmeans._init", "gdask.ml._logistic._loop", "scipy.optimize")


def import_loops() -> None:
    """Import :data:`LOOP_MODULES` here."""
    for name in LOOP_MODULES:
        importlib.import_module(name)


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
    if on_host:  # the GDataSet reductions' kernel (mean, var, std of a NumPy block's rows)
        from gdask.gdataset import moments

        calls.append(lambda: moments(x, 0))

    def init_round() -> None:  # k-means||: the first candidates, then a round of new ones
        mind, label = kernels.nearest_update(x, c, 0)
        kernels.nearest_update(x, np.concatenate([c, c2.astype(c.dtype)]), _K, mind, label)

    return [lambda: km.assign(x, c), init_round, *calls]


def _pagerank_calls() -> list[Callable[[], Any]]:
    """PageRank's kernels (:func:`gdask.ml.pagerank` on the workers), each case numba compiles: the
    sweep order's (on the client: sampled and in full), the transpose and the sweeps with weights all
    1 and not (as float64, and, in one block, as uint8 and float32, or as the few weights other than 1
    of the first graph's duplicate links), in one block (pushed over ``A`` in either direction, or
    renumbered, transposed and gathered) and in two, renumbered or not."""
    import scipy.sparse as sp

    from gdask.ml._pagerank import _sweep_order
    from gdask.ml._pagerank_loop import OneRank, _one_block, _rank_sweeps, direct, narrow, prepare
    from gdask.ml.kernels._pagerank_cpu import order_estimate, sort_by_key, unsigned

    rng = np.random.default_rng(0)
    n, m = 64, 256
    src, dst = rng.integers(0, n - 8, m), rng.integers(4, n, m)  # the last 8 nodes dangling, the first 4 get no link
    # the last two sent as uint8 and float32 (halves: duplicate links summed stay halves)
    weights = (np.ones(m), rng.uniform(0.5, 2.0, m), rng.integers(1, 4, m).astype(float), rng.integers(1, 8, m) / 2)
    graphs = [sp.csr_matrix((w, (src, dst)), shape=(n, n)) for w in weights]
    pos = rng.permutation(n)

    def sweeps(A: Any, renumber: bool, nblocks: int) -> None:
        P = prepare(A, pos if renumber else None, nblocks)
        _rank_sweeps(OneRank(), [P.block(b) for b in range(P.nblocks)], P.out, P.bounds, 0.85, 1e-3, 3,
                     descending=renumber, spread=nblocks == 1)

    def one_block(A: Any, order: str) -> None:
        # the in-degree order opens with the nodes that receive nothing: their links are folded out of the sweeps
        P = direct(A, np.argsort(np.bincount(A.indices, minlength=n), kind="stable") if order == "in-degree" else None)
        P.values = narrow(P.values)
        _one_block(OneRank(), P.arrays, P.order, 0.85, 1e-3, 3, order == "descending")

    calls: list[Callable[[], Any]] = [
        lambda: _sweep_order(graphs[1]),
        lambda: sort_by_key(np.arange(n, dtype=np.uint32), True),
        lambda: order_estimate(graphs[1].indptr.astype(np.int64), unsigned(graphs[1].indices), graphs[1].data, 3,
                               np.empty(n)),
    ]
    for i, A in enumerate(graphs):
        calls += [lambda A=A, o=o: one_block(A, o) for o in ("ascending", "descending", "in-degree")]
        if i < 2:
            calls += [lambda A=A: sweeps(A, False, 1), lambda A=A: sweeps(A, True, 2)]
    return calls


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
    calls = [] if backend == "cuda" else _pagerank_calls()  # first: the last call is _loads_from_cache's
    calls += [f for x, host in _blocks(dtypes, backend) for f in _calls(x, host)]
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


def _loads_from_cache() -> bool:
    """Whether numba's on-disk cache holds the NumPy kernels: the warm-up's last kernel call (the
    child compiles in the warm-up's order) is made here and loads from the cache without compiling.
    A compilation by another thread meanwhile also answers False: a child then runs for nothing."""
    from numba.core import event

    x, host = _blocks(("float64",), "emulated")[0]
    with event.install_recorder("numba:compile") as compiled:
        _calls(x, host)[-1]()
    return not compiled.buffer


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

    On NumPy blocks a child process compiles them into numba's on-disk cache and the thread then
    loads them, so the worker's tasks never wait behind the warm-up for numba's compile lock (a task
    that needs a kernel before the child is done compiles it itself); on CuPy blocks the thread
    compiles the numba.cuda kernels in the worker (a child would need a CUDA context of its own).
    :meth:`status` says how far it is.
    """

    name = "gdask-warm-kernels"
    idempotent = True

    def __init__(self) -> None:
        self.seconds: float | None = None
        self.error: str | None = None
        self.compiled = 0
        self.total: int | None = None
        self._done: threading.Event | None = None
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None  # the process compiling into numba's cache
        self._closed = False
        self.phase = "starting"  # -> "checking" numba's cache -> "loading" (or "compiling" first) -> "done"

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def setup(self, worker: Any) -> None:
        self._done = threading.Event()
        import_loops()  # before the worker runs a task, as the kernels' modules below
        backend = _numba_backend(worker)
        if backend is None:
            self.seconds, self.total = 0.0, 0
            self.phase = "done"
            self._done.set()
            return
        if backend == "emulated":
            # the kernels' modules (and what they import, which may add warnings filters) are imported
            # now, before the worker runs a task, so that the warm-up's thread changes nothing tasks see
            host = np.asfortranarray(np.zeros((_N, _D)))
            _calls(host, host)
        threading.Thread(target=self._run, args=(backend,), name="gdask-warm-kernels", daemon=True).start()

    def _progress(self, done: int, total: int) -> None:
        self.compiled, self.total = done, total

    def _run(self, backend: str) -> None:
        t0 = time.perf_counter()
        try:
            self.phase = "checking"
            if backend == "cuda" or not _loads_from_cache():
                self.phase = "compiling"
                if backend == "emulated":
                    self._compile_in_child()  # into numba's cache, by a child: this process's compile lock stays free
            else:
                self.phase = "loading"
            if not self._closed:
                warm_kernels(backend=backend, progress=self._progress)  # loaded from that cache (or compiled)
        except Exception as e:  # noqa: BLE001 - a failed warm-up costs only time: the fit compiles then
            self.error = repr(e)
            logger.warning("gdask: compiling the kernels ahead failed (%r); the first fit compiles them", e)
        finally:
            self.seconds = time.perf_counter() - t0
            self.phase = "done"
            self._done.set()

    def _compile_in_child(self) -> None:
        """Compile the NumPy kernels into numba's on-disk cache in a child process, which dies with
        this one (and at :meth:`teardown`); a child that fails or runs past
        ``gdask.timeouts.warm-kernels`` is logged and this thread compiles instead."""
        limit = float(config.get("timeouts.warm-kernels", 600))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the worker's imports
        with self._lock:
            if self._closed:
                return
            self._child = subprocess.Popen(
                [sys.executable, "-m", "gdask.ml._warm", "--parent", str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        child = self._child
        try:
            _, err = child.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            logger.warning("gdask: compiling the kernels in a child process took over %g s "
                           "(gdask.timeouts.warm-kernels); the worker compiles them", limit)
            return
        finally:
            with self._lock:
                self._child = None
        if child.returncode != 0 and not self._closed:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            logger.warning("gdask: compiling the kernels in a child process failed (exit status %s: %s); "
                           "the worker compiles them", child.returncode, " | ".join(tail))

    def teardown(self, worker: Any) -> None:
        """Stop the compiling child, if any: nothing is left behind when the worker closes."""
        with self._lock:
            self._closed = True
            child = self._child
        if child is not None and child.poll() is None:
            child.kill()

    def status(self) -> dict[str, Any]:
        """``done``, ``seconds`` (when done), ``error``, ``compiled`` kernel calls of ``total``, and the
        ``phase``: "checking" numba's cache, "loading" from it, "compiling" (not cached yet), "done"."""
        done = self._done is not None and self._done.is_set()
        return {"done": done, "seconds": self.seconds, "error": self.error, "compiled": self.compiled,
                "total": self.total, "phase": self.phase}

    def starting(self) -> bool:
        """Whether the worker is still loading its kernels from numba's cache (a second or less): what
        :class:`~gdask.LocalGPUCluster` waits for before it returns, so that the first fit's tasks do
        not share the worker's CPU with the warm-up. A compilation (kernels not cached yet, or CUDA
        kernels: minutes on a busy machine) is not waited for; the fit then runs beside it."""
        return self._done is not None and not self._done.is_set() and self.phase in ("starting", "checking",
                                                                                      "loading")


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


def _exit_with_parent(parent: int) -> None:
    """In the compiling child: end when the worker that started it ends (at once on Linux, where the
    kernel sends SIGKILL; elsewhere within half a second, by watching the parent's pid)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - no prctl: the watcher below is enough
            pass
    if os.getppid() != parent:  # the parent was gone before the child could ask to die with it
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="gdask-warm-parent").start()


def main(argv: list[str] | None = None) -> int:
    """``python -m gdask.ml._warm [--parent PID]``: compile the NumPy kernels into numba's on-disk
    cache (what :class:`WarmKernels` runs in a child process)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gdask.ml._warm", description=main.__doc__)
    parser.add_argument("--parent", type=int, default=None, help="end when the process of this pid ends")
    args = parser.parse_args(argv)
    if args.parent is not None:
        _exit_with_parent(args.parent)
    warm_kernels(backend="emulated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
