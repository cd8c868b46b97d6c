"""Every ``python`` code block of README.md runs as written: as a script, in its own process, small sizes,
on both emulated backends: NumPy blocks (``emulated``, the laptop) and array-api-strict blocks
(``emulated-strict``: they refuse NumPy operands and implicit conversion as CuPy arrays do, so a block that
passes there runs unchanged on GPUs). The strict run gets ``DASK_GDASK__BACKEND=emulated-strict`` and
``backend="emulated"`` arguments become ``backend="emulated-strict"``; the two runs go at once (they mostly
wait on their clusters), so the second backend adds little to the suite's time."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    out = []
    section = "top"
    for m in re.finditer(r"^(#+ [^\n]*)$|^```python\n(.*?)^```", text, re.M | re.S):
        if m.group(1):
            section = m.group(1).lstrip("# ").strip()
            continue
        out.append((f"{len(out) + 1}-{re.sub(r'[^a-z]+', '-', section.lower()).strip('-')}", m.group(2)))
    return out


BLOCKS = _blocks()


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 6


#: the device backends every block runs on
BACKENDS = ("emulated", "emulated-strict")


def for_backend(code: str, backend: str) -> str:
    """``code`` with its explicit ``backend="emulated"`` arguments set to ``backend``."""
    return re.sub(r"""backend=(["'])emulated\1""", lambda m: f"backend={m.group(1)}{backend}{m.group(1)}", code)


def test_for_backend_rewrites_only_emulated_backend_arguments():
    code = 'LocalGPUCluster(backend="emulated", n=2); f(backend=\'emulated\'); g(backend="cuda")'
    assert for_backend(code, "emulated-strict") == (
        'LocalGPUCluster(backend="emulated-strict", n=2); f(backend=\'emulated-strict\'); g(backend="cuda")')
    assert for_backend(code, "emulated") == code


def _start(code: str, backend: str, where: Path) -> subprocess.Popen:
    where.mkdir()
    script = where / "block.py"
    script.write_text(for_backend(code, backend))
    env = {**os.environ, "GDASK_DOCS_SMALL": "1", "PYTHONWARNINGS": "ignore", "PYTHONFAULTHANDLER": "1",
           "DASK_DISTRIBUTED__SCHEDULER__DASHBOARD_ADDRESS": ":0"}
    if backend != "emulated":  # the emulated run keeps the default backend ("auto": emulated without a GPU)
        env["DASK_GDASK__BACKEND"] = backend
    return subprocess.Popen([sys.executable, str(script)], cwd=where, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


#: seconds both runs of a block may take together: under pytest-timeout's 300, so that a run that
#: does not finish is reported with where it was
BUDGET = 270


def _stop_with_stacks(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGABRT to a run that is out of time and to its workers (PYTHONFAULTHANDLER: each prints
    every thread's stack to the run's stderr), then its output."""
    import signal

    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for p in [*tree, proc]:
        try:
            os.kill(p.pid, signal.SIGABRT)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        return proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


@pytest.mark.parametrize("code", [c for _, c in BLOCKS], ids=[i for i, _ in BLOCKS])
def test_readme_block_runs_as_a_script(code, tmp_path):
    import time

    deadline = time.monotonic() + BUDGET
    procs = {b: _start(code, b, tmp_path / b) for b in BACKENDS}
    failed = []
    try:
        for backend, proc in procs.items():
            try:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                out, err = _stop_with_stacks(proc)
                failed.append(f"--- on {backend}: not done within {BUDGET} s (the stacks at that moment are "
                              f"below):\n{out[-3000:]}\n{err[-12000:]}".strip())
                continue
            if proc.returncode != 0:
                failed.append(f"--- on {backend} (exit {proc.returncode}):\n{out[-3000:]}\n{err[-4000:]}".strip())
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert not failed, "\n".join(failed)
