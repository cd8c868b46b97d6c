"""PageRank as a delta iteration over a blocked sparse graph (GTracker + iteration channel).

Two solvers of the same linear system ``y = damping * M @ (inv * y) + (1 - damping) / n``:

* ``"gauss-seidel"`` (default): block Gauss-Seidel sweeps. The blocks are visited in one order
  (the one in which most rank flows forward, chosen from the graph by :func:`sweep_order`), each
  block starts from the newest values of the blocks already updated in the same sweep, and the
  diagonal block is relaxed row by row inside its task (Gauss-Seidel over the block's own edges).
  On graphs whose links mostly point one way along that order (citations, hierarchies) a sweep
  propagates rank along a whole chain of links instead of one link per iteration, so far fewer
  sweeps are needed than power iterations; on any graph a Gauss-Seidel sweep contracts at least
  as fast as a Jacobi step asymptotically (Stein-Rosenberg: the iteration matrix is non-negative).
* ``"jacobi"``: every block product reads the previous iteration's ranks (one power-iteration
  step per iteration, all block products independent).

Both run as :func:`gdask.iterate` delta iterations: a block whose update is below the per-block
threshold keeps its value, its channel token does not change, and GTracker reuses the block
products that read it.
"""

from __future__ import annotations

import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import Task, TaskRef
from numba import njit

from gdask._compat import scheduler_workers
from gdask.ml._base import job_share, shared_docs
from gdask.ml.kernels._pagerank_cpu import (
    order_estimate,
    order_share_keys,
    order_shares,
    received_weights,
    sort_by_key,
    unsigned,
)

__all__ = ["pagerank", "BlockedGraph", "blocked_graph", "sweep_order"]

_METHODS = ("gauss-seidel", "jacobi")
_LOOPS = ("auto", "workers", "graph")

#: ``loop="auto"`` runs the sweeps on the workers from this many nodes (one default graph block of the
#: delta iteration's): below, a graph per iteration costs milliseconds and keeps GTracker's reuse
WORKERS_MIN_NODES = 65_536

#: the loop on the workers splits the graph between the workers (by default) from this many edges per node:
#: a sweep's values go to every other rank, n values a sweep against the nnz / ranks edges each sweeps,
#: and blocks updated from each other's last sweep need more sweeps than one Gauss-Seidel order (21 in
#: two blocks against 15 in one, 3M edges between 1M nodes). Measured on one 2-core host: one rank is
#: faster at 3-8 edges a node, the two level at 20
SPLIT_MIN_EDGES_PER_NODE = 24

#: one block on the workers sweeps in node order, without weighing the in-degree order, when this share
#: of the nodes or more is dangling: the rank they spread each sweep (one sweep late, over every node)
#: bounds the sweeps whatever the order. Measured (1M nodes, tol 1e-6, sweeps in-degree / node order):
#: 60% dangling 5 / 5, 58% (R-MAT) 17 / 14, 30% 9 / 8, but 20% 10 / 12 and 1% 8 / 15
DANGLING_NATURAL = 0.25

#: the in-degree order's share is estimated over one in ``2 ** SHARE_SAMPLE_BITS`` of the sources on graphs
#: of more than SHARE_SAMPLE_MIN_EDGES edges (its random reads cost 35 ms on 5M random edges)
SHARE_SAMPLE_BITS = 3
SHARE_SAMPLE_MIN_EDGES = 2_000_000


def _held(x):
    """A block of the graph: the task that holds it (rerun from the scheduler's copy when lost)."""
    return x


def _contrib(m, y, inv):
    """One block product: links from source block j into destination block i."""
    return m @ (y * inv)


def _row_update(damping, teleport, *parts):
    out = parts[0].copy()
    for p in parts[1:]:
        out += p
    out *= damping
    out += teleport
    return out


@njit(nogil=True, cache=True)
def _gs_kernel(indptr, indices, data, inv, y, b, damping, sweeps, descending):  # pragma: no cover - compiled
    """In place: ``sweeps`` Gauss-Seidel sweeps of ``y = damping * M @ (inv * y) + b`` over the rows
    of one diagonal block, visiting rows in descending (or ascending) order; a row's link to itself
    is solved for (``y[r] = (damping * s' + b[r]) / (1 - damping * w * inv[r])``), as each row's own
    equation in Gauss-Seidel."""
    n = y.shape[0]
    for _ in range(sweeps):
        for t in range(n):
            r = n - 1 - t if descending else t
            s = 0.0
            own = 0.0
            for k in range(indptr[r], indptr[r + 1]):
                c = indices[k]
                if c == r:
                    own += data[k] * inv[c]
                else:
                    s += data[k] * inv[c] * y[c]
            y[r] = (damping * s + b[r]) / (1.0 - damping * own)


