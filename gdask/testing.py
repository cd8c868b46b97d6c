"""Test helpers: a gdask cluster of in-process device workers, as ``distributed.utils_test.gen_cluster``.

Every worker gets its own device plugin instance (its own emulated device, state and window store), so
in-process workers behave like separate device processes: the device of a task is its worker's (found
through the worker running the task), never a process-wide one. No process is started, so a test
cluster comes up in a fraction of a second.

Examples
--------
>>> from gdask.testing import gen_gpu_cluster
>>> @gen_gpu_cluster(n_devices=2, device_memory="64MiB")
... async def test_sum(client, scheduler, workers):
...     X = gdask.from_array(np.ones((1000, 4)), block_rows=250)
...     assert (await client.compute(X.sum(0)))[0] == 1000
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from typing import Any, AsyncIterator, Callable

__all__ = ["InProcessGPUCluster", "gen_gpu_cluster", "gpu_cluster"]


def _worker_specs(n_devices: int, device_memory: Any, device_speeds: list[float] | None, bandwidth: Any,
                  streams: int | None, backend: str, window_store: bool, worker_kwargs: dict) -> list[dict]:
    """Options of each in-process device worker: its own plugin instances (device, state, store)."""
    from gdask._plugins import device_plugin, worker_plugins
    from gdask.devices import make_specs
    from gdask.window_cache import WindowStore

    specs = make_specs(n_devices, backend=backend, device_memory=device_memory, device_speeds=device_speeds,
                       bandwidth=bandwidth, streams=streams)
    if specs[0].backend == "cuda":
        raise ValueError("in-process device workers need an emulated backend: CUDA devices need a process each")
    out = []
    for i, spec in enumerate(specs):
        plugins = worker_plugins({i: spec})  # config gdask.plugins.worker, for this worker alone
        kw = dict(name=i, nthreads=device_plugin(plugins).worker_threads(), plugins=set(plugins), resources={"GPU": 1},
                  dashboard=False, **worker_kwargs)
        if window_store:
            kw.setdefault("data", WindowStore)
        out.append(kw)
    return out


def InProcessGPUCluster(n_devices: int = 2, *, device_memory: Any = "64MiB", device_speeds: list[float] | None = None,
                        bandwidth: Any = None, streams: int | None = None, placement: bool = True,
                        window_store: bool = True, backend: str = "emulated", **worker_kwargs: Any):
    """A ``LocalGPUCluster`` whose device workers run in this process (a ``distributed.SpecCluster``): the
    same plugins, devices and stores, started in a fraction of a second. For tests.

    Examples
    --------
    >>> with InProcessGPUCluster(2) as cluster, Client(cluster) as client:  # doctest: +SKIP
    ...     gdask.ml.KMeans(4).fit(X)
    """
    from distributed import Scheduler, SpecCluster, Worker

    from gdask._plugins import scheduler_plugins

    workers = {kw["name"]: {"cls": Worker, "options": kw}
               for kw in _worker_specs(n_devices, device_memory, device_speeds, bandwidth, streams, backend,
                                       window_store, worker_kwargs)}
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0",
                                               "plugins": scheduler_plugins() if placement else []}}
    return SpecCluster(workers=workers, scheduler=scheduler, name="gdask-in-process")


@contextlib.asynccontextmanager
async def gpu_cluster(n_devices: int = 2, *, device_memory: Any = "64MiB", device_speeds: list[float] | None = None,
                      bandwidth: Any = None, streams: int | None = None, placement: bool = True,
                      window_store: bool = True, backend: str = "emulated",
                      **worker_kwargs: Any) -> AsyncIterator[tuple[Any, list[Any]]]:
    """An in-process scheduler and ``n_devices`` in-process device workers: ``(scheduler, workers)``.

    Parameters
    ----------
    n_devices : int
        Device workers (named 0, 1, ...).
    device_memory, device_speeds, bandwidth, streams, backend
        As for :class:`gdask.LocalGPUCluster` (emulated backends only: CUDA devices need a process each).
    placement : bool
        Install the scheduler plugins of config ``gdask.plugins.scheduler`` (placement, jobs).
    window_store : bool
        Give each worker a :class:`gdask.window_cache.WindowStore` as its data.
    **worker_kwargs
        Passed to every ``distributed.Worker``.
    """
    from distributed import Scheduler, Worker

    from gdask._plugins import scheduler_plugins

    options = _worker_specs(n_devices, device_memory, device_speeds, bandwidth, streams, backend, window_store,
                            worker_kwargs)
    async with Scheduler(dashboard_address=":0", plugins=scheduler_plugins() if placement else [],
                         validate=True) as scheduler:
        workers = [Worker(scheduler.address, **kw) for kw in options]
        try:
            await asyncio.gather(*workers)
            yield scheduler, workers
        finally:
            await asyncio.gather(*(w.close() for w in workers), return_exceptions=True)


def gen_gpu_cluster(n_devices: int = 2, *, timeout: float = 60, **cluster_kwargs: Any) -> Callable:
    """Decorator for ``async def test(client, scheduler, workers)``: runs it against :func:`gpu_cluster`
    with an asynchronous Client, within ``timeout`` seconds (a hang fails with a TimeoutError)."""

    def decorator(test: Callable) -> Callable:
        if not inspect.iscoroutinefunction(test):
            raise TypeError("gen_gpu_cluster decorates async test functions")

        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> Any:
            async def main() -> Any:
                from distributed import Client

                async with gpu_cluster(n_devices, **cluster_kwargs) as (scheduler, workers):
                    async with Client(scheduler.address, asynchronous=True) as client:
                        return await asyncio.wait_for(test(client, scheduler, workers, *args, **kwargs), timeout)

            return asyncio.run(main())

        # pytest must not see the wrapped test's (client, scheduler, workers) parameters as fixtures
        params = list(inspect.signature(test).parameters.values())[3:]
        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return run

    return decorator
