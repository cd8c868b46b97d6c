"""PageRank: gdask (sweeps on the workers) vs SciPy's power iteration, networkx and a dask.array loop.

One run, same graphs, tol=1e-6 on the L1 change of the ranks: synthetic power-law graphs
(:func:`gdask.ml.powerlaw_graph`, ``--avg-degree`` links per node, ``--p-back`` of them to random
nodes) in the generator's node order (numbers follow the links) and renumbered at random (numbers say
nothing about the links). Timed regions:

* gdask: the whole ``gdask.ml.pagerank(A, client=...)`` call (checks, sweep order, transpose, blocks
  sent to the workers, the sweeps, ranks back), on a LocalGPUCluster of ``--devices`` emulated
  devices (default loop: ``"workers"``; default ``nblocks``: one block on these sparse graphs, one rank
  sweeping the whole graph); and the whole call without a Client (the same sweeps in this process);
* scipy: the power-iteration loop only (``M = A.T`` and the degrees are built before its timer), in
  this process, single-threaded SpMV (:func:`incremental.pagerank_scipy`);
* networkx: ``networkx.pagerank`` (graphs up to ``--networkx-max-nodes``; DiGraph built untimed);
* dask.array: a power iteration with one graph per iteration (``--dask-array``; slow at 1M nodes).

gdask and scipy alternate ``--repeat`` times (the machine may be shared: each pair sees about the
same load); the table prints the median of each and the median of the per-pair ratios. The 1 -> 2
device scaling runs gdask with ``--scaling-nblocks`` blocks (default 2: one per device) on the
2-device cluster and on a 1-device one (the ranks must be the same bits). Rank agreement: L1
distance to scipy's ranks.

    python benchmarks/pagerank.py                    # 1M nodes, ~5M edges
    python benchmarks/pagerank.py --nodes 100000 --dask-array --json out.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import _common
import numpy as np


def graphs(args):
    import gdask.ml

    A = gdask.ml.powerlaw_graph(args.nodes, avg_degree=args.avg_degree, seed=0, p_back=args.p_back)
    out = {}
    for order in args.orders:
        if order == "shuffled":
            perm = np.random.default_rng(1).permutation(args.nodes)
            out[order] = A[perm][:, perm].tocsr()
        else:
            out[order] = A
    return out


def run_gdask(client, A, tol, nblocks):
    import gdask.ml

    t = time.perf_counter()
    r, info = gdask.ml.pagerank(A, tol=tol, nblocks=nblocks, return_info=True, client=client)
    return r, time.perf_counter() - t, info


def compare(client, A, args, nblocks):
    """Alternating scipy / gdask runs on ``A``: a result row."""
    from incremental import pagerank_scipy

    pairs, r_g, r_s, info = [], None, None, None
    for _ in range(args.repeat):
        r_s, info_s = pagerank_scipy(A, args.tol, 0.85)
        r_g, sec, info = run_gdask(client, A, args.tol, nblocks)
        pairs.append((sec, info_s["seconds"]))
    g = [p[0] for p in pairs]
    s = [p[1] for p in pairs]
    return {"edges": int(A.nnz), "gdask_s": statistics.median(g), "scipy_s": statistics.median(s),
            "ratio": statistics.median([a / b for a, b in pairs]), "pairs": pairs, "gdask_iter": info["n_iter"],
            "scipy_iter": info_s["n_iter"], "order": info["order"], "loop": info["loop"], "nblocks": info["nblocks"],
            "sweep_ms": [round(h["seconds"] * 1e3, 2) for h in info["history"]],
            "l1_vs_scipy": float(np.abs(r_g - r_s).sum()), "ranks": r_g}


def here(A, args, row):
    """``gdask.ml.pagerank(A)`` without a Client (in this process), alternating with scipy as
    :func:`compare`: the median time, the median per-pair ratio, and whether the ranks are the
    cluster's bits (when both ran the same number of blocks)."""
    from incremental import pagerank_scipy

    import gdask.ml

    pairs = []
    for _ in range(args.repeat):
        _, info_s = pagerank_scipy(A, args.tol, 0.85)
        t = time.perf_counter()
        r, info = gdask.ml.pagerank(A, tol=args.tol, nblocks=args.nblocks, return_info=True)
        pairs.append((time.perf_counter() - t, info_s["seconds"]))
    assert info["loop"] == "local"
    same = bool(np.array_equal(r, row["ranks"])) if info["nblocks"] == row["nblocks"] else "-"
    return {"here_s": statistics.median(p[0] for p in pairs), "here_ratio": statistics.median(a / b for a, b in pairs),
            "here_pairs": pairs, "here_same_bits": same}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--avg-degree", type=float, default=5.0)
    p.add_argument("--p-back", type=float, default=0.05)
    p.add_argument("--orders", nargs="+", default=["link", "shuffled"], choices=["link", "shuffled"])
    p.add_argument("--tol", type=float, default=1e-6)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--nblocks", type=int, default=None, help="gdask's blocks (default: gdask's choice)")
    p.add_argument("--scaling-nblocks", type=int, default=2, help="blocks of the 1 -> 2 device scaling runs")
    p.add_argument("--repeat", type=int, default=3, help="alternating gdask / scipy runs per graph")
    p.add_argument("--no-scaling", action="store_true", help="skip the 1-device run")
    p.add_argument("--networkx-max-nodes", type=int, default=200_000)
    p.add_argument("--dask-array", action="store_true", help="also the dask.array power iteration")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", message="Sending large graph")
    from distributed import Client

    import gdask
    import gdask.ml
    from gdask.gdataset import ExecutionLog

    G = graphs(args)
    nblocks = args.nblocks
    rows = {}
    with gdask.LocalGPUCluster(n_devices=args.devices, backend="emulated", device_memory="3GiB",
                               dashboard_address=":0") as cluster, Client(cluster) as client:
        _common.warmed(client)
        run_gdask(client, gdask.ml.powerlaw_graph(100_000, seed=5), args.tol, nblocks)  # compiles the kernels
        for order, A in G.items():
            rows[order] = compare(client, A, args, nblocks)
            if not args.no_scaling:
                r2, sec, _ = run_gdask(client, A, args.tol, args.scaling_nblocks)
                rows[order]["split_s"], rows[order]["split_ranks"] = sec, r2
            if args.dask_array:
                from incremental import pagerank_dask

                log = ExecutionLog(client)
                r_d, info_d = pagerank_dask(client, A, nblocks or max(2, args.devices), args.tol, 0.85, log)
                rows[order]["dask_array_s"] = info_d["seconds"]
            if args.nodes <= args.networkx_max_nodes:
                from incremental import pagerank_networkx

                r_n, info_n = pagerank_networkx(A, args.tol, 0.85)
                rows[order]["networkx_s"] = info_n["seconds"]
    for order, A in G.items():  # no Client now: the call computes in this process
        rows[order].update(here(A, args, rows[order]))
    if not args.no_scaling:
        with gdask.LocalGPUCluster(n_devices=1, backend="emulated", device_memory="6GiB",
                                   dashboard_address=":0") as cluster, Client(cluster) as client:
            _common.warmed(client)
            run_gdask(client, gdask.ml.powerlaw_graph(100_000, seed=5), args.tol, args.scaling_nblocks)
            for order, A in G.items():
                r1, sec, _ = run_gdask(client, A, args.tol, args.scaling_nblocks)
                rows[order]["one_device_s"] = sec
                rows[order]["same_bits_1_vs_2"] = bool(np.array_equal(r1, rows[order].pop("split_ranks")))
    report(rows, args, nblocks)
    for r in rows.values():
        r.pop("ranks")
    _common.write_json(args.json, {"args": vars(args), "rows": rows, "setup": _common.setup(["scipy", "networkx"])})


