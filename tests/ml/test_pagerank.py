"""gdask.ml.pagerank (delta iteration over a blocked sparse graph) and powerlaw_graph."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import gdask.ml


def reference_pagerank(A, damping=0.85, tol=1e-15):
    """Dense power iteration (uniform teleport, dangling mass spread uniformly)."""
    A = np.asarray(A.todense() if sp.issparse(A) else A, dtype=np.float64)
    n = A.shape[0]
    out = A.sum(axis=1)
    P = np.divide(A, out[:, None], out=np.zeros_like(A), where=out[:, None] > 0)
    dangling = out == 0
    r = np.full(n, 1.0 / n)
    for _ in range(10_000):
        new = damping * (P.T @ r + r[dangling].sum() / n) + (1 - damping) / n
        if np.abs(new - r).sum() < tol:
            return new
        r = new
    raise AssertionError("reference did not converge")


def block_tasks(info):
    """Executed tasks that read one matrix block (scheduler transitions)."""
    return sum(x["executed_by_prefix"].get("pagerank-contrib", 0) + x["executed_by_prefix"].get("pagerank-diag", 0)
               for x in info["history"])


@pytest.mark.parametrize("method", ["gauss-seidel", "jacobi"])
def test_matches_dense_reference_and_networkx(bclient, method):
    """The blocks are SciPy CSR matrices on the host on every backend (no sparse device arrays): the
    same answer on strict devices shows that nothing of the loop assumes NumPy device blocks."""
    client = bclient
    A = gdask.ml.powerlaw_graph(600, avg_degree=4, seed=3, p_back=0.03)
    assert (A.getnnz(axis=1) == 0).any()  # has dangling nodes
    r, info = gdask.ml.pagerank(A, tol=1e-7, nblocks=3, method=method, return_info=True, client=client)
    ref = reference_pagerank(A)
    assert info["converged"]
    assert np.abs(r - ref).max() < 1e-6
    assert r.sum() == pytest.approx(1.0)
    nx = pytest.importorskip("networkx")
    G = nx.from_scipy_sparse_array(A, create_using=nx.DiGraph)
    pr = nx.pagerank(G, alpha=0.85, tol=1e-12, max_iter=1000)
    assert np.abs(r - np.array([pr[i] for i in range(A.shape[0])])).max() < 1e-6


@pytest.mark.parametrize("method, nblocks", [("gauss-seidel", 2), ("gauss-seidel", 1), ("jacobi", 2)])
def test_small_handmade_graph_with_dangling_and_weights(client, method, nblocks):
    # 0 -> 1 (weight 2), 0 -> 2, 1 -> 2, 2 -> 0, 3 dangling, 4 isolated
    A = sp.csr_matrix((np.array([2.0, 1.0, 1.0, 1.0]), (np.array([0, 0, 1, 2]), np.array([1, 2, 2, 0]))),
                      shape=(5, 5))
    r = gdask.ml.pagerank(A, damping=0.5, tol=1e-9, nblocks=nblocks, method=method, client=client)
    np.testing.assert_allclose(r, reference_pagerank(A, damping=0.5), atol=1e-8)


def test_converged_blocks_reuse_block_products(client):
    A = gdask.ml.powerlaw_graph(3000, avg_degree=5, seed=0, p_back=0.0)
    r, info = gdask.ml.pagerank(A, tol=1e-8, nblocks=6, method="jacobi", return_info=True, client=client)
    assert np.abs(r - reference_pagerank(A)).max() < 1e-6
    h = info["history"]
    assert h[0]["executed"] >= 36  # every block product runs once
    assert sum(x["reused"] for x in h) > 0
    assert any(x["active_blocks"] < 6 for x in h)
    # a block product runs again only if its source block changed
    executed = sum(x["executed"] for x in h)
    assert executed < info["n_iter"] * (36 + 6)


def test_gauss_seidel_needs_fewer_block_tasks_than_jacobi(client):
    # the generator's default kind of graph: links mostly to older nodes, 5% to random ones; and the
    # same graph renumbered at random (the node order says nothing about the links: the sweep
    # follows the nodes sorted by the rank they receive)
    A = gdask.ml.powerlaw_graph(3000, avg_degree=5, seed=0, p_back=0.05)
    p = np.random.default_rng(7).permutation(3000)
    B = A[p][:, p].tocsr()
    ref = reference_pagerank(A)
    r_gs, gs = gdask.ml.pagerank(A, tol=1e-7, nblocks=4, return_info=True, client=client)
    r_b, gs_b = gdask.ml.pagerank(B, tol=1e-7, nblocks=4, return_info=True, client=client)
    r_j, jac = gdask.ml.pagerank(A, tol=1e-7, nblocks=4, method="jacobi", return_info=True, client=client)
    assert (gs["method"], gs["order"], gs_b["order"], jac["order"]) == ("gauss-seidel", "descending", "in-degree", None)
    assert gs["converged"] and gs_b["converged"] and jac["converged"]
    for r in (r_gs, r_b[p.argsort()], r_j):
        assert np.abs(r - ref).max() < 1e-7
    # every block task of a sweep runs once at first: 12 products + 4 diagonal solves
    assert gs["history"][0]["executed_by_prefix"] == {"pagerank-contrib": 12, "pagerank-diag": 4}
    assert 2 * gs["n_iter"] <= jac["n_iter"] and 2 * gs_b["n_iter"] <= jac["n_iter"]
    assert 2 * block_tasks(gs) <= block_tasks(jac) and 2 * block_tasks(gs_b) <= block_tasks(jac)
    # products that read a block kept unchanged on the channel are reused
    assert sum(x["reused"] for x in gs["history"]) > 0
    assert block_tasks(gs) < 16 * gs["n_iter"]


def test_gauss_seidel_sweeps_along_the_links(client):
    # a DAG whose links point to lower-numbered nodes: one descending sweep is exact (the second
    # one only confirms); the same graph with the node order reversed is swept in ascending order
    A = gdask.ml.powerlaw_graph(2000, avg_degree=5, seed=2, p_back=0.0)
    rev = np.arange(2000)[::-1]
    B = A[rev][:, rev].tocsr()
    r, info = gdask.ml.pagerank(A, tol=1e-9, nblocks=4, return_info=True, client=client)
    rb, info_b = gdask.ml.pagerank(B, tol=1e-9, nblocks=4, return_info=True, client=client)
    assert (info["order"], info_b["order"]) == ("descending", "ascending")
    assert info["n_iter"] == info_b["n_iter"] == 2
    assert info["history"][-1]["change"] < 1e-12
    np.testing.assert_allclose(r, reference_pagerank(A), atol=1e-9)
    np.testing.assert_allclose(rb, r[rev], atol=1e-12)


def test_sweep_order():
    from gdask.ml._pagerank import sweep_order

    A = gdask.ml.powerlaw_graph(2000, avg_degree=5, seed=1, p_back=0.05)
    assert sweep_order(A) == ("descending", None)
    rev = np.arange(2000)[::-1]
    assert sweep_order(A[rev][:, rev]) == ("ascending", None)
    p = np.random.default_rng(0).permutation(2000)
    order, perm = sweep_order(A[p][:, p])
    assert order == "in-degree" and np.array_equal(np.sort(perm), np.arange(2000))
    # the renumbered graph's links mostly point to higher numbers (sources first)
    B = A[p][:, p].tocsr()[perm][:, perm].tocoo()
    assert (B.col > B.row).mean() > 0.9
    assert sweep_order(sp.csr_matrix((3, 3))) == ("descending", None)  # no links at all


def test_diagonal_solve_kernel_alone():
    # one block, no incoming products: repeated row-by-row sweeps solve the whole system
    from gdask.ml._pagerank import _diag_solve

    A = gdask.ml.powerlaw_graph(300, avg_degree=4, seed=5, p_back=0.2)
    out = np.asarray(A.sum(axis=1)).ravel()
    inv = np.divide(1.0, out, out=np.zeros(300), where=out > 0)
    y0 = np.full(300, 0.15 / 300)
    for descending in (True, False):
        y = _diag_solve(A.T.tocsr(), inv, y0, 0.85, 0.15 / 300, 200, descending)
        assert np.all(y0 == 0.15 / 300)  # the input block is not modified
        np.testing.assert_allclose(y / y.sum(), reference_pagerank(A), atol=1e-12)


def test_powerlaw_graph_properties():
    A = gdask.ml.powerlaw_graph(5000, avg_degree=6, seed=1)
    B = gdask.ml.powerlaw_graph(5000, avg_degree=6, seed=1)
    assert (A != B).nnz == 0  # deterministic for a seed
    assert A.shape == (5000, 5000) and A.diagonal().sum() == 0
    indeg = np.asarray(A.sum(axis=0)).ravel()
    assert indeg.max() > 50 * indeg.mean()  # heavy tail: hubs
    assert 4 < A.nnz / 5000 < 6.5
    with pytest.raises(ValueError, match="exponent"):
        gdask.ml.powerlaw_graph(10, exponent=1.5)


def test_pagerank_errors(client):
    with pytest.raises(ValueError, match="square"):
        gdask.ml.pagerank(sp.csr_matrix((3, 4)), client=client)
    with pytest.raises(ValueError, match="damping"):
        gdask.ml.pagerank(sp.eye(3, format="csr"), damping=1.5, client=client)
    with pytest.raises(ValueError, match="method"):
        gdask.ml.pagerank(sp.eye(3, format="csr"), method="power", client=client)
    with pytest.raises(ValueError, match="inner_sweeps"):
        gdask.ml.pagerank(sp.eye(3, format="csr"), inner_sweeps=0, client=client)


# -- without a Client: the sweeps in this process ---------------------------------------------------------
def test_no_client_matches_the_reference_and_says_where_it_ran():
    from gdask.gdataset import default_client_or_none

    assert default_client_or_none() is None  # no cluster here: none given, none current
    A = gdask.ml.powerlaw_graph(3_000, avg_degree=5, seed=11, p_back=0.05)
    w = A.copy()
    w.data = np.random.default_rng(1).uniform(0.5, 3.0, w.nnz)  # weighted links too
    for G in (A, w):
        ref = reference_pagerank(G)
        for method in ("gauss-seidel", "jacobi"):
            records = []
            r, info = gdask.ml.pagerank(G, tol=1e-10, method=method, return_info=True, callback=records.append)
            assert info["loop"] == "local" and info["method"] == method and info["converged"]
            assert np.abs(r - ref).sum() < 1e-8 and r.sum() == pytest.approx(1.0)
            assert [x["iteration"] for x in records] == list(range(1, info["n_iter"] + 1))
            assert all(x["executed"] == 0 for x in info["history"])  # no task ran


@pytest.mark.parametrize("nblocks", [1, 3])
def test_no_client_has_the_bits_of_the_loop_on_the_workers(_emulated_client, nblocks):
    """The cluster's client is passed, not current: the call without one sweeps in this process."""
    A = gdask.ml.powerlaw_graph(5_000, avg_degree=6, seed=5, p_back=0.1)
    on_workers, info_w = gdask.ml.pagerank(A, tol=1e-9, nblocks=nblocks, loop="workers", return_info=True,
                                           client=_emulated_client)
    here, info_h = gdask.ml.pagerank(A, tol=1e-9, nblocks=nblocks, return_info=True)
    assert info_w["loop"] == "workers" and info_h["loop"] == "local"
    assert info_h["n_iter"] == info_w["n_iter"] and info_h["order"] == info_w["order"]
    np.testing.assert_array_equal(here, on_workers)


