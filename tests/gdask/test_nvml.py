"""NVML readings (NVLink, SMs, topology levels, CUDA_VISIBLE_DEVICES) against a fake ``pynvml``,
and the ``nvidia-smi topo -m`` parser against recorded outputs (``tests/gdask/data``)."""

from __future__ import annotations

import importlib.machinery
import pathlib
import sys
import types
import warnings
from dataclasses import dataclass, field

import pytest

from gdask import GDaskWarning, NoDeviceError
from gdask._devices import _nvml, discover, make_specs
from gdask.scheduling._topology import Topology, link_rank, parse_nvidia_smi_topo

DATA = pathlib.Path(__file__).parent / "data"
GiB = 2**30


# -- a fake pynvml ------------------------------------------------------------------------------------
class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


@dataclass(eq=False)
class FakeMig:
    uuid: str
    name: str
    memory: int
    sm: int
    gi: int
    ci: int


@dataclass(eq=False)
class FakeGPU:
    name: str
    uuid: str
    bus: str                      # as NVML writes it: "00000000:18:00.0"
    memory: int = 141 * GiB
    sm: int | None = 132          # nvmlDeviceGetAttributes().multiprocessorCount; None: NotSupported
    cores: int = 16896            # nvmlDeviceGetNumGpuCores: CUDA cores, never the SM count
    links: list | None = None     # per NVLink: remote bus id ("" = inactive); None: no NVLink
    migs: list = field(default_factory=list)
    mig_capable: bool = True
    index: int = -1


def make_pynvml(gpus: list[FakeGPU], level, p2p_nvlink=lambda a, b: False, *, attributes=True,
                p2p_status=True, init_error: str | None = None) -> types.ModuleType:
    """A ``pynvml`` module over ``gpus``. ``level(i, j)``: NVML topology level of two GPUs;
    ``p2p_nvlink(i, j)``: whether the P2P NVLink status is OK."""
    for i, g in enumerate(gpus):
        g.index = i
    m = types.ModuleType("pynvml")
    m.NVMLError, m.NVMLError_NotSupported = NVMLError, NVMLError_NotSupported
    m.NVML_FEATURE_ENABLED, m.NVML_NVLINK_MAX_LINKS = 1, 18
    m.NVML_P2P_CAPS_INDEX_NVLINK, m.NVML_P2P_STATUS_OK, m.NVML_P2P_STATUS_NOT_SUPPORTED = 2, 0, 5
    m.NVML_DEVICE_MIG_ENABLE = 1
    m.calls = []

    def init():
        if init_error:
            raise NVMLError(init_error)

    m.nvmlInit = init
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    m.nvmlDeviceGetName = lambda h: (h.name.encode() if isinstance(h, FakeGPU) else h.name)  # bytes, as old pynvml
    m.nvmlDeviceGetUUID = lambda h: h.uuid
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=h.bus.encode())
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=h.memory, used=GiB // 2)

    def num_cores(h):
        m.calls.append("nvmlDeviceGetNumGpuCores")
        return h.cores

    m.nvmlDeviceGetNumGpuCores = num_cores
    if attributes:
        def attrs(h):
            if h.sm is None:
                raise NVMLError_NotSupported("Not Supported")
            return types.SimpleNamespace(multiprocessorCount=h.sm)

        m.nvmlDeviceGetAttributes = attrs

    def mig_mode(h):
        if not h.mig_capable:
            raise NVMLError_NotSupported("Not Supported")
        return [int(bool(h.migs)), int(bool(h.migs))]

    m.nvmlDeviceGetMigMode = mig_mode
    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7

    def mig_handle(h, k):
        if k >= len(h.migs):
            raise NVMLError_NotFound("Not Found")
        return h.migs[k]

    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    m.nvmlDeviceGetGpuInstanceId = lambda mh: mh.gi
    m.nvmlDeviceGetComputeInstanceId = lambda mh: mh.ci

    def link_state(h, link):
        if h.links is None:
            raise NVMLError_NotSupported("Not Supported")
        if link >= len(h.links):
            raise NVMLError_InvalidArgument("Invalid Argument")
        return int(bool(h.links[link]))

    m.nvmlDeviceGetNvLinkState = link_state
    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(busId=h.links[link].encode())
    if p2p_status:
        def p2p(a, b, caps):
            assert caps == m.NVML_P2P_CAPS_INDEX_NVLINK
            return m.NVML_P2P_STATUS_OK if p2p_nvlink(a.index, b.index) else m.NVML_P2P_STATUS_NOT_SUPPORTED

        m.nvmlDeviceGetP2PStatus = p2p
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: level(a.index, b.index)
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=7, memory=3)
    return m


