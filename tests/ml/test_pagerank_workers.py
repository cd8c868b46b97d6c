"""gdask.ml.pagerank with its sweeps on the workers (loop="workers"): answers, bits, kernels."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import gdask.ml
from gdask import _shm
from gdask.ml import _pagerank
from gdask.ml._pagerank import (
    DANGLING_NATURAL,
    ORDERLESS,
    RENUMBER_MIN_SHARE,
    _clearly_orderless,
    _sweep_order,
    _worker_blocks,
    sweep_order,
)
from gdask.ml._pagerank_loop import (
    EXCEPTIONS_MAX_SHARE,
    OneRank,
    _one_block,
    _rank_sweeps,
    direct,
    narrow,
    own_links,
    prepare,
)
from gdask.ml.kernels._pagerank_cpu import (
    order_estimate,
    order_share_keys,
    sort_by_key,
    sweep_block,
    transpose_fold,
    transpose_renumber,
    unsigned,
)
from tests.ml.test_pagerank import reference_pagerank


def _shuffled(A, seed):
    p = np.random.default_rng(seed).permutation(A.shape[0])
    return A[p][:, p].tocsr()


@pytest.mark.parametrize("kind", ["natural", "reversed", "shuffled", "weighted"])
@pytest.mark.parametrize("nblocks", [1, 3])
def test_matches_dense_reference(bclient, kind, nblocks):
    A = gdask.ml.powerlaw_graph(700, avg_degree=4, seed=3, p_back=0.05)
    if kind == "reversed":
        A = A[::-1][:, ::-1].tocsr()
    elif kind == "shuffled":
        A = _shuffled(A, 1)
    elif kind == "weighted":
        A.data = np.random.default_rng(0).uniform(0.5, 3.0, A.nnz)
    assert (A.getnnz(axis=1) == 0).any()  # dangling nodes
    r, info = gdask.ml.pagerank(A, tol=1e-10, nblocks=nblocks, loop="workers", return_info=True, client=bclient)
    assert info["loop"] == "workers" and info["converged"] and info["nblocks"] == nblocks
    assert info["order"] == {"natural": "descending", "reversed": "ascending", "shuffled": "in-degree",
                             "weighted": "descending"}[kind]
    np.testing.assert_allclose(r, reference_pagerank(A), rtol=0, atol=1e-9)
    assert r.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("nblocks", [1, 2])
def test_small_handmade_graph(client, nblocks):
    # 0 -> 1 (weight 2), 0 -> 2, 1 -> 2, 2 -> 0, 3 dangling, 4 isolated
    A = sp.csr_matrix((np.array([2.0, 1.0, 1.0, 1.0]), (np.array([0, 0, 1, 2]), np.array([1, 2, 2, 0]))),
                      shape=(5, 5))
    r = gdask.ml.pagerank(A, damping=0.5, tol=1e-12, nblocks=nblocks, loop="workers", client=client)
    np.testing.assert_allclose(r, reference_pagerank(A, damping=0.5), atol=1e-10)


def test_same_bits_wherever_the_blocks_sit(client):
    # 4 blocks on the 2 workers (2 each) and all 4 in one rank in this process: the same bits, as a
    # block reads the other blocks' values of the previous sweep wherever they are
    A = _shuffled(gdask.ml.powerlaw_graph(3000, avg_degree=5, seed=4), 2)
    r, info = gdask.ml.pagerank(A, tol=1e-9, nblocks=4, loop="workers", return_info=True, client=client)
    assert info["ranks"] == 2
    _, perm = sweep_order(A)
    pos = np.empty_like(perm)
    pos[perm] = np.arange(len(perm))
    P = prepare(A.astype(np.float64), pos, 4)
    one = _rank_sweeps(OneRank(), [P.block(b) for b in range(4)], P.out, P.bounds, 0.85, 1e-9, 200, False)
    y = one["y"][pos]
    assert one["n_iter"] == info["n_iter"]
    np.testing.assert_array_equal(r, y / y.sum())


def test_fewer_sweeps_than_power_iterations(client):
    A = gdask.ml.powerlaw_graph(5000, avg_degree=5, seed=0, p_back=0.05)
    _, gs = gdask.ml.pagerank(A, tol=1e-8, nblocks=2, loop="workers", return_info=True, client=client)
    _, jac = gdask.ml.pagerank(A, tol=1e-8, nblocks=2, method="jacobi", return_info=True, client=client)
    assert gs["converged"] and 2 * gs["n_iter"] <= jac["n_iter"]


def _power_iterations(A, tol, damping=0.85):
    """The power iteration as SciPy users write it (dangling rank spread over every node, the L1
    change of the ranks against ``tol``): its iterations and ranks."""
    n = A.shape[0]
    out = np.asarray(A.sum(axis=1)).ravel()
    inv = np.zeros(n)
    np.divide(1.0, out, out=inv, where=out > 0)
    M, r, dangling = A.T.tocsr(), np.full(n, 1.0 / n), out == 0
    for it in range(1, 1000):
        new = damping * (M @ (r * inv) + r[dangling].sum() / n) + (1.0 - damping) / n
        change, r = np.abs(new - r).sum(), new
        if change <= tol:
            return it, r
    raise AssertionError("the power iteration did not converge")


@pytest.mark.parametrize("nblocks", [1, 2])
def test_links_without_an_order_take_no_more_sweeps_than_power_iterations(client, nblocks):
    """Random links follow no order: the sweeps spread the dangling nodes' rank as the power
    iteration does. The linear system without that term converges only at the damping's rate
    (3x the power iteration's iterations at 1M nodes, whatever the sweep order)."""
    rng = np.random.default_rng(7)
    n, m = 20_000, 100_000
    A = sp.csr_matrix((np.ones(m), (rng.integers(0, n, m), rng.integers(0, n, m))), shape=(n, n))
    A.sum_duplicates()
    assert _sweep_order(A)[2] < ORDERLESS
    its, _ = _power_iterations(A, 1e-8)
    _, ref = _power_iterations(A, 1e-13)
    r, info = gdask.ml.pagerank(A, tol=1e-8, nblocks=nblocks, loop="workers", return_info=True, client=client)
    assert info["converged"] and info["n_iter"] <= its, (info["n_iter"], its)
    assert np.abs(r - ref).sum() <= 1e-6


def _zipf_dangling(n, m, seed, dangling=0.3):
    """Links from random sources among the first ``1 - dangling`` of the nodes to Zipf-distributed
    targets, nodes renumbered at random: hubs anywhere, many of them dangling."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, int(n * (1 - dangling)), m)
    dst = rng.permutation(n)[np.minimum(rng.zipf(1.6, m) - 1, n - 1)]
    A = sp.csr_matrix((np.ones(m), (src, dst)), shape=(n, n))
    A.sum_duplicates()
    A.data[:] = 1.0
    return A


def test_one_block_spreads_the_dangling_rank(client):
    """One block (the default on sparse graphs) spreads the dangling nodes' rank each sweep: with 30%
    of the nodes dangling, hubs among them, the linear system without that term needs more sweeps than
    the power iteration's iterations although the links follow an order (15 against 13 at 1M nodes)."""
    A = _zipf_dangling(20_000, 100_000, seed=3)
    assert _sweep_order(A)[2] >= ORDERLESS
    its, _ = _power_iterations(A, 1e-8)
    _, ref = _power_iterations(A, 1e-13)
    r, info = gdask.ml.pagerank(A, tol=1e-8, nblocks=1, loop="workers", return_info=True, client=client)
    assert info["converged"] and info["n_iter"] < its, (info["n_iter"], its)
    assert np.abs(r - ref).sum() <= 1e-6


def test_one_block_sweeps_in_node_order_when_many_nodes_dangle(client):
    """With a quarter of the nodes dangling or more, one block sweeps in node order: the in-degree
    order (which sweep_order picks for these links) needs no fewer sweeps there and costs a sort."""
    A = _zipf_dangling(20_000, 100_000, seed=4, dangling=0.3)
    assert sweep_order(A)[0] == "in-degree"
    _, one = gdask.ml.pagerank(A, tol=1e-8, nblocks=1, loop="workers", return_info=True, client=client)
    _, two = gdask.ml.pagerank(A, tol=1e-8, nblocks=2, loop="workers", return_info=True, client=client)
    assert one["order"] == "ascending" and two["order"] == "in-degree"
    B = _zipf_dangling(20_000, 100_000, seed=4, dangling=0.1)
    _, few = gdask.ml.pagerank(B, tol=1e-8, nblocks=1, loop="workers", return_info=True, client=client)
    assert few["order"] == "in-degree"


def test_default_blocks(client, monkeypatch):
    """One block (one rank sweeps the whole graph in one order) unless the graph has many edges a node
    or would crowd a worker's memory; then one block per worker."""
    sparse = gdask.ml.powerlaw_graph(_pagerank.WORKERS_MIN_NODES, avg_degree=5, seed=1)
    assert _worker_blocks(sparse, client) == 1
    r, info = gdask.ml.pagerank(sparse, tol=1e-8, return_info=True, client=client)
    assert info["loop"] == "workers" and info["nblocks"] == 1 and info["ranks"] == 1
    monkeypatch.setattr(_pagerank, "SPLIT_MIN_EDGES_PER_NODE", 4)
    assert _worker_blocks(sparse, client) == 2
    r2, info2 = gdask.ml.pagerank(sparse, tol=1e-8, return_info=True, client=client)
    assert info2["nblocks"] == 2 and info2["ranks"] == 2
    np.testing.assert_allclose(r2, r, rtol=0, atol=1e-7)
    monkeypatch.setattr(_pagerank, "SPLIT_MIN_EDGES_PER_NODE", 10 ** 6)
    monkeypatch.setattr(_pagerank, "scheduler_workers", lambda c: {"a": {"memory_limit": 10 * sparse.nnz},
                                                                   "b": {"memory_limit": 10 ** 12}})
    assert _worker_blocks(sparse, client) == 2  # over a quarter of the smaller worker's memory


def test_sort_by_key_orders_ties_by_index():
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 7, 5000):
        # keys with equal values and digits in all three 11-bit passes
        keys = (rng.integers(0, 4, n) << 25 | rng.integers(0, 3, n) << 12 | rng.integers(0, 2, n)).astype(np.uint32)
        idx = np.arange(n)
        np.testing.assert_array_equal(sort_by_key(keys, False), np.lexsort((idx, keys)))
        np.testing.assert_array_equal(sort_by_key(keys, True), np.lexsort((-idx, keys)))


