"""Device sharing policies: requests, ledger, placement, topology, jobs table. No cluster."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gdask.scheduling._interference import InterferenceModel, JobProfile
from gdask.scheduling._sharing import (
    DeviceCapacity,
    JobRequest,
    Placement,
    ShareError,
    ShareExceededError,
    ShareLedger,
    device_score,
    first_fit,
    jobs_table,
    place,
    whole_device,
)
from gdask.scheduling._topology import LINK_KINDS, Topology, link_rank

GiB = 2**30


def ledger4(memory: str = "16GiB") -> ShareLedger:
    return ShareLedger([DeviceCapacity(f"d{i}", memory) for i in range(4)])


# -- requests -------------------------------------------------------------------------------------
def test_job_request_parses_and_validates():
    j = JobRequest("tuning-3", gpu=0.25, memory="4GiB")
    assert j.memory == 4 * GiB and j.gpu == 0.25 and j.profile is None
    assert JobRequest("a", 1, 1000).memory == 1000
    with pytest.raises(ValueError, match=r"gpu must be a fraction of a device in \(0, 1\]"):
        JobRequest("a", gpu=1.5, memory="1GiB")
    with pytest.raises(ValueError, match="gpu"):
        JobRequest("a", gpu=0, memory="1GiB")
    with pytest.raises(TypeError, match="gpu"):
        JobRequest("a", gpu="half", memory="1GiB")
    with pytest.raises(ValueError, match="memory"):
        JobRequest("a", gpu=0.5, memory="lots")
    with pytest.raises(ValueError, match="memory must be positive"):
        JobRequest("a", gpu=0.5, memory=0)
    with pytest.raises(ValueError, match="name"):
        JobRequest("", gpu=0.5, memory="1GiB")
    with pytest.raises(TypeError, match="JobProfile"):
        JobRequest("a", gpu=0.5, memory="1GiB", profile=(0.5, 0.5))
    with pytest.raises(ValueError, match="compute"):
        DeviceCapacity("d", "1GiB", compute=0)
    assert DeviceCapacity("d", "1GiB").memory == GiB


# -- ledger ---------------------------------------------------------------------------------------
def test_grant_enforces_fraction_and_memory():
    ledger = ShareLedger([DeviceCapacity("d0", "8GiB")])
    a = JobRequest("a", 0.5, "4GiB")
    ledger.grant(a, "d0")
    ledger.grant(JobRequest("b", 0.25, "2GiB"), "d0")
    assert ledger.free("d0") == (0.25, 2 * GiB)
    with pytest.raises(ShareExceededError, match="gpu") as e:
        ledger.grant(JobRequest("c", 0.5, "1GiB"), "d0")
    assert e.value.resource == "gpu" and e.value.available == pytest.approx(0.25)
    with pytest.raises(ShareExceededError, match="memory") as e:
        ledger.grant(JobRequest("c", 0.25, "3GiB"), "d0")
    assert e.value.resource == "memory" and e.value.requested == 3 * GiB
    assert "c" not in ledger.jobs  # a refused grant leaves no trace
    ledger.grant(JobRequest("c", 0.25, "2GiB"), "d0")  # exactly full is fine
    assert ledger.free("d0") == (0.0, 0)
    with pytest.raises(ShareError, match="already has a grant"):
        ledger.grant(a, "d0")
    with pytest.raises(ShareError, match="already used by another request"):
        ledger.grant(JobRequest("a", 0.1, "1GiB"), "d0")
    with pytest.raises(ShareError, match="unknown device"):
        ledger.grant(JobRequest("z", 0.1, "1GiB"), "d9")
    assert ledger.release("b") == ["d0"]
    assert ledger.free("d0") == (pytest.approx(0.25), 2 * GiB)
    with pytest.raises(ShareError, match="no grant"):
        ledger.release("b")


def test_many_small_fractions_fill_a_device_exactly():
    ledger = ShareLedger([DeviceCapacity("d0", "1GiB")])
    for i in range(10):
        ledger.grant(JobRequest(f"j{i}", 0.1, "100MiB"), "d0")  # 10 x 0.1 sums to 0.9999...
    assert not ledger.fits(JobRequest("x", 0.1, "1MiB"), "d0")


def test_charge_spills_only_the_job_over_its_request():
    ledger = ShareLedger([DeviceCapacity("d0", "8GiB")])
    ledger.grant(JobRequest("a", 0.5, "1GiB"), "d0")
    ledger.grant(JobRequest("b", 0.5, "2GiB"), "d0")
    assert ledger.charge("b", GiB) == 0
    assert ledger.charge("a", GiB // 2) == 0
    assert ledger.charge("a", GiB // 2) == 0          # exactly at its request
    assert ledger.charge("a", 300) == 300             # a is over: spill 300 bytes of a
    assert ledger.used("a") == {"d0": GiB}            # assumed spilled
    assert ledger.used("b") == {"d0": GiB}            # b is untouched
    assert ledger.charge("b", GiB) == 0               # b may still use all of its request
    assert ledger.charge("b", 5) == 5
    ledger.uncharge("a", GiB // 4)
    assert ledger.charge("a", GiB // 4) == 0
    with pytest.raises(ValueError, match="uncharge"):
        ledger.charge("a", -1)
    with pytest.raises(ShareError, match="no grant"):
        ledger.charge("nobody", 1)


def test_multi_device_job_and_remove_device():
    ledger = ledger4()
    j = JobRequest("spmd", 0.5, "1GiB")
    ledger.grant(j, "d0")
    ledger.grant(j, "d1")
    with pytest.raises(ShareError, match="say which one"):
        ledger.charge("spmd", 10)
    assert ledger.charge("spmd", GiB + 1, device="d1") == 1
    assert ledger.used("spmd") == {"d0": 0, "d1": GiB}
    with pytest.raises(ShareError, match="no grant on device"):
        ledger.charge("spmd", 1, device="d2")
    assert ledger.remove_device("d1") == ["spmd"]
    assert ledger.devices_of("spmd") == ["d0"]
    assert ledger.remove_device("d0") == ["spmd"]
    assert ledger.jobs == []


def test_profile_defaults_and_device_scaling():
    ledger = ShareLedger([DeviceCapacity("fast", "8GiB", compute=2.0), DeviceCapacity("slow", "8GiB")])
    j = JobRequest("a", 0.5, "2GiB")
    assert ledger.profile(j) == JobProfile(0.5, 0.5)           # unknown profile: its request
    assert ledger.profile(j, "fast") == JobProfile(0.25, 0.5, 0.25)
    ledger.grant(j, "slow")
    ledger.set_profile("a", JobProfile(0.9, 0.1))
    assert ledger.profile("a", "slow") == JobProfile(0.9, 0.1, 0.25)


# -- placement ------------------------------------------------------------------------------------
def contention(own: JobProfile, others: list[JobProfile]) -> float:
    """The stated synthetic contention model of these tests (the policies never see it): a
    resource over-subscribed ``T`` times slows its phase ``T`` times; phases overlap."""
    tc = own.compute + sum(o.compute for o in others)
    tb = own.bandwidth + sum(o.bandwidth for o in others)
    return max(own.compute * max(1, tc), own.bandwidth * max(1, tb)) / max(own.compute, own.bandwidth)


def mixed_jobs() -> list[JobRequest]:
    """Arrival order c, c, b, b, ...: naive packing puts equal bottlenecks together."""
    comp, band = JobProfile(0.8, 0.2), JobProfile(0.15, 0.85)
    return [JobRequest(f"j{i}", 0.5, "2GiB", profile=comp if i % 4 < 2 else band) for i in range(8)]


def trained_model() -> InterferenceModel:
    rng = np.random.default_rng(7)
    m = InterferenceModel()
    for _ in range(300):
        profs = [JobProfile(*rng.uniform(0.05, 0.95, 2)) for _ in range(int(rng.integers(2, 4)))]
        m.observe(profs[0], profs[1:], contention(profs[0], profs[1:]) * rng.lognormal(0, 0.02))
    return m


def run_policy(policy, model=None) -> tuple[float, ShareLedger]:
    ledger = ledger4()
    for job in mixed_jobs():
        p = policy(job, None, ledger, model)
        assert isinstance(p, Placement) and p.device is not None
        ledger.grant(job, p.device)
    slow = []
    for d in ledger.devices:
        profs = [ledger.profile(n, d) for n in ledger.jobs_on(d)]
        slow += [contention(p, profs[:i] + profs[i + 1:]) for i, p in enumerate(profs)]
    return float(np.mean(slow)), ledger


@pytest.mark.parametrize("use_model", [False, True])
def test_place_separates_equal_bottlenecks_and_beats_first_fit(use_model):
    model = trained_model() if use_model else None
    ours, ledger = run_policy(place, model)
    naive, naive_ledger = run_policy(first_fit)
    for d in ledger.devices:  # every device got one compute-bound and one bandwidth-bound job
        assert sorted(ledger.profile(n).bottleneck for n in ledger.jobs_on(d)) == ["bandwidth", "compute"]
    assert sorted(naive_ledger.profile(n).bottleneck for n in naive_ledger.jobs_on("d0")) == ["compute"] * 2
    assert ours < naive
    assert ours == pytest.approx(1.0, abs=0.1) and naive > 1.4


def test_place_spreads_load_and_respects_memory():
    ledger = ledger4("4GiB")
    p = place(JobRequest("a", 0.25, "1GiB"), None, ledger)
    assert p.device == "d0" and set(p.scores) == {"d0", "d1", "d2", "d3"}
    ledger.grant(JobRequest("a", 0.25, "1GiB"), "d0")
    assert place(JobRequest("b", 0.25, "1GiB"), None, ledger).device == "d1"  # d0 is busier
    big = JobRequest("big", 0.25, "3500MiB")
    p = place(big, ["d0", "d1"], ledger)
    assert p.device == "d1" and "d0" not in p.scores  # only 3GiB free on d0
    # memory is one of the dimensions: on an empty device the big job's score is its memory share
    assert device_score(big, "d1", ledger) == pytest.approx(3500 / 4096)
    assert device_score(JobRequest("x", 0.25, "1GiB"), "d1", ledger) == pytest.approx(0.25)


def test_baselines_and_queueing():
    ledger = ledger4()
    jobs = [JobRequest(f"j{i}", 0.25, "1GiB") for i in range(5)]
    for j in jobs[:4]:
        p = whole_device(j, None, ledger)
        ledger.grant(j, p.device)
    assert [ledger.jobs_on(d) for d in ledger.devices] == [["j0"], ["j1"], ["j2"], ["j3"]]
    p = whole_device(jobs[4], None, ledger)
    assert p.device is None and p.devices == ()   # all busy: the job queues
    assert first_fit(jobs[4], None, ledger).device == "d0"
    assert first_fit(JobRequest("huge", 0.8, "1GiB"), None, ledger).device is None
    assert place(JobRequest("huge", 0.8, "1GiB"), None, ledger).device is None
    ledger.release("j2")
    assert whole_device(jobs[4], None, ledger).device == "d2"


def test_place_with_topology_picks_best_linked_group():
    ledger = ledger4()
    topo = Topology({("d0", "d1"): "pcie-switch", ("d2", "d3"): "nvlink", ("d0", "d2"): "socket",
                     ("d0", "d3"): "socket", ("d1", "d2"): "socket", ("d1", "d3"): "socket"})
    p = place(JobRequest("spmd", 0.5, "1GiB"), None, ledger, count=2, topology=topo)
    assert p.devices == ("d2", "d3")
    ledger.grant(JobRequest("hog", 0.75, "1GiB"), "d3")  # d3 cannot take the job any more
    p = place(JobRequest("spmd", 0.5, "1GiB"), None, ledger, count=2, topology=topo)
    assert p.devices == ("d0", "d1")
    assert place(JobRequest("spmd", 0.5, "1GiB"), None, ledger, count=4).devices == ()
    with pytest.raises(ValueError, match="count"):
        place(JobRequest("spmd", 0.5, "1GiB"), None, ledger, count=0)


# -- topology -------------------------------------------------------------------------------------
def test_link_rank_order_and_names():
    ranks = [link_rank(k) for k in LINK_KINDS]
    assert ranks == sorted(ranks, reverse=True) and len(set(ranks)) == len(ranks)
    assert link_rank("nvlink") > link_rank("pcie-switch") > link_rank("socket") > link_rank("network")
    assert link_rank("NV18") == link_rank("nvlink")
    assert link_rank("PIX") == link_rank("PXB") == link_rank("pcie-switch")
    assert link_rank("SYS") == link_rank("socket")
    with pytest.raises(ValueError, match="unknown link kind 'carrier-pigeon'"):
        link_rank("carrier-pigeon")


def test_topology_from_config_and_groups():
    t = Topology({0: {1: "nvlink", 2: "pix"}, 1: {2: "sys"}})
    assert t.link(1, 0) == "nvlink" and t.link(2, 0) == "pcie-switch" and t.link(0, 3) == "network"
    assert t.worst_link([0, 1, 2]) == "socket"
    assert t.best_group([0, 1, 2, 3], 2) == (0, 1)
    assert t.best_group([2, 1, 0], 1, load={2: 5.0, 1: 1.0, 0: 3.0}) == (1,)
    # equal links: lowest total load wins
    flat = Topology({(a, b): "pcie-switch" for a in range(4) for b in range(a + 1, 4)})
    assert flat.best_group(range(4), 2, load={0: 3, 1: 1, 2: 0, 3: 2}) == (1, 2)
    # greedy path on a larger set gives the same answer as the exhaustive one
    links = {(a, b): ("nvlink" if a // 4 == b // 4 else "socket") for a in range(12) for b in range(a + 1, 12)}
    big = Topology(links)
    assert big.best_group(range(12), 4, load={i: -i for i in range(12)}) == (8, 9, 10, 11)
    assert big.best_group(range(12), 4, load={i: -i for i in range(12)}, max_combinations=1) == (8, 9, 10, 11)
    with pytest.raises(ValueError, match="group of 5"):
        t.best_group([0, 1, 2, 3], 5)
    with pytest.raises(ValueError, match="unknown link kind"):
        Topology({(0, 1): "wifi"})
    with pytest.raises(ValueError, match="two different devices"):
        Topology({(0, 0): "nvlink"})


def test_topology_from_nvml_details():
    # what gdask._devices._nvml.details(i) returns on a 4-GPU box: 0-1 and 2-3 NVLinked pairs
    details = {
        0: {"sm_count": 132, "topology": "GPU1:NV18,GPU2:SYS,GPU3:SYS"},
        1: {"sm_count": 132, "topology": "GPU0:NV18,GPU2:SYS,GPU3:PHB"},
        2: {"sm_count": 132, "topology": "GPU0:SYS,GPU1:SYS,GPU3:NV4"},
        3: {},  # NVML gave nothing for this one: its links come from the others' reports
    }
    t = Topology.from_nvml(details)
    assert t.link(0, 1) == "nvlink" and t.link(2, 3) == "nvlink" and t.link(1, 3) == "pcie-host"
    assert t.link(0, 2) == "socket" and t.best_group([0, 2, 3], 2) == (2, 3)
    # logical devices (worker addresses) on physical GPUs, two of them on one split GPU, two hosts
    devices = {"w0": 0, "w0b": 0, "w1": 1, "w9": 2}
    hosts = {"w0": "a", "w0b": "a", "w1": "a", "w9": "b"}
    t = Topology.from_nvml(details, devices=devices, hosts=hosts)
    assert t.link("w0", "w0b") == "same-device" and t.link("w0b", "w1") == "nvlink"
    assert t.link("w1", "w9") == "network"
    assert t.best_group(["w9", "w1", "w0"], 2) == ("w1", "w0")
    # unknown future NVML levels fall back to the default; garbage is an error
    assert Topology.from_nvml({0: {"topology": "GPU1:QPI9"}}, default="socket").link(0, 1) == "socket"
    with pytest.raises(ValueError, match="cannot parse NVML topology entry"):
        Topology.from_nvml({0: {"topology": "nonsense"}})


# -- jobs table -----------------------------------------------------------------------------------
def test_jobs_table():
    ledger = ledger4()
    ledger.grant(JobRequest("a", 0.5, "2GiB", profile=JobProfile(0.9, 0.1)), "d0")
    ledger.grant(JobRequest("b", 0.5, "1GiB", profile=JobProfile(0.85, 0.2)), "d0")
    ledger.grant(JobRequest("c", 0.25, "1GiB"), "d1")
    ledger.charge("a", 1000)
    model = trained_model()
    df = jobs_table(ledger, model, measured={"a": 1.7})
    assert list(df.index) == ["a", "b", "c"]
    assert df.loc["a", "devices"] == ["d0"] and df.loc["a", "co_runners"] == ["b"]
    assert df.loc["a", "share"] == 0.5 and df.loc["a", "memory"] == 2 * GiB and df.loc["a", "memory_used"] == 1000
    assert df.loc["a", "bottleneck"] == "compute"
    assert df.loc["a", "predicted_slowdown"] > 1.4       # two compute-bound jobs together
    assert df.loc["c", "predicted_slowdown"] == 1.0      # alone
    assert df.loc["a", "measured_slowdown"] == 1.7 and math.isnan(df.loc["b", "measured_slowdown"])
    assert jobs_table(ledger)["predicted_slowdown"].isna().all()
    assert jobs_table(ShareLedger()).empty