def make_cupy(sm_by_bus: dict[str, int], with_attribute: bool = True) -> types.ModuleType:
    """A ``cupy`` whose CUDA runtime sees the GPUs at ``sm_by_bus`` (CuPy's 4-digit-domain bus ids),
    in that order, with those multiprocessor counts."""
    buses = list(sm_by_bus)

    class CUDARuntimeError(RuntimeError):
        pass

    def get_attribute(attr, ordinal):
        assert attr == 16, "cudaDevAttrMultiProcessorCount is attribute 16"
        return sm_by_bus[buses[ordinal]]

    rt = types.SimpleNamespace(
        CUDARuntimeError=CUDARuntimeError,
        getDeviceCount=lambda: len(buses),
        deviceGetPCIBusId=lambda ordinal: buses[ordinal].upper(),
        getDeviceProperties=lambda ordinal: {"multiProcessorCount": sm_by_bus[buses[ordinal]]},
    )
    if with_attribute:
        rt.deviceGetAttribute = get_attribute
    cp = types.ModuleType("cupy")
    cp.cuda = types.SimpleNamespace(runtime=rt)
    return cp


@pytest.fixture
def install(monkeypatch):
    """Install a fake pynvml (and cupy, or none) for one test; the NVML state is reset around it."""
    _nvml.reset()
    monkeypatch.setitem(sys.modules, "cupy", None)  # default: CuPy not importable

    def _install(pynvml: types.ModuleType, cupy: types.ModuleType | None = None) -> types.ModuleType:
        monkeypatch.setitem(sys.modules, "pynvml", pynvml)
        monkeypatch.setitem(sys.modules, "cupy", cupy)
        _nvml.reset()
        return pynvml

    yield _install
    _nvml.reset()


# -- the machines ------------------------------------------------------------------------------------
H200_BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
SWITCH_BUSES = ["00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0"]


def uuid(i: int, lead: str = "5ea1") -> str:
    return f"GPU-{lead}{i:04x}-1c2d-3e4f-a5b6-c7d8e9f0a1b{i:x}"


def hgx_h200(**kw) -> list[FakeGPU]:
    """8 H200 SXM on 4 NVSwitches: every one of a GPU's 18 links ends at a switch."""
    return [FakeGPU("NVIDIA H200", uuid(i), f"00000000:{b.upper()}:00.0",
                    links=[SWITCH_BUSES[k % 4] for k in range(18)], **kw)
            for i, b in enumerate(H200_BUSES)]


def hgx_level(i: int, j: int) -> int:
    return 40 if i // 4 == j // 4 else 50  # NODE within a socket, SYS across


PCIE_LEVELS = {frozenset((0, 1)): 10, frozenset((0, 2)): 20, frozenset((1, 2)): 20}


def pcie_box() -> list[FakeGPU]:
    """4 L40S on PCIe only (no NVLink), levels as in topo_pcie_4gpu.txt."""
    return [FakeGPU("NVIDIA L40S", uuid(i, "a0a0"), f"00000000:{b}:00.0", memory=48 * GiB, sm=142,
                    cores=18176, links=None, mig_capable=False)
            for i, b in enumerate(["01", "02", "41", "81"])]


