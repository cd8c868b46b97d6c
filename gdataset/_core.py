"""GDataSet: a row-blocked Dask collection whose blocks live in device memory."""

from __future__ import annotations

import math
import numbers
import operator
import warnings
from typing import Any, Callable, Mapping, Sequence

import dask
import dask.array as da
import numpy as np
from dask._task_spec import GraphNode, convert_legacy_task
from dask.array.dispatch import concatenate_lookup
from dask.base import DaskMethodsMixin, tokenize
from dask.core import flatten
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.task_spec import Alias, DataNode, Task, TaskRef

from gdask import protocol
from gdask.gdataset import _blocks, _ops, _output, _same_host, _seq
from gdask.gdataset._repr import gdataset_html
from gdask.gdataset.locality import block_places
from gdask.scheduling import job_salt

__all__ = ["GDataSet"]

#: operands up to this size are embedded in every task; larger ones travel once as a graph node
_EMBED_BYTES = 64 * 1024

_BINOPS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow,
}


def _optimize(dsk, keys, **kwargs):
    """Cull only: block keys must survive optimisation so that persisted blocks are reused."""
    if isinstance(dsk, HighLevelGraph):
        return dsk.cull(set(_flatten(keys)))
    return dask.optimization.cull(dict(dsk), list(flatten(keys)))[0]


def _flatten(keys):
    for k in keys:
        if isinstance(k, list):
            yield from _flatten(k)
        else:
            yield k


@concatenate_lookup.register_lazy("array_api_strict")
def _register_strict_concatenate() -> None:
    """dask.array joins the chunks of a result (``X.sum(0).compute()``) with the namespace's concat
    when they are strict device arrays (NumPy would try to convert them, which they refuse)."""
    import array_api_strict as xps  # optional (the emulated-strict backend): imported when its arrays exist

    def concat(arrays, axis=0):
        return xps.concat(list(arrays), axis=axis)

    concatenate_lookup.register(type(xps.empty(0)), concat)


def device_layer(tasks: Mapping, kind: str) -> MaterializedLayer:
    """A graph layer of device work: every task carries the ``gdask_gpu`` annotation (its kind of
    block operation), which the placement plugin reads, and those of the ``dask.annotate`` contexts
    it is built in (e.g. the priorities of :func:`gdask.window_cache.scan`: a layer given annotations
    of its own would drop them)."""
    return MaterializedLayer(dict(tasks), annotations={**dask.get_annotations(), protocol.ANN_GPU: kind})


def _meta_array(backend: str, shape: tuple[int, ...], dtype: Any):
    if backend == "cupy":
        import cupy  # optional and heavy: only for CuPy blocks

        return cupy.empty(shape, dtype=dtype)
    return np.empty(shape, dtype=dtype)


class _Operands:
    """Turns the operands of a block operation into per-block task arguments and dependencies."""

    def __init__(self, ref: GDataSet, args: Sequence[Any]):
        self.ref = ref
        self.graph: dict[Any, Any] = {}
        self.deps: list[Any] = []
        self.args: list[tuple[str, Any]] = []
        self.metas: list[Any] = []
        for a in args:
            self._add(a)

    def _add(self, a: Any) -> None:
        ref = self.ref
        if isinstance(a, GDataSet):
            if a.row_blocks != ref.row_blocks:
                raise ValueError(
                    "GDataSets in one operation must have the same row blocking; got blocks "
                    f"{_short(a.row_blocks)} and {_short(ref.row_blocks)}. Create both with the same "
                    "block_rows."
                )
            self.deps.append(a)
            self.args.append(("blocks", a.name))
            self.metas.append(_meta_array("numpy", (0,) + a.shape[1:], a.dtype))
        elif isinstance(a, da.Array):
            if a.npartitions != 1:
                a = a.rechunk(a.shape)
            self.deps.append(a)
            self.args.append(("ref", (a.name,) + (0,) * a.ndim))
            self.metas.append(np.zeros(a.shape, dtype=a.dtype))
        elif isinstance(a, Delayed):
            self.deps.append(a)
            self.args.append(("ref", a.key))
            self.metas.append(None)
        elif hasattr(a, "shape") and hasattr(a, "dtype") and getattr(a, "ndim", 0) > 0:
            host = a if isinstance(a, np.ndarray) else _blocks.to_numpy(a)
            if host.nbytes <= _EMBED_BYTES:
                self.args.append(("value", a))
            else:
                key = "operand-" + tokenize(a, *job_salt())
                self.graph[key] = DataNode(key, a)
                self.args.append(("ref", key))
            self.metas.append(np.broadcast_to(np.zeros((), dtype=host.dtype), host.shape))
        else:
            self.args.append(("value", a))
            self.metas.append(a)

    def block_args(self, i: int) -> list[Any]:
        out = []
        for kind, v in self.args:
            if kind == "blocks":
                out.append(TaskRef((v, i)))
            elif kind == "ref":
                out.append(TaskRef(v))
            else:
                out.append(v)
        return out

    def tokens(self) -> list[Any]:
        return [v if kind != "value" else tokenize(v) for kind, v in self.args]