def test_no_client_refuses_a_cluster_loop():
    A = sp.eye(4, format="csr")
    for loop in ("graph", "workers"):
        with pytest.raises(ValueError, match="no Client"):
            gdask.ml.pagerank(A, loop=loop)


def test_64_bit_indices_are_taken_as_the_usual_32_bit_ones():
    """A graph whose index arrays were made 64-bit (by hand, or loaded so) while its numbers fit in 32
    bits reaches the kernels with 32-bit indices (one compiled type for each, not two), and ranks as
    the same graph with 32-bit indices does, to the bit; its own arrays are left as they were."""
    from gdask.ml._pagerank import _check_adjacency

    A = gdask.ml.powerlaw_graph(70_000, avg_degree=5, seed=3, p_back=0.1)
    wide = A.copy()
    wide.indices, wide.indptr = A.indices.astype(np.int64), A.indptr.astype(np.int64)
    checked = _check_adjacency(wide)
    assert checked.indices.dtype == np.int32 and checked.indptr.dtype == np.int32
    np.testing.assert_array_equal(checked.indices, A.indices)
    np.testing.assert_array_equal(checked.indptr, A.indptr)
    assert wide.indices.dtype == np.int64 and wide.indptr.dtype == np.int64
    np.testing.assert_array_equal(gdask.ml.pagerank(wide), gdask.ml.pagerank(A))


