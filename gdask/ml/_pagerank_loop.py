"""PageRank's loop on the workers: one task per worker sweeps the graph blocks it holds, rank blocks go
worker to worker (:func:`gdask.gdataset.collective.run_on_workers`), no graph per iteration.

The graph is prepared here in one pass (:func:`prepare`): ``M = A.T`` renumbered by the sweep order,
split by rows into ``nblocks`` blocks of about equal edges. Each worker receives its blocks once and
every worker the sources' out-weights (the inverse out-degrees are computed there). An iteration is
one sweep: every block is relaxed row by row (Gauss-Seidel over its own edges), reading the other
blocks' values from the previous sweep (block Jacobi between blocks), so a block's update is the same
whichever worker holds it and whichever blocks share that worker: the ranks have the same bits on any
number of workers for the same ``nblocks``. After a sweep the workers all-gather their blocks' new
values, L1 changes and sums, and every worker takes the same stop decision (sums in block order) on
the change of the ranks ``y / sum(y)``.

With ``spread``, the sweeps also spread the rank of the dangling nodes (no out-links) over every
node, as the power iteration does (their sum over the last sweep's ``y``, the same on every worker),
and ``y`` is scaled back to a sum of 1 after each sweep. :func:`gdask.ml.pagerank` spreads on one
block (one Gauss-Seidel order over the whole graph: fewer sweeps on every graph measured, 15 -> 9 on 3M
edges between 1M nodes with 30% of them dangling) and on graphs whose links follow no order, where the
linear system without that term converges only at ``damping``'s rate (45-56 sweeps against SciPy's 16
power iterations on 5M random edges between 1M nodes); blocks updated from each other's last sweep
and the lagged spread slow ordered graphs (12 -> 42 sweeps on the benchmark's graph in 2 blocks). Both
have ranks of the same fixed point (``y`` of one is a multiple of the other's).

One block (the default below :data:`~gdask.ml._pagerank.SPLIT_MIN_EDGES_PER_NODE` edges a node) is
swept by one worker over ``A`` as the user gave it (:class:`Direct`, :func:`_one_block`): no transpose
is made on the client, and the graph is sent while the client chooses the sweep order. In node order
each node pushes its new value to its destinations' accumulators (:func:`push_sweep`: as fast as the
gathers on graphs whose links spread over the nodes, and the transpose, 3 to 10 sweeps' time on them,
is saved); in the in-degree order the worker renumbers and transposes ``A`` itself and the sweeps
gather (the hubs' accumulators would queue the pushes). To a worker on the client's host the graph,
the order and the ranks go through a file in shared memory (:mod:`gdask._shm`).

A worker lost (or a loop that could not start) ends the attempt with
:class:`~gdask.gdataset.collective.CollectiveError`: the blocks are sent again to the workers there
are then (the client keeps the prepared graph for the whole call) and the sweeps run again from the
start, at most config ``gdask.engine.max-restarts`` times, to the same bits.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from distributed import Future

from gdask import _shm, config
from gdask._compat import scheduler_workers
from gdask.gdataset.collective import CollectiveError, run_on_workers
from gdask.ml.kernels._pagerank_cpu import (
    finish_sweep,
    inverse_out_weights,
    ones_except,
    push_init,
    push_sweep,
    scale_block,
    self_links,
    sweep_block,
    sweep_folded,
    transpose_fold,
    transpose_renumber,
    unsigned,
    weight_kind,
)

__all__ = ["Direct", "OneRank", "Prepared", "direct", "discard", "narrow", "own_links", "place", "prepare",
           "run_sweeps", "sweep_here"]

logger = logging.getLogger("gdask.ml")


@dataclass
class Prepared:
    """``M`` (renumbered, row = destination) as CSR arrays, split by rows at ``bounds``; ``out`` the
    sources' out-weights in the new numbering (int32 degrees when every edge weighs the same)."""

    n: int
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray  # empty: every edge weighs the same
    out: np.ndarray
    bounds: np.ndarray

    @property
    def nblocks(self) -> int:
        return len(self.bounds) - 1

    def block(self, b: int) -> tuple:
        """Block ``b``: (index, first row, indptr from 0, indices, values), compact arrays."""
        lo, hi = int(self.bounds[b]), int(self.bounds[b + 1])
        a, z = int(self.indptr[lo]), int(self.indptr[hi])
        ptr = self.indptr[lo:hi + 1] - a
        ptr = ptr.astype(index_dtype(z - a))
        vals = self.values[a:z] if self.values.size else self.values
        return b, lo, ptr, self.indices[a:z], vals