@pytest.mark.parametrize("ties", [False, True])
def test_order_share_from_keys_is_the_sorted_orders(ties):
    """The in-degree order's forward share from the keys (no sort) is the share of the sorted order;
    over an eighth of the sources it is an estimate within 0.01 here."""
    A = _shuffled(gdask.ml.powerlaw_graph(60_000, avg_degree=5, seed=3, p_back=0.1), 2)
    A = (A + sp.eye(60_000, format="csr")).tocsr()  # self-loops count in neither direction
    A.data = np.random.default_rng(0).random(A.nnz) + 0.5
    indptr = A.indptr.astype(np.int64)
    out = np.asarray(A.sum(axis=1)).ravel()
    inv = 1.0 / out
    keys = np.random.default_rng(1).integers(0, 500, 60_000).astype(np.uint32)  # many ties
    pos = np.empty(60_000, np.int64)
    pos[sort_by_key(keys, ties)] = np.arange(60_000)
    coo = A.tocoo()
    w = coo.data * inv[coo.row]
    loops = coo.row == coo.col
    want = w[(pos[coo.row] < pos[coo.col]) & ~loops].sum() / w[~loops].sum()
    fwd, tot = order_share_keys(indptr, unsigned(A.indices), A.data, inv, keys, ties, 0)
    assert tot == pytest.approx(w[~loops].sum(), rel=1e-12)
    assert fwd / tot == pytest.approx(want, rel=1e-12)
    fwd8, tot8 = order_share_keys(indptr, unsigned(A.indices), A.data, inv, keys, ties, 3)
    assert 0.08 * tot < tot8 < 0.17 * tot and abs(fwd8 / tot8 - want) < 0.01


