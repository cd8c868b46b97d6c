"""``gdask worker SCHEDULER_ADDRESS``: a ``dask worker`` for devices (as ``dask cuda worker``).

One worker process per device of this node: every visible GPU (``CUDA_VISIBLE_DEVICES`` rotated so
that each worker's own GPU comes first, ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, an RMM pool; a MIG
instance alone, by its UUID), with this node's memory over the workers as each one's host memory
limit (as ``dask cuda worker``), or
``--n-devices`` emulated devices. Each worker gets the same plugins a ``LocalGPUCluster`` worker gets
(those of config ``gdask.plugins.worker``: its device, streams, state and metrics; the job monitor;
gdask.ml's kernel warm-up) and gdask's window store as its data, and logs one line naming its device,
memory, pool and streams.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from typing import Any

logger = logging.getLogger("gdask.worker")

__all__ = ["add_arguments", "main", "worker_kwargs"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scheduler", nargs="?", default=None,
                   help="scheduler address, e.g. tcp://10.0.0.1:8786 (or --scheduler-file)")
    p.add_argument("--scheduler-file", default=None, help="file with the scheduler's address (dask's format)")
    g = p.add_argument_group("devices")
    g.add_argument("--backend", default="auto", choices=["auto", "cuda", "emulated", "emulated-strict"],
                   help="device backend: CUDA where a GPU and CuPy exist (auto), or emulated devices")
    g.add_argument("--n-devices", type=int, default=None,
                   help="devices (worker processes): default every visible GPU, or config "
                        "gdask.emulated.n-devices emulated ones; more than the GPUs splits them into logical devices")
    g.add_argument("--device-memory", default=None,
                   help="memory budget per emulated device, e.g. 4GiB (config gdask.emulated.memory)")
    g.add_argument("--device-memory-limit", default=None,
                   help="cap on the device memory each CUDA worker uses, e.g. 60GiB (config gdask.cuda.memory-limit)")
    g.add_argument("--rmm-pool-size", default=None,
                   help="RMM pool per CUDA worker: bytes (40GiB) or a fraction of the device (0.8); "
                        "config gdask.cuda.rmm-pool-size")
    g.add_argument("--device-speeds", default=None,
                   help="emulated devices' relative speeds, comma separated (e.g. 1,0.5)")
    g.add_argument("--streams", type=int, default=None, help="streams each device starts with (gdask.device.streams)")
    g.add_argument("--max-streams", type=int, default=None,
                   help="most streams when tuned from throughput (gdask.device.max-streams)")
    g.add_argument("--nthreads", type=int, default=None,
                   help="threads per worker (default: what its streams need; at least --max-streams)")
    w = p.add_argument_group("dask worker options")
    w.add_argument("--name", default=None, help="worker name prefix: workers are <name>-<device> "
                                                 "(default <hostname>-<pid>)")
    w.add_argument("--preload", action="append", default=[], help="module or file to preload in every worker")
    w.add_argument("--tls-ca-file", default=None, help="CA cert(s) file for TLS (PEM)")
    w.add_argument("--tls-cert", default=None, help="certificate file for TLS (PEM)")
    w.add_argument("--tls-key", default=None, help="private key file for TLS (PEM)")
    w.add_argument("--memory-limit", default="auto",
                   help="host memory limit per worker (dask's --memory-limit); default and 'auto': this host's "
                        "memory / the device workers, as dask cuda worker")
    w.add_argument("--local-directory", default=None, help="directory for the workers' files")
    w.add_argument("--resources", default=None, help='extra resources per worker, e.g. "FOO=2 BAR=1" '
                                                      "(GPU=1 is always set)")
    w.add_argument("--nanny", dest="nanny", action="store_true", default=True,
                   help="start each worker under a nanny that restarts it (default)")
    w.add_argument("--no-nanny", dest="nanny", action="store_false", help="run the workers in this process")
    w.add_argument("--death-timeout", type=float, default=None,
                   help="seconds a worker waits for the scheduler before it closes itself")
    w.add_argument("--dashboard-address", default=":0", help="each worker's dashboard address (default: any port)")
    w.add_argument("--no-dashboard", dest="dashboard", action="store_false", default=True,
                   help="no dashboard on the workers")


def _security(args: argparse.Namespace) -> Any:
    from distributed.security import Security

    given = [args.tls_ca_file, args.tls_cert, args.tls_key]
    if not any(given):
        return None
    if not all(given):
        raise SystemExit("gdask worker: TLS needs all of --tls-ca-file, --tls-cert and --tls-key")
    return Security(tls_ca_file=args.tls_ca_file, tls_worker_cert=args.tls_cert, tls_worker_key=args.tls_key,
                    require_encryption=True)


def _resources(text: str | None) -> dict[str, float]:
    out = {"GPU": 1.0}
    for pair in (text or "").replace(",", " ").split():
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"gdask worker: --resources takes NAME=VALUE pairs, got {pair!r}")
        try:
            out[key] = float(value)
        except ValueError:
            raise SystemExit(f"gdask worker: resource {key!r} must be a number, got {value!r}") from None
    return out


def worker_kwargs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Keyword arguments of one ``Nanny`` (or ``Worker``) per device of this node."""
    from gdask import config
    from gdask._cluster import worker_memory_limit
    from gdask._plugins import device_plugin, worker_plugins
    from gdask.devices import make_specs, worker_environment

    speeds = None if args.device_speeds is None else [float(s) for s in args.device_speeds.split(",")]
    device_memory = args.device_memory_limit if args.backend == "cuda" else args.device_memory
    specs = make_specs(args.n_devices, backend=args.backend, device_memory=device_memory, device_speeds=speeds,
                       streams=args.streams)
    if specs[0].backend == "cuda" and args.device_memory_limit is None and args.device_memory is not None:
        raise SystemExit("gdask worker: CUDA devices take --device-memory-limit, not --device-memory")
    prefix = args.name or f"{socket.gethostname()}-{os.getpid()}"
    memory_limit = worker_memory_limit(args.memory_limit, len(specs))
    resources = _resources(args.resources)
    security = _security(args)
    out = []
    for i, spec in enumerate(specs):
        name = f"{prefix}-{i}"
        # config gdask.plugins.worker: the device and job monitor, gdask.ml's kernel warm-up, ...
        plugins = worker_plugins({name: spec}, rmm_pool_size=args.rmm_pool_size, max_streams=args.max_streams)
        nthreads = max(args.nthreads or 0, device_plugin(plugins).worker_threads())
        env = worker_environment(specs, i)  # the node's GPUs, this worker's own first
        from gdask.window_cache import WindowStore

        kw: dict[str, Any] = dict(
            scheduler_ip=args.scheduler, scheduler_file=args.scheduler_file, nthreads=nthreads, name=name,
            resources=resources, plugins=set(plugins), memory_limit=memory_limit, preload=list(args.preload),
            dashboard=args.dashboard, dashboard_address=args.dashboard_address, security=security,
            death_timeout=args.death_timeout, local_directory=args.local_directory, env=env,
        )
        if config.get("window-cache.enabled", True):
            kw["data"] = WindowStore
        out.append(kw)
    return out


