"""What the numba.cuda kernels of gdask.ml share: numba.cuda imported on first use, whether the
kernels can run here, inputs and streams, launch shapes, the compiled-kernel cache, device functions
and the fixed-order reduction of per-thread-block partials.

Inputs are CuPy arrays (or any object with ``__cuda_array_interface__``), and the kernels run on the
caller's stream (``stream=``, by default CuPy's current stream). Under the CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) they take NumPy arrays and run on the simulator's default stream, with
small thread blocks: that is how the kernels are tested without a GPU.

numba.cuda is imported on the first call (``import gdask`` and the kernel modules do not import it),
and each kernel is compiled once per name and block dtype (:data:`KERNELS`). Kernels name ``cuda`` as
a global of the module that defines them, which the simulator swaps for its own per-launch module:
:func:`kernel` binds it in that module before the factory compiles. The simulator runs one launch at
a time: call the kernels from one thread when ``NUMBA_ENABLE_CUDASIM=1``. The threads of a block
create a shared array on first use, unlocked, so two threads racing there could each get their own:
:func:`numba_cuda` makes that creation atomic (:func:`_atomic_simulated_shared`).

Sums are deterministic: no floating-point atomics. Each thread block writes its partials to its own
row of a ``(grid, ...)`` buffer, and :func:`sum_partials` adds the rows in thread-block order. So a
kernel run twice on the same block with the same grid gives the same bits.
"""

# Kernels spell out min / max as comparisons: numba's built-in CUDA target fails to type the
# builtins for floats (checked with numba 0.68 compiling PTX for sm_90).
# ruff: noqa: PLR1730, FURB136

from __future__ import annotations

import importlib
import logging
import threading
from contextlib import nullcontext
from typing import Any, Callable

import numpy as np

logger = logging.getLogger("gdask.ml")

cuda: Any = None

#: threads per block on a GPU, and in the simulator (where every thread is a Python thread)
THREADS = 256
SIM_THREADS = 32
#: blocks per multiprocessor of a grid on a GPU; the whole grid in the simulator, kept small so that
#: its grid-stride loops run several rounds on small test blocks
BLOCKS_PER_SM = 4
SIM_MAX_BLOCKS = 4
#: shared memory a kernel asks for at most (bytes): under the 48 KiB a block gets without opting in
SHARED_BUDGET = 40 * 1024

_lock = threading.RLock()  # a factory asks for the shared device functions under it
#: compiled kernels (numba dispatchers), by kernel name and block dtype
KERNELS: dict[tuple[str, str], Any] = {}
_SM_COUNT: list[int] = []


class CudaKernelError(ValueError):
    """A block or an operand that the CUDA kernels cannot take (the message names the fix)."""


def numba_cuda() -> Any:
    """The ``numba.cuda`` module, imported on the first call."""
    global cuda
    if cuda is None:
        from numba import cuda as module

        if simulating():
            _atomic_simulated_shared()
        cuda = module
    return cuda


def _atomic_simulated_shared() -> None:
    """Make the simulator's creation of static shared arrays atomic. It keys a block's arrays by the
    line that creates them and creates a missing one without a lock: a thread switch between the
    look-up and the store gave two threads of one block two arrays (an atomic add lost, partial sums
    split: a rare wrong count under load). Here the ``n``-th static array a thread creates in a
    launch is the launch's ``n``-th, created under a lock: the kernels create theirs at the top, in
    the same order in every thread (the simulator's own assumption: each such line once per thread).
    Dynamic shared memory (size 0) is the simulator's. Idempotent; every launch gets it."""
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, "_gdask_atomic", False):
        return
    create = shared.array
    guard = threading.Lock()
    mine = threading.local()  # per simulated thread: (its launch's shared memory, arrays it created)

    def array(self: Any, shape: Any, dtype: Any, alignment: Any = None) -> Any:
        if shape == 0 or alignment is not None:  # dynamic shared memory, or the simulator's refusal
            return create(self, shape, dtype, alignment)
        seen = getattr(mine, "seen", None)
        if seen is None or seen[0] is not self:
            seen = mine.seen = [self, 0]
        where = ("gdask static shared array", seen[1])
        seen[1] += 1
        with guard:
            found = self._allocations.get(where)
            if found is None:
                if isinstance(dtype, kernelapi.types.Type):  # the simulator's own conversion
                    dtype = kernelapi.numpy_support.as_dtype(dtype)
                found = self._allocations[where] = kernelapi.np.empty(shape, dtype)
        return found

    array._gdask_atomic = True  # type: ignore[attr-defined]
    shared.array = array


