"""What every gdask.ml estimator shares: its input, its outputs, its device share and its checks.

Modelled on cuML's Dask estimators (one base with a data handler and delayed-prediction mixins):

* **Input** (:meth:`DeviceEstimatorMixin._input`): NumPy arrays, lists and pandas objects (validated
  by scikit-learn itself: its errors, ``n_features_in_``, ``feature_names_in_``), CuPy arrays, cuDF
  and dask(-cuDF) DataFrames, dask arrays and GDataSets become one :class:`Input`: the data (an
  in-memory array, or a GDataSet) and its :class:`InputKind`, detected in one place
  (:func:`input_kind`).
* **Outputs** (:meth:`DeviceEstimatorMixin._to_output`, :meth:`DeviceEstimatorMixin._blockwise`):
  cuML's ``output_type`` convention. The estimator parameter ``output_type`` (default: config
  ``gdask.output-type``, ``"input"``) chooses the array type of the fitted attributes and of
  in-memory results: ``"input"`` follows the input (NumPy in, NumPy out; CuPy or cuDF in, CuPy
  out), ``"numpy"``, ``"cupy"``, or ``"device"`` (the array type of the devices' blocks). Lazy input
  (a GDataSet, a dask collection) gives lazy predictions, blocked like it.
* **The device share**: the ``gpu`` / ``memory`` / ``job_name`` parameters, documented once
  (:data:`JOB_PARAMETERS`, put into docstrings by :func:`shared_docs`), opened through the engine's
  :func:`gdask.gdataset.device_share`.
* **Non-finite data**: one exception (:class:`NotFinite`) and one check (:func:`check_finite`,
  :func:`require_finite` inside block tasks).
"""

from __future__ import annotations

import contextlib
import functools
import re
import textwrap
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

from gdask import config
from gdask.devices import array_namespace, asarray_like, astype, is_sparse, numpy_dtype, sparse_all_finite, to_numpy
from gdask.gdataset import DeviceShare, GDataSet, device_share, from_array, from_dask_array, from_dataframe
from gdask.gdataset.engine import Interrupts

__all__ = [
    "JOB_PARAMETERS", "OUTPUT_TYPES", "OUTPUT_TYPE_PARAMETER", "DeviceEstimatorMixin", "Input", "InputKind",
    "NotFinite", "all_finite", "as_dask_array", "check_finite", "estimator_job", "host_array",
    "in_task_scope", "input_kind", "is_host_input", "job_share", "module_name", "require_finite", "shared_docs",
    "task_scope",
]

F = TypeVar("F", bound=Callable[..., Any])

#: the values of the ``output_type`` parameter and of config ``gdask.output-type``
OUTPUT_TYPES = ("input", "numpy", "cupy", "device")

# -- docs written once ---------------------------------------------------------------------------------
#: numpydoc text of the ``gpu``, ``memory`` and ``job_name`` parameters (``{job_parameters}`` in a docstring)
JOB_PARAMETERS = """\
gpu : float, optional
    Run inside ``gdask.job(client, gpu=gpu, memory=memory, name=job_name)``: a share of a device of
    the current Client's cluster (see :func:`gdask.job`). Default None: no share is asked for (and
    none without a Client).
memory : int or str, optional
    Device memory of that share (``"4GiB"``); default ``gpu`` times the device's memory.
job_name : str, optional
    The job's name in :func:`gdask.scheduling.jobs` (default: the kind of work and a random suffix)."""

#: numpydoc text of the ``output_type`` parameter (``{output_type_parameter}`` in a docstring)
OUTPUT_TYPE_PARAMETER = """\
output_type : {"input", "numpy", "cupy", "device"}, optional
    Array type of the fitted attributes and of in-memory results (predictions, transforms):
    "input" follows the input (NumPy, lists and pandas give NumPy; CuPy and cuDF give CuPy; the
    attributes of a fit on a GDataSet or a dask collection are NumPy, or CuPy for CuPy chunks),
    "numpy", "cupy", or "device" (the array type of the devices' blocks: CuPy on CUDA devices,
    NumPy on emulated ones). Predictions for a GDataSet or a dask collection stay lazy, blocked
    like it. Default: config ``gdask.output-type`` ("input")."""

