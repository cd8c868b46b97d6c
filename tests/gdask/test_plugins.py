"""The plugins a cluster installs come from config (``gdask.plugins.worker`` / ``.scheduler``): the
cluster imports no package above it, and a site adds or drops plugins in its Dask config."""

from __future__ import annotations

import argparse
import ast
import pathlib

import dask
import pytest
from distributed import SchedulerPlugin, WorkerPlugin

from gdask import protocol
from gdask._plugins import device_plugin, load_factory, scheduler_plugins, worker_plugins
from gdask.testing import gen_gpu_cluster

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Marker(WorkerPlugin):
    name = "test-marker"

    def __init__(self, specs=None) -> None:
        self.names = None if specs is None else sorted(specs)

    def setup(self, worker):
        self.worker_name = worker.name


class SchedulerMarker(SchedulerPlugin):
    name = "test-scheduler-marker"


def marker(specs=None, **options):
    """A worker-plugin factory as config lists them."""
    return Marker(specs)


def scheduler_marker():
    return [SchedulerMarker(), None]


def test_the_default_lists_the_device_plugins_and_the_kernel_warm_up():
    from gdask.ml import WarmKernels

    names = [p.name for p in worker_plugins(None)]
    assert names == [protocol.PLUGIN_DEVICE, protocol.PLUGIN_JOB_MONITOR, protocol.PLUGIN_WINDOW_CACHE,
                     WarmKernels.name]
    assert [p.name for p in scheduler_plugins()] == [protocol.PLUGIN_PLACEMENT, protocol.PLUGIN_JOBS,
                                                     protocol.PLUGIN_RESIDENCY]
    with dask.config.set({"gdask.ml.warm-kernels": False}):  # the warm-up's own switch still holds
        assert WarmKernels.name not in [p.name for p in worker_plugins(None)]


def test_options_reach_every_factory_and_factories_may_return_lists_or_none():
    with dask.config.set({"gdask.plugins.worker": ["gdask.scheduling:worker_plugins", f"{__name__}:marker"],
                          "gdask.plugins.scheduler": [f"{__name__}:scheduler_marker"]}):
        from gdask.devices import make_specs

        specs = dict(zip("ab", make_specs(2, backend="emulated")))
        plugins = worker_plugins(specs, max_streams=2)
        assert [type(p).__name__ for p in plugins] == ["DeviceSetup", "JobMonitor", "WindowCachePlugin", "Marker"]
        assert plugins[3].names == ["a", "b"] and device_plugin(plugins) is plugins[0]
        assert [type(p) for p in scheduler_plugins()] == [SchedulerMarker]


@pytest.mark.parametrize("ref, match", [
    ("gdask.scheduling.worker_plugins", "'module:attribute'"),
    ("gdask.scheduling:no_such_factory", "cannot be loaded"),
    ("no_such_module_here:f", "cannot be loaded"),
    ("gdask.protocol:PLUGIN_DEVICE", "not callable"),
])
def test_a_bad_entry_names_the_config_key(ref, match):
    with pytest.raises(ValueError, match=match) as e:
        load_factory(ref, "plugins.worker")
    assert "gdask.plugins.worker" in str(e.value)


def test_a_list_without_the_device_plugin_is_refused():
    with dask.config.set({"gdask.plugins.worker": [f"{__name__}:marker"]}):
        with pytest.raises(ValueError, match="no device plugin"):
            device_plugin(worker_plugins(None))


@gen_gpu_cluster(n_devices=2)
async def _in_process_cluster(client, scheduler, workers):
    assert all(Marker.name in w.plugins for w in workers)
    assert [w.plugins[Marker.name].worker_name for w in workers] == [0, 1]
    assert all(protocol.PLUGIN_DEVICE in w.plugins for w in workers)
    assert SchedulerMarker.name in scheduler.plugins and protocol.PLUGIN_PLACEMENT in scheduler.plugins


def test_in_process_clusters_install_what_config_lists():
    with dask.config.set({"gdask.plugins.worker": ["gdask.scheduling:worker_plugins", f"{__name__}:marker"],
                          "gdask.plugins.scheduler": ["gdask.scheduling:scheduler_plugins",
                                                      f"{__name__}:scheduler_marker"]}):
        _in_process_cluster()


def test_gdask_worker_gives_each_worker_what_config_lists():
    from gdask._worker_cli import add_arguments, worker_kwargs
    from gdask.ml import WarmKernels

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["tcp://127.0.0.1:1", "--backend", "emulated", "--n-devices", "2"])
    for kw in worker_kwargs(args):
        assert {type(x).__name__ for x in kw["plugins"]} == {"DeviceSetup", "JobMonitor", "WindowCachePlugin",
                                                            WarmKernels.__name__}
    with dask.config.set({"gdask.plugins.worker": ["gdask.scheduling:worker_plugins", f"{__name__}:marker"]}):
        names = [sorted(type(x).__name__ for x in kw["plugins"]) for kw in worker_kwargs(args)]
    assert names == [["DeviceSetup", "JobMonitor", "Marker", "WindowCachePlugin"]] * 2


@pytest.mark.parametrize("module", ["gdask/_cluster.py", "gdask/_plugins.py", "gdask/testing.py",
                                    "gdask/_worker_cli.py"])
def test_the_cluster_imports_no_estimators(module):
    """The cluster sits below gdask.ml: it installs the warm-up as a config entry, never by import."""
    tree = ast.parse((ROOT / module).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [m for m in names if m == "gdask.ml" or m.startswith("gdask.ml.")]