def simulating() -> bool:
    """Whether numba runs CUDA kernels in its simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    from numba.core import config

    return bool(config.ENABLE_CUDASIM)


_USABLE: list[bool] = []


def usable() -> bool:
    """Whether the kernels can run on CuPy blocks in this process: numba.cuda imports and sees a driver
    and a GPU, and the simulator (which runs on NumPy arrays) is off. Checked once per process; when
    not, the reason is logged once and CuPy blocks take the array API code."""
    if simulating():
        return False
    if not _USABLE:
        with _lock:
            if not _USABLE:
                try:
                    ok = bool(numba_cuda().is_available()) and _smoke_test()
                    why = "numba.cuda finds no usable GPU or driver, or its test kernel gave a wrong sum"
                except Exception as e:  # noqa: BLE001 - numba.cuda missing or broken: reported, then not used
                    ok, why = False, f"numba.cuda cannot be used: {type(e).__name__}: {e}"
                if not ok:
                    logger.warning("gdask: %s; CuPy blocks run the array API code instead of the CUDA kernels", why)
                _USABLE.append(ok)
    return _USABLE[0]


# -- host side: inputs, streams, launch shapes ------------------------------------------------------
def array_module_of(x: Any) -> Any:
    """The array module that holds the kernels' inputs and outputs: NumPy under the simulator, else
    CuPy (for any object with ``__cuda_array_interface__``)."""
    if simulating():
        if not isinstance(x, np.ndarray):
            raise CudaKernelError(f"the CUDA simulator runs kernels on NumPy arrays, got {type(x).__name__}; "
                                  "pass the block as a NumPy array when NUMBA_ENABLE_CUDASIM=1")
        return np
    if not hasattr(x, "__cuda_array_interface__"):
        raise CudaKernelError(f"the CUDA kernels need a device array (CuPy), got {type(x).__name__}; move the "
                              "block to the GPU first (cupy.asarray), use the CPU kernels of gdask.ml.kernels, "
                              "or set NUMBA_ENABLE_CUDASIM=1 to run the kernels on NumPy in the simulator")
    import cupy

    return cupy


def float_block(blk: Any, name: str = "block") -> Any:
    xp = array_module_of(blk)
    blk = xp.asarray(blk)
    if blk.ndim != 2 or blk.dtype not in (np.float32, np.float64) or blk.shape[1] < 1:
        raise CudaKernelError(f"the {name} must be a 2-D float32 or float64 array with at least one column, got "
                              f"shape {blk.shape} dtype {blk.dtype}; convert it with .astype(numpy.float32) first")
    return blk


def stream_scope(xp: Any, stream: Any) -> Any:
    """Context in which CuPy's allocations and copies run on ``stream`` (nothing to do otherwise)."""
    if xp is np or stream is None:
        return nullcontext()
    return stream


def launch_stream(xp: Any, stream: Any) -> Any:
    """The numba stream to launch on: the caller's CuPy stream (default: CuPy's current one)."""
    if xp is np:
        return 0
    if stream is None:
        stream = xp.cuda.get_current_stream()
    ptr = int(getattr(stream, "ptr", 0))
    cu = numba_cuda()
    return cu.external_stream(ptr) if ptr else cu.default_stream()


def arg(x: Any, out: bool = False) -> Any:
    """A kernel argument: device arrays without numba's host synchronisation on the exporter's
    stream (the kernel runs on that stream); in the simulator, inputs are not copied back."""
    if simulating():
        return x if out else numba_cuda().In(x)
    return numba_cuda().as_cuda_array(x, sync=False)


def threads() -> int:
    return SIM_THREADS if simulating() else THREADS