_DOCS = {"job_parameters": JOB_PARAMETERS, "output_type_parameter": OUTPUT_TYPE_PARAMETER}


def shared_docs(obj: F) -> F:
    """Put the shared parameter docs into ``obj``'s docstring: a line holding only
    ``{job_parameters}`` or ``{output_type_parameter}`` becomes that text, at the line's indent."""
    doc = obj.__doc__ or ""
    for marker, text in _DOCS.items():
        doc = re.sub(r"^( *)\{" + marker + r"\}$", lambda m, t=text: textwrap.indent(t, m.group(1)), doc,
                     flags=re.MULTILINE)
    obj.__doc__ = doc
    return obj


# -- non-finite data -----------------------------------------------------------------------------------
class NotFinite(ArithmeticError):
    """A pass's sums, loss or gradient were not finite (NaN / inf in the data, or an overflow)."""


def all_finite(b: Any) -> bool:
    """Whether a block has no NaN or infinity (a CSR block: its stored values)."""
    if is_sparse(b):
        return sparse_all_finite(b)
    if isinstance(b, np.ndarray):
        return bool(b.dtype.kind in "biu" or np.isfinite(b).all())
    xp = array_namespace(b)
    return bool(xp.isdtype(b.dtype, ("bool", "integral")) or xp.all(xp.isfinite(b)))


def check_finite(X: GDataSet, what: str = "X") -> None:
    """Raise ``ValueError`` when the GDataSet ``X`` contains NaN or infinity (one pass over it)."""
    if not X.reduce_blocks(all_finite, all, name="check-finite").compute():
        raise ValueError(f"Input {what} contains NaN or infinity; remove or impute them before fitting")


def require_finite(blk: Any) -> None:
    """Predicting on rows with NaN or infinity raises, as for NumPy input (scikit-learn's check),
    also when the rows come lazily in blocks (checked in each block's task)."""
    if not all_finite(blk):
        raise ValueError(f"Input X contains NaN or infinity (in a block of {blk.shape[0]} rows); remove or impute "
                         "them before predicting")


# -- what the input is ---------------------------------------------------------------------------------
def module_name(x: Any) -> str:
    """Top-level module of ``x``'s type ("numpy", "cupy", "pandas", "cudf", ...)."""
    return type(x).__module__.split(".")[0]


#: modules whose data lives on a device, and the array type that stands for it ("device": arrays of a
#: device's own namespace, as the blocks of emulated-strict devices)
_DEVICE_MODULES = {"cupy": "cupy", "cudf": "cupy", "dask_cudf": "cupy", "array_api_strict": "device"}


@dataclass(frozen=True)
class InputKind:
    """What an estimator method was given.

    Attributes
    ----------
    container : str
        "array" (in memory: NumPy, lists, pandas, sparse, CuPy, cuDF), "gdataset" or "dask".
    array : str
        The array type the input stands for: "numpy", "cupy" or "device" (a device namespace's own
        arrays); a dask collection's chunk type; for a GDataSet, the type it was made from
        (``GDataSet.input_type``: "numpy" for host data, "cupy" for CuPy / cuDF).
    """

    container: str
    array: str

    @property
    def lazy(self) -> bool:
        """A GDataSet or dask collection: predictions for it stay lazy."""
        return self.container != "array"

    @property
    def host(self) -> bool:
        """In-memory host data that scikit-learn's own validation reads."""
        return self.container == "array" and self.array == "numpy"


def input_kind(X: Any) -> InputKind:
    """The :class:`InputKind` of ``X`` (the one place gdask.ml tells inputs apart)."""
    if isinstance(X, GDataSet):  # results follow what the dataset was made from
        return InputKind("gdataset", getattr(X, "input_type", None) or "numpy")
    if hasattr(X, "__dask_graph__"):
        meta = getattr(X, "_meta", None)  # dask arrays and DataFrames: an empty chunk of their type
        return InputKind("dask", _DEVICE_MODULES.get(module_name(meta), "numpy"))
    return InputKind("array", _DEVICE_MODULES.get(module_name(X), "numpy"))