def index_dtype(count: int) -> type:
    """The unsigned type of positions among ``count`` items (or of offsets up to ``count``): uint32
    below 2**32 (4 bytes: half the cache lines of a gather), else uint64."""
    return np.uint32 if count < 2 ** 32 else np.uint64


def prepare(A: Any, pos: np.ndarray | None, nblocks: int, stop: np.ndarray | None = None) -> Prepared | None:
    """``A`` (checked CSR, float64) as :class:`Prepared`, renumbered by ``pos`` (new index of each
    node, or None) and split into ``nblocks`` row blocks of about equal edges. ``stop``: a one-item
    array another thread sets to end a prepare nobody will use (None is returned then)."""
    n = A.shape[0]
    lo_w = float(A.data.min()) if A.nnz else 1.0
    uniform = A.nnz == 0 or (lo_w > 0 and lo_w == float(A.data.max()))
    indptr = A.indptr.astype(np.int64, copy=False)
    udt = index_dtype(n)  # 4-byte positions: half the cache lines of the gathers
    p = np.empty(0, udt) if pos is None else np.asarray(pos).astype(udt)
    mptr = np.empty(n + 1, np.int64)
    midx = np.empty(A.nnz, udt)
    mval = np.empty(0 if uniform else A.nnz, np.float64)
    if not transpose_renumber(indptr, unsigned(A.indices), A.data, p, mptr, midx, mval,
                              np.zeros(1, np.uint8) if stop is None else stop):
        return None
    out = np.diff(indptr).astype(np.int32) if uniform else np.asarray(A.sum(axis=1)).ravel()
    if pos is not None:
        moved = np.empty_like(out)
        moved[pos] = out
        out = moved
    nb = int(max(1, min(nblocks, n)))
    cuts = np.searchsorted(mptr, np.linspace(0, mptr[-1], nb + 1)[1:-1])
    bounds = np.concatenate([[0], np.minimum(cuts, n), [n]]).astype(np.int64)
    bounds = np.maximum.accumulate(bounds)
    return Prepared(n=n, indptr=mptr, indices=midx, values=mval, out=out, bounds=bounds)


#: a graph whose links weigh 1 but for at most this share of them is swept as an unweighted one, with
#: the few other links corrected after their nodes' (:func:`direct`)
EXCEPTIONS_MAX_SHARE = 1 / 16


@dataclass
class Direct:
    """``A`` itself (row = source) for the sweeps that push (one block, no transpose): CSR arrays
    with unsigned indices, ``values`` empty when every edge weighs the same or when the links
    weigh 1 but those at the positions ``extra``, which weigh ``extra_w``, and the sweep order
    (``order`` empty: node order)."""

    n: int
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    order: np.ndarray
    extra: np.ndarray
    extra_w: np.ndarray

    @property
    def nblocks(self) -> int:
        return 1

    @property
    def arrays(self) -> tuple:
        """The graph's arrays as the worker's sweeps take them (:func:`_one_block`)."""
        return self.indptr, self.indices, self.values, self.extra, self.extra_w


