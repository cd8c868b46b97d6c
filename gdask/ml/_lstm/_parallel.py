"""The parallel side of gdask's LSTM training: the fit's ``torch.distributed`` process group across
its workers, malloc settings while a worker trains, and each epoch's plan of which rows a worker
computes in each step (see :mod:`gdask.ml._lstm._torch` for the epoch order)."""

from __future__ import annotations

import contextlib
import datetime
from typing import Any, Iterator

import numpy as np
import torch

from gdask import config
from gdask.gdataset import CollectiveError, LoopContext

__all__ = ["GlobalPlan", "ProcessGroup", "StreamPlan", "training_malloc"]


# -- malloc on workers ----------------------------------------------------------------------------------
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_GLIBC_MMAP_THRESHOLD = 128 * 1024  # glibc's mmap threshold when the environment fixed the trim threshold


@contextlib.contextmanager
def training_malloc() -> Iterator[int | None]:
    """While a fit trains on a glibc worker whose nanny set ``MALLOC_TRIM_THRESHOLD_`` (distributed's
    default, so that freed memory goes back to the OS at once): raise malloc's trim and mmap thresholds
    to config ``gdask.ml.torch.mmap-threshold``, then restore them and trim.

    With the variable set, every tensor larger than 128 KiB (a batch's activations and gradients) is
    mmapped and unmapped again and the heap's top is given back after each step, so every step faults
    its pages in again: measured, CPU training steps 2-3x slower than in a plain process. Yields the
    threshold set, or None when nothing was changed (not glibc, the variable unset, or config null)."""
    import ctypes
    import ctypes.util
    import os

    from gdask.devices import parse_size

    value = config.get("ml.torch.mmap-threshold", "64MiB")
    trim = os.environ.get("MALLOC_TRIM_THRESHOLD_")
    name = ctypes.util.find_library("c") if value is not None and trim is not None else None
    libc = ctypes.CDLL(name) if name else None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or "MALLOC_MMAP_THRESHOLD_" in os.environ or not trim.isdigit():
        yield None
        return
    nbytes = int(parse_size(value, name="gdask.ml.torch.mmap-threshold"))
    mallopt(_M_TRIM_THRESHOLD, nbytes)
    mallopt(_M_MMAP_THRESHOLD, nbytes)
    try:
        yield nbytes
    finally:
        mallopt(_M_MMAP_THRESHOLD, _GLIBC_MMAP_THRESHOLD)
        mallopt(_M_TRIM_THRESHOLD, int(trim))
        libc.malloc_trim(0)