def pcie_level(i: int, j: int) -> int:
    return PCIE_LEVELS.get(frozenset((i, j)), 30)


# -- NVLink, SMs, levels ------------------------------------------------------------------------------
def test_nvswitch_pairs_are_nvlink_and_sms_are_multiprocessors(install):
    nvml = install(make_pynvml(hgx_h200(), hgx_level, lambda a, b: True))
    d = _nvml.details(0)
    assert d["topology"] == ",".join(f"GPU{j}:NV18" for j in range(1, 8))
    assert d["sm_count"] == 132 and d["uuid"] == uuid(0) and d["pci_bus_id"] == "0000:18:00.0"
    assert "nvmlDeviceGetNumGpuCores" not in nvml.calls
    st = _nvml.state()
    assert st.available and [g["sm_count"] for g in st.devices] == [132] * 8
    assert st.devices[4]["pci_bus_id"] == "0000:9a:00.0" and st.devices[0]["name"] == "NVIDIA H200"
    # the topology built from NVML is the one nvidia-smi prints for such a box
    t = Topology.from_nvml({i: _nvml.details(i) for i in range(8)}, default="socket")
    smi = Topology.from_nvidia_smi((DATA / "topo_hgx_h200.txt").read_text())
    assert all(t.link(a, b) == smi.link(a, b) == "nvlink" for a in range(8) for b in range(8) if a != b)


def test_nvswitch_without_p2p_nvlink_is_pcie(install):
    # links up but the P2P NVLink status is not OK (e.g. fabric manager down): the PCIe path counts
    install(make_pynvml(hgx_h200(), hgx_level, lambda a, b: False))
    assert _nvml.details(0)["topology"] == "GPU1:NODE,GPU2:NODE,GPU3:NODE,GPU4:SYS,GPU5:SYS,GPU6:SYS,GPU7:SYS"


def test_pcie_box_levels_match_nvidia_smi(install):
    install(make_pynvml(pcie_box(), pcie_level))
    details = {i: _nvml.details(i) for i in range(4)}
    assert details[0]["topology"] == "GPU1:PIX,GPU2:PXB,GPU3:PHB"
    assert details[3]["sm_count"] == 142
    t = Topology.from_nvml(details)
    smi = Topology.from_nvidia_smi((DATA / "topo_pcie_4gpu.txt").read_text())
    pairs = [(a, b) for a in range(4) for b in range(a + 1, 4)]
    assert [t.link(a, b) for a, b in pairs] == [smi.link(a, b) for a, b in pairs]
    assert t.link(0, 1) == "pcie-switch" and t.link(2, 3) == "pcie-host"
    assert t.best_group(range(4), 2) == (0, 1)


def test_direct_nvlink_bridge_counts_links_to_the_peer(install):
    # two PCIe cards joined by a 4-link NVLink bridge, two without: NV4 for the pair only
    gpus = pcie_box()
    gpus[0].links = [gpus[1].bus] * 4
    gpus[1].links = [gpus[0].bus] * 4
    nvml = install(make_pynvml(gpus, pcie_level, lambda a, b: {a, b} == {0, 1}))
    assert _nvml.details(0)["topology"] == "GPU1:NV4,GPU2:PXB,GPU3:PHB"
    assert _nvml.details(2)["topology"] == "GPU0:PXB,GPU1:PXB,GPU3:PHB"
    # a pynvml without nvmlDeviceGetP2PStatus still sees direct links
    del nvml.nvmlDeviceGetP2PStatus
    _nvml.reset()
    assert _nvml.details(1)["topology"] == "GPU0:NV4,GPU2:PXB,GPU3:PHB"