def test_weights_of_any_type_rank_as_float64_without_copying_the_links():
    """Integer, boolean and float32 weights (a COO or CSR matrix or array) rank as the same graph in
    float64 does, to the bit; a CSR input's index arrays are used as they are (not copied), and the
    input is left as it was."""
    from gdask.ml._pagerank import _check_adjacency

    A = gdask.ml.powerlaw_graph(50_000, avg_degree=5, seed=8, p_back=0.1)
    A.data[::7] = 3.0
    want = gdask.ml.pagerank(A)
    for dtype in (np.float32, np.int64, np.uint8):
        B = A.astype(dtype)
        checked = _check_adjacency(B)
        assert checked.dtype == np.float64
        assert np.shares_memory(checked.indices, B.indices) and np.shares_memory(checked.indptr, B.indptr)
        assert B.dtype == dtype
        np.testing.assert_array_equal(gdask.ml.pagerank(B), want)
        np.testing.assert_array_equal(gdask.ml.pagerank(sp.coo_array(B)), want)
    ones = A.copy()
    ones.data[:] = 1.0
    np.testing.assert_array_equal(gdask.ml.pagerank(A.astype(bool)), gdask.ml.pagerank(ones))


def test_graph_loop_solves_a_nodes_link_to_itself(client):
    # the diagonal blocks' sweeps solve each row's own equation: along a chain whose links follow the
    # node order into a sink linked only to itself, the ranks are exact after the first iteration (read
    # at its last value, the sink's link held it back at the damping's rate: over 100 iterations to 1e-12)
    n = 80
    src = np.concatenate([np.arange(n - 1), [n - 1, 10, 40]])
    dst = np.concatenate([np.arange(1, n), [n - 1, 10, 40]])
    A = sp.csr_matrix((np.ones(src.size), (src, dst)), shape=(n, n))
    out = np.asarray(A.sum(axis=1)).ravel()
    want = np.linalg.solve(np.eye(n) - 0.85 * (A.toarray() / out[:, None]).T, np.full(n, 0.15 / n))
    r, info = gdask.ml.pagerank(A, loop="graph", nblocks=1, tol=1e-12, return_info=True)
    assert info["order"] == "ascending" and info["converged"] and info["n_iter"] <= 3, info["n_iter"]
    np.testing.assert_allclose(r, want / want.sum(), rtol=1e-9, atol=0)