def test_auto_loop(client):
    A = gdask.ml.powerlaw_graph(2000, avg_degree=4, seed=1)
    _, info = gdask.ml.pagerank(A, tol=1e-8, return_info=True, client=client)
    assert info["loop"] == "graph"  # below WORKERS_MIN_NODES: the delta iteration


def test_transpose_renumber_matches_scipy():
    A = gdask.ml.powerlaw_graph(500, avg_degree=4, seed=2, p_back=0.2)
    A.data = np.arange(1.0, A.nnz + 1.0)
    pos = np.random.default_rng(3).permutation(500)
    for p in (np.empty(0, np.int64), pos):
        ptr, idx, val = np.empty(501, np.int64), np.empty(A.nnz, np.int32), np.empty(A.nnz)
        assert transpose_renumber(A.indptr.astype(np.int64), A.indices, A.data, p, ptr, idx, val, np.zeros(1, np.uint8))
        coo = A.tocoo()
        want = A if p.size == 0 else sp.csr_matrix((coo.data, (pos[coo.row], pos[coo.col])), shape=A.shape)
        got = sp.csr_matrix((val, idx, ptr), shape=A.shape)
        assert (got != want.T.tocsr()).nnz == 0


def test_a_stopped_transpose_ends_early_and_prepare_returns_none():
    # the node-order build beside the sweep order is stopped when the order renumbers the nodes
    A = gdask.ml.powerlaw_graph(3000, avg_degree=4, seed=5)
    stop = np.ones(1, np.uint8)
    ptr, idx, val = np.empty(3001, np.int64), np.empty(A.nnz, np.uint32), np.empty(0)
    assert not transpose_renumber(A.indptr.astype(np.int64), unsigned(A.indices), A.data, np.empty(0, np.uint32),
                                  ptr, idx, val, stop)
    assert prepare(A, None, 1, stop) is None
    stop[0] = 0
    P = prepare(A, None, 1, stop)
    assert P is not None and (sp.csr_matrix((np.ones(A.nnz), P.indices, P.indptr), shape=A.shape)
                              != A.T.tocsr()).nnz == 0


def test_loop_errors(client):
    with pytest.raises(ValueError, match="loop"):
        gdask.ml.pagerank(sp.eye(3, format="csr"), loop="gpu", client=client)
    with pytest.raises(ValueError, match="method='gauss-seidel'"):
        gdask.ml.pagerank(sp.eye(3, format="csr"), loop="workers", method="jacobi", client=client)


@pytest.mark.parametrize("nblocks", [1, 2])
def test_a_failed_loop_runs_again_to_the_same_bits(client, monkeypatch, tmp_path, nblocks):
    # the loop's first attempt ends as a lost worker ends it (CollectiveError): the blocks are sent
    # again and the sweeps run again from the start (one block: through shared memory, no file left)
    import dask

    import gdask.ml._pagerank_loop as loop
    from gdask.gdataset.collective import CollectiveError

    monkeypatch.setitem(dask.config.config["gdask"], "shared-memory-dir", str(tmp_path))
    A = _shuffled(gdask.ml.powerlaw_graph(3000, avg_degree=5, seed=6), 4)
    ref = gdask.ml.pagerank(A, tol=1e-9, nblocks=nblocks, loop="workers", client=client)
    real, calls = loop.run_on_workers, []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise CollectiveError("pagerank-sweeps on the workers lost worker(s) ['tcp://gone']")
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "run_on_workers", failing_once)
    r, info = gdask.ml.pagerank(A, tol=1e-9, nblocks=nblocks, loop="workers", return_info=True, client=client)
    assert info["restarts"] == 1 and len(calls) == 2 and info["order"] == "in-degree"
    np.testing.assert_array_equal(r, ref)
    assert list(tmp_path.iterdir()) == []


def _graph_with_weights_and_dangling(n=3000, seed=8, weighted=True):
    A = gdask.ml.powerlaw_graph(n, avg_degree=5, seed=seed, p_back=0.3)
    loops = np.arange(0, n, 7)
    A = (A + sp.csr_matrix((np.ones(len(loops)), (loops, loops)), shape=A.shape)).tocsr()  # some self-loops
    A.data[:] = 1.0
    if weighted:
        A.data = np.random.default_rng(seed).uniform(0.5, 3.0, A.nnz)
    assert (A.getnnz(axis=1) == 0).any()  # dangling nodes
    return A