def _as_task(node: Any) -> Any:
    """A legacy tuple task as a ``Task`` (GDataSet layers already hold ``Task`` objects)."""
    if isinstance(node, (Task, DataNode)):
        return node
    return convert_legacy_task(None, node, ())


def _ncols(ncols: Any) -> int | tuple[int, ...] | None:
    """``ncols`` as stored: None (1-D), an int (2-D), or the tuple ``shape[1:]`` of data with more
    trailing dimensions (3-D sequences ``(n, T, f)``: ``(T, f)``)."""
    if ncols is None:
        return None
    if isinstance(ncols, (tuple, list)):
        dims = tuple(int(c) for c in ncols)
        return None if not dims else dims[0] if len(dims) == 1 else dims
    return int(ncols)


def _short(t: tuple[int, ...]) -> str:
    return str(t) if len(t) <= 6 else f"({', '.join(map(str, t[:3]))}, ..., {t[-1]}) ({len(t)} blocks)"


class GDataSet(DaskMethodsMixin):
    """A dataset split into row blocks that live in device memory (GPU or emulated).

    Blocks are NumPy or CuPy arrays in a coalesced, feature-major layout (2-D blocks are
    Fortran-ordered, so ``block.T`` is a C-contiguous ``(features, rows)`` array). 3-D data, ``n``
    sequences of shape ``(T, f)``, is blocked along ``n`` and stored time-major: a block is a
    ``(rows, T, f)`` view of ``(T, rows, f)`` C-contiguous memory, the layout recurrent kernels
    (cuDNN's LSTM) read (see :mod:`gdask.gdataset._seq`); ``ncols`` is then ``(T, f)``. Sparse data
    (:func:`gdask.from_array` of a SciPy sparse matrix) is blocked into CSR row slices (``nnz`` its
    stored values; SciPy CSR on emulated devices, ``cupyx.scipy.sparse`` CSR on CUDA): the K-means and
    logistic regression estimators, ``mean`` / ``var`` / ``std`` over rows, ``astype`` and ``compute``
    (a SciPy CSR matrix) take it. A GDataSet is a
    Dask collection: ``dask.compute``, ``dask.persist``, ``client.compute`` and ``.compute()`` work.
    Keys are derived from content and operation, so rebuilding the same computation gives the same
    keys.

    Create one with :func:`gdask.from_array`, :func:`gdask.from_dask_array` or
    :func:`gdask.from_dataframe` rather than directly.
    """

    __array_priority__ = 20

    def __init__(self, dsk: HighLevelGraph, name: str, row_blocks: Sequence[int], ncols: int | None,
                 dtype: Any, backend: str = "numpy", columns: Sequence[str] | None = None,
                 input_type: str = "numpy", nnz: int | None = None) -> None:
        if not isinstance(dsk, HighLevelGraph):
            dsk = HighLevelGraph.from_collections(name, dict(dsk), dependencies=())
        self.dask = dsk
        self.name = name
        self.row_blocks = tuple(int(r) for r in row_blocks)
        self.ncols = _ncols(ncols)
        self.dtype = np.dtype(dtype)
        self.backend = backend
        self.columns = None if columns is None else list(columns)
        #: the array type this dataset was made from ("numpy", "cupy" or "device"): what ``compute()``
        #: and reductions return under config ``gdask.output-type: input`` (see :mod:`gdask.gdataset._output`)
        self.input_type = input_type
        #: stored values of a dataset of CSR blocks (see the class docs); None: dense blocks
        self.nnz = None if nnz is None else int(nnz)

    # -- Dask collection protocol ---------------------------------------------------------------
    def __dask_graph__(self) -> HighLevelGraph:
        return self.dask

    def __dask_keys__(self) -> list[tuple[str, int]]:
        return [(self.name, i) for i in range(self.nblocks)]

    def __dask_layers__(self) -> tuple[str, ...]:
        return (self.name,)

    def __dask_tokenize__(self) -> str:
        return self.name

    __dask_optimize__ = staticmethod(_optimize)
    __dask_scheduler__ = staticmethod(dask.threaded.get)

    def __dask_postcompute__(self):
        return _output.join_blocks, (_output.output_type(self.input_type),)

    def compute(self, output_type: str | None = None, **kwargs: Any) -> Any:
        """The whole dataset as one array, its blocks joined along the rows (see ``dask.compute``).

        Parameters
        ----------
        output_type : {"input", "numpy", "cupy", "device"}, optional
            Array type of the result: "input" the type the dataset was made from (:attr:`input_type`:
            NumPy for NumPy data, also on GPUs), "numpy", "cupy", or "device" (the devices' blocks as
            they are). Default: config ``gdask.output-type`` ("input").
        **kwargs
            Passed to ``dask.compute`` (e.g. ``scheduler=``).
        """
        if output_type is None:
            return super().compute(**kwargs)
        _output.output_type(self.input_type, output_type)  # a bad value fails before any work
        with dask.config.set({"gdask.output-type": output_type}):
            return super().compute(**kwargs)

    def __dask_postpersist__(self):
        return self._rebuild, ()

    def persist(self, **kwargs: Any) -> GDataSet:
        """Compute the blocks into cluster (device) memory and return a GDataSet that points at
        them (see ``dask.persist``). Blocks made from in-memory arrays travel to the workers in the
        graph, once: Dask's "Sending large graph" warning about them is silenced here, since its
        advice (load the data with Dask, or scatter it) is what this call does."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
            done = _same_host.held(self, kwargs)  # every block held already: nothing to send
            if done is None:
                done = _same_host.persist(self, kwargs)  # on one host: the blocks through shared memory
            return done if done is not None else super().persist(**kwargs)

    def _rebuild(self, dsk, *, rename: dict | None = None) -> GDataSet:
        name = rename.get(self.name, self.name) if rename else self.name
        out = GDataSet(dsk, name, self.row_blocks, self.ncols, self.dtype, self.backend, self.columns,
                       input_type=self.input_type, nnz=self.nnz)
        out._versions = self._versions
        return out

    # -- block versions (incremental updates) ------------------------------------------------------
    _versions: tuple[int, ...] | None = None

    @property
    def block_versions(self) -> tuple[int, ...]:
        """Version of every block: 0 at creation, +1 each time :meth:`update_blocks` replaces it."""
        return self._versions if self._versions is not None else (0,) * self.nblocks

    def update_blocks(self, blocks: Mapping[int, Any]) -> GDataSet:
        """A new version of this dataset with some blocks replaced; the others are unchanged.

        Unchanged blocks keep their task (same work under the new name), so under
        :func:`gdask.incremental` everything computed from them is reused and only what depends on
        the replaced blocks runs again. Without a tracker this is an ordinary new dataset.

        Parameters
        ----------
        blocks : dict
            ``{block index: new block}``; each new block is a host or device array with the same
            number of rows and columns as the block it replaces.

        Returns
        -------
        GDataSet
            Same blocking; :attr:`block_versions` bumped for the replaced blocks.

        Examples
        --------
        >>> X = gdask.from_array(np.zeros((8, 2)), block_rows=4)
        >>> X2 = X.update_blocks({1: np.ones((4, 2))})
        >>> X2.block_versions
        (0, 1)
        """
        versions = list(self.block_versions)
        new = {}
        for i, b in dict(blocks).items():
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -self.nblocks <= i < self.nblocks:
                raise IndexError(f"block index {i!r} out of range for a GDataSet with {self.nblocks} blocks")
            i = int(i) % self.nblocks
            want = (self.row_blocks[i], *self.shape[1:])
            if tuple(getattr(b, "shape", ())) != want:
                raise ValueError(f"new block {i} must have shape {want} like the block it replaces, got "
                                 f"{getattr(b, 'shape', None)}")
            if b.dtype != self.dtype:
                b = b.astype(self.dtype)
            new[i] = b
            versions[i] += 1
        if not new:
            return self
        name = f"{self.name.rsplit('-', 1)[0]}-{tokenize(self.name, {i: tokenize(b) for i, b in new.items()})}"
        old = self.dask.layers[self.name] if self.name in self.dask.layers else self.dask
        layer = {}
        for i in range(self.nblocks):
            key = (name, i)
            if i in new:
                layer[key] = Task(key, _blocks.to_device, new[i])
            else:  # same task under the new key: same fingerprint, so reusable
                node = old[(self.name, i)]
                task = None if isinstance(node, TaskRef) else _as_task(node)
                if isinstance(node, TaskRef):  # a persisted block (a Future): point at it
                    layer[key] = Alias(key, node.key)
                elif isinstance(task, GraphNode):
                    layer[key] = task.substitute({}, key=key)
                else:  # the block itself (persisted inside gdask.incremental: its graph holds the data)
                    layer[key] = DataNode(key, task)
        graph = HighLevelGraph.from_collections(name, device_layer(layer, "update"), dependencies=[self])
        out = GDataSet(graph, name, self.row_blocks, self.ncols, self.dtype, self.backend, self.columns,
                       input_type=self.input_type)
        out._versions = tuple(versions)
        return out

    # -- shape -----------------------------------------------------------------------------------
    @property
    def nblocks(self) -> int:
        return len(self.row_blocks)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        n = sum(self.row_blocks)
        if self.ncols is None:
            return (n,)
        return (n, *self.ncols) if isinstance(self.ncols, tuple) else (n, self.ncols)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks (CSR blocks: their values, 64-bit column indices and row pointers)."""
        if self.nnz is not None:  # CSR blocks
            return self.nnz * (self.dtype.itemsize + 8) + (self.shape[0] + self.nblocks) * 8
        return self.size * self.dtype.itemsize

    @property
    def block_offsets(self) -> tuple[int, ...]:
        out, acc = [], 0
        for r in self.row_blocks:
            out.append(acc)
            acc += r
        return tuple(out)

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def T(self) -> _Transposed:
        return _Transposed(self)

    def block(self, i: int) -> Delayed:
        """Block ``i`` as a ``dask.delayed`` value."""
        if not -self.nblocks <= i < self.nblocks:
            raise IndexError(f"block {i} out of range for a GDataSet with {self.nblocks} blocks")
        return Delayed((self.name, i % self.nblocks), self.dask, layer=self.name)

    def reduce_groups(self, chunk: Callable[..., Any], combine: Callable[[list], Any], *args: Any,
                      groups: Sequence[Sequence[int]] | None = None, name: str | None = None,
                      host: bool = True, **kwargs: Any) -> list[Delayed]:
        """First level of :meth:`reduce_blocks` only: one ``dask.delayed`` partial per group.

        Each group's task runs ``chunk(block, *args)`` on its blocks and ``combine``s them where the
        blocks live; the caller combines the (few, small) results, typically on the client with
        ``combine(dask.compute(*parts))``. This saves the root task and its transfers, which is a
        good part of an iteration's latency in a loop such as K-means. ``groups`` defaults to
        :meth:`block_groups` (or one group per block when not persisted). With ``host`` (default)
        the partials come back as NumPy data, so the caller needs no GPU.
        """
        if groups is None:
            groups = self.block_groups() or [[i] for i in range(self.nblocks)]
        keys, graph, layer = _tree_reduce(self, chunk, combine, args, kwargs, name=name, groups=groups, root=False,
                                          group_kwargs={"host": host})
        return [Delayed(k, graph, layer=layer) for k in keys]

    def block_groups(self, client: Any = None) -> list[list[int]] | None:
        """Block indices grouped by the worker thread that holds them, for ``reduce_blocks(groups=)``.

        Each worker's blocks are split into as many groups as it has threads, so grouped tasks still
        use every thread (stream). ``None`` when there is no Dask client or the blocks are not
        persisted. Waits for blocks still being persisted and asks the scheduler where they are:
        call it once per loop, not per iteration.
        """
        places = block_places(self, client, wait_ready=True)
        return None if places is None else places.groups(self.nblocks)

    def to_delayed(self) -> list[Delayed]:
        return [self.block(i) for i in range(self.nblocks)]

    # -- building blocks ---------------------------------------------------------------------------
    def map_blocks(self, func: Callable[..., Any], *args: Any, dtype: Any = None, ncols: Any = "infer",
                   name: str | None = None, **kwargs: Any) -> GDataSet:
        """Apply ``func(block, *args, **kwargs)`` to every block; the result keeps the row blocking.

        Other GDataSets in ``args`` (same blocking) are passed block by block; small arrays,
        scalars and single-chunk dask arrays are passed whole. ``func`` gets device arrays
        (NumPy on emulated devices, CuPy on CUDA) in the coalesced layout and must return an array
        with the block's number of rows.

        Parameters
        ----------
        func : callable
            Block kernel (NumPy, CuPy, numba, ... code).
        dtype, ncols : optional
            Output dtype and number of columns (``None`` for 1-D output). By default inferred by
            calling ``func`` on empty blocks.
        name : str, optional
            Key prefix; defaults to the function's name.
        """
        return _elemwise(_ops.RowsChecked(func), self, *args, dtype=dtype, ncols=ncols,
                         name=name or _ops.fname(func), kwargs=kwargs)

    def reduce_blocks(self, chunk: Callable[..., Any], combine: Callable[[list], Any], *args: Any,
                      finalize: Callable[[Any], Any] | None = None, split_every: int = 8,
                      name: str | None = None, groups: Sequence[Sequence[int]] | None = None,
                      **kwargs: Any) -> Delayed:
        """Tree reduction over blocks: ``chunk(block, *args)`` per block, then ``combine(list)``.

        Returns a ``dask.delayed`` object whose ``.compute()`` gives ``finalize(combined)``.
        ``groups`` (lists of block indices, see :meth:`block_groups`) runs each group's chunks in
        one task and combines them there: fewer tasks and transfers when a group's blocks share a
        worker. ``combine`` must then accept partials of a group as well as combined values.
        """
        key = _tree_reduce(self, chunk, combine, args, kwargs, finalize=finalize, split_every=split_every,
                           name=name, groups=groups)
        return Delayed(key[0], key[1])

    # -- elementwise -----------------------------------------------------------------------------
    def _binop(self, op: str, other: Any, reverse: bool = False) -> GDataSet:
        if not isinstance(other, (GDataSet, numbers.Number, np.generic, da.Array)) and not hasattr(other, "shape"):
            return NotImplemented
        f = _BINOPS.get(op) or getattr(operator, op)
        return _elemwise(f, other, self) if reverse else _elemwise(f, self, other)

    def __add__(self, o): return self._binop("add", o)
    def __radd__(self, o): return self._binop("add", o, True)
    def __sub__(self, o): return self._binop("sub", o)
    def __rsub__(self, o): return self._binop("sub", o, True)
    def __mul__(self, o): return self._binop("mul", o)
    def __rmul__(self, o): return self._binop("mul", o, True)
    def __truediv__(self, o): return self._binop("truediv", o)
    def __rtruediv__(self, o): return self._binop("truediv", o, True)
    def __floordiv__(self, o): return self._binop("floordiv", o)
    def __rfloordiv__(self, o): return self._binop("floordiv", o, True)
    def __mod__(self, o): return self._binop("mod", o)
    def __pow__(self, o): return self._binop("pow", o)
    def __rpow__(self, o): return self._binop("pow", o, True)
    def __lt__(self, o): return self._binop("lt", o)
    def __le__(self, o): return self._binop("le", o)
    def __gt__(self, o): return self._binop("gt", o)
    def __ge__(self, o): return self._binop("ge", o)
    def __eq__(self, o): return self._binop("eq", o)  # type: ignore[override]
    def __ne__(self, o): return self._binop("ne", o)  # type: ignore[override]
    def __neg__(self): return _elemwise(operator.neg, self)
    def __abs__(self): return _elemwise(operator.abs, self)
    __hash__ = None  # type: ignore[assignment]

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs.get("out") is not None or ufunc.nout != 1:
            return NotImplemented
        return _elemwise(_ops.apply_ufunc, *inputs, kwargs={"ufunc": ufunc, **kwargs}, name=ufunc.__name__)

    def __array_function__(self, func, types, args, kwargs):
        method = {np.sum: "sum", np.mean: "mean", np.std: "std", np.min: "min", np.max: "max",
                  np.argmin: "argmin", np.argmax: "argmax"}.get(func)
        if method is None:
            return NotImplemented
        return getattr(args[0], method)(*args[1:], **kwargs)

    def __array__(self, dtype=None, copy=None):
        raise TypeError(
            "A GDataSet is lazy and lives on devices; call .compute() to get a NumPy/CuPy array "
            "(np.asarray would silently move all the data)."
        )

    def astype(self, dtype: Any) -> GDataSet:
        dtype = np.dtype(dtype)
        if dtype.kind not in "biuf":
            raise TypeError(f"GDataSet blocks must have a numeric (bool, integer or float) dtype; astype({dtype}) "
                            "is not one. Compute to NumPy first for strings or objects.")
        out = _elemwise(_blocks.block_astype, self, dtype, dtype=dtype, ncols=self.ncols, name="astype")
        out.nnz = self.nnz  # CSR blocks stay CSR
        return out

    def __getitem__(self, index: Any) -> GDataSet:
        """``X[:, ...]`` indexes within rows (``X[:, j]``, ``X[:, -1, :]``); ``X[rows]`` /
        ``X[rows, ...]`` selects rows (ascending integer array, boolean mask or slice): each selected
        row stays in its block, so no block moves between devices, and blocks left empty are dropped
        (mini-batches, train/validation splits)."""
        if not isinstance(index, tuple):
            index = (index,)
        if index and not (isinstance(index[0], slice) and index[0] == slice(None)):
            out = _select_rows(self, index[0])
            return out if len(index) == 1 else out[(slice(None), *index[1:])]
        if not index:
            raise NotImplementedError(
                "GDataSet indexing keeps all rows: use X[:, None], X[:, j] or X[:, cols], or X[rows] to select rows"
            )
        return _elemwise(_blocks.getitem, self, index, name="getitem")

    # -- matmul ----------------------------------------------------------------------------------
    def __matmul__(self, other: Any) -> GDataSet:
        if self.ndim != 2:
            raise ValueError("X @ W needs a 2-D GDataSet")
        shape = getattr(other, "shape", None)
        if shape is None or len(shape) not in (1, 2) or shape[0] != self.ncols:
            raise ValueError(
                f"X @ W needs W of shape ({self.ncols},) or ({self.ncols}, m) for X of shape {self.shape}; "
                f"got {shape}"
            )
        if isinstance(other, GDataSet):
            raise ValueError("X @ Y with two row-blocked GDataSets is not a small-operand product; use X.T @ Y")
        return _elemwise(_blocks.matmul_right, self, other, name="matmul",
                         ncols=None if len(shape) == 1 else shape[1],
                         dtype=np.result_type(self.dtype, other.dtype))

    # -- reductions ------------------------------------------------------------------------------
    def _check_axis(self, axis: Any, allowed: tuple) -> None:
        if self.ndim == 3 and allowed == (None, 0):  # sequences: also over rows and time steps
            allowed = (None, 0, (0, 1))
        if axis not in allowed:
            raise ValueError(f"axis must be one of {allowed} for this reduction, got {axis!r}")

    def sum(self, axis: int | None = None) -> da.Array:
        """Sum over rows (``axis=0``) or everything (``axis=None``); a one-chunk dask array."""
        self._check_axis(axis, (None, 0))
        dtype = np.sum(np.zeros(1, self.dtype)).dtype
        return _reduction(self, _ops.sum_chunk, _ops.sum_combine, None, axis, dtype, "sum")

    def mean(self, axis: int | None = None) -> da.Array:
        self._check_axis(axis, (None, 0))
        dtype = np.mean(np.zeros(1, self.dtype)).dtype
        return _reduction(self, _ops.moment_chunk, _ops.moment_combine, _ops.mean_finalize, axis, dtype, "mean")

    def std(self, axis: int | None = None, ddof: int = 0) -> da.Array:
        self._check_axis(axis, (None, 0))
        dtype = np.mean(np.zeros(1, self.dtype)).dtype
        return _reduction(self, _ops.moment_chunk, _ops.moment_combine, _ops.std_finalize, axis, dtype, "std",
                          finalize_args=(ddof,))

    def var(self, axis: int | None = None, ddof: int = 0) -> da.Array:
        self._check_axis(axis, (None, 0))
        dtype = np.mean(np.zeros(1, self.dtype)).dtype
        return _reduction(self, _ops.moment_chunk, _ops.moment_combine, _ops.var_finalize, axis, dtype, "var",
                          finalize_args=(ddof,))

    def min(self, axis: int | None = None) -> da.Array:
        self._check_axis(axis, (None, 0))
        return _reduction(self, _ops.min_chunk, _ops.min_combine, None, axis, self.dtype, "min")

    def max(self, axis: int | None = None) -> da.Array:
        self._check_axis(axis, (None, 0))
        return _reduction(self, _ops.max_chunk, _ops.max_combine, None, axis, self.dtype, "max")

    def argmin(self, axis: int = 1) -> GDataSet:
        """Per-row index of the smallest value (``axis=1``): a 1-D GDataSet."""
        self._check_axis(axis, (1, -1))
        return _elemwise(_ops.argmin1, self, name="argmin", ncols=None, dtype=np.intp)

    def argmax(self, axis: int = 1) -> GDataSet:
        self._check_axis(axis, (1, -1))
        return _elemwise(_ops.argmax1, self, name="argmax", ncols=None, dtype=np.intp)

    # -- display ---------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"GDataSet<shape={self.shape}, dtype={self.dtype}, nblocks={self.nblocks}, "
                f"block_rows={_short(self.row_blocks)}, backend={self.backend}, name={self.name}>")

    def _repr_html_(self) -> str:
        return gdataset_html(self)


