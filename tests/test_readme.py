"""Every ``python`` code block of README.md runs as written: as a script, in its own process, small sizes."""

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


@pytest.mark.parametrize("code", [c for _, c in BLOCKS], ids=[i for i, _ in BLOCKS])
def test_readme_block_runs_as_a_script(code, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(code)
    env = {**os.environ, "GDASK_DOCS_SMALL": "1", "PYTHONWARNINGS": "ignore",
           "DASK_DISTRIBUTED__SCHEDULER__DASHBOARD_ADDRESS": ":0"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-4000:]).strip()
    assert proc.returncode == 0, tail