# -- the process group of a fit -----------------------------------------------------------------------
class ProcessGroup:
    """The fit's ``torch.distributed`` process group across its workers (none for one rank).

    Rank 0 opens a ``TCPStore`` on a free port of its host and all-gathers the address through the
    loop's own exchange; every wait (rendezvous, all-reduce) is bounded by config
    ``gdask.ml.torch.timeout``. The group is a ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` object of
    its own, not torch's default group, so several fits (or several ranks in one process) coexist.
    """

    def __init__(self, ctx: LoopContext, device: torch.device) -> None:
        self.size = ctx.size
        self.device = device
        self.pg: Any = None
        self.store: Any = None
        backend = str(config.get("ml.torch.backend", "auto"))
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" and _nccl_available() else "gloo"
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"gdask.ml.torch.backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
        self.backend = backend
        self.timeout = float(config.get("ml.torch.timeout", 120))
        if self.size == 1:
            return
        import torch.distributed as dist

        td = datetime.timedelta(seconds=self.timeout)
        host = ctx.host
        try:
            if ctx.rank == 0:
                self.store = dist.TCPStore(host, 0, self.size, is_master=True, timeout=td, wait_for_workers=False)
                addr = (host, int(self.store.port))
            else:
                addr = None
            addr = ctx.allgather(addr)[0]
            if ctx.rank != 0:
                self.store = dist.TCPStore(addr[0], addr[1], self.size, is_master=False, timeout=td)
            prefix = dist.PrefixStore("gdask-fit", self.store)
            if backend == "nccl":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = td
                self.pg = dist.ProcessGroupNCCL(prefix, ctx.rank, self.size, opts)
            else:
                self.pg = _gloo(dist, prefix, ctx.rank, self.size, td, host)
        except CollectiveError:
            raise
        except RuntimeError as e:  # the rendezvous timed out or a peer went away
            raise CollectiveError(f"could not set up the {backend} process group of rank {ctx.rank} of "
                                  f"{self.size}: {e}") from e

    def allreduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks, in place (nothing to do for one rank)."""
        if self.pg is None:
            return t
        buf = t.cpu() if self.backend == "gloo" and t.is_cuda else t
        try:
            self.pg.allreduce([buf]).wait()
        except RuntimeError as e:  # a peer died or timed out: the loop restarts from its last epoch
            raise CollectiveError(f"all-reduce over {self.size} workers failed: {e}") from e
        if buf is not t:
            t.copy_(buf)
        return t

    def close(self) -> None:
        pg, self.pg, self.store = self.pg, None, None
        shutdown = getattr(pg, "shutdown", None)
        if shutdown is not None:
            shutdown()


def _nccl_available() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_nccl_available())


def _gloo(dist: Any, store: Any, rank: int, size: int, timeout: datetime.timedelta, host: str) -> Any:
    """A gloo group bound to ``host``'s interface (the worker's address: reachable by its peers)."""
    options = getattr(dist.ProcessGroupGloo, "_Options", None)
    if options is None:  # an older torch: its default device (the machine's hostname)
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    opts = options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(store, rank, size, opts)


# -- the epoch plans ------------------------------------------------------------------------------------
class GlobalPlan:
    """Data on the devices: global batches of the epoch's order. Each step yields this worker's part,
    ``(parts, inv)``: ``parts`` = ``[(local position, block-local rows)]`` in block order, each block's
    rows in the batch's order (what a block contributes to a step depends on the block only, never on
    which worker holds it), and ``inv`` the permutation that puts the rows gathered block by block back
    in the batch's order (None when they are in it): one worker holding every block computes exactly a
    single process's batch."""

    def __init__(self, order: np.ndarray, batch_size: int, offsets: np.ndarray, local: list) -> None:
        self.order = order
        self.batch_size = batch_size
        self.offsets = offsets
        self.blocks = np.asarray([b for b, _ in local], dtype=np.int64)
        self.pos = {int(b): pos for pos, (b, _) in enumerate(local)}

    def __iter__(self):
        ends = self.offsets[1:]
        for j in range(0, max(len(self.order), 1), self.batch_size):
            batch = self.order[j:j + self.batch_size]
            owner = np.searchsorted(ends, batch, side="right")
            mine = np.isin(owner, self.blocks)
            rows, own = batch[mine], owner[mine]
            if not rows.size:
                yield [], None
                continue
            by_block = np.argsort(own, kind="stable")  # stable: each block's rows stay in the batch's order
            own, rows = own[by_block], rows[by_block]
            cuts = [0, *(np.flatnonzero(np.diff(own)) + 1).tolist(), len(own)]
            parts = [(self.pos[int(own[a])], rows[a:b] - self.offsets[own[a]]) for a, b in zip(cuts, cuts[1:])]
            inv = None
            if (by_block != np.arange(by_block.size)).any():
                inv = np.empty_like(by_block)
                inv[by_block] = np.arange(by_block.size)
            yield parts, inv

    def done(self, parts: list, cache: dict) -> None:
        """Blocks on the devices stay cached for the whole fit."""


class StreamPlan(GlobalPlan):
    """Data larger than the devices: the epoch's order walks windows of blocks, each small enough
    for one device's window cache, and shuffles the rows within each window. Window ``j`` of ``m``
    holds the blocks ``b`` with ``b % m == j`` (blocks of every part of the data: with blocks placed
    in runs, every worker holds some of each window); the windows go forward on even epochs and
    backward on odd ones (the blocks a worker is left with are the first it reads next), each
    window's rows in the order of ``np.random.default_rng([seed, epoch, j]).permutation``. The order
    depends on the data, the seed and the window size only, never on which worker holds which block,
    so with per-block gradients a streamed fit has the same bits however its blocks are placed (and
    after a lost worker). Steps are global batches of it, as in :class:`GlobalPlan`; a block leaves
    this worker's cache once its rows of the epoch are used."""

    def __init__(self, seed: int, epoch: int, window: int, batch_size: int, offsets: np.ndarray,
                 train: np.ndarray, local: list) -> None:
        nblocks = len(offsets) - 1
        m = max(1, -(-nblocks // max(1, int(window))))
        windows = list(range(m))[::-1] if epoch % 2 else list(range(m))
        block_of = np.searchsorted(offsets[1:], train, side="right")
        pieces = []
        for j in windows:
            rows = train[block_of % m == j]
            pieces.append(rows[np.random.default_rng([seed, int(epoch), j]).permutation(rows.size)])
        super().__init__(np.concatenate(pieces) if pieces else train[:0], batch_size, offsets, local)
        mine = [b for b, _ in local]
        #: this worker's blocks in the order the epoch reads them (a hint for the window cache)
        self.reads = [b for j in windows for b in sorted(mine) if b % m == j]
        self.windows = m
        counts = np.bincount(block_of, minlength=nblocks)
        self.left = {pos: int(counts[b]) for pos, (b, _) in enumerate(local)}

    def done(self, parts: list, cache: dict) -> None:
        """Drop a block once all its rows of the epoch were used: the window cache may evict it."""
        for p, rows in parts:
            self.left[p] -= rows.size
            if self.left[p] <= 0:
                cache.pop(p, None)