def is_host_input(X: Any) -> bool:
    """In-memory host data scikit-learn's own validation reads (arrays, lists, pandas, sparse)."""
    return input_kind(X).host


def host_array(v: Any) -> Any:
    """``v`` (targets, weights, results) as host data: lazy collections computed, device arrays and
    cuDF objects copied to the host; host data (lists, pandas) as it is."""
    if v is None:
        return None
    if input_kind(v).lazy:
        v = v.compute()
    if module_name(v) == "cudf":
        return v.to_numpy()
    return v if input_kind(v).host else to_numpy(v)


def _float_dtype(dtype: Any, ints_to: Any) -> Any:
    """The float dtype the kernels compute in for data of ``dtype`` (None: keep it): non-float data
    in ``ints_to``, float16 in float32."""
    dtype = numpy_dtype(dtype)
    if dtype.kind != "f":
        return np.dtype(ints_to)
    return np.dtype(np.float32) if dtype.itemsize < 4 else None


@dataclass
class Input:
    """An estimator method's input, adapted: ``data`` is the validated in-memory array (NumPy or
    CuPy) for in-memory input, else a GDataSet (also for cuDF DataFrames)."""

    kind: InputKind
    data: Any
    original: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def gdataset(self, block_rows: Any = None) -> GDataSet:
        """The data as a GDataSet (split into device blocks here for in-memory arrays)."""
        if isinstance(self.data, GDataSet):
            return self.data
        return from_array(self.data, block_rows=block_rows)


def _adapt_lazy(X: Any) -> GDataSet:
    """A GDataSet of a GDataSet, a dask array or a (dask-, cu)DataFrame."""
    if isinstance(X, GDataSet):
        return X
    if hasattr(X, "columns"):
        return from_dataframe(X)
    if hasattr(X, "__dask_graph__"):
        return from_dask_array(X)
    raise TypeError(f"X must be an array (NumPy, CuPy, dask), a DataFrame or a GDataSet, got {type(X).__name__}")


# -- running inside worker tasks -----------------------------------------------------------------------
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
    """Run an estimator method in :func:`task_scope`, a Ctrl-C during it never lost (see
    :class:`~gdask.gdataset.engine.Interrupts`)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with Interrupts(), task_scope():
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def job_share(gpu: float | None, memory: Any, job_name: str | None, kind: str) -> contextlib.AbstractContextManager:
    """The engine's :func:`~gdask.gdataset.device_share` for the ``gpu``, ``memory`` and
    ``job_name`` parameters (:data:`JOB_PARAMETERS`) of work of ``kind``."""
    return device_share(DeviceShare(gpu, memory, job_name, kind))


def estimator_job(est: Any) -> contextlib.AbstractContextManager:
    """:func:`job_share` of an estimator's ``gpu``, ``memory`` and ``job_name`` parameters (its class
    name the kind of work): blocks made inside the job get the job's private keys."""
    return job_share(getattr(est, "gpu", None), getattr(est, "memory", None), getattr(est, "job_name", None),
                     type(est).__name__)


def _no_rows(blk: Any) -> Any:
    """An empty slice of a block: its array type on its device, for ``output_type="device"`` (a CSR
    block's dense type: of its stored values)."""
    return blk.data[:0] if is_sparse(blk) else blk[:0, ...]