@pytest.mark.parametrize("weights", ["ones", "mostly-ones", "counts", "float32", "float64"])
@pytest.mark.parametrize("order", ["ascending", "descending", "in-degree"])
def test_one_block_sweeps_are_the_gauss_seidel_sweeps_of_the_blocks(weights, order):
    # the one-block loop (pushed over A in node order; renumbered, transposed on the worker and gathered
    # in the in-degree order; weights sent in the narrowest type that holds them, or as the few links
    # that do not weigh 1) against the blocked loop's sweeps of one block with the spread, sweep by
    # sweep (tol 0: a fixed number of sweeps): the same iterates, to rounding
    A = _graph_with_weights_and_dangling(weighted=weights not in ("ones", "mostly-ones"))
    if weights == "mostly-ones":  # duplicate links summed, a link of weight 0, light and heavy ones
        rows = np.flatnonzero(np.diff(A.indptr))
        at = A.indptr[rows[[0, 5, 6, 40, 41, -1]]]  # the first node's, the last's, links of neighbours
        A.data[at] = [2.0, 0.0, 0.25, 3.0, 7.5, 2.0]
        A.data[A.indptr[rows[7]]:A.indptr[rows[7] + 1]] = 0.5  # every link of a node: out-weight below 1
    if weights == "counts":
        A.data = np.random.default_rng(1).integers(1, 256, A.nnz).astype(float)
    elif weights == "float32":
        A.data = A.data.astype(np.float32).astype(float)
    perm = np.random.default_rng(0).permutation(A.shape[0]) if order == "in-degree" else None
    P = direct(A, perm)
    P.values = narrow(P.values)
    assert P.values.size == (0 if weights in ("ones", "mostly-ones") else A.nnz)
    assert P.values.dtype == {"ones": np.float64, "mostly-ones": np.float64, "counts": np.uint8,
                              "float32": np.float32, "float64": np.float64}[weights]
    assert (P.extra.size > 0) == (weights == "mostly-ones")
    pos = None if perm is None else np.argsort(perm)
    Q = prepare(A, pos, 1)
    for sweeps in (1, 2, 7):
        got = _one_block(OneRank(), P.arrays, P.order, 0.85, 0.0, sweeps, order == "descending")
        want = _rank_sweeps(OneRank(), [Q.block(0)], Q.out, Q.bounds, 0.85, 0.0, sweeps, order == "descending",
                            spread=True)
        assert got["n_iter"] == want["n_iter"] == sweeps
        ref = want["y"] if pos is None else want["y"][pos]
        np.testing.assert_allclose(got["y"], ref, rtol=1e-12, atol=0)
        assert got["y"].sum() == pytest.approx(1.0, abs=1e-12)


def test_links_of_weight_one_but_a_few_go_without_their_weights():
    # a few links that do not weigh 1 go as positions and weights; from more than EXCEPTIONS_MAX_SHARE of
    # the links, the weights go whole; weights all equal (not 1): none
    A = _graph_with_weights_and_dangling(weighted=False)
    few = int(A.nnz * EXCEPTIONS_MAX_SHARE)
    at = np.sort(np.random.default_rng(2).choice(A.nnz, few, replace=False))
    A.data[at] = 2.0
    P = direct(A, None)
    assert P.values.size == 0
    np.testing.assert_array_equal(P.extra, at)
    np.testing.assert_array_equal(P.extra_w, 2.0)
    B = A.copy()
    B.data[np.setdiff1d(np.arange(A.nnz), at)[:1]] = 3.0  # one more
    Q = direct(B, None)
    assert Q.extra.size == Q.extra_w.size == 0 and Q.values is B.data
    A.data[:] = 4.0
    R = direct(A, None)
    assert R.values.size == R.extra.size == R.extra_w.size == 0


def _hub_graph(weighted, n=4000, seed=12):
    """Links from every node but a few into 150 hubs (Zipf-like), some hubs linking back to random nodes:
    most nodes receive no link (taken out of the in-degree order's sweeps), some dangle, a few are isolated."""
    rng = np.random.default_rng(seed)
    m = 5 * n
    src = rng.integers(0, n - 40, m)  # the last 40 nodes send nothing
    dst = np.minimum(rng.zipf(1.6, m) - 1, 149)
    back = rng.random(m) < 0.02  # some links to random nodes (they then receive)
    dst[back] = rng.integers(0, n, int(back.sum()))
    w = rng.uniform(0.5, 3.0, m) if weighted else np.ones(m)
    A = sp.csr_matrix((w, (src, dst)), shape=(n, n))
    A.data[:] = A.data if weighted else 1.0
    return A


def _received_order(A):
    """The nodes by the number of links they receive, ascending (the nodes receiving none first)."""
    return np.argsort(np.bincount(A.indices, minlength=A.shape[0]), kind="stable")


