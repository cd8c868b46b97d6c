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


def test_matches_dense_reference_and_networkx(client):
    A = gdask.ml.powerlaw_graph(600, avg_degree=4, seed=3, p_back=0.03)
    assert (A.getnnz(axis=1) == 0).any()  # has dangling nodes
    r, info = gdask.ml.pagerank(A, tol=1e-7, nblocks=3, return_info=True, client=client)
    ref = reference_pagerank(A)
    assert info["converged"]
    assert np.abs(r - ref).max() < 1e-6
    assert r.sum() == pytest.approx(1.0)
    nx = pytest.importorskip("networkx")
    G = nx.from_scipy_sparse_array(A, create_using=nx.DiGraph)
    pr = nx.pagerank(G, alpha=0.85, tol=1e-12, max_iter=1000)
    assert np.abs(r - np.array([pr[i] for i in range(A.shape[0])])).max() < 1e-6


def test_small_handmade_graph_with_dangling_and_weights(client):
    # 0 -> 1 (weight 2), 0 -> 2, 1 -> 2, 2 -> 0, 3 dangling, 4 isolated
    A = sp.csr_matrix((np.array([2.0, 1.0, 1.0, 1.0]), (np.array([0, 0, 1, 2]), np.array([1, 2, 2, 0]))),
                      shape=(5, 5))
    r = gdask.ml.pagerank(A, damping=0.5, tol=1e-9, nblocks=2, client=client)
    np.testing.assert_allclose(r, reference_pagerank(A, damping=0.5), atol=1e-8)


def test_converged_blocks_reuse_block_products(client):
    A = gdask.ml.powerlaw_graph(3000, avg_degree=5, seed=0, p_back=0.0)
    r, info = gdask.ml.pagerank(A, tol=1e-8, nblocks=6, return_info=True, client=client)
    assert np.abs(r - reference_pagerank(A)).max() < 1e-6
    h = info["history"]
    assert h[0]["executed"] >= 36  # every block product runs once
    assert sum(x["reused"] for x in h) > 0
    assert any(x["active_blocks"] < 6 for x in h)
    # a block product runs again only if its source block changed
    executed = sum(x["executed"] for x in h)
    assert executed < info["n_iter"] * (36 + 6)


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