async def _run(args: argparse.Namespace) -> int:
    from distributed import Nanny, Worker

    from gdask._compat import wait_for_signals

    kwargs = worker_kwargs(args)
    if not args.nanny:
        if len(kwargs) > 1 and kwargs[0]["env"].get("CUDA_VISIBLE_DEVICES"):
            raise SystemExit("gdask worker: --no-nanny runs every worker in this process, which sees one GPU "
                             "set: use --n-devices 1 or the nanny")
        for kw in kwargs:
            os.environ.update(kw.pop("env"))
    workers = [(Nanny if args.nanny else Worker)(**kw) for kw in kwargs]
    logger.info("gdask worker: starting %d device worker(s) for %s", len(workers),
                args.scheduler or args.scheduler_file)

    async def finished() -> None:
        await asyncio.gather(*workers)
        await asyncio.gather(*(w.finished() for w in workers))

    async def on_signal() -> None:
        signum = await wait_for_signals()
        logger.info("gdask worker: signal %s, closing the workers", signum)
        await asyncio.gather(*(w.close(timeout=10, reason=f"signal-{signum}") for w in workers),
                             return_exceptions=True)

    tasks = [asyncio.create_task(finished()), asyncio.create_task(on_signal())]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    for t in done:
        t.result()
    return 0


def main(args: argparse.Namespace) -> int:
    """Run the device workers of this node until they end or a SIGINT / SIGTERM arrives."""
    if not args.scheduler and not args.scheduler_file:
        print("gdask worker: give the scheduler's address (gdask worker tcp://HOST:8786) or --scheduler-file",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
    from distributed.compatibility import asyncio_run
    from distributed.config import get_loop_factory

    try:
        return asyncio_run(_run(args), loop_factory=get_loop_factory())
    except (TimeoutError, asyncio.TimeoutError):
        logger.error("gdask worker: timed out starting the workers (is the scheduler at %s reachable?)",
                     args.scheduler or args.scheduler_file)
        return 1
