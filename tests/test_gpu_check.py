"""benchmarks/gpu_check.sh is one prepared run for a GPU machine that this machine cannot execute:
check that it parses, that every script and flag it names exists, and the roofline arithmetic of
benchmarks/gpu_roofline.py against a fake NVML."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import shutil
import subprocess
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_parses():
    out = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def _commands():
    text = SCRIPT.read_text().replace("\\\n", " ")
    return re.findall(r"python3 (benchmarks/\w+\.py)([^\n]*)", text)


def test_gpu_check_names_scripts_and_flags_that_exist():
    cmds = _commands()
    assert {c for c, _ in cmds} >= {"benchmarks/gpu_roofline.py", "benchmarks/window.py",
                                    "benchmarks/load_balance.py"}
    for script, rest in cmds:
        source = (ROOT / script).read_text()
        for flag in re.findall(r"(--[a-z][a-z-]*)", rest):
            assert f'"{flag}"' in source, f"{script} has no option {flag}"
        assert "--backend cuda" in rest or script.endswith("gpu_roofline.py")
    text = SCRIPT.read_text()
    assert 'pytest -m "gpu or cudasim"' in text and "gpu_check.json" in text
    assert "--rows 100000000 --features 32 --clusters 64" in text and "--logical 1,2,4" in text
    caps = [int(c) for c in re.findall(r"^\s*step [\w-]+ (\d+) ", text, flags=re.M)]
    assert len(caps) == 6 and sum(caps) <= 8 * 60 - 30  # the caps leave 30 s for the summary: under 8 minutes


@pytest.fixture
def roofline(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_roofline", ROOT / "benchmarks" / "gpu_roofline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_nvml(monkeypatch, name, bus=None, mhz=None):
    nv = types.ModuleType("pynvml")
    nv.NVML_CLOCK_MEM = 2
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetHandleByIndex = lambda i: object()
    nv.nvmlDeviceGetName = lambda h: name

    def bus_width(h):
        if bus is None:
            raise AttributeError("nvmlDeviceGetMemoryBusWidth")
        return bus

    nv.nvmlDeviceGetMemoryBusWidth = bus_width
    nv.nvmlDeviceGetMaxClockInfo = lambda h, kind: mhz if kind == 2 else 0
    monkeypatch.setitem(sys.modules, "pynvml", nv)


def test_peak_bandwidth_from_nvml_or_the_datasheet(roofline, monkeypatch):
    _fake_nvml(monkeypatch, "NVIDIA H100 80GB HBM3", bus=5120, mhz=2619)
    peak, source, name = roofline.peak_bandwidth(0)
    assert peak == pytest.approx(3.352e12, rel=1e-3) and "5120-bit" in source and "H100" in name
    _fake_nvml(monkeypatch, b"NVIDIA H200", bus=None)
    peak, source, _ = roofline.peak_bandwidth(0)
    assert peak == 4.8e12 and "datasheet" in source
    _fake_nvml(monkeypatch, "Some Future GPU", bus=None)
    assert roofline.peak_bandwidth(0)[0] is None