class _Transposed:
    """``X.T``: only for ``X.T @ Y`` (a small dense result reduced over blocks)."""

    def __init__(self, x: GDataSet) -> None:
        self.x = x

    @property
    def shape(self) -> tuple[int, ...]:
        return self.x.shape[::-1]

    def __matmul__(self, other: Any) -> da.Array:
        x = self.x
        if x.ndim > 2 or getattr(other, "ndim", 0) > 2:
            raise ValueError("X.T @ Y needs 1-D or 2-D GDataSets; reshape sequences with map_blocks first")
        if not isinstance(other, GDataSet):
            raise TypeError("X.T @ Y needs Y to be a GDataSet with the same row blocking as X")
        ncols = x.ncols
        shape = tuple(s for s in (ncols, other.ncols) if s is not None)
        dtype = np.result_type(x.dtype, other.dtype)
        return _reduction(x, _blocks.tmatmul, _ops.sum_combine, None, "tmatmul", dtype, "tmatmul",
                          extra=(other,), shape=shape)


# -- graph builders ------------------------------------------------------------------------------
def _elemwise(func: Callable, *args: Any, dtype: Any = None, ncols: Any = "infer", name: str | None = None,
              kwargs: dict | None = None) -> GDataSet:
    """A GDataSet whose block i is ``func(*args_i, **kwargs)``."""
    kwargs = kwargs or {}
    ref = next((a for a in args if isinstance(a, GDataSet)), None)
    if ref is None:
        raise TypeError("a block operation needs at least one GDataSet operand")
    ops = _Operands(ref, args)
    if ncols == "infer" or dtype is None:
        metas = [m if m is not None else np.zeros(()) for m in ops.metas]
        try:
            with np.errstate(all="ignore"):
                meta = np.asarray(func(*metas, **kwargs))
        except Exception as e:
            raise ValueError(
                f"could not infer the output of {_ops.fname(func)} from empty blocks ({type(e).__name__}: {e}); "
                "pass dtype= and ncols= (None for 1-D output)"
            ) from e
        if ncols == "infer":
            if meta.ndim not in (1, 2, 3):
                raise ValueError(f"{_ops.fname(func)} must return 1-D, 2-D or 3-D blocks, got {meta.ndim}-D")
            ncols = _ncols(meta.shape[1:])
        if dtype is None:
            dtype = meta.dtype
    prefix = name or _ops.fname(func)
    out = f"{prefix}-{tokenize(func, *ops.tokens(), kwargs, ref.row_blocks)}"
    layer = dict(ops.graph)
    for i in range(ref.nblocks):
        layer[(out, i)] = Task((out, i), _blocks.block_op, func, *ops.block_args(i), **kwargs)
    graph = HighLevelGraph.from_collections(out, device_layer(layer, "block"), dependencies=ops.deps)
    return GDataSet(graph, out, ref.row_blocks, ncols, dtype, ref.backend, input_type=ref.input_type)


