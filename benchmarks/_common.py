"""Shared helpers of the benchmarks: the setup header every table prints, library versions, JSON
output, and the ONE place where benchmarks reach gdask's private names.

Benchmarks run as scripts (``python benchmarks/NAME.py``), so this module is imported as
``_common`` (the script's folder is first on ``sys.path``, also in the worker processes a
LocalGPUCluster spawns).

Private names (resolved lazily, on first use, so a reorganisation of gdask's private modules breaks
this table only): see :data:`PRIVATE`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import sys
from collections.abc import Iterable, Iterator
from importlib import metadata
from typing import Any

__all__ = ["PRIVATE", "all_cores", "blas_threads", "library_versions", "print_setup", "setup", "warmed",
           "write_json"]

#: name -> (module, attribute): gdask internals the benchmarks use. Keep this table short.
PRIVATE = {
    "lloyd_partial": ("gdask.ml.kernels", "lloyd_partial"),  # one block's K-means partial sums (public)
    "lloyd_combine": ("gdask.ml.kernels", "lloyd_combine"),
    "to_numpy": ("gdask.devices", "to_numpy"),  # a device block as NumPy (CuPy -> host): public
    "block_workers": ("gdask.gdataset", "block_workers"),  # where each block of a GDataSet lives: public
    "current_device": ("gdask.devices", "current_device"),  # the worker's device (emulated kernels): public
    "make_specs": ("gdask.devices", "make_specs"),  # public
    "DeviceSetup": ("gdask.scheduling", "DeviceSetup"),  # the worker plugin that gives a worker its device: public
    "ContentionModel": ("gdask._devices._contention", "ContentionModel"),  # the emulator's stated model
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = PRIVATE[name]
    except KeyError:
        raise AttributeError(f"module '_common' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def library_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed version of each distribution (``None`` when it is not installed)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def blas_threads() -> dict[str, int]:
    """Threads of each BLAS / OpenMP library loaded in this process (threadpoolctl), by library
    file prefix, e.g. ``{"libscipy_openblas64_": 2, "libgomp": 2}``; empty without threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return {}
    out: dict[str, int] = {}
    for pool in threadpool_info():
        out[os.path.basename(str(pool.get("filepath") or pool.get("prefix")))] = int(pool.get("num_threads", 0))
    return out


@contextlib.contextmanager
def all_cores() -> Iterator[dict[str, int]]:
    """Run a baseline in this process on every core; yields the BLAS / OpenMP threads in effect.

    Starting a LocalCluster's workers sets ``OMP_NUM_THREADS=1`` (and the BLAS equivalents) in
    *this* process's environment (distributed's ``nanny.pre-spawn-environ``), so an OpenMP or BLAS
    runtime loaded afterwards (scikit-learn's, SciPy's) would run single-threaded: a baseline
    measured after a cluster started would be handicapped. ``threadpoolctl`` sets every loaded
    runtime to ``os.cpu_count()`` threads for the block.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=os.cpu_count() or 1):
        yield blas_threads()


def setup(libraries: Iterable[str] = (), **fields: Any) -> dict[str, Any]:
    """The baseline's setup: machine (cores, Python), BLAS threads, library versions, and the
    benchmark's own ``fields`` (dtype, threads of each implementation, ...).

    Parameters
    ----------
    libraries : iterable of str
        Distributions whose versions are reported (numpy, scikit-learn, ...).
    **fields
        Reported as they are (``dtype="float32"``, ``sklearn_threads=2``).
    """
    import numpy  # noqa: F401 - loads the BLAS whose threads are reported

    out: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "blas_threads": blas_threads(),
        "versions": library_versions(["numpy", "dask", "distributed", *libraries]),
    }
    out.update(fields)
    return out


def print_setup(s: dict[str, Any], *, file: Any = None) -> None:
    """Print a setup (from :func:`setup`) as two ``setup:`` lines above a table."""
    file = file or sys.stdout
    own = {k: v for k, v in s.items() if k not in ("cores", "python", "machine", "blas_threads", "versions")}
    blas = ", ".join(f"{k} {v}" for k, v in s["blas_threads"].items()) or "n/a"
    vers = ", ".join(f"{k} {v or 'missing'}" for k, v in s["versions"].items())
    print(f"setup: {s['cores']} cores ({s['machine']}), Python {s['python']}, BLAS threads: {blas}; {vers}", file=file)
    if own:
        print("setup: " + "; ".join(f"{k}={v}" for k, v in own.items()), file=file)


def warmed(*clients: Any, timeout: float = 600.0, file: Any = None) -> None:
    """Wait until the workers of ``clients`` (default: the current client) finished compiling
    gdask's kernels ahead (:class:`gdask.ml.WarmKernels`, a child process per worker started with
    it: ~40 s on 2 cores when numba's cache is cold, e.g. the first run after installing). Timing
    meanwhile would time the compiler too, in gdask's figures and in every peer's beside them.
    Prints one ``setup:`` line."""
    import time

    from distributed import get_client

    from gdask.ml import wait_for_warm_kernels

    t = time.perf_counter()
    done: dict[str, float] = {}
    for c in clients or (get_client(),):
        done.update(wait_for_warm_kernels(c, timeout=timeout))
    if done:
        print(f"setup: waited {time.perf_counter() - t:.1f} s for {len(done)} worker(s) to compile gdask's kernels "
              f"ahead (the slowest took {max(done.values()):.1f} s), before timing", file=file or sys.stdout)


def write_json(path: str | None, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` (nothing when ``path`` is None); objects JSON
    cannot hold are written as their ``str``."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)