@pytest.mark.parametrize("level, name, kind", [
    (0, "INTERNAL", "pcie-switch"), (10, "PIX", "pcie-switch"), (20, "PXB", "pcie-switch"),
    (30, "PHB", "pcie-host"), (40, "NODE", "pcie-host"), (50, "SYS", "socket"),
])
def test_every_topology_level_is_mapped(install, level, name, kind):
    install(make_pynvml(pcie_box()[:2], lambda i, j: level))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a known level warns about nothing
        d = _nvml.details(0)
        assert d["topology"] == f"GPU1:{name}"
        assert Topology.from_nvml({0: d, 1: {}}, default="network").link(0, 1) == kind


@pytest.mark.parametrize("level, name, kind", [
    (5, "PIX", "pcie-switch"), (35, "NODE", "pcie-host"), (45, "SYS", "socket"), (70, "SYS", "socket"),
])
def test_unknown_topology_level_is_the_next_worse_known_one(install, level, name, kind):
    install(make_pynvml(pcie_box()[:2], lambda i, j: level))
    with pytest.warns(GDaskWarning, match=f"unknown NVML topology level {level}: read as {name}"):
        d = _nvml.details(0)
    assert d["topology"] == f"GPU1:{name}"
    assert Topology.from_nvml({0: d, 1: {}}, default="network").link(0, 1) == kind  # not "network"


def test_sms_from_cuda_when_nvml_has_no_attributes(install):
    gpus = hgx_h200()
    # CUDA sees two of the GPUs, in another order than NVML: matched by PCI bus id
    cupy = make_cupy({"0000:9a:00.0": 132, "0000:18:00.0": 114})
    install(make_pynvml(gpus, hgx_level, lambda a, b: True, attributes=False), cupy)
    assert _nvml.state().devices[4]["sm_count"] is None  # the inventory does not start CUDA
    assert _nvml.details(4)["sm_count"] == 132 and _nvml.details(0)["sm_count"] == 114
    assert "sm_count" not in _nvml.details(1)  # CUDA does not see it: absent, not 16896
    # a CuPy without deviceGetAttribute: the device properties
    install(make_pynvml(hgx_h200(), hgx_level, lambda a, b: True, attributes=False),
            make_cupy({"0000:9a:00.0": 132}, with_attribute=False))
    assert _nvml.details(4)["sm_count"] == 132


def test_sms_from_cuda_when_attributes_are_not_supported(install):
    install(make_pynvml(hgx_h200(sm=None), hgx_level, lambda a, b: True), make_cupy({"0000:2a:00.0": 132}))
    assert _nvml.details(1)["sm_count"] == 132


def test_no_sm_count_rather_than_cuda_cores(install):
    nvml = install(make_pynvml(hgx_h200(sm=None), hgx_level, lambda a, b: True))  # and no CuPy
    d = _nvml.details(0)
    assert "sm_count" not in d and _nvml.state().devices[0]["sm_count"] is None
    assert "nvmlDeviceGetNumGpuCores" not in nvml.calls


def test_without_nvml_zero_devices_and_why(install):
    install(make_pynvml([], hgx_level, init_error="Driver Not Loaded"))
    st = _nvml.state()
    assert not st.available and "Driver Not Loaded" in st.reason and st.devices == []
    assert _nvml.details(0) == {} and _nvml.utilization(0) == {}
    with pytest.raises(NoDeviceError, match="Driver Not Loaded"):
        _nvml.visible_device({})
    install(make_pynvml([], hgx_level))
    assert _nvml.state().reason == "NVML found no CUDA devices"


def test_state_is_probed_once_until_reset(install):
    gpus = hgx_h200()
    install(make_pynvml(gpus, hgx_level))
    assert len(_nvml.state().devices) == 8
    gpus.pop()
    assert len(_nvml.state().devices) == 8
    assert len(_nvml.state(refresh=True).devices) == 7
    gpus.pop()
    _nvml.reset()
    assert len(_nvml.state().devices) == 6


