"""What a GPU node gives each device worker, against a fake ``pynvml`` (and a ``cupy`` that is only
"installed"): its ``CUDA_VISIBLE_DEVICES`` (every GPU of the cluster, its own first; a MIG instance
by its UUID), the device spec (which CUDA device it is on, its memory), its host memory limit, and
NVML readings that a MIG instance does not support."""

from __future__ import annotations

import argparse
import importlib.machinery
import logging
import sys
import types

import numpy as np
import pytest

from gdask._devices import _nvml, discover, make_specs, worker_environment
from tests.gdask.test_nvml import (  # noqa: F401 - install is a fixture
    FakeMig,
    NVMLError,
    NVMLError_NotSupported,
    hgx_h200,
    hgx_level,
    install,
    make_cupy,
    make_pynvml,
    uuid,
)

GiB = 2**30
TB = 10**12

MIG_SMALL = FakeMig("MIG-2f4a9c1e-7b3d-5e6f-8a9b-0c1d2e3f4a5b", "NVIDIA H200 MIG 1g.18gb", 16 * GiB, 16, 9, 0)
MIG_LARGE = FakeMig("MIG-8d7c6b5a-4e3f-2a1b-0c9d-8e7f6a5b4c3d", "NVIDIA H200 MIG 3g.71gb", 70 * GiB, 60, 2, 0)


@pytest.fixture
def gpus(install, monkeypatch):  # noqa: F811 - the fixture
    """``gpus(n, migs=...)``: a node of ``n`` H200s as NVML and CUDA see it (CuPy "installed"), with
    ``CUDA_VISIBLE_DEVICES`` unset; ``migs`` maps a GPU index to its MIG instances."""

    def _node(n: int, migs: dict | None = None) -> types.ModuleType:
        node = hgx_h200()[:n]
        for i, instances in (migs or {}).items():
            node[i].migs = list(instances)
        cupy = make_cupy({})
        cupy.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        return install(make_pynvml(node, hgx_level), cupy)

    return _node


def _visible(env: dict) -> list[str]:
    return env["CUDA_VISIBLE_DEVICES"].split(",")


# -- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------------------
def test_each_worker_sees_every_gpu_its_own_first(gpus, monkeypatch):
    """As `dask cuda worker`: peers visible (CUDA IPC, NCCL over NVLink), the worker's own GPU is CUDA
    device 0 of its process, named by UUID."""
    gpus(4)
    specs = make_specs(backend="cuda")
    assert [s.uuid for s in specs] == [uuid(i) for i in range(4)]
    for i, spec in enumerate(specs):
        env = worker_environment(specs, i)
        assert _visible(env) == [uuid((i + k) % 4) for k in range(4)]
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        # "device 0 of the process" is the worker's own GPU wherever it is looked up: NVML's view of
        # the process, and the device a worker without a spec makes from config (DeviceSetup.spec_for)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env["CUDA_VISIBLE_DEVICES"])
        assert _nvml.visible_device()["index"] == i
        own = make_specs(1, backend="cuda")[0]
        assert (own.physical, own.uuid, own.memory) == (i, spec.uuid, spec.memory)