@pytest.mark.parametrize("weighted", [False, True])
def test_one_block_takes_the_nodes_that_receive_nothing_out_of_the_sweeps(weighted):
    # the in-degree order starts with the nodes that receive no link: their links leave the transposed
    # graph, folded into one sum per row, and their rows are not swept. The same iterates, sweep by sweep,
    # as the blocked loop's sweeps of the whole graph
    A = _hub_graph(weighted)
    perm = _received_order(A)
    p = int((np.bincount(A.indices, minlength=A.shape[0]) == 0).sum())
    assert p > A.shape[0] // 2
    P = direct(A, perm)
    P.values = narrow(P.values)
    pos = np.argsort(perm)
    Q = prepare(A, pos, 1)
    for sweeps in (1, 2, 7, 30):
        got = _one_block(OneRank(), P.arrays, P.order, 0.85, 0.0, sweeps, False)
        want = _rank_sweeps(OneRank(), [Q.block(0)], Q.out, Q.bounds, 0.85, 0.0, sweeps, False, spread=True)
        np.testing.assert_allclose(got["y"], want["y"][pos], rtol=1e-12, atol=0)
    # the changes the loop stops on: as the sweeps of every row over the whole transposed graph record them
    n = A.shape[0]
    inv = np.zeros(n)
    np.divide(1.0, Q.out, out=inv, where=Q.out > 0)
    y = np.full(n, 1.0 / n)
    x = inv * y
    dangling, last, changes = float(y[inv == 0].sum()), float(y.sum()), []
    loops = own_links(Q.indptr, Q.indices, Q.values)
    for _ in range(30):
        diff, total, dangling = sweep_block(Q.indptr, Q.indices, Q.values, 0, x, x, inv, y, 0.85,
                                            0.15 / n * last + 0.85 * dangling / n, False, True, *loops)
        changes.append((diff + abs(total - last)) / total)
        last = total
    hist = [h["change"] for h in got["history"]]
    np.testing.assert_allclose(hist, changes[:len(hist)], rtol=1e-6, atol=1e-12)  # to rounding
    assert len(hist) == 30 or hist[-1] == 0.0  # tol 0: an earlier stop only where the ranks stopped moving
    # the fold itself: what the first p nodes send each row, at one value c each, is c times its sum
    ptr, idx, val, pre = _fold(A, pos, inv, weighted)
    kept = int(ptr[-1])
    assert kept == int((Q.indices >= p).sum()) and (idx[:kept] >= p).all()
    y = np.random.default_rng(0).random(A.shape[0])
    y[:p] = 0.3
    full = sp.csr_matrix((Q.values if weighted else np.ones(Q.indices.size), Q.indices, Q.indptr), shape=A.shape)
    left = sp.csr_matrix((val[:kept] if weighted else np.ones(kept), idx[:kept], ptr), shape=A.shape)
    np.testing.assert_allclose(full @ (inv * y), 0.3 * pre + left @ (inv * y), rtol=1e-12)


def _fold(A, pos, inv, weighted, ptr_dtype=np.uint32):
    """:func:`transpose_fold` of ``A`` renumbered by ``pos``: ``M``'s row pointers (of ``ptr_dtype``,
    where the kernel counts the rows' links), indices and values less the links of the nodes that
    receive nothing and come first, and their sums per row."""
    n = A.shape[0]
    ptr, idx = np.empty(n + 1, ptr_dtype), np.empty(A.nnz, np.uint32)
    val, pre = np.empty(A.nnz if weighted else 0), np.zeros(n)
    own = np.empty(1, np.int64)  # room for one of the links from a node to itself: the others only counted
    rows = np.full(A.nnz, 7, np.uint32)  # scratch: what it holds before does not matter
    p, kept, nown = transpose_fold(A.indptr.astype(np.int64), unsigned(A.indices), A.data, pos.astype(np.uint32), inv,
                                   ptr, idx, val, pre, own, rows)
    assert p == int((np.bincount(A.indices, minlength=n) == 0).sum()) and kept == ptr[-1]  # received order: they lead
    selfs = np.flatnonzero(A.indices == np.repeat(np.arange(n), np.diff(A.indptr)))
    assert nown == selfs.size > 1 and own[0] == selfs[0]
    return ptr, idx, val, pre


@pytest.mark.parametrize("ptr_dtype", [np.uint32, np.int64])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("graph", ["hubs", "random"])
def test_transpose_fold_is_the_transpose_less_the_first_nodes_links(graph, weighted, ptr_dtype):
    # most links come from nodes that receive none (hubs: the links left are counted) or few do (random:
    # their links are taken off the counts); either way M's other links stay, in M's order, and each row's
    # sum over the first p nodes' links is what the transpose's row held
    if graph == "hubs":
        A = _hub_graph(weighted)
    else:
        rng = np.random.default_rng(21)
        n, m = 3000, 9000
        w = rng.uniform(0.5, 3.0, m) if weighted else np.ones(m)
        A = sp.csr_matrix((w, (rng.integers(0, n, m), rng.integers(0, n, m))), shape=(n, n))
        A.data[:] = A.data if weighted else 1.0
    n = A.shape[0]
    perm = _received_order(A)
    pos = np.argsort(perm)
    p = int((np.bincount(A.indices, minlength=n) == 0).sum())
    inv = np.random.default_rng(5).random(n)
    Q = prepare(A, pos, 1)  # the whole transpose (transpose_renumber)
    ptr, idx, val, pre = _fold(A, pos, inv, weighted, ptr_dtype)
    links_folded = int(np.diff(A.indptr)[perm[:p]].sum())
    assert (2 * links_folded > A.nnz) == (graph == "hubs") and p > 0
    keep = Q.indices >= p
    rows = np.repeat(np.arange(n), np.diff(Q.indptr))
    np.testing.assert_array_equal(np.diff(ptr), np.bincount(rows[keep], minlength=n))
    np.testing.assert_array_equal(idx[:ptr[-1]], Q.indices[keep])
    if weighted:
        np.testing.assert_array_equal(val[:ptr[-1]], Q.values[keep])
    terms = (Q.values[~keep] if weighted else 1.0) * inv[Q.indices[~keep]]
    np.testing.assert_allclose(pre, np.bincount(rows[~keep], terms, minlength=n), rtol=1e-12, atol=0)


@pytest.mark.parametrize("order", ["ascending", "in-degree"])
def test_one_block_change_bounds_the_ranks_change(order):
    # each sweep's recorded change bounds the L1 change of the ranks from the sweep before (here at most
    # twice over): the loop never stops before the ranks changed by tol or less
    A = _graph_with_weights_and_dangling(seed=9)
    perm = np.random.default_rng(1).permutation(A.shape[0]) if order == "in-degree" else None
    P = direct(A, perm)
    prev = np.full(A.shape[0], 1.0 / A.shape[0])
    for k in range(1, 12):
        res = _one_block(OneRank(), P.arrays, P.order, 0.85, 0.0, k, False)
        true = np.abs(res["y"] - prev).sum()
        bound = res["history"][-1]["change"]
        assert true * (1 - 1e-9) <= bound <= 2 * true * (1 + 1e-9) + 1e-15
        prev = res["y"]


