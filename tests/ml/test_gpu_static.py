"""benchmarks/gpu_static.py's model on hand-made inputs: occupancy, the SASS reader, loop counting
(nested loops, the compiler's unrolling, rare lines) and the roofline fractions. Compiling the real
kernels for sm_90 takes minutes and the CUDA toolkit wheels: CI runs the script itself (.ci/run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_static as gs  # noqa: E402


def test_occupancy_on_sm90_limits():
    assert gs.occupancy(64, 256, 0) == 0.5  # registers: 4 blocks of 8 warps
    assert gs.occupancy(32, 256, 0) == 1.0
    assert gs.occupancy(128, 128, 40000) == 0.25  # registers and shared memory both allow 4 blocks
    assert gs.occupancy(32, 128, 100_000) == 2 * 4 / 64  # shared memory: 2 blocks
    assert gs.occupancy(255, 1024, 0) == 0.0  # does not launch


SASS = """
\t//## File "{f}", line 2
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
\t//## File "{f}", line 3
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;
.L_x_1:
\t//## File "{f}", line 4
        /*0020*/                   FFMA R3, R2, R2, R3 ;
        /*0030*/                   FFMA R3, R2, R2, R3 ;
        /*0040*/               @P0 BRA `(.L_x_1) ;
\t//## File "{f}", line 5
        /*0050*/                   STS [R5], R3 ;
        /*0060*/                   NOP ;
\t//## File "{f}", line 3
        /*0070*/               @P1 BRA `(.L_x_0) ;
        /*0080*/                   EXIT ;
"""

SOURCE = """def kernel():
    for tt in range(ST):
        x = load()
        for j in range(D):
        store(x)  # rare
"""


def _compiled(tmp_path):
    f = tmp_path / "k.py"
    f.write_text(SOURCE)
    c = gs.Compiled(registers=40, spills=0, local_bytes=0, static_smem=0)
    gs._parse_sass(SASS.format(f=f), c)
    return c


def test_sass_reader_finds_loops_and_lines(tmp_path):
    c = _compiled(tmp_path)
    assert len(c.sass) == 9
    lps = gs.loops(c)
    assert [(lo, hi) for lo, hi, _ in lps] == [(0x20, 0x40), (0x10, 0x70)]
    assert lps[0][2] == "for j in range(D):" and lps[1][2] == "x = load()"


def test_loop_count_nested_unrolled_and_rare(tmp_path):
    c = _compiled(tmp_path)
    # the inner loop: 3 instructions, its 2 FFMAs are 2 source iterations (unrolled by 2): D = 8 -> 4 runs
    n, m = gs._count(c, 0x10, 0x70, {"for j in range(D)": (8, "FFMA", 1)}, rare=1.0)
    assert n == 3 + 4 * 3 and m == 2  # LDG, STS, BRA (NOP left out) + 4 x the inner loop
    n, _ = gs._count(c, 0x10, 0x70, {"for j in range(D)": (8, "FFMA", 1)}, rare=0.25)
    assert n == 2.25 + 12  # the STS of the `# rare` line counts a quarter
    with pytest.raises(SystemExit, match="no trip count"):
        gs._count(c, 0x10, 0x70, {}, rare=1.0)


def test_model_fractions(monkeypatch):
    c = gs.Compiled(registers=64, spills=0, local_bytes=0, static_smem=0)
    spec = {"n": 10**8, "d": 32, "k": 8, "dtype": "float32", "itemsize": 4, "bytes_per_row": 128,
            "flops_per_row": 520, "tpb": 256, "mode": "tile"}
    monkeypatch.setattr(gs, "per_row_instructions", lambda c, spec: (spec["warp_instr"], 0.0))
    spec["warp_instr"] = 10.0  # under the memory time: the roofline
    row = gs.model_row("kmeans_pass", c, spec, False)
    assert row["predicted_fraction"] == 1.0 and row["predicted_s"] == pytest.approx(128e8 / gs.HBM_BW)
    spec["warp_instr"] = 4 * 128 / gs.HBM_BW * gs.ISSUE_RATE  # issue takes 4 times the memory time
    row = gs.model_row("kmeans_pass", c, spec, True)
    assert row["predicted_fraction"] == pytest.approx(0.25) and row["baseline"]
    assert set(row) >= {"kernel", "shape", "registers", "spills", "local_bytes", "occupancy", "predicted_s",
                        "predicted_fraction", "baseline"}
    assert row["shape"] == {"n": 10**8, "d": 32, "k": 8, "dtype": "float32"}


def test_targets():
    row = {"kernel": "kmeans_pass", "baseline": False, "predicted_fraction": 0.69, "spills": 0, "local_bytes": 8}
    assert len(gs._violations(row)) == 2
    assert gs._violations({**row, "predicted_fraction": 0.7, "local_bytes": 0}) == []
    assert gs._violations({**row, "baseline": True, "predicted_fraction": 0.31}) != []
    assert gs._violations({**row, "baseline": True, "predicted_fraction": 0.3}) == []