# -- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------------------
def env(value: str | None, order: str | None = "PCI_BUS_ID") -> dict[str, str]:
    e = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    if order is not None:
        e["CUDA_DEVICE_ORDER"] = order
    return e


def test_visible_device_by_ordinal_uuid_and_prefix(install):
    install(make_pynvml(hgx_h200(), hgx_level))
    assert _nvml.visible_device(env(None))["index"] == 0
    d = _nvml.visible_device(env("3,1"))
    assert (d["index"], d["uuid"], d["pci_bus_id"], d["name"]) == (3, uuid(3), "0000:5d:00.0", "NVIDIA H200")
    assert d["memory_total"] == 141 * GiB and d["sm_count"] == 132
    assert _nvml.visible_device(env(uuid(6)))["index"] == 6
    assert _nvml.visible_device(env(f" {uuid(6).upper()} ,0"))["index"] == 6
    assert _nvml.visible_device(env("GPU-5ea10005"))["index"] == 5  # a unique prefix
    assert _nvml.visible_device(env("5ea10002-1c2d"))["index"] == 2  # CUDA's prefix without "GPU-"
    assert [v["index"] for v in _nvml.visible_devices(env(f"7,{uuid(2)},0"))] == [7, 2, 0]
    assert _nvml.cuda_environment(_nvml.visible_device(env("4"))) == {
        "CUDA_VISIBLE_DEVICES": uuid(4), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert _nvml.index_by_pci_bus_id("0000:DB:00.0") == 7  # as CuPy writes it


def test_visible_device_errors_name_the_value_and_the_devices(install):
    install(make_pynvml(hgx_h200(), hgx_level))
    with pytest.raises(ValueError, match=r"'GPU-ffff' matches no GPU NVML sees \(0: NVIDIA H200 GPU-5ea1"):
        _nvml.visible_device(env("GPU-ffff,0"))
    with pytest.raises(ValueError, match=r"'GPU-5ea1' is a prefix of 8 GPU UUIDs"):
        _nvml.visible_device(env("GPU-5ea1"))
    with pytest.raises(ValueError, match=r"'8' is GPU ordinal 8, but NVML sees 8 GPU"):
        _nvml.visible_device(env("8"))
    for hidden in ("", "-1", " -1,0"):
        with pytest.raises(NoDeviceError, match="hides every GPU"):
            _nvml.visible_device(env(hidden))
    with pytest.raises(ValueError, match="no GPU at PCI bus id '0000:99:00.0'"):
        _nvml.index_by_pci_bus_id("0000:99:00.0")
    # as in CUDA, a bad later entry ends the list
    with pytest.warns(GDaskWarning, match="'bogus' matches no GPU"):
        assert [v["index"] for v in _nvml.visible_devices(env("2,bogus,3"))] == [2]


def test_ordinals_without_pci_bus_order_warn_on_mixed_gpus(install):
    install(make_pynvml(hgx_h200(), hgx_level))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one model: CUDA and NVML orders agree, no warning
        assert _nvml.visible_device(env("1", order=None))["index"] == 1
    install(make_pynvml(hgx_h200()[:2] + pcie_box()[:2], hgx_level))
    with pytest.warns(GDaskWarning, match="set CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        _nvml.visible_device(env("1", order=None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _nvml.visible_device(env("1"))["index"] == 1  # PCI_BUS_ID order
        assert _nvml.visible_device(env(uuid(1, "a0a0"), order=None))["index"] == 3  # UUIDs are unambiguous


def test_devices_of_a_plain_dask_worker_follow_cuda_visible_devices(install, monkeypatch):
    # `dask worker --preload gdask.scheduling` with CUDA_VISIBLE_DEVICES set by the deployment
    cupy = make_cupy({})
    cupy.__spec__ = importlib.machinery.ModuleSpec("cupy", None)  # "installed"
    install(make_pynvml(hgx_h200(), hgx_level), cupy)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5ea10005,2")
    inv = discover("cuda")
    assert [d["index"] for d in inv.cuda_devices] == [5, 2]
    spec = make_specs(1)[0]
    assert (spec.backend, spec.physical, spec.name, spec.memory) == ("cuda", 5, "NVIDIA H200", 141 * GiB)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert discover("auto").backend == "emulated" and "hides every GPU" in discover("auto").cuda_reason
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-0bad")
    with pytest.raises(ValueError, match="'GPU-0bad' matches no GPU"):
        discover("auto")


def test_mig_instances(install):
    gpus = hgx_h200()[:2]
    gpus[1].migs = [
        FakeMig("MIG-2f4a9c1e-7b3d-5e6f-8a9b-0c1d2e3f4a5b", "NVIDIA H200 MIG 1g.18gb", 16 * GiB, 16, 9, 0),
        FakeMig("MIG-8d7c6b5a-4e3f-2a1b-0c9d-8e7f6a5b4c3d", "NVIDIA H200 MIG 3g.71gb", 70 * GiB, 60, 2, 0),
    ]
    install(make_pynvml(gpus, hgx_level))
    st = _nvml.state()
    assert not st.devices[0]["mig"] and st.devices[1]["mig"] and len(st.devices[1]["mig_devices"]) == 2
    d = _nvml.visible_device(env("MIG-8d7c6b5a-4e3f-2a1b-0c9d-8e7f6a5b4c3d"))
    assert (d["index"], d["uuid"], d["mig_index"], d["sm_count"], d["memory_total"]) == (1, uuid(1), 1, 60, 70 * GiB)
    assert d["name"] == "NVIDIA H200 MIG 3g.71gb"
    assert _nvml.cuda_environment(d)["CUDA_VISIBLE_DEVICES"] == "MIG-8d7c6b5a-4e3f-2a1b-0c9d-8e7f6a5b4c3d"
    old = _nvml.visible_device(env(f"MIG-{uuid(1)}/9/0"))  # CUDA 11.0-11.x spelling: GPU uuid/GI/CI
    assert old["mig_uuid"] == "MIG-2f4a9c1e-7b3d-5e6f-8a9b-0c1d2e3f4a5b" and old["sm_count"] == 16
    with pytest.raises(ValueError, match="names no MIG instance NVML sees.*MIG-2f4a9c1e"):
        _nvml.visible_device(env("MIG-00000000-0000-0000-0000-000000000000"))


# -- nvidia-smi topo -m ------------------------------------------------------------------------------
def test_parse_hgx_h200():
    text = (DATA / "topo_hgx_h200.txt").read_text()
    m = parse_nvidia_smi_topo(text)
    assert sorted(m) == list(range(8)) and all(sorted(r) == [j for j in range(8) if j != i] for i, r in m.items())
    assert {c for r in m.values() for c in r.values()} == {"NV18"}  # NIC columns and rows are left out
    t = Topology.from_nvidia_smi(text)
    assert t.worst_link(range(8)) == "nvlink"
    assert t.best_group(range(8), 4, load={0: 3, 1: 3}) == (2, 3, 4, 5)  # all links equal: least load
    assert t.best_group([6, 1, 3], 2) == (6, 1)


def test_parse_pcie_4gpu():
    text = (DATA / "topo_pcie_4gpu.txt").read_text()
    assert parse_nvidia_smi_topo(text) == {
        0: {1: "PIX", 2: "PXB", 3: "PHB"}, 1: {0: "PIX", 2: "PXB", 3: "PHB"},
        2: {0: "PXB", 1: "PXB", 3: "PHB"}, 3: {0: "PHB", 1: "PHB", 2: "PHB"},
    }
    t = Topology.from_nvidia_smi(text)
    assert (t.link(0, 1), t.link(0, 2), t.link(1, 3)) == ("pcie-switch", "pcie-switch", "pcie-host")
    assert t.best_group(range(4), 2) == (0, 1)
    assert t.best_group(range(4), 3) == (0, 1, 2)
    assert t.best_group([3, 1, 2], 2) == (1, 2)
    assert t.best_group(range(4), 2, load={0: 5.0}) == (1, 2)  # busy GPU0: the next best-linked pair


def test_parse_two_socket_box():
    text = (DATA / "topo_2socket_8gpu.txt").read_text()
    m = parse_nvidia_smi_topo(text)
    assert m[0] == {1: "PIX", 2: "NODE", 3: "NODE", 4: "SYS", 5: "SYS", 6: "SYS", 7: "SYS"}
    assert m[6][7] == "PIX" and m[5][6] == "NODE" and m[7][0] == "SYS"
    t = Topology.from_nvidia_smi(text)
    assert (t.link(2, 3), t.link(1, 2), t.link(3, 4)) == ("pcie-switch", "pcie-host", "socket")
    assert t.best_group(range(8), 4) == (0, 1, 2, 3)  # one socket
    assert t.best_group(range(8), 4, load={0: 1, 1: 1}) == (4, 5, 6, 7)
    assert t.best_group([0, 2, 4, 6], 2) == (0, 2)  # NODE beats SYS
    assert t.best_group([1, 5], 2) == (1, 5) and t.worst_link([1, 5]) == "socket"
    assert t.worst_link(range(8)) == "socket"


def test_parse_variants_of_the_output():
    text = (DATA / "topo_2socket_8gpu.txt").read_text()
    want = parse_nvidia_smi_topo(text)
    # pasted with spaces for tabs, without the legend, with a terminal's underline on the header
    spaced = text.split("\nLegend")[0].expandtabs(8)
    assert parse_nvidia_smi_topo(spaced) == want
    lines = text.splitlines()
    lines[0] = "\x1b[4m" + lines[0] + "\x1b[0m"
    assert parse_nvidia_smi_topo("nvidia-smi topo -m\n" + "\n".join(lines)) == want
    # old drivers: SOC for SYS; a single GPU has no links
    old = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-7\nGPU1\tSOC\t X \t8-15\n"
    assert Topology.from_nvidia_smi(old).link(0, 1) == "socket"
    single = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-63\t0\t\tN/A\n"
    assert parse_nvidia_smi_topo(single) == {0: {}}


def test_parse_errors_and_unknown_cells():
    with pytest.raises(ValueError, match="no header line with GPU columns"):
        parse_nvidia_smi_topo("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    with pytest.raises(ValueError, match="has 1 cells but the header has 2 device columns"):
        parse_nvidia_smi_topo("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \nGPU1\tPIX\t X \t0-7\n")
    with pytest.raises(ValueError, match=r"GPU rows \[0\] but GPU columns \[0, 1\]"):
        parse_nvidia_smi_topo("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPIX\t0-7\n")
    with pytest.raises(ValueError, match="GPU1's own cell should be 'X'"):
        parse_nvidia_smi_topo("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tPIX\tPIX\n")
    # a cell this gdask does not know: the default link, with a warning naming it
    with pytest.warns(GDaskWarning, match=r"unknown link kind\(s\) \(GPU0-GPU1: 'C2C'\) taken as 'socket'"):
        t = Topology.from_nvidia_smi("\tGPU0\tGPU1\nGPU0\t X \tC2C\nGPU1\tC2C\t X \n", default="socket")
    assert t.link(0, 1) == "socket"


def test_link_names_of_every_level_and_disagreeing_reports():
    assert link_rank("INTERNAL") == link_rank("PIX") > link_rank("PHB") == link_rank("NODE") > link_rank("SOC")
    # two GPUs that report their link differently: the worse report is kept
    t = Topology.from_nvml({0: {"topology": "GPU1:NV2"}, 1: {"topology": "GPU0:PHB"}})
    assert t.link(0, 1) == "pcie-host"