def direct(A: Any, perm: np.ndarray | None) -> Direct:
    """``A`` (checked CSR, float64) as :class:`Direct`, swept in the order ``perm`` (new node ``k`` is
    node ``perm[k]``; None: node order). No copy of the graph is made but for 4-byte row pointers.

    Links that weigh 1 but for at most :data:`EXCEPTIONS_MAX_SHARE` of them (a random graph whose
    duplicate links SciPy summed: 194 weights of 2 among 20M) are sent without their weights, the
    others as positions and weights: the sweeps then read no weight a link (20M links: 65-72 -> 55-61
    ms a sweep against uint8 weights, in turn in one process)."""
    n = A.shape[0]
    indptr = A.indptr.astype(index_dtype(A.nnz))
    udt = index_dtype(n)
    order = np.empty(0, udt) if perm is None else np.asarray(perm).astype(udt)
    # one pass over the weights where they weigh 1 but a few (none, or duplicate links): the min and max
    # (every weight the same, not 1) are read only for the others
    extra = ones_except(A.data, int(A.nnz * EXCEPTIONS_MAX_SHARE))
    values = np.empty(0)
    if extra is None:
        extra = np.empty(0, np.int64)
        lo_w = float(A.data.min())
        if not (lo_w > 0 and lo_w == float(A.data.max())):
            values = A.data
    return Direct(n=n, indptr=indptr, indices=unsigned(A.indices), values=values, order=order, extra=extra,
                  extra_w=A.data[extra])


def narrow(values: np.ndarray) -> np.ndarray:
    """The weights in the narrowest type that holds each exactly (uint8 for small counts, as summed
    duplicate links give, float32, or as they are): the sweeps read them every sweep and they are
    sent once (on 20M links of weight 1 or 2: 160 -> 20 MB, a sweep 66 -> 58 ms). The ranks are the
    same: every weight converts back to the same float64."""
    if values.dtype != np.float64 or not values.size:
        return values
    kind = weight_kind(values)
    return values if kind == 2 else values.astype(np.uint8 if kind == 0 else np.float32)


#: the positions of a graph's links from a node to itself that a kernel reading every link anyway
#: (:func:`push_init`, :func:`transpose_fold`) keeps; a graph with more is read again for them
OWN_FOUND = 4096