def test_logical_devices_sharing_a_gpu_record_it(gpus):
    """n_devices > GPUs: each spec says which GPU it is on (``uuid``, ``physical``); the ones that
    share a GPU have the same UUID and a share of its memory, and each worker still sees every GPU,
    its own first."""
    gpus(2)
    specs = make_specs(5, backend="cuda")
    assert [s.physical for s in specs] == [0, 1, 0, 1, 0]
    assert [s.uuid for s in specs] == [uuid(0), uuid(1), uuid(0), uuid(1), uuid(0)]
    assert [s.memory for s in specs] == [141 * GiB // 3, 141 * GiB // 2] * 2 + [141 * GiB // 3]
    assert [_visible(worker_environment(specs, i))[0] for i in range(5)] == [s.uuid for s in specs]
    assert _visible(worker_environment(specs, 3)) == [uuid(1), uuid(0)]
    assert not any(s.is_mig for s in specs)


def test_local_gpu_cluster_gives_workers_the_rotated_list(gpus):
    """LocalGPUCluster's worker spec (the nanny's env), as built for each device; before, each worker
    saw only its own GPU, which blocks CUDA IPC between workers (NCCL falls back to host memory)."""
    from gdask import LocalGPUCluster

    gpus(3)
    cluster = object.__new__(LocalGPUCluster)  # the worker-spec logic only: no processes on fake GPUs
    cluster.device_specs = make_specs(backend="cuda")
    cluster._spec_by_name = dict(enumerate(cluster.device_specs))
    cluster.worker_spec, cluster._worker_plugins = {}, []
    cluster.new_spec = {"cls": object, "options": {"env": {"OMP_NUM_THREADS": "1"}}}
    for i in range(3):
        spec = cluster.new_worker_spec()
        cluster.worker_spec.update(spec)
        env = spec[i]["options"]["env"]
        assert _visible(env) == [uuid((i + k) % 3) for k in range(3)] and env["OMP_NUM_THREADS"] == "1"


def test_gdask_worker_cli_gives_workers_the_rotated_list(gpus):
    from gdask._worker_cli import add_arguments, worker_kwargs

    gpus(3)
    p = argparse.ArgumentParser()
    add_arguments(p)
    kws = worker_kwargs(p.parse_args(["tcp://127.0.0.1:8786", "--backend", "cuda", "--n-devices", "4"]))
    assert [_visible(kw["env"]) for kw in kws] == [
        [uuid(0), uuid(1), uuid(2)], [uuid(1), uuid(2), uuid(0)], [uuid(2), uuid(0), uuid(1)],
        [uuid(0), uuid(1), uuid(2)]]


# -- MIG ----------------------------------------------------------------------------------------------
def test_mig_instances_are_devices_by_uuid_with_their_own_memory(gpus):
    """A GPU in MIG mode is its instances: each a device named by its MIG UUID (the parent's index
    reaches only CUDA's first instance), with the instance's memory (the pool is a share of it, not
    of the whole GPU)."""
    gpus(2, migs={1: [MIG_SMALL, MIG_LARGE]})
    inv = discover("cuda")
    assert [d.get("mig_uuid") for d in inv.cuda_devices] == [None, MIG_SMALL.uuid, MIG_LARGE.uuid]
    specs = make_specs(backend="cuda")
    assert [(s.physical, s.uuid, s.memory) for s in specs] == [
        (0, uuid(0), 141 * GiB), (1, MIG_SMALL.uuid, 16 * GiB), (1, MIG_LARGE.uuid, 70 * GiB)]
    assert [s.is_mig for s in specs] == [False, True, True]
    assert specs[1].name == "NVIDIA H200 MIG 1g.18gb"
    assert _visible(worker_environment(specs, 1)) == [MIG_SMALL.uuid]  # one MIG instance per CUDA process
    assert _visible(worker_environment(specs, 2)) == [MIG_LARGE.uuid]
    assert _visible(worker_environment(specs, 0)) == [uuid(0)]  # the GPUs' list holds no MIG instance
    from gdask.scheduling._worker import parse_pool_size

    assert parse_pool_size(0.8, specs[1].memory) == int(0.8 * 16 * GiB)  # the pool fits the slice


def test_a_mig_gpu_named_by_ordinal_is_its_first_instance(gpus, monkeypatch):
    gpus(2, migs={1: [MIG_SMALL, MIG_LARGE]})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    spec = make_specs(1, backend="cuda")[0]
    assert (spec.physical, spec.uuid, spec.memory) == (1, MIG_SMALL.uuid, 16 * GiB)


def test_nvml_readings_a_mig_device_does_not_support_are_none(gpus):
    """nvmlDeviceGetUtilizationRates raises NotSupported in MIG mode: the device's info (its metrics,
    device_table) reports None instead of failing; memory is the instance's."""
    nvml = gpus(2, migs={1: [MIG_SMALL]})

    def rates(h):
        if getattr(h, "migs", None) or isinstance(h, FakeMig):
            raise NVMLError_NotSupported("Not Supported")
        return types.SimpleNamespace(gpu=7, memory=3)

    nvml.nvmlDeviceGetUtilizationRates = rates
    nvml.nvmlDeviceGetHandleByUUID = lambda u: MIG_SMALL if u == MIG_SMALL.uuid else None
    assert _nvml.utilization(0) == {"gpu_util": 7, "mem_util": 3, "memory_used": GiB // 2,
                                    "memory_total": 141 * GiB}
    u = _nvml.utilization(1, MIG_SMALL.uuid)
    assert u == {"gpu_util": None, "mem_util": None, "memory_used": GiB // 2, "memory_total": 16 * GiB}
    assert _nvml.utilization(1)["gpu_util"] is None  # the parent GPU in MIG mode too

    def no_memory(h):
        raise NVMLError_NotSupported("Not Supported")

    nvml.nvmlDeviceGetMemoryInfo = no_memory
    assert _nvml.utilization(0)["memory_total"] is None
    _nvml.reset()
    st = _nvml.state()  # the inventory survives readings NVML does not support
    assert st.available and st.devices[0]["memory_total"] is None
    with pytest.raises(ValueError, match="NVML does not report the memory of CUDA device GPU-5ea1.*device_memory="):
        make_specs(backend="cuda")
    assert make_specs(backend="cuda", device_memory="10GiB")[0].memory == 10 * GiB
    from gdask._info import format_info, info

    assert "memory unknown" in format_info(info("cuda"))


def test_cuda_device_info_with_mig(gpus, monkeypatch):
    """CudaDevice.info() (a worker's device metrics) on a MIG instance: no NotSupported error."""
    from gdask._devices import _cuda
    from tests.gdask.test_cuda_memory import FakeCupy

    nvml = gpus(2, migs={1: [MIG_SMALL]})

    def rates(h):
        raise NVMLError_NotSupported("Not Supported")

    nvml.nvmlDeviceGetUtilizationRates = rates
    nvml.nvmlDeviceGetHandleByUUID = lambda u: MIG_SMALL
    cupy = FakeCupy().module
    cupy.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    spec = make_specs(backend="cuda")[1]
    info = _cuda.CudaDevice(spec).info()
    assert info["gpu_util"] is None and info["uuid"] == MIG_SMALL.uuid and info["memory"] == 16 * GiB


# -- transient NVML failures ---------------------------------------------------------------------------
class NVMLError_Unknown(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


def test_transient_nvml_failures_are_probed_again(install, monkeypatch):  # noqa: F811 - the fixture
    """A failure that may pass (an unknown NVML error, a query that failed) is not kept for the
    process's life: NVML is probed again after RETRY_SECONDS. No driver is a definitive answer."""
    nvml = install(make_pynvml(hgx_h200()[:2], hgx_level))
    failing = [NVMLError_Unknown("Unknown Error")]

    def init():
        if failing:
            raise failing.pop(0)

    nvml.nvmlInit = init
    _nvml.reset()
    monkeypatch.setattr(_nvml, "RETRY_SECONDS", 3600.0)
    st = _nvml.state()
    assert not st.available and st.transient and "Unknown Error" in st.reason
    assert _nvml.state() is st  # not before RETRY_SECONDS
    monkeypatch.setattr(_nvml, "RETRY_SECONDS", 0.0)
    assert _nvml.state().available  # probed again: the GPUs are there
    # a query that fails midway is transient too
    count = nvml.nvmlDeviceGetCount
    nvml.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(NVMLError("Timeout"))
    assert _nvml.state(refresh=True).transient
    nvml.nvmlDeviceGetCount = count
    assert _nvml.state().available
    # no driver: kept
    failing.append(NVMLError_DriverNotLoaded("Driver Not Loaded"))
    st = _nvml.state(refresh=True)
    assert not st.available and not st.transient
    assert _nvml.state() is st


# -- host memory limit ----------------------------------------------------------------------------------
def _nanny_limit(memory_limit, nthreads: int, cores: int) -> int | None:
    """The limit a Nanny derives from ``memory_limit`` (distributed's parse, with ``cores`` cores)."""
    from distributed.worker_memory import parse_memory_limit

    return parse_memory_limit(memory_limit, nthreads, total_cores=cores, logger=logging.getLogger("test"))


def test_gdask_worker_host_memory_is_ram_over_device_workers(monkeypatch):
    """A 192-core, 2 TB node with 8 device workers of 4 threads: 250 GB each (2 TB / 8), not
    distributed's 'auto' (2 TB x 4 / 192 = 42 GB, less than one GPU's evicted blocks)."""
    from distributed import system

    from gdask._worker_cli import add_arguments, worker_kwargs

    monkeypatch.setattr(system, "MEMORY_LIMIT", 2 * TB)
    p = argparse.ArgumentParser()
    add_arguments(p)
    base = ["tcp://127.0.0.1:8786", "--backend", "emulated", "--n-devices", "8", "--device-memory", "64MiB"]
    for extra in ([], ["--memory-limit", "auto"]):
        kws = worker_kwargs(p.parse_args(base + extra))
        assert [_nanny_limit(kw["memory_limit"], 4, cores=192) for kw in kws] == [2 * TB // 8] * 8
    kws = worker_kwargs(p.parse_args(base + ["--memory-limit", "100GB"]))  # the user's value, as given
    assert {_nanny_limit(kw["memory_limit"], 4, cores=192) for kw in kws} == {100 * 10**9}


@pytest.mark.timeout(180)
def test_local_gpu_cluster_host_memory_is_ram_over_devices(monkeypatch):
    """Each worker's nanny holds this machine's memory over the devices (faked: 16 GiB, 192 cores)."""
    from distributed import system, worker_memory

    import gdask

    monkeypatch.setattr(system, "MEMORY_LIMIT", 16 * GiB)
    monkeypatch.setattr(worker_memory.parse_memory_limit, "__defaults__", (192,))  # distributed's core count
    with gdask.LocalGPUCluster(n_devices=2, backend="emulated", device_memory="64MiB",
                               dashboard_address=":0") as cluster:
        assert [n.memory_manager.memory_limit for n in cluster.workers.values()] == [8 * GiB] * 2
    with gdask.LocalGPUCluster(n_devices=1, backend="emulated", device_memory="64MiB", memory_limit="2GiB",
                               dashboard_address=":0") as cluster:
        assert [n.memory_manager.memory_limit for n in cluster.workers.values()] == [2 * GiB]


def test_worker_memory_limit_values():
    from distributed import system

    from gdask._cluster import worker_memory_limit

    assert worker_memory_limit("auto", 4) == system.MEMORY_LIMIT // 4
    assert worker_memory_limit(None, 4) is None and worker_memory_limit(0, 4) == 0  # no limit, as distributed
    assert worker_memory_limit("30GB", 4) == "30GB" and worker_memory_limit(0.5, 4) == 0.5


# -- on a GPU (gpu_check.sh's gpu-tests step) ------------------------------------------------------------
def _cuda_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, driver or GPU
        return False



def _probe(dask_worker) -> dict:
    """What a CUDA worker sees: its CUDA_VISIBLE_DEVICES, allocator, memory in use, device info, and a
    C-order host array copied in (F order, on the device) and back (F order kept)."""
    import os

    from gdask.devices import context

    dev = context(dask_worker).device
    host = np.arange(3000 * 5, dtype=np.float32).reshape(3000, 5)
    block = dev.asarray(host)
    back = dev.to_host(block)
    info = {k: v for k, v in dev.info().items() if v is None or isinstance(v, (int, float, str))}
    return {"name": str(dask_worker.name), "visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "kind": dev.allocator_kind, "used": dev.memory_used(), "info": info,
            "f_order": bool(block.flags.f_contiguous), "same": bool(np.array_equal(back, host)),
            "back_f_order": bool(back.flags.f_contiguous)}


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_gpu(), reason="needs a CUDA GPU")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("n_devices", [1, 2])
def test_on_a_gpu_each_worker_owns_its_device(n_devices):
    """On one GPU: one worker, then two logical devices sharing it (the same UUID first in both)."""
    from distributed import Client, system

    import gdask

    _nvml.reset()
    with gdask.LocalGPUCluster(n_devices=n_devices, backend="cuda", dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        specs = cluster.device_specs
        got = client.run(_probe)
        limits = [n.memory_manager.memory_limit for n in cluster.workers.values()]
    assert limits == [system.MEMORY_LIMIT // n_devices] * n_devices
    for r in got.values():
        spec = specs[int(r["name"])]
        assert r["visible"].split(",")[0] == spec.uuid, r  # its own device is CUDA device 0
        assert r["kind"] in ("rmm", "cupy") and 0 <= r["used"] <= spec.memory, r
        assert r["info"]["uuid"] == spec.uuid and "gpu_util" in r["info"], r
        assert r["f_order"] and r["same"] and r["back_f_order"], r


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_gpu(), reason="needs a CUDA GPU")
def test_on_a_gpu_cupy_pool_without_rmm(monkeypatch):
    """CuPy's pool as the allocator (RMM hidden): capped at the budget, counted in used bytes, and an
    allocation over the cap is a DeviceMemoryError that says its size."""
    import cupy

    from gdask import DeviceMemoryError
    from gdask._devices import _cuda
    from gdask.devices import DeviceSpec

    for name in ("rmm", "rmm.mr", "rmm.statistics", "rmm.allocators", "rmm.allocators.cupy"):
        monkeypatch.setitem(sys.modules, name, None)
    pool = cupy.get_default_memory_pool()
    budget = 256 * 2**20
    dev = _cuda.CudaDevice(DeviceSpec(index=0, backend="cuda", memory=budget, physical=0, name="test"))
    try:
        dev.allocator = _cuda.setup_rmm_pool(None, budget)
        assert dev.allocator_kind == "cupy" and pool.get_limit() == budget
        before = dev.memory_used()
        a = dev.asarray(np.ones((2**20, 16), np.float32, order="F"))  # 64 MiB
        assert dev.memory_used() - before == a.nbytes
        with pytest.raises(DeviceMemoryError) as err:
            dev.translate_oom(lambda: cupy.empty(2 * budget, np.uint8))
        assert err.value.requested == 2 * budget
        del a
    finally:
        pool.free_all_blocks()
        pool.set_limit(size=0)
        cupy.cuda.set_allocator(pool.malloc)
