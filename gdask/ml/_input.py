"""Input handling shared by the gdask.ml estimators."""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

from gdask.devices import array_namespace
from gdask.gdataset import DeviceShare, GDataSet, device_share

F = TypeVar("F", bound=Callable[..., Any])

#: ``.on`` while an estimator method of this thread runs seceded from its worker task (:func:`task_scope`)
_SECEDED = threading.local()


def _in_worker_task() -> bool:
    """Whether the calling thread runs a task of a distributed worker (e.g. joblib's dask backend
    calls estimators inside tasks)."""
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    return True


@contextlib.contextmanager
def task_scope() -> Iterator[None]:
    """Let an estimator method compute from inside a worker task: the task secedes from the
    worker's thread pool for the duration (the method's own tasks need those threads: waiting for
    them while holding one deadlocked, e.g. ``GridSearchCV`` under ``joblib.parallel_backend("dask")``),
    submits through the worker's client, and rejoins at the end. Elsewhere it does nothing."""
    if getattr(_SECEDED, "on", False) or not _in_worker_task():
        yield
        return
    from distributed import worker_client

    _SECEDED.on = True  # methods that call each other secede once
    try:
        with worker_client() as client, client.as_current():
            yield
    finally:
        _SECEDED.on = False


def in_task_scope(method: F) -> F:
    """Run an estimator method in :func:`task_scope`."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with task_scope():
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def module_name(x: Any) -> str:
    """Top-level module of ``x``'s type ("numpy", "cupy", "pandas", ...)."""
    return type(x).__module__.split(".")[0]


def is_host_input(X: Any) -> bool:
    """In-memory host data scikit-learn's own validation understands (arrays, lists, pandas, sparse)."""
    if isinstance(X, GDataSet) or module_name(X) in ("cupy", "cudf", "dask_cudf"):
        return False
    return not hasattr(X, "__dask_graph__")


def all_finite(b: Any) -> bool:
    """Whether a block has no NaN or infinity."""
    if isinstance(b, np.ndarray):
        return bool(b.dtype.kind in "biu" or np.isfinite(b).all())
    xp = array_namespace(b)
    return bool(xp.isdtype(b.dtype, ("bool", "integral")) or xp.all(xp.isfinite(b)))


def check_finite(X: GDataSet, what: str = "X") -> None:
    """Raise ``ValueError`` when the GDataSet ``X`` contains NaN or infinity (one pass over it)."""
    if not X.reduce_blocks(all_finite, all, name="check-finite").compute():
        raise ValueError(f"Input {what} contains NaN or infinity; remove or impute them before fitting")


def estimator_job(est: Any) -> contextlib.AbstractContextManager:
    """The engine's :func:`~gdask.gdataset.device_share` from an estimator's ``gpu``, ``memory`` and
    ``job_name`` parameters."""
    return device_share(DeviceShare(getattr(est, "gpu", None), getattr(est, "memory", None),
                                    getattr(est, "job_name", None), type(est).__name__))