def test_one_block_converges_to_the_reference_in_every_order(client, monkeypatch):
    monkeypatch.setattr(_pagerank, "RENUMBER_MIN_SHARE", 0.0)  # renumbered at this graph's share (0.86)
    A = _graph_with_weights_and_dangling(n=70_000, seed=4)
    results = {}
    for kind, B in (("natural", A), ("shuffled", _shuffled(A, 2))):
        r, info = gdask.ml.pagerank(B, tol=1e-10, nblocks=1, loop="workers", return_info=True, client=client)
        assert info["converged"] and info["nblocks"] == 1
        results[kind] = (r, info["order"])
    p = np.random.default_rng(2).permutation(A.shape[0])
    r_nat, r_shuf = results["natural"][0], results["shuffled"][0]
    np.testing.assert_allclose(r_shuf, r_nat[p], rtol=0, atol=1e-9)  # the same ranks, renumbered
    assert results["natural"][1] == "descending" and results["shuffled"][1] == "in-degree"
    _, want = _power_iterations(A, 1e-12)  # SciPy's power iteration, to a tight tolerance
    np.testing.assert_allclose(r_nat, want / want.sum(), rtol=0, atol=1e-9)


@pytest.mark.parametrize("same_host", [True, False])
def test_one_block_through_shared_memory_or_the_socket_the_same_bits(client, tmp_path, same_host, monkeypatch):
    # the graph, the order and the ranks through a file in shared memory, or through the socket: the
    # same bits; no file is left behind
    import dask

    monkeypatch.setattr(_pagerank, "RENUMBER_MIN_SHARE", 0.0)  # renumbered at this graph's share (0.86)
    A = _shuffled(_graph_with_weights_and_dangling(n=70_000, seed=5), 3)
    with dask.config.set({"gdask.ml.same-host-transfer": False}):
        ref = gdask.ml.pagerank(A, tol=1e-9, nblocks=1, loop="workers", client=client)
    with dask.config.set({"gdask.ml.same-host-transfer": same_host, "gdask.shared-memory-dir": str(tmp_path)}):
        written = []
        real = _shm.write

        def spy(arrays, where):
            out = real(arrays, where)
            written.append(out)
            return out

        import gdask.ml._pagerank_loop as loop

        loop._shm.write, saved = spy, loop._shm.write
        try:
            r, info = gdask.ml.pagerank(A, tol=1e-9, nblocks=1, loop="workers", return_info=True, client=client)
        finally:
            loop._shm.write = saved
    np.testing.assert_array_equal(r, ref)
    assert info["order"] == "in-degree"
    assert len(written) == (2 if same_host else 0) and all(isinstance(w, _shm.SharedArrays) for w in written)
    assert list(tmp_path.iterdir()) == []


def test_one_block_renumbers_only_from_the_minimum_share(client):
    # one block is renumbered by received rank when that order's share reaches RENUMBER_MIN_SHARE (its sort
    # and transpose cost more sweeps than it saves below); the ranks are the same either way, and
    # sweep_order (the graph loop's choice, whose blocks are built anyway) keeps choosing it
    low = _shuffled(_graph_with_weights_and_dangling(n=70_000, seed=4), 2)
    high = _shuffled(gdask.ml.powerlaw_graph(70_000, avg_degree=5, seed=4, p_back=0.05), 2)
    shares = {name: _sweep_order(B)[2] for name, B in (("low", low), ("high", high))}
    assert shares["low"] < RENUMBER_MIN_SHARE <= shares["high"]
    for name, B in (("low", low), ("high", high)):
        assert sweep_order(B)[0] == "in-degree"
        r, info = gdask.ml.pagerank(B, tol=1e-10, nblocks=1, loop="workers", return_info=True, client=client)
        assert info["order"] == ("in-degree" if name == "high" else "ascending"), name
        _, want = _power_iterations(B, 1e-12)  # SciPy's power iteration, to a tight tolerance
        np.testing.assert_allclose(r, want / want.sum(), rtol=0, atol=1e-9)


def test_one_block_falls_back_to_the_socket_when_the_worker_sees_no_file(client, monkeypatch, tmp_path):
    # a worker that looks local but sees another /dev/shm (a container of its own, say): it answers that it
    # found no file, and the graph goes through its socket; the same bits, no file left
    import dask

    import gdask.ml._pagerank_loop as loop

    A = _graph_with_weights_and_dangling(n=70_000, seed=6)
    with dask.config.set({"gdask.ml.same-host-transfer": False}):
        ref = gdask.ml.pagerank(A, tol=1e-9, nblocks=1, loop="workers", client=client)
    real = _shm.write

    def elsewhere(arrays, where):  # written where no worker looks
        out = real(arrays, where)
        moved = out.path + "-elsewhere"
        import os

        os.rename(out.path, moved)
        seen.append(moved)
        return _shm.SharedArrays(out.path, out.specs)

    seen = []
    monkeypatch.setattr(loop._shm, "write", elsewhere)
    with dask.config.set({"gdask.shared-memory-dir": str(tmp_path)}):
        r, info = gdask.ml.pagerank(A, tol=1e-9, nblocks=1, loop="workers", return_info=True, client=client)
    np.testing.assert_array_equal(r, ref)
    assert len(seen) == 1 and info["restarts"] == 0
    for path in seen:
        import os

        os.unlink(path)
    assert list(tmp_path.iterdir()) == []