def own_links(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, lo: int = 0,
              extra: np.ndarray | None = None, extra_w: np.ndarray | None = None,
              pos: np.ndarray | None = None, found: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a CSR block (local; columns global from ``lo``, unsigned indices) with a link to
    themselves, ascending, renumbered by ``pos`` (new index of each node) when given, and those links'
    weights summed per row: ``values`` (all 1 when empty), but ``extra_w`` at the positions ``extra``
    (:class:`Direct`'s exceptions). What the sweeps solve for in each such node's own update.
    ``found``: (buffer, count) from a kernel that noted the links' positions as it read them (a
    block scanned again only when the buffer could not hold them all)."""
    if found is not None and found[1] <= found[0].size:
        k = found[0][:found[1]]
    else:
        k = self_links(indptr, indices, lo)
    if not k.size:
        return k, np.empty(0)
    rows = np.searchsorted(np.asarray(indptr, np.int64), k, side="right") - 1
    w = values[k].astype(np.float64) if values.size else np.ones(k.size)
    if extra is not None and extra.size:
        e = np.minimum(np.searchsorted(extra, k), extra.size - 1)
        hit = extra[e] == k
        w[hit] = extra_w[e[hit]]
    if pos is not None:
        rows = np.asarray(pos, np.int64)[rows]
    rows, at = np.unique(rows, return_inverse=True)
    return rows.astype(np.int64), np.bincount(at, weights=w, minlength=rows.size)


def _one_block(comm: Any, graph: Any, order: Any, damping: float, tol: float, max_iter: int,
               descending: bool, y_file: str | None = None) -> dict:
    """(On a worker) the Gauss-Seidel sweeps of one block over ``A`` (a :class:`Direct` graph's
    arrays), the dangling rank spread each sweep and ``y`` scaled to a sum of 1 between sweeps, until
    the ranks change by at most ``tol`` (L1): the sweeps of :func:`_rank_sweeps` on one block with
    ``spread``, in node order (``order`` empty) over ``A`` itself (:func:`push_sweep`), else over ``M``
    renumbered by ``order``, transposed here (:func:`sweep_folded`: its gathers read the hubs' values,
    where the pushes would queue on the hubs' accumulators).

    The scaling costs no pass over the nodes: the vectors keep the scale of the last sweep's values
    (sum ``total``) and the sweep's constant term is scaled to it instead. Nor does the change of the
    ranks ``y / total``: it is bounded by ``(sum |y - y_last| + |total - total_last|) / total`` from
    the sweep's own sums (stricter than the change itself, by at most ``2 |total - total_last| / total``).

    ``graph`` and ``order`` may come as :class:`~gdask._shm.SharedArrays`; then the ranks go
    back through the file ``y_file`` (the result holds ``"y": None``), or, when the files are not
    on this worker's host, the result is ``{"unshared": True}``."""
    if isinstance(graph, _shm.SharedArrays):
        graph = _shm.read(graph)
        if isinstance(order, _shm.SharedArrays):
            order, = _shm.read(order) or [None]
        if graph is None or order is None:
            return {"unshared": True}
    indptr, indices, values, extra, extra_w = graph
    n = len(indptr) - 1
    teleport = (1.0 - damping) / n
    y = np.full(n, 1.0 / n)
    inv = np.empty(n)
    pos, fill = None, None
    if order.size:
        pos, sweep, fill = _folded_gathers(indptr, indices, values, extra, extra_w, order, damping, y, inv)
        dangling = float(y[inv == 0.0].sum())
    else:
        acc = np.empty(n)
        own = np.empty(OWN_FOUND, np.int64)
        dangling, nown = push_init(indptr, indices, values, extra, extra_w, descending, y, inv, acc, own)
        loops, loop_w = own_links(indptr, indices, values, 0, extra, extra_w, found=(own, nown))

        def sweep(base):
            return push_sweep(indptr, indices, values, extra, extra_w, descending, inv, acc, y, damping, base,
                              loops, loop_w)
    last = float(y.sum())  # y is the ranks times last: the sum of the last sweep's values
    history, converged, it = [], False, 0
    while it < max_iter:
        t0 = time.perf_counter()
        # the fixed point's constant, of the ranks (sum 1, dangling / last of it on dangling nodes), at y's scale
        diff, total, dangling = sweep(teleport * last + damping * dangling / n)
        it += 1
        change = (diff + abs(total - last)) / total
        last = total
        history.append({"iteration": it, "seconds": time.perf_counter() - t0, "change": change,
                        "active_blocks": int(change > 0)})
        if change <= tol:
            converged = True
            break
    if fill is not None:
        fill()
    y *= 1.0 / last
    if pos is not None:
        y = y[pos]
    if y_file is not None and _shm.write_out(y_file, y):
        y = None
    return {"y": y, "n_iter": it, "converged": converged, "history": history}


def _folded_gathers(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, extra: np.ndarray,
                    extra_w: np.ndarray, order: np.ndarray, damping: float, y: np.ndarray, inv: np.ndarray) -> tuple:
    """(In :func:`_one_block`) the sweeps in the order ``order`` (ascending received rank): ``A``
    renumbered and transposed into ``M``, into ``inv`` the inverse out-weights (renumbered), ``y``
    left at ``1 / n``. The nodes that receive no link and come first (the order's start: a few on
    random graphs, 99% of the nodes on one whose links end in a few thousand hubs) are taken out of
    the sweeps (:func:`transpose_fold` leaves their links out of ``M``): each sweep gives them its
    constant term, so what they send a row is that term times a sum made once. Returns (``pos``,
    ``sweep(base)``, ``fill()``: their values into ``y`` after the last sweep)."""
    n = len(indptr) - 1
    if extra.size:  # the weights whole (in the narrowest type that holds them): the transpose carries them
        values = np.ones(len(indices), (np.uint8, np.float32, np.float64)[weight_kind(extra_w)])
        values[extra] = extra_w
    udt = index_dtype(n)  # 4-byte positions: half the cache lines of their lookups
    pos = np.empty(n, udt)
    pos[order.astype(np.int64)] = np.arange(n, dtype=udt)
    inverse_out_weights(indptr, values, y)  # (y as scratch) the inverse out-weights, renumbered
    inv[pos] = y
    y[:] = 1.0 / n
    mptr = np.empty(n + 1, index_dtype(len(indices)))
    midx = np.empty(len(indices), indices.dtype)
    mval = np.empty(len(values))
    pre = np.zeros(n)
    own = np.empty(OWN_FOUND, np.int64)
    p, kept, nown = transpose_fold(indptr.astype(np.int64), indices, values, pos, inv, mptr, midx, mval, pre, own,
                                   np.empty(len(indices), udt))
    loops, loop_w = own_links(indptr, indices, values, 0, pos=pos, found=(own, nown))
    midx, mval = midx[:kept], mval[:kept] if mval.size else mval
    x = inv * y
    p_dangling = int(np.count_nonzero(inv[:p] == 0.0))
    state = [1.0 / n]  # the leading nodes' value: 1 / n, then each sweep's constant term

    def sweep(base):
        out = sweep_folded(mptr, midx, mval, pre, p, p_dangling, x, inv, y, damping, base, state[0], loops, loop_w)
        state[0] = base
        return out

    def fill():
        y[:p] = state[0]

    return pos, sweep, fill


def _rank_sweeps(comm: Any, blocks: list, out: np.ndarray, bounds: np.ndarray, damping: float, tol: float,
                 max_iter: int, descending: bool, spread: bool = False) -> dict:
    """(On a worker) sweep ``blocks`` until the ranks ``y / sum(y)`` change by at most ``tol`` (L1)."""
    n = int(bounds[-1])
    teleport = (1.0 - damping) / n
    inv = np.zeros(n)
    np.divide(1.0, out, out=inv, where=out > 0)
    y = np.full(n, 1.0 / n if spread else teleport)
    x = inv * y
    blocks = sorted(blocks, key=lambda blk: blk[0], reverse=descending)
    loops = {blk[0]: own_links(blk[2], blk[3], blk[4], blk[1]) for blk in blocks}
    # one block here: the other blocks' x changes only between sweeps (the values received), so the
    # sweep reads x everywhere and needs no copy of the last sweep's (xprev is x)
    alone = len(blocks) == 1
    xprev = x if alone else x.copy()
    yprev = y.copy()  # the last sweep's y, whole, for the ranks' change
    prev_total = float(y.sum())
    dangling_rank = float(y[inv == 0.0].sum())  # spread over every node each sweep (with spread)
    nb = len(bounds) - 1
    # what is sent, in two buffers taken in turn: a peer has copied a sweep's values before it sends its
    # next sweep's, which this rank waits for before it writes the same buffer again (no fresh 4 MB a sweep)
    outbox = [[np.empty(int(bounds[b + 1] - bounds[b])) for b, *_ in blocks] for _ in range(2 if comm.size > 1 else 0)]
    history, converged, it = [], False, 0
    while it < max_iter:
        t0 = time.perf_counter()
        mine = []
        base = teleport + damping * dangling_rank / n if spread else teleport  # of the last sweep's y
        for b, lo, ptr, idx, vals in blocks:
            change, total, _ = sweep_block(ptr, idx, vals, lo, x, xprev, inv, y, damping, base, descending, alone,
                                           *loops[b])
            mine.append((b, change, total))
        if not alone:
            for b, lo, ptr, _, _ in blocks:
                xprev[lo:lo + len(ptr) - 1] = x[lo:lo + len(ptr) - 1]
        sent = []
        if comm.size > 1:
            for (b, _, _), buf in zip(mine, outbox[it % 2]):
                np.copyto(buf, y[bounds[b]:bounds[b + 1]])
                sent.append((b, buf))
        got = comm.allgather((mine, sent))
        changes, totals = np.zeros(nb), np.zeros(nb)
        for rank, (stats, vals) in enumerate(got):
            for b, change, total in stats:
                changes[b], totals[b] = change, total
            if rank != comm.rank:
                for b, v in vals:
                    y[bounds[b]:bounds[b + 1]] = v
                    scale_block(y, inv, x, xprev, bounds[b], bounds[b + 1])
        it += 1
        total = sum(totals.tolist())  # block order: the same on every rank
        # every rank now holds the whole y, the same bits: the ranks' change (y / sum(y) whatever the scale:
        # yprev keeps this y unscaled), and with spread y back to a sum of 1, the fixed point's (the
        # error along y itself goes: it decayed slowest), and the dangling nodes' rank for the next sweep
        change, dangling_rank = finish_sweep(y, yprev, x, xprev, inv, total, prev_total, spread)
        prev_total = total
        history.append({"iteration": it, "seconds": time.perf_counter() - t0, "change": change,
                        "active_blocks": int((changes > 0).sum())})
        if change <= tol:
            converged = True
            break
    # every rank holds the whole y (the same bits): the client fetches one rank's result
    return {"y": y, "n_iter": it, "converged": converged, "history": history}


def place(client: Any, P: Prepared | Direct, same_host: bool = True) -> tuple[list[str], list[tuple]]:
    """Send each worker its contiguous share of the blocks and the out-weights (a :class:`Direct`
    graph: the graph to one worker, through shared memory when it is on this host and
    ``same_host``: :mod:`gdask._shm`; its order goes with the sweeps, and may be set after
    this); (peers, args), for :func:`run_sweeps` (``placed``)."""
    info = scheduler_workers(client)
    workers = sorted(info)
    if not workers:  # between a lost worker and its restart, say
        wait = float(config.get("timeouts.cluster-start", 120))
        try:
            client.wait_for_workers(1, timeout=wait)
        except TimeoutError:
            raise RuntimeError(f"pagerank found no worker on the cluster within {wait:g} s (config "
                               f"gdask.timeouts.cluster-start): start workers, or pass loop='graph'") from None
        info = scheduler_workers(client)
        workers = sorted(info)
    if isinstance(P, Direct):
        P.values = narrow(P.values)
        arrays = P.arrays
        where = _shm.directory() if same_host and _shm.on_this_host(workers[0], info.get(workers[0])) else None
        graph = _shm.write(list(arrays), where) if where else None
        if graph is None:
            graph = client.scatter(arrays, workers=[workers[0]], hash=False, direct=True)
        return workers[:1], [(graph,)]
    ranks = min(len(workers), P.nblocks)
    peers, args = workers[:ranks], []
    for r, addr in enumerate(peers):
        share = [P.block(b) for b in range(r * P.nblocks // ranks, (r + 1) * P.nblocks // ranks)]
        blocks, out = client.scatter([share, P.out], workers=[addr], hash=False, direct=True)
        args.append((blocks, out))
    return peers, args


def discard(placed: Any) -> None:
    """Remove the files of a :func:`place` started in a thread (a ``concurrent.futures.Future``) that
    :func:`run_sweeps` will not take: once it ended (a placement that failed left none)."""
    try:
        _, args = placed.result()
    except Exception:
        return
    for x in (x for a in args for x in a):
        if isinstance(x, _shm.SharedArrays):
            _shm.remove(x)


class OneRank:
    """The communicator of a loop with one rank, every block in this process (no Client)."""

    rank, size = 0, 1

    def allgather(self, value: Any) -> list[Any]:
        return [value]


def sweep_here(P: Prepared | Direct, *, damping: float, tol: float, max_iter: int, descending: bool,
               spread: bool = False) -> dict:
    """The sweeps of :func:`run_sweeps` in this process, as one rank (:class:`OneRank`): the same
    bits as the loop on the workers for the same blocks; its result dict (``ranks`` 1, no restarts)."""
    if isinstance(P, Direct):  # one block, spread
        P.values = narrow(P.values)
        out = _one_block(OneRank(), P.arrays, P.order, damping, tol, max_iter, descending)
    else:
        out = _rank_sweeps(OneRank(), [P.block(b) for b in range(P.nblocks)], P.out, P.bounds, damping, tol,
                           max_iter, descending, spread)
    out["restarts"], out["ranks"] = 0, 1
    for record in out["history"]:  # the fields of the graph loop's records: no task ran, nothing was sent
        record.update(executed=0, reused=0, executed_by_prefix={}, channel_bytes=0)
    return out


def run_sweeps(client: Any, P: Prepared | Direct, *, damping: float, tol: float, max_iter: int, descending: bool,
               spread: bool = False, placed: Any = None) -> dict:
    """The sweeps on the workers (see the module docstring): the rank-0 result dict plus
    ``restarts``. ``placed``: a :class:`concurrent.futures.Future` of :func:`place` started earlier
    (its first attempt; it is sent again if that failed)."""
    restarts = 0
    max_restarts = int(config.get("engine.max-restarts", 3))
    same_host = True
    while True:
        args: list = []
        y_file = None
        try:
            if placed is not None:
                placed, attempt = None, placed
                peers, args = attempt.result()
            else:
                peers, args = place(client, P, same_host)
            if isinstance(P, Direct):  # one block, spread
                (graph,), = args
                order: Any = P.order
                if isinstance(graph, _shm.SharedArrays):  # the order and the ranks through shared memory too
                    where = os.path.dirname(graph.path)
                    order = (_shm.write([P.order], where) if P.order.size else None) or P.order
                    y_file = _shm.out_file(where)
                if isinstance(order, np.ndarray) and order.size >= 2 ** 16:
                    order = client.scatter(P.order, workers=peers, hash=False, direct=True)
                args = [(graph, order)]
                func, rank_args = _one_block, [(graph, order, damping, tol, max_iter, descending, y_file)]
            else:
                func, rank_args = _rank_sweeps, [(blocks, out, P.bounds, damping, tol, max_iter, descending, spread)
                                                 for blocks, out in args]
            res = run_on_workers(client, func, peers, rank_args, name="pagerank-sweeps", same_results=True)
            if res[0].get("unshared"):  # the worker saw no such file: not on this host after all
                same_host = False
                continue
            if res[0]["y"] is None:
                res[0]["y"] = _shm.read_out(y_file, np.float64, P.n)
        except (CollectiveError, OSError) as e:  # OSError: a worker gone while its blocks were sent
            if restarts >= max_restarts:
                raise
            restarts += 1
            logger.warning("pagerank on the workers failed (%s); sending the blocks again (restart %d of %d)",
                           e, restarts, max_restarts)
            continue
        finally:
            client.cancel([f for a in args for f in a if isinstance(f, Future)])
            for f in [y_file, *(x for a in args for x in a if isinstance(x, _shm.SharedArrays))]:
                _shm.remove(f)
        out = res[0]
        out["restarts"] = restarts
        out["ranks"] = len(peers)
        for i, record in enumerate(out["history"]):  # the fields of the graph loop's records, for this loop
            record.update(executed=len(peers) if i == 0 else 0, reused=0,
                          executed_by_prefix={"pagerank-sweeps": len(peers)} if i == 0 else {},
                          channel_bytes=8 * P.n * (len(peers) - 1))  # each rank's values to every other rank
        return out
