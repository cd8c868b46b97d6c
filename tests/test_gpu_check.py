"""benchmarks/gpu_check.sh, the one prepared run for a GPU machine: it parses, every script and flag it
names exists, its caps fit 8 minutes, its dry run (the same steps on emulated devices) runs at tiny size
and rewrites its JSON after every step; and the roofline arithmetic of benchmarks/gpu_roofline.py
against a fake NVML."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STEPS = ["info", "gpu-tests", "roofline", "static-model", "window", "load-balance"]
needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and timeout")


@needs_bash
def test_gpu_check_parses():
    out = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def _settings(text: str) -> dict[str, list[str]]:
    """Every ``name=(...)`` array of the script's settings, by name (the GPU's first, then the dry runs')."""
    out: dict[str, list[str]] = {}
    for name, body in re.findall(r"^\s*(\w+)=\(([^)]*)\)", text, flags=re.M):
        out.setdefault(name, []).append(body)
    return out


def test_gpu_check_names_scripts_and_flags_that_exist():
    text = SCRIPT.read_text()
    settings = _settings(text)
    scripts = {"roofline": "gpu_roofline.py", "window": "window.py", "load_balance": "load_balance.py"}
    for key, script in scripts.items():
        assert f"benchmarks/{script} --backend \"$backend\" \"${{{key}[@]}}\"" in text.replace("\\\n", " ")
        source = (ROOT / "benchmarks" / script).read_text()
        for body in settings[key]:
            for flag in re.findall(r"(--[a-z][a-z-]*)", body):
                assert f'"{flag}"' in source, f"{script} has no option {flag}"
        assert '"--backend"' in source and '"--json"' in source
    # the static model's step (issue #24): its flags exist, the GPU run measures beside the committed predictions
    assert 'benchmarks/gpu_static.py "${static_model[@]}"' in text
    source = (ROOT / "benchmarks" / "gpu_static.py").read_text()
    for body in settings["static_model"]:
        for flag in re.findall(r"(--[a-z][a-z-]*)", body):
            assert f'"{flag}"' in source, f"gpu_static.py has no option {flag}"
    assert "--predicted benchmarks/gpu_static.json" in settings["static_model"][0]
    assert (ROOT / "benchmarks" / "gpu_static.json").exists()
    gpu = settings["roofline"][0]  # the GPU run: the sizes
    assert "--rows 100000000 --features 32 --clusters 64" in gpu and "--logical 1,2,4" in gpu
    assert settings["tests"][0] == '-m "gpu or cudasim"'
    caps = {name: int(cap) for name, cap in re.findall(r"^\s*step ([\w-]+) (\d+) ", text, flags=re.M)}
    assert list(caps) == ["install", *STEPS]
    assert sum(caps.values()) <= 8 * 60 - 30  # the caps leave 30 s for the summaries: under 8 minutes
    # the offline install as ../shared/device/wheels.sh prints it: wheels into /tmp/site, then the project
    # with the image's own setuptools
    assert "--no-index --no-deps --no-compile --no-cache-dir --upgrade" in text and "--target /tmp/site" in text
    assert "--no-build-isolation -e ." in text


def test_the_project_builds_with_an_older_setuptools():
    """The GPU image's setuptools builds gdask without isolation: setuptools < 77 refuses a bare SPDX
    ``license`` string (PEP 639), so pyproject keeps the table form and does not require 77."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(project["project"]["license"], dict)
    assert project["build-system"]["requires"] == ["setuptools>=61"]


@needs_bash
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_dry_run_runs_every_step_and_keeps_what_finished(tmp_path):
    """The dry run: the same steps on emulated devices at tiny size. gpu_check.json is rewritten after
    every step (a snapshot with some of the steps finished is seen while it runs: a run cut short
    keeps them), and only two files are written to $OUT."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(["bash", str(SCRIPT), "--dry-run", "--tiny"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = []
    while proc.poll() is None:
        try:
            seen.append(list(json.loads((out / "gpu_check.json").read_text())["steps"]))
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    log = proc.stdout.read()
    report = json.loads((out / "gpu_check.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.log"], log
    assert report["mode"] == "dry" and list(report["steps"]) == STEPS, log  # no .whl, dry: no install
    assert any(0 < len(s) < len(STEPS) for s in seen), seen  # written as it went
    steps = report["steps"]
    assert steps["info"]["exit"] == 0 and steps["info"]["result"]["backend"] == "emulated", log
    tests = steps["gpu-tests"]["result"]
    assert steps["gpu-tests"]["exit"] == 0 and tests["tests"] >= 2 and tests["failures"] == tests["errors"] == 0, log
    roof = steps["roofline"]["result"]
    assert steps["roofline"]["exit"] == 0 and roof["backend"] == "emulated", log
    assert roof["kernel"]["seconds"] > 0 and [f["logical_devices"] for f in roof["fits"]] == [2], log
    for name in ("window", "load-balance"):  # 1: a benchmark's bar not met, at this size
        assert steps[name]["exit"] in (0, 1) and "missing" not in steps[name]["result"], (name, log)
    assert f"gpu_check (dry): {report['total_seconds']} s" in log
    assert not list(tmp_path.glob("gpu-check.*")), "the steps' folder is removed"


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