# -- the mixin -----------------------------------------------------------------------------------------
class DeviceEstimatorMixin:
    """What the gdask.ml estimators share: input adaptation, output types, the device share.

    The estimator keeps its parameters as scikit-learn's ``BaseEstimator`` wants them (set in its
    ``__init__``); this mixin reads ``output_type``, ``gpu``, ``memory`` and ``job_name`` when the
    estimator has them. Put it first among the bases: ``class E(DeviceEstimatorMixin, ClassifierMixin,
    BaseEstimator)``.
    """

    #: what ``_input`` turns non-float data into (float16 always becomes float32)
    _ints_to: Any = np.float64
    #: gdask's own fitted diagnostics (``history_``, ``fit_mode_``, timings): documented and readable, but not
    #: listed by ``dir()``, so that the fitted attributes a tool finds by listing (dask-ml's
    #: ``assert_estimator_equal``, tab completion of ``*_``) are exactly scikit-learn's
    _diagnostics: tuple[str, ...] = ()

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) - set(self._diagnostics))

    # -- input ---------------------------------------------------------------------------------------
    def _input(self, X: Any, *, reset: bool, ndim: int | tuple[int, ...] | None = 2,
               dtype: Any = (np.float64, np.float32), allow_nd: bool = False, features: bool = True,
               accept_sparse: Any = False, **validate: Any) -> Input:
        """``X`` adapted (see :class:`Input`).

        Host input goes through scikit-learn's ``validate_data`` (its errors, ``n_features_in_``,
        ``feature_names_in_``; ``dtype`` its list of accepted dtypes, ``validate`` more of its
        keyword arguments, e.g. ``ensure_min_samples``; ``accept_sparse`` its argument: ``"csr"`` turns
        SciPy sparse input of any format into CSR, which :meth:`Input.gdataset` blocks into CSR row
        slices; False refuses sparse input with scikit-learn's error). Other input is cast to a
        float dtype (:attr:`_ints_to` for non-float data, float32 for float16), its ``ndim`` checked,
        and, with ``features``, its column count recorded (``reset``) or checked against the fit's.
        """
        kind = input_kind(X)
        self._output_type(kind)  # a bad output_type fails before any work
        if kind.host:
            from sklearn.utils.validation import validate_data

            return Input(kind, validate_data(self, X, reset=reset, accept_sparse=accept_sparse, dtype=list(dtype),
                                             allow_nd=allow_nd, **validate), X)
        if kind.container == "array":  # CuPy and other device arrays; cuDF becomes a GDataSet
            data = from_dataframe(X) if hasattr(X, "columns") else X
        else:
            data = _adapt_lazy(X)
        to = _float_dtype(data.dtype, self._ints_to)
        if to is not None:
            data = data.astype(to) if isinstance(data, GDataSet) else astype(data, to)
        if ndim is not None and data.ndim not in ((ndim,) if isinstance(ndim, int) else ndim):
            want = "2-D data (n_samples, n_features)" if ndim == 2 else f"{ndim}-D data"
            raise ValueError(f"{type(self).__name__} needs {want}, got shape {tuple(data.shape)}")
        if features:
            self._set_features(data, reset)
        return Input(kind, data, X)

    def _input_xy(self, X: Any, y: Any, **kw: Any) -> tuple[Input, Any]:
        """(:meth:`_input` of ``X``, ``y``); host ``X`` with in-memory host ``y`` is validated
        together by scikit-learn (``check_X_y``: consistent lengths, a 1-D ``y``), which returns the
        validated ``y``; else ``y`` comes back as it was given."""
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None")
        if not (input_kind(X).host and input_kind(y).host):
            return self._input(X, reset=True, **kw), y
        from sklearn.utils.validation import validate_data

        dtype = kw.get("dtype", (np.float64, np.float32))
        data, y = validate_data(self, X, y, y_numeric=False, reset=True, accept_sparse=kw.get("accept_sparse", False),
                                dtype=list(dtype), allow_nd=kw.get("allow_nd", False))
        return Input(input_kind(X), data, X), y

    def _set_features(self, data: Any, reset: bool) -> None:
        """Record (``reset``) or check the column count and names of non-host input."""
        columns = getattr(data, "columns", None)
        if reset:
            self.n_features_in_ = int(data.shape[1])
            if columns is not None:
                self.feature_names_in_ = np.asarray(columns, dtype=object)
            elif hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
        elif data.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {data.shape[1]} features, but {type(self).__name__} is expecting "
                             f"{self.n_features_in_} features as input.")

    # -- output --------------------------------------------------------------------------------------
    def _output_type(self, kind: InputKind) -> str:
        """The array type ("numpy", "cupy" or "device") of in-memory results for input of ``kind``."""
        out = getattr(self, "output_type", None)
        if out is None:
            out = config.get("output-type", "input")
        if out not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES} (or None: config gdask.output-type), "
                             f"got {out!r}")
        return kind.array if out == "input" else out

    def _to_output(self, value: Any, kind: InputKind, data: Any = None) -> Any:
        """An in-memory result (host NumPy, or already on a device) as the output type for input of
        ``kind``; ``data`` (the GDataSet it came from, if any) tells the devices' array type for
        ``"device"``. Non-numeric results (string class labels) stay NumPy: device arrays hold numbers."""
        if isinstance(value, np.ndarray) and value.dtype.kind not in "biufc":
            return value
        target = self._output_type(kind)
        if target == "numpy":
            return to_numpy(value)
        if target == "cupy":
            if module_name(value) == "cupy":
                return value
            try:
                import cupy
            except ImportError as e:
                raise ImportError("output_type='cupy' needs CuPy, which is not installed; use output_type="
                                  "'numpy' or install cupy") from e
            return cupy.asarray(to_numpy(value))
        if not isinstance(value, np.ndarray):
            return value  # already a device array
        if not isinstance(data, GDataSet):  # a result computed here: ask a device for its array type
            data = from_array(np.zeros(1))
        return asarray_like(value, _device_sample(data))

    def _blockwise(self, inp: Input, func: Callable[..., Any], *args: Any, dtype: Any, ncols: Any,
                   name: str) -> Any:
        """``func(block, *args)`` over the blocks of ``inp``: lazy for lazy input (a GDataSet, or a
        dask array for dask input), else computed and returned as the output type."""
        G = inp.gdataset()
        out = G.map_blocks(func, *args, dtype=dtype, ncols=ncols, name=name)
        if inp.kind.container == "gdataset":
            return out
        if inp.kind.container == "dask":
            return as_dask_array(out, inp.kind, inp.original)
        return self._to_output(to_numpy(out.compute()), inp.kind, G)

    # -- the device share ----------------------------------------------------------------------------
    def _job(self) -> contextlib.AbstractContextManager:
        """The device share of the ``gpu``, ``memory`` and ``job_name`` parameters (:func:`estimator_job`)."""
        return estimator_job(self)