def test_shared_arrays_round_trip_and_refusals(tmp_path, monkeypatch):
    arrays = [np.arange(10, dtype=np.uint32), np.empty(0), np.linspace(0, 1, 7), np.arange(3, dtype=np.int64)]
    sa = _shm.write(arrays, str(tmp_path))
    got = _shm.read(sa)
    assert [g.dtype for g in got] == [a.dtype for a in arrays]
    for g, a in zip(got, arrays):
        np.testing.assert_array_equal(g, a)
        assert g.flags.writeable and g.flags.c_contiguous
    got[0][0] = 99  # copy-on-write: the file keeps its bytes
    assert _shm.read(sa)[0][0] == 0
    _shm.remove(sa)
    assert _shm.read(sa) is None and list(tmp_path.iterdir()) == []
    # the result file: written only while the caller still waits for it
    out = _shm.out_file(str(tmp_path))
    assert _shm.write_out(out, np.arange(5.0))
    np.testing.assert_array_equal(_shm.read_out(out, np.float64, 5), np.arange(5.0))
    with pytest.raises(RuntimeError, match="holds 5 values"):
        _shm.read_out(out, np.float64, 6)
    _shm.remove(out)
    assert not _shm.write_out(out, np.arange(5.0)) and list(tmp_path.iterdir()) == []
    # no room: None, and no file
    monkeypatch.setattr(_shm, "room", lambda nbytes, where: False)
    assert _shm.write(arrays, str(tmp_path)) is None and list(tmp_path.iterdir()) == []


def test_shared_memory_directory_and_host(tmp_path):
    import dask

    with dask.config.set({"gdask.ml.same-host-transfer": False}):
        assert _shm.directory() is None
    with dask.config.set({"gdask.shared-memory-dir": str(tmp_path)}):
        assert _shm.directory() == str(tmp_path)
    with dask.config.set({"gdask.shared-memory-dir": str(tmp_path / "missing")}):
        assert _shm.directory() is None
    assert _shm.on_this_host("tcp://127.0.0.1:4000", {"host": "127.0.0.1"})
    assert _shm.on_this_host("tcp://127.0.0.1:4000")
    assert not _shm.on_this_host("tcp://203.0.113.9:4000", {"host": "203.0.113.9"})