def _diag_solve(m, inv, y, damping, teleport, sweeps, descending, *parts):
    """Block ``i``'s Gauss-Seidel update: the incoming products ``parts`` (other blocks, already
    weighted by their inverse out-degrees) plus ``sweeps`` row-by-row sweeps over the diagonal block
    ``m`` starting from the block's current value ``y``."""
    b = np.full(y.shape[0], teleport)
    for p in parts:
        b += damping * p
    out = np.array(y, dtype=np.float64, copy=True)
    _gs_kernel(m.indptr, m.indices, m.data, np.asarray(inv, dtype=np.float64), out, b, float(damping), int(sweeps),
               bool(descending))
    return out


@dataclass
class BlockedGraph:
    """A graph split into ``nblocks x nblocks`` CSR blocks held on the cluster.

    ``blocks[i][j]`` is the future of ``M[rows_i, cols_j]`` where ``M = A.T`` (row = destination,
    column = source); ``inv[j]`` the future of the inverse out-degrees of source block ``j``
    (0 for dangling nodes); ``bounds`` the node ranges of the blocks. The futures are of tasks
    (not scattered data), so blocks lost with a worker are computed again.
    """

    n: int
    bounds: np.ndarray
    blocks: list
    inv: list
    nnz: int

    @property
    def nblocks(self) -> int:
        return len(self.bounds) - 1

    def block_sizes(self) -> list[int]:
        return [int(b - a) for a, b in zip(self.bounds[:-1], self.bounds[1:])]

    def release(self) -> None:
        """Drop the blocks' futures (never ``Future.release()``: they may be shared)."""
        self.blocks = []
        self.inv = []


def _check_adjacency(A: Any):
    import scipy.sparse as sp

    if not sp.issparse(A):
        A = sp.csr_matrix(np.asarray(A))
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"the adjacency matrix must be square, got shape {A.shape}")
    A = A.tocsr()  # no copy of a CSR matrix: it is only read
    if A.dtype != np.float64:  # the weights in float64; SciPy's astype copies the indices and indptr too
        A = sp.csr_matrix((A.data.astype(np.float64), A.indices, A.indptr), shape=A.shape, copy=False)
    if A.nnz and A.data.min() < 0:
        raise ValueError("edge weights must be non-negative")
    if A.indices.dtype != np.int32 and max(A.shape[0], A.nnz) < 2 ** 31:
        # 64-bit indices that fit in 32 bits (set by hand, or loaded so): the kernels' usual types, not
        # a second compilation of each of them for these (8 s on a 2-core machine)
        A = sp.csr_matrix((A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32)), shape=A.shape, copy=False)
    return A


