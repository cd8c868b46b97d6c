"""Streams: throughput of a block kernel at every fixed stream count K, and with feedback tuning.

One device worker runs the kernel over many blocks on gdask's stream executor
(``gdask.scheduling.StreamThreadPoolExecutor``, installed by the ``DeviceSetup`` worker plugin exactly
as on a LocalGPUCluster worker, with ``nthreads = max_streams``). The same worker, in the same run,
is measured with K fixed to 1, 2, ..., max and then with the feedback controller
(``StreamController``, hill climbing) starting from K = 1. Throughput is the executor's own
measurement (tasks per second of busy time, one value per feedback round of ``--round-tasks``
tasks) and, for comparison, the client's wall-clock tasks per second.

Kernels:

* ``--backend emulated --kernel contended`` (default): an EMULATED GPU. A kernel alone fills only
  ``--fill`` of the device (a small block leaves SMs idle), so concurrent kernels on more streams
  add throughput until the device is full; each extra concurrent kernel then costs
  ``--contention`` of the device's throughput (cache / memory-bandwidth interference). Device time
  is a GIL-free ``time.sleep`` computed from that model when the kernel starts, plus a real small
  NumPy reduction of the block. Device throughput with n kernels in flight:
  ``min(1, n * fill) * (1 - contention * (n - 1)) / work``. This is a model, stated as such.
* ``--backend emulated --kernel numpy``: a real CPU kernel that releases the GIL (NumPy ufuncs on a
  large block). On this project's 2 shared cores it measures CPU contention, not a GPU.
* ``--backend cuda``: CuPy kernels (small GEMMs on a device-resident block) on real CUDA streams,
  one non-blocking stream per executor slot.

Bar (issue #3): the adaptive controller reaches >= 95% of the best fixed K within 10 feedback
rounds. ``rounds-to-converge`` is the first round from which the controller's settled count
(recomputed by replaying its measurements through the pure policy) always has a fixed-K throughput
>= 95% of the best; the adaptive steady throughput (rounds after 10) is reported against the best.

    python benchmarks/streams.py                       # emulated contended GPU, max 8 streams
    python benchmarks/streams.py --kernel numpy        # real GIL-free CPU kernel
    python benchmarks/streams.py --backend cuda --json streams-cuda.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import _common
import numpy as np


class ContendedDevice:
    """Emulated device time: ``fill`` of the device per kernel, ``contention`` per extra kernel."""

    def __init__(self, work_s: float, fill: float, contention: float) -> None:
        self.work_s = work_s
        self.fill = fill
        self.contention = contention
        self._lock = threading.Lock()
        self._active = 0

    def throughput(self, n: int) -> float:
        """Kernels per second with ``n`` kernels in flight."""
        return min(1.0, n * self.fill) * max(0.05, 1.0 - self.contention * (n - 1)) / self.work_s

    def kernel(self, block: np.ndarray) -> float:
        with self._lock:
            self._active += 1
            n = self._active
        try:
            time.sleep(n / self.throughput(n))  # this kernel's share of the device: GIL-free
            return float(np.square(block[:256]).sum())
        finally:
            with self._lock:
                self._active -= 1


def contended_kernel(block):
    from distributed import get_worker

    return get_worker().bench_device.kernel(block)  # the model instance lives on the worker


def numpy_kernel(block):
    out = np.empty_like(block)
    np.multiply(block, block, out=out)
    np.sqrt(out, out=out)
    np.add(out, block, out=out)
    return float(out[:16].sum())


def make_block(i, rows, cols, backend):
    rng = np.random.default_rng(i)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    if backend == "cuda":
        return _common.current_device().asarray(x)
    return x


def cuda_kernel(block, repeat=8):
    import cupy as cp

    w = cp.ones((block.shape[1], block.shape[1]), dtype=block.dtype) / block.shape[1]
    y = block
    for _ in range(repeat):
        y = cp.tanh(y @ w)
    return float(y[:16].sum())  # synchronizes this slot's stream


def run(args) -> dict:
    from distributed import Client, LocalCluster

    from gdask.scheduling import StreamController, stream_executor

    make_specs, DeviceSetup = _common.make_specs, _common.DeviceSetup

    spec = make_specs(1, backend=args.backend, streams=1)[0]
    setup = DeviceSetup({0: spec}, max_streams=args.max_streams, adaptive_streams=True)
    mx = setup.worker_threads()
    rt = args.round_tasks or max(8, 4 * mx)
    if args.backend == "cuda":
        kernel = cuda_kernel
        what = f"CuPy (GEMM + tanh) x8 on {args.rows}x{args.cols} float32 blocks, real CUDA streams"
    elif args.kernel == "numpy":
        kernel = numpy_kernel
        what = f"NumPy ufuncs on {args.rows}x{args.cols} float32 blocks (real CPU, GIL released)"
    else:
        model = (args.work_ms / 1e3, args.fill, args.contention)
        kernel = contended_kernel
        what = (f"EMULATED GPU: fill {args.fill:g}/kernel, contention {args.contention:g}/extra kernel, "
                f"{args.work_ms:g} ms of device work/kernel (sleep) + NumPy sum")
    print(f"device: {spec.backend} ({spec.name}); kernel: {what}")
    print(f"max streams {mx}, {rt} tasks per feedback round, {args.blocks} blocks")
    setup_info = _common.setup(["cupy-cuda12x"] if args.backend == "cuda" else [], dtype="float32",
                               worker="1 in-process worker", threads=f"{mx} (= max streams)",
                               baseline="the same worker with K fixed at 1..max")
    _common.print_setup(setup_info)

    with LocalCluster(n_workers=1, threads_per_worker=mx, processes=False, plugins={setup},
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        _common.warmed(client)
        if kernel is contended_kernel:
            def install(dask_worker, model=model):
                dask_worker.bench_device = ContendedDevice(*model)

            client.run(install)
        blocks = client.map(make_block, range(args.blocks), rows=args.rows, cols=args.cols,
                            backend=args.backend, pure=False)
        client.gather(client.map(kernel, blocks, pure=False))  # warm-up (allocations, kernels)

        def rounds_done(dask_worker):
            return stream_executor(dask_worker).rounds

        def phase(configure, rounds):
            """Tasks in batches of a round until the executor closed ``rounds`` rounds (a round
            closes on its task count and a least busy time, so a round may take more than one
            batch on a fast or loaded machine): its trace of those rounds, wall tasks/s."""
            (r0,) = client.run(rounds_done).values()
            client.run(configure)
            n, t = 0, time.perf_counter()
            while True:
                client.gather(client.map(kernel, [blocks[i % len(blocks)] for i in range(n, n + rt)], pure=False))
                n += rt
                (r1,) = client.run(rounds_done).values()
                if r1 - r0 >= rounds:
                    break
                if time.perf_counter() - t > args.phase_timeout:
                    raise TimeoutError(f"{r1 - r0} of {rounds} feedback rounds closed in {args.phase_timeout:g} s "
                                       f"({n} tasks; --phase-timeout)")
            wall = time.perf_counter() - t
            (trace,) = client.run(lambda dask_worker: list(stream_executor(dask_worker).trace)).values()
            return trace[len(trace) - (r1 - r0):], n / wall

        static = {}
        for k in range(1, mx + 1):
            trace, wall = phase(lambda dask_worker, k=k: stream_executor(dask_worker).set_streams(k),
                                args.static_rounds + 1)
            thr = statistics.median(t for _, t in trace[1:])  # first round: transition from K-1
            static[k] = {"throughput": thr, "wall_tasks_per_s": wall, "rounds": [t for _, t in trace]}
            print(f"  fixed K={k}: {thr:8.1f} tasks/s (executor)  {wall:8.1f} tasks/s (wall)")

        def start_adaptive(dask_worker, mx=mx):
            stream_executor(dask_worker).adapt(StreamController(mx, start=1))

        trace, wall = phase(start_adaptive, args.adaptive_rounds)
    best_k = max(static, key=lambda k: static[k]["throughput"])
    best = static[best_k]["throughput"]
    replay = StreamController(mx, start=1)  # the pure policy replays its own decisions
    homes = []
    for _, t in trace:
        replay.observe(t)
        homes.append(replay.home)
    good = [static[h]["throughput"] >= 0.95 * best for h in homes]
    converge = next((r + 1 for r in range(len(good)) if all(good[r:])), None)
    steady = [t for _, t in trace[args.bar_rounds:]]
    steady_thr = statistics.mean(steady) if steady else float("nan")
    result = {
        "setup": setup_info,
        "device": spec.backend, "kernel": what, "max_streams": mx, "round_tasks": rt,
        "static": static, "best_k": best_k, "best_throughput": best,
        "adaptive": {
            "k_trace": [k for k, _ in trace], "home_trace": homes,
            "throughputs": [t for _, t in trace], "rounds_to_converge": converge,
            "settled_k": homes[-1], "steady_throughput": steady_thr,
            "steady_ratio": steady_thr / best, "wall_tasks_per_s": wall,
        },
    }
    result["bar_met"] = bool(converge is not None and converge <= args.bar_rounds
                             and steady_thr >= 0.95 * best)
    return result


def table(r: dict) -> str:
    best = r["best_throughput"]
    lines = [f"{'config':<14}{'tasks/s':>10}{'vs best':>9}{'wall t/s':>10}"]
    for k, s in r["static"].items():
        mark = " <- best" if int(k) == r["best_k"] else ""
        lines.append(f"{'fixed K=' + str(k):<14}{s['throughput']:>10.1f}{s['throughput'] / best:>9.2f}"
                     f"{s['wall_tasks_per_s']:>10.1f}{mark}")
    a = r["adaptive"]
    lines.append(f"{'adaptive':<14}{a['steady_throughput']:>10.1f}{a['steady_ratio']:>9.2f}"
                 f"{a['wall_tasks_per_s']:>10.1f}  (rounds after 10; wall includes the climb)")
    lines.append(f"K per round : {a['k_trace']}")
    lines.append(f"settled K   : {a['home_trace']}")
    lines.append(f"rounds to reach >= 95% of best fixed K (K={r['best_k']}): {a['rounds_to_converge']}"
                 f"; bar (<= 10 rounds, steady >= 0.95): {'MET' if r['bar_met'] else 'NOT MET'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["emulated", "cuda"], default="emulated")
    p.add_argument("--kernel", choices=["contended", "numpy"], default="contended",
                   help="emulated backend only: modelled GPU (default) or a real GIL-free CPU kernel")
    p.add_argument("--max-streams", type=int, default=8)
    p.add_argument("--round-tasks", type=int, default=None, help="tasks per feedback round")
    p.add_argument("--static-rounds", type=int, default=4, help="measured rounds per fixed K")
    p.add_argument("--adaptive-rounds", type=int, default=24)
    p.add_argument("--bar-rounds", type=int, default=10)
    p.add_argument("--blocks", type=int, default=16)
    p.add_argument("--rows", type=int, default=None, help="block rows (default depends on kernel)")
    p.add_argument("--cols", type=int, default=None)
    p.add_argument("--work-ms", type=float, default=10.0, help="contended: device work per kernel")
    p.add_argument("--fill", type=float, default=1 / 3, help="contended: device share one kernel uses")
    p.add_argument("--contention", type=float, default=0.04, help="contended: loss per extra kernel")
    p.add_argument("--phase-timeout", type=float, default=300.0,
                   help="seconds a phase may take to close its feedback rounds")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    defaults = {"cuda": (4096, 256), "numpy": (1_000_000, 4), "contended": (4096, 8)}
    rows, cols = defaults["cuda" if args.backend == "cuda" else args.kernel]
    args.rows = args.rows or rows
    args.cols = args.cols or cols
    r = run(args)
    print(table(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