def report(rows, args, nblocks):
    print(f"\nPageRank, {args.nodes:,} nodes, tol={args.tol:g} (L1), gdask on {args.devices} emulated devices, "
          f"nblocks={nblocks or 'default'}; gdask = the whole call, scipy = its power-iteration loop; median of "
          f"{args.repeat} alternating runs; scaling: {args.scaling_nblocks} blocks on {args.devices} devices and on 1")
    _common.print_setup(_common.setup(["scipy", "networkx"]))
    head = (f"{'graph':<10}{'edges':>10}{'gdask s':>9}{'blocks':>7}{'iters':>6}{'scipy s':>9}{'iters':>6}"
            f"{'gdask/scipy':>13}{'L1 vs scipy':>13}")
    print(head + f"{'split s':>9}{'1 dev s':>9}{'1/2 dev':>9}{'same bits':>10}{'networkx s':>11}{'dask.array s':>13}")
    for order, r in rows.items():
        one, split = r.get("one_device_s"), r.get("split_s")
        one_s, speedup = (f"{one:.3f}", f"{one / split:.2f}x") if one and split else ("-", "-")
        split_s = f"{split:.3f}" if split else "-"
        print(f"{order:<10}{r['edges']:>10,}{r['gdask_s']:>9.3f}{r['nblocks']:>7}{r['gdask_iter']:>6}{r['scipy_s']:>9.3f}"
              f"{r['scipy_iter']:>6}{r['ratio']:>13.2f}{r['l1_vs_scipy']:>13.2e}"
              f"{split_s:>9}{one_s:>9}{speedup:>9}"
              f"{str(r.get('same_bits_1_vs_2', '-')):>10}{r.get('networkx_s', float('nan')):>11.3f}"
              f"{r.get('dask_array_s', float('nan')):>13.3f}")
        print(f"{'':<10}sweep order {r['order']}, per-sweep ms {r['sweep_ms']}, pairs (gdask, scipy) s "
              f"{[(round(a, 3), round(b, 3)) for a, b in r['pairs']]}")
        here_pairs = [(round(a, 3), round(b, 3)) for a, b in r["here_pairs"]]
        print(f"{'':<10}without a Client (this process): {r['here_s']:.3f} s, gdask/scipy {r['here_ratio']:.2f}, "
              f"the cluster's bits: {r['here_same_bits']}, pairs {here_pairs}")


if __name__ == "__main__":
    main()