def _out_weights(A: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each node's out-weight (row sum of ``A``) and its inverse (0 for dangling nodes)."""
    out = np.asarray(A.sum(axis=1)).ravel()
    inv = np.zeros(A.shape[0])
    np.divide(1.0, out, out=inv, where=out > 0)
    return out, inv


def blocked_graph(A: Any, nblocks: int | None = None, client: Any = None) -> BlockedGraph:
    """Split adjacency ``A`` (``A[i, j]`` = weight of edge ``i -> j``) into blocks on the cluster."""
    if client is None:
        from distributed import default_client

        client = default_client()
    A = _check_adjacency(A)
    n = A.shape[0]
    if nblocks is None:
        nblocks = int(min(16, max(2, n // 65536)))
    nblocks = int(max(1, min(nblocks, n)))
    bounds = np.linspace(0, n, nblocks + 1).astype(np.int64)
    _, inv = _out_weights(A)
    M = A.T.tocsr()
    parts = []
    for i in range(nblocks):
        rows = M[bounds[i]:bounds[i + 1]]
        rows_c = rows.tocsc()
        for j in range(nblocks):
            parts.append(rows_c[:, bounds[j]:bounds[j + 1]].tocsr())
    # Blocks come from tasks, never ``client.scatter``: the scheduler keeps each task (its block in
    # the task's arguments), so a block lost with a worker is computed again (lineage); scattered
    # data is lost for good. Per-call keys: content-hashed keys would be shared with an earlier call
    # on equal blocks, whose release may still be under way on the scheduler.
    name = f"pagerank-block-{uuid.uuid4().hex}"
    dsk = {(name, i, j): Task((name, i, j), _held, parts[i * nblocks + j])
           for i in range(nblocks) for j in range(nblocks)}
    dsk.update({(name + "-inv", j): Task((name + "-inv", j), _held, inv[bounds[j]:bounds[j + 1]].copy())
                for j in range(nblocks)})
    keys = list(dsk)
    with warnings.catch_warnings():  # the blocks travel in the graph, once: what this call is for
        warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
        futs = dict(zip(keys, client.get(dsk, keys, sync=False)))
    blocks = [[futs[(name, i, j)] for j in range(nblocks)] for i in range(nblocks)]
    inv_f = [futs[(name + "-inv", j)] for j in range(nblocks)]
    return BlockedGraph(n=n, bounds=bounds, blocks=blocks, inv=inv_f, nnz=int(A.nnz))


#: the loop on the workers sweeps a graph whose best sweep order carries less than this share of the
#: transition weight forward (e.g. random links: ~0.5-0.65) in node order, spreading the dangling
#: nodes' rank every sweep as the power iteration does: 11 sweeps in one block (14 in two) against
#: SciPy's 16 power iterations on 5M random edges between 1M nodes, where the sweeps of the linear
#: system took 45-56 (its series converges at ``damping``'s rate). Graphs whose links follow an
#: order (shares of 0.95 and more on citation-like and power-law graphs, in node order or by received
#: rank) converge in fewer sweeps without that global term: 12 against 28.
ORDERLESS = 0.8

#: one block on the workers is renumbered by received rank (the in-degree order) only when that order's
#: share reaches this: renumbering costs its sort and the transpose on the worker, ~4-5 sweeps' time, and
#: below it the order saved fewer sweeps than that. Measured (1M nodes, tol 1e-6, sweeps in-degree / node
#: order, 2-3% dangling): power-law graphs renumbered at random, shares 0.96 8 / 16, 0.92 10 / 15 (the
#: same time), 0.86 11 / 13 (node order faster); links from random nodes to Zipf-popular ones, share
#: 0.85, 11 / 11 at 2% to 20% dangling (node order 0.3-0.7 s faster). The node order is never the
#: risk: Gauss-Seidel needs at most the power iteration's sweeps (Stein-Rosenberg), each an SpMV's cost
RENUMBER_MIN_SHARE = 0.9


def sweep_order(A: Any) -> tuple[str, np.ndarray | None]:
    """The Gauss-Seidel sweep order for adjacency ``A``: the one in which most rank flows forward.

    A sweep gains over a power iteration by the links whose source is updated before their
    destination. Candidates: the node order swept in descending or ascending index, and the nodes
    sorted by the rank they receive in one step (weighted in-degree, ascending: sources first, hubs
    last; ties in the better direction of the node order). Each is scored by the share of the
    transition weight on its forward links (the in-degree order's over a fixed eighth of the sources
    on graphs of more than :data:`SHARE_SAMPLE_MIN_EDGES` edges); the node order is kept unless the
    in-degree order scores more than 0.05 higher (renumbering the graph costs a copy of it).

    Parameters
    ----------
    A : scipy.sparse matrix
        ``A[i, j]`` = weight of the edge ``i -> j``.

    Returns
    -------
    (str, numpy.ndarray or None)
        ``"descending"`` or ``"ascending"`` with ``None``, or ``"in-degree"`` with the
        permutation ``perm`` (new node ``k`` is node ``perm[k]``) to sweep in ascending order.
    """
    order, perm, _ = _sweep_order(A)
    return order, perm


def _sweep_order(A: Any, dangling_natural: float | None = None,
                 renumber_min: float = 0.0) -> tuple[str, np.ndarray | None, float]:
    """:func:`sweep_order` and the share of the transition weight on the order's forward links; with
    ``dangling_natural``, the node order when at least that share of the nodes is dangling; the
    in-degree order only when its share is ``renumber_min`` or more."""
    A = _check_adjacency(A)
    n = A.shape[0]
    if n >= 2 ** 32:
        raise ValueError(f"sweep_order takes graphs of fewer than 2**32 nodes, got {n}")
    indptr = A.indptr.astype(np.int64, copy=False)
    inv = np.empty(n)
    down, up, total = order_shares(indptr, A.indices, A.data, inv)
    if total <= 0:
        return "descending", None, 1.0
    desc, asc = down / total, up / total  # links to lower indices: forward in a descending sweep
    natural = "descending" if desc >= asc else "ascending"
    if max(desc, asc) >= 0.95:  # no order can score 0.05 more: skip the sort
        return natural, None, max(desc, asc)
    if dangling_natural is not None and np.count_nonzero(inv == 0.0) >= dangling_natural * n:
        return natural, None, max(desc, asc)
    received = np.empty(n)
    received_weights(indptr, unsigned(A.indices), A.data, inv, received)
    # by received rank (float32-rounded: positive floats' bits order as the floats do), ascending; ties
    # (and near-ties) in the better direction of the node order. Its share from the keys themselves (no
    # sort unless it wins), on large graphs over a fixed eighth of the sources (a ~1e-3 estimate)
    keys = received.astype(np.float32).view(np.uint32)
    ties = natural == "descending"
    sample = SHARE_SAMPLE_BITS if A.nnz > SHARE_SAMPLE_MIN_EDGES else 0
    fwd, tot = order_share_keys(indptr, unsigned(A.indices), A.data, inv, keys, ties, sample)
    if tot <= 0 and sample:
        fwd, tot = order_share_keys(indptr, unsigned(A.indices), A.data, inv, keys, ties, 0)
    by_degree = fwd / tot if tot > 0 else 0.0
    if by_degree > max(desc, asc) + 0.05 and by_degree >= renumber_min:
        return "in-degree", sort_by_key(keys, ties).astype(np.int64), by_degree
    return natural, None, max(desc, asc)


def _clearly_orderless(A: Any) -> bool:
    """Whether samples of ``A``'s links (:func:`order_estimate`: two of an eighth of the sources, or
    of about a million links on larger graphs) show no order with a share near :data:`ORDERLESS`:
    the node order's two directions and the in-degree order, all under ``ORDERLESS - 0.1``. Then
    :func:`_sweep_order`, 4 to 9 times longer on such graphs (64 against 13 ms on 5M random links,
    178 against 20 on 20M), is not needed. The in-degree share from sampled
    keys can run 0.12 low (0.60 against 0.72 on a preferential-attachment graph): a graph whose
    in-degree order holds just over ``ORDERLESS`` may be swept in node order, more sweeps to the
    same ranks. On graphs of up to :data:`SHARE_SAMPLE_MIN_EDGES` links the full choice is cheap
    enough: False. False too when at least :data:`DANGLING_NATURAL` of the nodes have no links: the
    choice with ``dangling_natural`` then ends after its first pass, which costs less than these
    samples' random reads (18 against 20-28 ms on 4M links from a third of 1M nodes)."""
    if A.nnz <= SHARE_SAMPLE_MIN_EDGES or A.shape[0] >= 2 ** 32:
        return False
    if np.count_nonzero(A.indptr[1:] == A.indptr[:-1]) >= DANGLING_NATURAL * A.shape[0]:
        return False
    bits = max(SHARE_SAMPLE_BITS, min(12, int(np.log2(A.nnz / 1e6))))
    est = order_estimate(A.indptr.astype(np.int64, copy=False), unsigned(A.indices), A.data, bits, np.empty(A.shape[0]))
    return max(est) < ORDERLESS - 0.1


def _compute(layer: dict, outs: list) -> list:
    import dask

    name = "pagerank-" + tokenize(outs)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=())
    return list(dask.compute(*[Delayed(k, graph, layer=name) for k in outs]))


def _product(layer: dict, m, y, inv, i: int, j: int) -> TaskRef:
    k = ("pagerank-contrib-" + tokenize(m.key, y.key, inv.key), i, j)
    layer[k] = Task(k, _contrib, m, y, inv)
    return TaskRef(k)


def _make_jacobi_step(damping: float):
    def step(G: BlockedGraph, state, ctx):
        nb = G.nblocks
        teleport = (1.0 - damping) / G.n
        layer: dict = {}
        outs = []
        for i in range(nb):
            parts = [_product(layer, G.blocks[i][j], ctx.refs[j], G.inv[j], i, j) for j in range(nb)]
            rk = ("pagerank-row-" + tokenize([p.key for p in parts], damping, teleport), i)
            layer[rk] = Task(rk, _row_update, damping, teleport, *parts)
            outs.append(rk)
        return _compute(layer, outs)

    return step


def _make_gs_step(damping: float, sweeps: int, descending: bool):
    def step(G: BlockedGraph, state, ctx):
        nb = G.nblocks
        teleport = (1.0 - damping) / G.n
        layer: dict = {}
        new: dict[int, TaskRef] = {}  # blocks already updated in this sweep
        for i in (range(nb - 1, -1, -1) if descending else range(nb)):
            # sources updated earlier in the sweep are read as the new in-graph values; the others as
            # the published (channel) values, so products of unchanged blocks are reused
            parts = [_product(layer, G.blocks[i][j], new.get(j, ctx.refs[j]), G.inv[j], i, j)
                     for j in range(nb) if j != i]
            m, inv, y = G.blocks[i][i], G.inv[i], ctx.refs[i]
            dk = ("pagerank-diag-" + tokenize(m.key, inv.key, y.key, [p.key for p in parts], damping, teleport,
                                              sweeps, descending), i)
            layer[dk] = Task(dk, _diag_solve, m, inv, y, damping, teleport, sweeps, descending, *parts)
            new[i] = TaskRef(dk)
        return _compute(layer, [new[i].key for i in range(nb)])

    return step


@shared_docs
def pagerank(A: Any, *, damping: float = 0.85, tol: float = 1e-6, max_iter: int = 200, nblocks: int | None = None,
             method: str = "gauss-seidel", inner_sweeps: int = 2, loop: str = "auto", client: Any = None,
             return_info: bool = False, gpu: float | None = None, memory: Any = None, job_name: str | None = None,
             verbose: int = 0, callback: Any = None):
    """PageRank of a directed graph as a delta iteration over a blocked sparse graph.

    Same definition as ``networkx.pagerank`` (uniform teleport, dangling nodes' rank spread
    uniformly). Computed through the equivalent linear system without dangling redistribution,
    ``y = damping * A_norm.T @ y + (1 - damping) / n`` with ``rank = y / sum(y)`` (exact for uniform
    teleport and dangling vectors): no global term couples the blocks, so a block of ``y`` that has
    converged stays unchanged. The matrix is split into ``nblocks x nblocks`` CSR blocks, one task
    per block (a product ``M_ij @ y_j`` for ``i != j``, a solve over ``M_ii`` on the diagonal);
    each iteration, :func:`gdask.iterate` publishes only the changed rank blocks on the iteration
    channel and GTracker reuses every block product whose source block did not change.

    With ``method="gauss-seidel"`` an iteration is one block Gauss-Seidel sweep: blocks are
    updated one after the other, each from the newest values of the blocks updated before it, and
    the diagonal block is relaxed row by row (``inner_sweeps`` times). The sweep follows the order
    that most of the transition weight follows (:func:`sweep_order`): the node order, descending
    when most links point to lower-numbered nodes (citation graphs) or ascending, or, when the
    node order does not follow the links, the nodes renumbered by the rank they receive (sources
    first; one block on the workers only from a forward share of :data:`RENUMBER_MIN_SHARE`). Rank
    travels along chains of links within one sweep: several times fewer sweeps than power iterations
    on such graphs. ``method="jacobi"``: power-iteration updates (each block product reads the last iterate).

    Parameters
    ----------
    A : scipy.sparse matrix or array
        ``A[i, j]`` = weight of the edge ``i -> j`` (e.g. from :func:`powerlaw_graph`).
    damping : float, default 0.85
    tol : float, default 1e-6
        Stop when an iteration changes the ranks by at most ``tol`` in L1 norm (the graph loop: when
        it changes the unnormalised ``y`` by at most ``tol * sum(y)``, a stricter test).
    max_iter : int, default 200
        Iterations (sweeps) at most.
    nblocks : int, optional
        Blocks per side (default: about 64Ki nodes per block, 2 to 16).
    method : {"gauss-seidel", "jacobi"}, default "gauss-seidel"
    inner_sweeps : int, default 2
        Gauss-Seidel sweeps over the diagonal block's own edges per block task (``"gauss-seidel"``).
    loop : {"auto", "workers", "graph"}, default "auto"
        ``"workers"``: Gauss-Seidel sweeps in one task per worker, rank blocks sent worker to worker
        (:mod:`gdask.ml._pagerank_loop`; same bits on any number of workers for one ``nblocks``,
        default one block, one per worker from :data:`SPLIT_MIN_EDGES_PER_NODE` edges a node or for
        graphs over a quarter of a worker's memory; progress records come when it ends). ``"graph"``: the delta
        iteration above. ``"auto"``: ``"workers"`` for Gauss-Seidel from :data:`WORKERS_MIN_NODES`
        nodes when config ``gdask.ml.worker-loop`` is on.
    client : distributed.Client, optional
        Default: the current one. None there: ``loop="auto"`` computes here (``info["loop"] == "local"``),
        as the loop on one worker (the same bits for one ``nblocks``, default 1); Jacobi: power iterations.
    {job_parameters}
    verbose : int, default 0
        1: a progress bar and a summary line; 2: one line per iteration (:class:`gdask.gdataset.Progress`).
    callback : callable, optional
        ``callback(record)`` after every iteration (``iteration``, ``seconds``, ``change``,
        ``executed``, ``reused``, ``active_blocks``, ...).
    return_info : bool
        Also return a dict with ``n_iter``, ``converged``, ``history`` (per-iteration tasks executed/reused,
        active blocks), ``block_tasks`` (block tasks per iteration if nothing were reused), ``method``, ``loop``
        and ``order`` (Gauss-Seidel's sweep order, ``"descending"``, ``"ascending"`` or ``"in-degree"``).

    Returns
    -------
    numpy.ndarray or (numpy.ndarray, dict)
        Ranks summing to 1.

    Raises
    ------
    ValueError
        If ``A`` is not square or has negative weights, ``damping`` is not in (0, 1), ``method`` or ``loop``
        is unknown (or not "auto" without a Client), ``loop="workers"`` with "jacobi", or ``inner_sweeps < 1``.

    Examples
    --------
    >>> r = gdask.ml.pagerank(gdask.ml.powerlaw_graph(10_000, seed=0), tol=1e-8)  # doctest: +SKIP
    """
    with job_share(gpu, memory, job_name, "pagerank"):
        return _pagerank(A, damping=damping, tol=tol, max_iter=max_iter, nblocks=nblocks, method=method,
                         inner_sweeps=inner_sweeps, loop=loop, client=client, return_info=return_info,
                         verbose=verbose, callback=callback)


def _pagerank(A: Any, *, damping: float, tol: float, max_iter: int, nblocks: int | None, method: str,
              inner_sweeps: int, loop: str, client: Any, return_info: bool, verbose: int = 0, callback: Any = None):
    from gdask.gdataset import iterate

    if loop not in _LOOPS:
        raise ValueError(f"loop must be one of {_LOOPS}, got {loop!r}")
    if not 0 < damping < 1:
        raise ValueError(f"damping must be in (0, 1), got {damping}")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if int(inner_sweeps) < 1:
        raise ValueError(f"inner_sweeps must be >= 1, got {inner_sweeps}")
    if client is None:
        from gdask.gdataset import default_client_or_none

        client = default_client_or_none()
    A = _check_adjacency(A)
    if client is None:  # no cluster: the sweeps (or Jacobi's products) in this process
        if loop != "auto":
            raise ValueError(f"loop={loop!r} runs on a Dask cluster, and there is no Client: pass client=, start "
                             "one (gdask.LocalGPUCluster and distributed.Client), or leave loop='auto' to compute "
                             "in this process")
        progress = (verbose, callback, max_iter)
        if method == "jacobi":
            return _jacobi_here(A, damping=damping, tol=tol, max_iter=max_iter, return_info=return_info,
                                progress=progress)
        return _pagerank_workers(A, damping=damping, tol=tol, max_iter=max_iter, nblocks=nblocks, client=None,
                                 return_info=return_info, progress=progress)
    if _on_workers(loop, method, A.shape[0]):
        return _pagerank_workers(A, damping=damping, tol=tol, max_iter=max_iter, nblocks=nblocks, client=client,
                                 return_info=return_info, progress=(verbose, callback, max_iter))
    order, perm = None, None
    if method == "gauss-seidel":
        order, perm = sweep_order(A)
        if perm is not None:
            A = A[perm][:, perm].tocsr()
        step = _make_gs_step(damping, int(inner_sweeps), order == "descending")
    else:
        step = _make_jacobi_step(damping)
    G = blocked_graph(A, nblocks=nblocks, client=client)
    try:
        y0 = [np.full(s, (1.0 - damping) / G.n) for s in G.block_sizes()]
        # every iterate stays below the fixed point y (Jacobi and Gauss-Seidel alike: each value is a
        # non-negative combination of values below y, started from y0 <= y), so sum(y_k) <= sum(y):
        # tol * sum(y_k) on y's L1 change is at least as strict as tol on the normalised ranks' change.
        from gdask.gdataset import Progress

        res = iterate(step, y0, data=G, max_iter=max_iter,
                      tol=lambda s: tol * sum(float(b.sum()) for b in s), client=client, per_block=True,
                      progress=Progress(verbose, callback, total=max_iter, desc="pagerank"))
    finally:
        G.release()
    y = np.concatenate(res.state)
    if perm is not None:
        y[perm] = y.copy()
    r = y / y.sum()
    if return_info:
        return r, {"n_iter": res.n_iter, "converged": res.converged, "history": res.history,
                   "nblocks": G.nblocks, "block_tasks": G.nblocks * G.nblocks, "method": method, "order": order,
                   "loop": "graph"}
    return r


def _on_workers(loop: str, method: str, n: int) -> bool:
    """Whether the sweeps run in the loop on the workers (see ``loop`` of :func:`pagerank`)."""
    from gdask import config

    if loop != "auto":
        if loop == "workers" and method != "gauss-seidel":
            raise ValueError("loop='workers' sweeps Gauss-Seidel: pass method='gauss-seidel' (or loop='graph')")
        return loop == "workers"
    return method == "gauss-seidel" and n >= WORKERS_MIN_NODES and bool(config.get("ml.worker-loop", True))


def _prepared_bytes(A: Any) -> int:
    """About the bytes of ``A`` prepared for the loop on the workers (4-byte indices, weights, row
    pointers): :func:`gdask.ml._pagerank_loop.prepare`'s output."""
    return 12 * A.nnz + 8 * A.shape[0]


def _worker_blocks(A: Any, client: Any) -> int:
    """Default ``nblocks`` of the loop on the workers: one block (one rank sweeps the whole graph in
    one Gauss-Seidel order) unless the graph has :data:`SPLIT_MIN_EDGES_PER_NODE` edges a node or
    more, or its blocks would take over a quarter of a worker's memory limit; then one per worker."""
    info = scheduler_workers(client)
    workers = max(1, len(info))
    n = A.shape[0]
    limits = [w.get("memory_limit") or 0 for w in info.values()]
    room = min(limits) / 4 if limits and min(limits) > 0 else float("inf")
    size = _prepared_bytes(A) + 16 * n  # the blocks and the rank's own vectors
    if A.nnz >= SPLIT_MIN_EDGES_PER_NODE * n or size > room:
        return workers
    return 1


def _pagerank_workers(A: Any, *, damping: float, tol: float, max_iter: int, nblocks: int | None, client: Any,
                      return_info: bool, progress: tuple):
    """:func:`pagerank` with the sweeps on the workers (:mod:`gdask.ml._pagerank_loop`); without a
    client (None) the same sweeps in this process, as one rank (default one block)."""
    from gdask.ml._pagerank_loop import direct, discard, place, prepare, run_sweeps, sweep_here

    def sweeps(P: Any, descending: bool, spread: bool, placed: Any = None) -> dict:
        if client is None:
            return sweep_here(P, damping=damping, tol=tol, max_iter=max_iter, descending=descending, spread=spread)
        return run_sweeps(client, P, damping=damping, tol=tol, max_iter=max_iter, descending=descending,
                          spread=spread, placed=placed)

    if nblocks is None:
        nblocks = 1 if client is None else _worker_blocks(A, client)
    if nblocks == 1:
        # one block: sweeps over A itself on one worker (no transpose here), A sent while the order is chosen
        P = direct(A, None)
        with ThreadPoolExecutor(1, thread_name_prefix="gdask-pagerank") as pool:
            placed = None if client is None else pool.submit(place, client, P)
            try:
                if _clearly_orderless(A):
                    order, perm = "ascending", None
                else:
                    order, perm, share = _sweep_order(A, DANGLING_NATURAL, RENUMBER_MIN_SHARE)
                    if share < ORDERLESS:  # no order that the rank follows: the sweeps as power iterations do
                        order, perm = "ascending", None
            except BaseException:
                if placed is not None:
                    discard(placed)  # the files it wrote, if any: run_sweeps never took them
                raise
            if perm is not None:
                P.order = perm.astype(P.order.dtype)
            res = sweeps(P, order == "descending", True, placed)
        return _finish_workers(res, P, order, None, progress, return_info, client)
    # the blocks in node order are built beside the choice of the order (the kernels release the GIL),
    # kept unless the nodes are renumbered (that build is then stopped: it would hold a core, and this
    # call, 0.07 s on 3M edges); not when a second copy of the graph would crowd the memory
    spare = _prepared_bytes(A) < psutil.virtual_memory().available / 4
    pos = None
    stop = np.zeros(1, np.uint8)
    with ThreadPoolExecutor(1, thread_name_prefix="gdask-pagerank") as pool:
        in_node_order = pool.submit(prepare, A, None, nblocks, stop) if spare else None
        try:
            order, perm, share = _sweep_order(A)
        except BaseException:
            stop[0] = 1  # the pool's exit waits for the build: end it
            raise
        if share < ORDERLESS:  # no order that the rank follows: the sweeps as power iterations do
            order, perm = "ascending", None
        if perm is None:
            P = in_node_order.result() if in_node_order is not None else prepare(A, None, nblocks)
        else:
            stop[0] = 1
            pos = np.empty_like(perm)
            pos[perm] = np.arange(len(perm))
            P = prepare(A, pos, nblocks)
    # between blocks updated from each other's last sweep the dangling rank's spread slows ordered graphs
    res = sweeps(P, order == "descending", share < ORDERLESS)
    return _finish_workers(res, P, order, pos, progress, return_info, client)


def _finish_workers(res: dict, P: Any, order: str, pos: np.ndarray | None, progress: tuple, return_info: bool,
                    client: Any):
    from gdask.gdataset import Progress

    bar = Progress(progress[0], progress[1], total=progress[2], desc="pagerank")
    try:
        for record in res["history"]:  # the records of the sweeps come back with the ranks
            bar.update(record)
    finally:
        bar.close(converged=res["converged"])
    # a new array either way: NumPy's sum of an array that came through a socket at an odd offset (not
    # 8-byte aligned) can differ in the last bit from the same values read from a file
    y = res["y"].copy() if pos is None else res["y"][pos]
    r = y / y.sum()
    if return_info:
        return r, {"n_iter": res["n_iter"], "converged": res["converged"], "history": res["history"],
                   "nblocks": P.nblocks, "block_tasks": P.nblocks if client is not None else 0,
                   "method": "gauss-seidel", "order": order, "loop": "workers" if client is not None else "local",
                   "ranks": res["ranks"], "restarts": res["restarts"]}
    return r


def _jacobi_here(A: Any, *, damping: float, tol: float, max_iter: int, return_info: bool, progress: tuple):
    """:func:`pagerank` with ``method="jacobi"`` without a Client: power iterations as SciPy products
    in this process, ``y <- damping * (A.T @ (y / out-weights) + dangling rank / n) + (1 - damping) / n``
    from ``y = 1 / n``, until ``y`` changes by at most ``tol * sum(y)`` (L1)."""
    from gdask.gdataset import Progress

    n = A.shape[0]
    M = A.T.tocsr()
    out, inv = _out_weights(A)
    dangling = out == 0
    y = np.full(n, 1.0 / n)
    history, converged = [], False
    bar = Progress(progress[0], progress[1], total=progress[2], desc="pagerank")
    try:
        for it in range(1, max_iter + 1):
            t0 = time.perf_counter()
            new = M @ (inv * y)
            new += float(y[dangling].sum()) / n
            new *= damping
            new += (1.0 - damping) / n
            diff, total = float(np.abs(new - y).sum()), float(new.sum())
            y = new
            record = {"iteration": it, "seconds": time.perf_counter() - t0, "change": diff / total,
                      "active_blocks": int(diff > 0), "executed": 0, "reused": 0, "executed_by_prefix": {},
                      "channel_bytes": 0}
            history.append(record)
            bar.update(record)
            if diff <= tol * total:
                converged = True
                break
    finally:
        bar.close(converged=converged)
    r = y / y.sum()
    if return_info:
        return r, {"n_iter": len(history), "converged": converged, "history": history, "nblocks": 1,
                   "block_tasks": 0, "method": "jacobi", "order": None, "loop": "local"}
    return r