def test_order_estimate_and_clearly_orderless():
    rng = np.random.default_rng(0)
    n, m = 200_000, 2_500_000
    random = sp.csr_matrix((np.ones(m), (rng.integers(0, n, m), rng.integers(0, n, m))), shape=(n, n))
    down, up, indeg = order_estimate(random.indptr.astype(np.int64), unsigned(random.indices), random.data, 3,
                                     np.empty(n))
    assert abs(down - 0.5) < 0.02 and abs(up - 0.5) < 0.02 and indeg < ORDERLESS - 0.1
    assert _clearly_orderless(random)
    # links mostly down the node order: the estimate sees it, and the full order is chosen
    src = rng.integers(1, n, m)
    dst = (src * rng.uniform(0, 1, m)).astype(np.int64)
    chain = sp.csr_matrix((np.ones(m), (src, dst)), shape=(n, n))
    down, up, _ = order_estimate(chain.indptr.astype(np.int64), unsigned(chain.indices), chain.data, 3, np.empty(n))
    assert down > 0.99 and not _clearly_orderless(chain)
    # hubs: most links end in a few nodes (the in-degree order), shuffled so the node order shows nothing
    dst = np.minimum(rng.zipf(1.8, m) - 1, n - 1)
    p = rng.permutation(n)
    hubs = sp.csr_matrix((np.ones(m), (rng.integers(0, n, m), p[dst])), shape=(n, n))
    assert order_estimate(hubs.indptr.astype(np.int64), unsigned(hubs.indices), hubs.data, 3, np.empty(n))[2] > 0.9
    assert not _clearly_orderless(hubs) and _sweep_order(hubs)[0] == "in-degree"
    # small graphs: the full order is cheap
    assert not _clearly_orderless(random[:1000, :1000])
    # no order, but two nodes in three without links: the choice in node order ends after one pass, so
    # the samples are not read (the same order: its share under ORDERLESS, the sweeps in ascending order)
    linked = rng.permutation(n)[: n // 3]
    dangling = sp.csr_matrix((np.ones(m), (linked[rng.integers(0, len(linked), m)], rng.integers(0, n, m))),
                             shape=(n, n))
    est = order_estimate(dangling.indptr.astype(np.int64), unsigned(dangling.indices), dangling.data, 3, np.empty(n))
    assert max(est) < ORDERLESS - 0.1
    assert not _clearly_orderless(dangling)
    order, perm, share = _sweep_order(dangling, DANGLING_NATURAL)
    assert perm is None and share < ORDERLESS


def test_an_error_while_the_order_is_chosen_leaves_no_file(client, monkeypatch, tmp_path):
    # the graph is written for the worker while the client chooses the order: an error there (or an
    # interrupt) removes what was written
    import dask

    def broken(*args, **kwargs):
        raise RuntimeError("order failed")

    monkeypatch.setattr(_pagerank, "_clearly_orderless", lambda A: False)
    monkeypatch.setattr(_pagerank, "_sweep_order", broken)
    A = _graph_with_weights_and_dangling(n=70_000, seed=7)
    with dask.config.set({"gdask.shared-memory-dir": str(tmp_path)}):
        with pytest.raises(RuntimeError, match="order failed"):
            gdask.ml.pagerank(A, nblocks=1, loop="workers", client=client)
    assert list(tmp_path.iterdir()) == []


def _chain_with_own_links(n, weights, reverse, rng):
    """A chain ``0 -> 1 -> ... -> n-1`` (reversed: ``n-1 -> ... -> 0``) into a sink that links only to
    itself, with links to themselves on a few other nodes; weights all 1, 1 but the own links' 3 (few
    exceptions), or all random."""
    src = np.arange(n - 1)
    dst = src + 1
    own = np.concatenate([rng.choice(n - 1, 4, replace=False), [n - 1]])
    src, dst = np.concatenate([src, own]), np.concatenate([dst, own])
    if reverse:
        src, dst = n - 1 - src, n - 1 - dst
    w = {"ones": np.ones(src.size), "few": np.where(src == dst, 3.0, 1.0),
         "all": rng.uniform(0.5, 2.0, src.size)}[weights]
    return sp.csr_matrix((w, (src, dst)), shape=(n, n))


def _exact_ranks(A, damping=0.85):
    n = A.shape[0]
    out = np.asarray(A.sum(axis=1)).ravel()
    T = (A.toarray() / out[:, None]).T  # no dangling nodes here
    y = np.linalg.solve(np.eye(n) - damping * T, np.full(n, (1 - damping) / n))
    return y / y.sum()


@pytest.mark.parametrize("weights", ["ones", "few", "all"])
@pytest.mark.parametrize("path", ["push-ascending", "push-descending", "in-degree", "blocks-1", "blocks-2"])
def test_a_node_linked_to_itself_is_solved_in_its_own_update(path, weights):
    """Gauss-Seidel solves each node's own equation: its link to itself is not read at its last value.
    Along a chain whose links all follow the sweep, the ranks are then exact after the first sweep
    (blocks: after a sweep per block), whatever the sink at its end keeps; read from the last sweep,
    the sink's link held it back at ``damping``'s rate (over 100 sweeps to 1e-12)."""
    rng = np.random.default_rng(7)
    n = 200  # 5 own links among 204: few enough to go as exceptions to weights of 1
    A = _chain_with_own_links(n, weights, path == "push-descending", rng)
    want = _exact_ranks(A)
    tol = 1e-12
    if path.startswith("push") or path == "in-degree":
        perm = None
        if path == "in-degree":  # the chain's node i is node q[i] of a shuffled numbering, swept in the chain's order
            perm = rng.permutation(n)
            C = A.tocoo()
            A = sp.csr_matrix((C.data, (perm[C.row], perm[C.col])), shape=(n, n))
            shuffled = np.empty(n)
            shuffled[perm] = want
            want = shuffled
        P = direct(A, perm)
        assert P.order.size == (0 if perm is None else n) and (P.extra.size > 0) == (weights == "few")
        got = _one_block(OneRank(), P.arrays, P.order, 0.85, tol, 200, path == "push-descending")
        y, sweeps = got["y"], got["n_iter"]
    else:
        Q = prepare(A, None, int(path[-1]))
        got = _rank_sweeps(OneRank(), [Q.block(b) for b in range(Q.nblocks)], Q.out, Q.bounds, 0.85, tol, 200,
                           False, spread=True)
        y, sweeps = got["y"] / got["y"].sum(), got["n_iter"]
    assert got["converged"]
    np.testing.assert_allclose(y, want, rtol=1e-9, atol=0)
    assert sweeps <= 3 * int(path[-1]) if path.startswith("blocks") else sweeps <= 3, sweeps


def test_own_links_finds_each_nodes_links_to_itself_with_their_weights():
    rng = np.random.default_rng(3)
    n = 500
    A = sp.random(n, n, density=0.02, random_state=4, format="csr") + sp.diags(
        np.where(rng.random(n) < 0.1, rng.uniform(1, 2, n), 0.0))
    A = sp.csr_matrix(A)
    A.eliminate_zeros()
    diag = A.diagonal()
    rows, w = own_links(A.indptr, unsigned(A.indices), A.data)
    np.testing.assert_array_equal(rows, np.flatnonzero(diag))
    np.testing.assert_array_equal(w, diag[rows])
    # renumbered, and with the weights 1 but a few exceptions at given positions
    pos = rng.permutation(n)
    k = np.flatnonzero(A.indices == np.repeat(np.arange(n), np.diff(A.indptr)))
    extra = np.sort(rng.choice(k, k.size // 2, replace=False))
    rows, w = own_links(A.indptr, unsigned(A.indices), np.empty(0), 0, extra, A.data[extra], pos=pos)
    order = np.argsort(pos[np.flatnonzero(diag)])
    np.testing.assert_array_equal(rows, pos[np.flatnonzero(diag)][order])
    want = np.where(np.isin(k, extra), A.data[k], 1.0)[order]
    np.testing.assert_array_equal(w, want)
    # a block's rows are local, its columns global
    B = A[100:300]
    rows, _ = own_links(B.indptr, unsigned(B.indices), B.data, 100)
    np.testing.assert_array_equal(rows, np.flatnonzero(diag[100:300]))


def test_own_links_past_what_the_kernels_note_are_found_by_a_scan(monkeypatch):
    # the kernels that read every link note the first OWN_FOUND links from a node to itself; a graph with
    # more is scanned again: the same sweeps to the bit
    import gdask.ml._pagerank_loop as loop

    rng = np.random.default_rng(11)
    A = _chain_with_own_links(200, "few", False, rng)
    perm = rng.permutation(200)
    runs = {}
    for room in (loop.OWN_FOUND, 2):
        monkeypatch.setattr(loop, "OWN_FOUND", room)
        for order in (None, perm):
            P = direct(A, order)
            runs[room, order is None] = _one_block(OneRank(), P.arrays, P.order, 0.85, 1e-12, 200, False)
    for node_order in (True, False):
        np.testing.assert_array_equal(runs[2, node_order]["y"], runs[loop.OWN_FOUND, node_order]["y"])


def test_positions_and_offsets_take_four_bytes_below_two_to_the_32():
    from gdask.ml._pagerank_loop import index_dtype

    assert [index_dtype(c) for c in (0, 2**32 - 1, 2**32, 2**40)] == [np.uint32, np.uint32, np.uint64, np.uint64]