def grid_for(n: int, tpb: int) -> int:
    """Blocks of a grid over ``n`` rows: enough to fill the device, fewer when rows run out."""
    if simulating():
        cap = SIM_MAX_BLOCKS
    else:
        if not _SM_COUNT:
            _SM_COUNT.append(int(numba_cuda().get_current_device().MULTIPROCESSOR_COUNT))
        cap = BLOCKS_PER_SM * _SM_COUNT[0]
    return max(1, min(cap, -(-n // tpb)))


def to_host(x: Any) -> np.ndarray:
    return x.get() if hasattr(x, "get") else np.asarray(x)


#: kernel factories by name: ``factory(dtype) -> compiled kernel``, registered by the kernel modules
FACTORIES: dict[str, Callable[[np.dtype], Any]] = {}


def register(name: str, factory: Callable[[np.dtype], Any]) -> None:
    """Make ``factory`` the maker of kernel ``name`` (:func:`kernel` calls it once per dtype)."""
    FACTORIES[name] = factory


def kernel(name: str, dtype: Any, spec: tuple = ()) -> Any:
    """Kernel ``name`` compiled for blocks of ``dtype`` (once per process), specialised on the
    compile-time constants ``spec`` (sizes, flags: ``factory(dtype, *spec)``) when given."""
    key = (name, np.dtype(dtype).name, *spec) if spec else (name, np.dtype(dtype).name)
    with _lock:
        kern = KERNELS.get(key)
        if kern is None:
            factory = FACTORIES[name]
            # the factory's kernels name ``cuda`` as a global of their module: bind it there
            # (once: a launch under way elsewhere has the simulator's module there, left as it is)
            module = importlib.import_module(factory.__module__)
            if getattr(module, "cuda", None) is None:
                module.cuda = numba_cuda()
            kern = KERNELS[key] = factory(np.dtype(dtype), *spec)
    return kern


# -- device functions shared by the kernels ---------------------------------------------------------
def _make_device_functions(_: np.dtype) -> tuple[Any, Any, Any, Any]:
    from numba import float64

    @cuda.jit(device=True)
    def block_sum(red, val):
        """Sum of ``val`` over the thread block (a tree in ``red[:blockDim]``), returned to all."""
        tid = cuda.threadIdx.x
        red[tid] = val
        cuda.syncthreads()
        s = cuda.blockDim.x // 2
        while s > 0:
            if tid < s:
                red[tid] += red[tid + s]
            cuda.syncthreads()
            s //= 2
        out = red[0]
        cuda.syncthreads()
        return out

    @cuda.jit(device=True)
    def sqdist(xt, i, cs, off, d):
        """Squared distance of row ``i`` to ``cs[off:off + d]``, in the block's dtype."""
        v = xt[0, i] - cs[off]
        acc = v * v
        for j in range(1, d):
            v = xt[j, i] - cs[off + j]
            acc += v * v
        return acc

    @cuda.jit(device=True)
    def sqdist64(xt, i, cs, off, d):
        """Squared distance of row ``i`` to ``cs[off:off + d]``, both widened to float64."""
        acc = 0.0
        for j in range(d):
            v = float64(xt[j, i]) - float64(cs[off + j])
            acc += v * v
        return acc

    @cuda.jit(device=True)
    def dot(xt, i, cs, off, d):
        """``x_i . cs[off:off + d]`` in the block's dtype."""
        acc = xt[0, i] * cs[off]
        for j in range(1, d):
            acc += xt[j, i] * cs[off + j]
        return acc

    return block_sum, sqdist, sqdist64, dot


def device_functions() -> tuple[Any, Any, Any, Any]:
    return kernel("common", np.float64)


def _make_rowsum(_: np.dtype) -> Any:
    @cuda.jit
    def rowsum(part, out):
        """``out[c] = sum_r part[r, c]`` adding the rows in order: the fixed-order reduction of the
        thread blocks' partials (one thread per column)."""
        col = cuda.grid(1)
        stride = cuda.gridsize(1)
        while col < part.shape[1]:
            acc = 0.0
            for r in range(part.shape[0]):
                acc += part[r, col]
            out[col] = acc
            col += stride

    return rowsum


def sum_partials(xp: Any, part: Any, rows: int, cols: int, stream: Any) -> Any:
    """The column sums of the ``(rows, cols)`` float64 partials (one row per thread block), rows added
    in thread-block order on the device: a deterministic result, unlike atomic adds."""
    out = xp.zeros(cols, np.float64)
    if rows and cols:
        tpb = threads()
        grid = max(1, min(-(-cols // tpb), SIM_MAX_BLOCKS if simulating() else 1024))
        kernel("rowsum", np.float64)[grid, tpb, launch_stream(xp, stream)](arg(part.reshape(rows, cols)),
                                                                             arg(out, True))
    return out


def _smoke_test() -> bool:
    """Compile and run the smallest kernel once on CuPy arrays (numba.cuda may import and see a GPU yet
    lack the compiler it needs, e.g. libNVVM)."""
    import cupy

    part = cupy.arange(6, dtype=np.float64).reshape(2, 3)
    out = sum_partials(cupy, part, 2, 3, None)
    cupy.cuda.get_current_stream().synchronize()
    return bool((out.get() == np.array([3.0, 5.0, 7.0])).all())


register("common", _make_device_functions)
register("rowsum", _make_rowsum)


def weights_vector(xp: Any, w: Any, n: int) -> Any:
    """Row weights as a contiguous float64 device vector (a 1-entry placeholder for None)."""
    wv = xp.ascontiguousarray(xp.asarray(w, dtype=np.float64)) if w is not None else xp.empty(1, np.float64)
    if w is not None and wv.shape != (n,):
        raise CudaKernelError(f"weights must have one entry per row ({n}), got shape {wv.shape}")
    return wv


def select_far(fd: np.ndarray, fi: np.ndarray, fl: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray,
                                                                                   np.ndarray]:
    """The ``q`` farthest of the thread blocks' candidates (larger distance first, then lower row):
    a partition of ``grid * N_FARTHEST`` values, then a sort of the ``q`` kept."""
    keep = fi >= 0
    fd, fi, fl = fd[keep], fi[keep], fl[keep].astype(np.int64)
    if fd.size > q:
        t = np.partition(fd, fd.size - q)[fd.size - q]  # the q-th largest distance
        above = np.flatnonzero(fd > t)
        tied = np.flatnonzero(fd == t)
        sel = np.concatenate([above, tied[np.argsort(fi[tied], kind="stable")][:q - above.size]])
        fd, fi, fl = fd[sel], fi[sel], fl[sel]
    order = np.lexsort((fi, -fd))  # farther first, then the lower row: the same order whatever the grid
    return fd[order], fi[order], fl[order]