def _tree_reduce(x: GDataSet, chunk, combine, args, kwargs, *, finalize=None, finalize_args=(),
                 split_every: int = 8, name: str | None = None, extra: tuple = (),
                 groups: Sequence[Sequence[int]] | None = None, root: bool = True,
                 group_kwargs: dict | None = None):
    """Build a reduction tree over ``x``'s blocks; returns (final key, graph).

    With ``groups`` (lists of block indices, e.g. from :meth:`GDataSet.block_groups`), the first
    level is one task per group that runs ``chunk`` on each of its blocks and combines locally.
    With ``root=False`` only that first level is built: returns (list of its keys, graph, layer name).
    """
    if split_every < 2:
        raise ValueError(f"split_every must be >= 2, got {split_every}")
    ops = _Operands(x, (x,) + tuple(extra) + tuple(args))
    prefix = name or _ops.fname(chunk)
    if groups is not None:
        groups = [list(g) for g in groups if len(g)]
        if sorted(i for g in groups for i in g) != list(range(x.nblocks)):
            raise ValueError(f"groups must cover each of the {x.nblocks} blocks exactly once")
    token = tokenize(chunk, combine, finalize, finalize_args, *ops.tokens(), kwargs, split_every, groups,
                     group_kwargs, root)
    part = f"{prefix}-partial-{token}"
    layer = dict(ops.graph)
    level = []
    if groups is None:
        for i in range(x.nblocks):
            layer[(part, i)] = Task((part, i), _blocks.partial_op, chunk, *ops.block_args(i), **kwargs)
            level.append((part, i))
    else:
        for gi, g in enumerate(groups):
            flat = [a for i in g for a in ops.block_args(i)]
            layer[(part, gi)] = Task((part, gi), _blocks.group_partial_op, chunk, combine,
                                     len(flat) // len(g), *flat, **(group_kwargs or {}), **kwargs)
            level.append((part, gi))
    if not root:
        return level, HighLevelGraph.from_collections(part, device_layer(layer, "reduce"), dependencies=ops.deps), part
    final = f"{prefix}-{token}"
    fin = None if finalize is None else (finalize, tuple(finalize_args))
    depth = 0
    while len(level) > split_every:
        depth += 1
        nxt = []
        for j in range(0, len(level), split_every):
            k = (f"{prefix}-combine-{token}", depth, j // split_every)
            layer[k] = Task(k, _blocks.combine_op, combine, *[TaskRef(r) for r in level[j:j + split_every]])
            nxt.append(k)
        level = nxt
    # the last combine and the finalize run in one task: one scheduler round trip less per reduction
    layer[final] = Task(final, _blocks.combine_op, combine, *[TaskRef(r) for r in level], finalize=fin)
    graph = HighLevelGraph.from_collections(final, device_layer(layer, "reduce"), dependencies=ops.deps)
    return final, graph


def _reduction(x: GDataSet, chunk, combine, finalize, axis, dtype, name, *, finalize_args=(), extra=(),
               shape=None) -> da.Array:
    dtype = np.dtype(dtype)
    if axis == "tmatmul":
        args: tuple = ()
    else:
        args = (axis,)
        # over rows: the trailing shape; over (rows, time steps) of sequences: the features
        shape = () if axis is None else x.shape[1 + (len(axis) - 1 if isinstance(axis, tuple) else 0):]
    if finalize is None:
        finalize, finalize_args = _ops.plain_finalize, (dtype,)
    else:
        finalize_args = (dtype,) + tuple(finalize_args)
    final, graph = _tree_reduce(x, chunk, combine, args, {}, finalize=finalize, finalize_args=finalize_args,
                                name=name, extra=extra)
    # expose the result as a one-chunk dask array under its own name, in the output type (converted where
    # it was computed: NumPy data gives a NumPy result, which block operations move back to the device)
    target = _output.output_type(x.input_type)
    aname = f"{name}-result-{target}-{final.rsplit('-', 1)[-1]}"
    akey = (aname,) + (0,) * len(shape)
    layer = {akey: Task(akey, _output.to_output, TaskRef(final), target)}
    graph = HighLevelGraph.from_collections(aname, layer, dependencies=[_GraphHolder(final, graph)])
    chunks = tuple((s,) for s in shape)
    meta_backend = {"numpy": "numpy", "cupy": "cupy"}.get(target, x.backend)
    return da.Array(graph, aname, chunks, meta=_meta_array(meta_backend, (0,) * len(shape), dtype))


def _select_rows(x: Any, index: Any) -> Any:
    """``x[index]`` along the rows: a GDataSet with the selected rows, each left in its block
    (blocks without selected rows are dropped); see :meth:`GDataSet.__getitem__`."""
    n = x.shape[0]
    rows = _seq.row_index(index, n)
    if rows.size == 0:
        raise IndexError("the row selection selects no rows; a GDataSet cannot be empty")
    bounds = np.asarray((*x.block_offsets, n), dtype=np.int64)
    cuts = np.searchsorted(rows, bounds, side="left")
    name = f"rows-{tokenize(x.name, rows)}"
    layer, sizes = {}, []
    for i in range(x.nblocks):
        local = rows[cuts[i]:cuts[i + 1]] - bounds[i]
        if local.size == 0:
            continue
        key = (name, len(sizes))
        layer[key] = Task(key, _blocks.block_op, _seq.take_rows, TaskRef((x.name, i)), local)
        sizes.append(int(local.size))
    graph = HighLevelGraph.from_collections(name, device_layer(layer, "block"), dependencies=[x])
    return GDataSet(graph, name, sizes, x.ncols, x.dtype, x.backend, x.columns, input_type=x.input_type)


class _GraphHolder:
    """Minimal collection wrapper so a raw HighLevelGraph can be a dependency."""

    def __init__(self, name, graph):
        self.name = name
        self.graph = graph

    def __dask_graph__(self):
        return self.graph

    def __dask_layers__(self):
        return (self.name,)