def as_dask_array(G: GDataSet, kind: InputKind, like: Any = None) -> Any:
    """A lazy result ``G`` as a dask array for dask input of ``kind``: one chunk per block (NumPy
    chunks for NumPy-backed input, else the devices' arrays), rechunked to the rows of ``like`` (the
    input dask array) when its blocking differs. Nothing is computed."""
    import dask
    import dask.array as da

    tail = tuple(G.shape[1:])
    host = kind.array == "numpy"
    meta = getattr(like, "_meta", None)
    meta = np.empty((0,) * (1 + len(tail)), dtype=G.dtype) if host or meta is None else \
        meta[(slice(0, 0),) * meta.ndim].astype(G.dtype).reshape((0,) * (1 + len(tail)))
    chunks = []
    for b, rows in zip(G.to_delayed(), G.row_blocks):
        v = dask.delayed(to_numpy, pure=True)(b) if host else b
        chunks.append(da.from_delayed(v, shape=(rows, *tail), dtype=G.dtype, meta=meta))
    out = da.concatenate(chunks, axis=0) if len(chunks) > 1 else chunks[0]
    want = getattr(like, "chunks", None)  # its row chunks, the empty ones left out (as GDataSets do)
    want = tuple(c for c in want[0] if c) if isinstance(like, da.Array) and want else None
    if want and not any(np.isnan(c) for c in want) and want != tuple(out.chunks[0]):
        out = out.rechunk({0: want})
    return out


def _device_sample(G: GDataSet) -> Any:
    """A zero-row array of the type of ``G``'s blocks, on their device (one small task)."""
    import dask

    return dask.delayed(_no_rows)(G.block(0)).compute()
