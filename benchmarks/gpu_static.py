"""A static model of gdask's numba.cuda kernels on an H200, computed without a GPU (issue #24).

Every kernel is compiled for sm_90 by numba-cuda (its ``cu12`` extra brings NVVM), assembled by
``ptxas`` and disassembled by ``nvdisasm`` (NVIDIA's pip wheels ``nvidia-cuda-nvcc-cu12`` and
``nvidia-cuda-nvdisasm``; or a CUDA toolkit on ``PATH``). For each kernel and shape it reports:

* registers per thread, spill bytes, stack (local memory) bytes, shared memory per thread block and
  the theoretical occupancy (sm_90: 64 K registers, 64 warps, 32 blocks, 228 KiB shared per SM);
* the SASS instructions of the hot loop, per row, counted from the disassembly (below);
* a predicted time on an H200 and the fraction of the attainable roofline it reaches.

The model (public H200 figures: 132 SMs, 4 warp schedulers each, ~1.98 GHz, 4.8 TB/s HBM, ~67
TFLOP/s FP32)::

    attainable = max(bytes / BW, FLOPs / peak)            the roofline: min(peak, intensity x BW)
    predicted  = max(bytes / BW, FLOPs / peak, warp instructions / (132 x 4 x 1.98e9 per s))
    fraction   = attainable / predicted

``bytes`` is what the pass must read once (the block, plus labels for logistic regression);
``FLOPs`` the work of the algorithm in its cheapest form (a K-means pass: ``2 k d`` per row for the
distances in GEMM form, ``d`` for the sums; logistic: ``4 d`` per row for ``X w`` and ``X^T r``).

Counting instructions. Line information (``lineinfo``) maps SASS to the kernel's Python lines; a
backward branch closes a loop. The *hot loop* of a kernel is named by a fragment of its source line:

* ``tile`` kernels (the rewritten ones): every distance loop is unrolled (sizes are compile-time
  constants), so one iteration of the tile loop handles ``rows`` rows; its instructions are counted
  statically, **every branch taken** (the rare paths, e.g. exact distances of candidate farthest
  rows, count as if each row took them: an overestimate), loops nested in it multiplied by their
  trip counts (given per loop line);
* ``inner`` kernels (the frozen baseline, whose loops run ``d`` and ``k`` times at run time): only
  the innermost distance loop is counted, ``instructions per iteration / loads per iteration`` per
  (center, feature) pair, ``k d`` pairs per row; everything else the kernel does per row is left
  out (an underestimate: the baseline's predicted fraction is an upper bound).

Blind spots (what the model does not see; the day a GPU comes, ``gpu_check.sh`` prints the measured
fraction beside the predicted one): latency (a kernel with few warps per scheduler cannot hide HBM
latency, which the occupancy column only hints at), the load/store pipe (shared and global loads
issue at a quarter of the rate of arithmetic on sm_90: reported as ``lsu_s`` and not in the max),
the half-rate FP64 pipe, caches (the block is read once, nothing assumed cached), bank conflicts,
barrier stalls, the tail of the grid and launch overhead (microseconds), and the host side.

usage: python benchmarks/gpu_static.py [--json out.json] [--all] [--check]
  --all      also compile every other kernel of gdask (both dtypes) for sm_90 (CI's compile check)
  --check    exit 1 unless the issue's targets hold (>= 70% rewritten, <= 30% baseline, no spills)
  --measure  on a GPU, time the same kernels and print the measured fraction beside the predicted one
             (gpu_check.sh, with --predicted benchmarks/gpu_static.json: the committed predictions)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: public H200 figures
SMS, SCHEDULERS, CLOCK = 132, 4, 1.98e9
HBM_BW = 4.8e12
FP32_PEAK = 67e12
ISSUE_RATE = SMS * SCHEDULERS * CLOCK  # warp instructions per second
LSU_RATE = SMS * CLOCK  # shared/global load-store warp instructions per second (a quarter of issue)
#: sm_90 per-SM limits
REGS_SM, WARPS_SM, BLOCKS_SM, SMEM_SM, SMEM_RESERVED = 65536, 64, 32, 233472, 1024

TARGET, BASELINE_MAX = 0.70, 0.30
_REAL_DEVICE: list = []  # numba's get_current_device, while compiling without a GPU
LINEINFO = True


# -- toolchain ---------------------------------------------------------------------------------------
def _tool(name: str) -> str:
    """Path of ``ptxas`` / ``nvdisasm``: NVIDIA's pip wheels first, then ``PATH``."""
    import importlib.util

    for pkg in ("nvidia.cuda_nvcc", "nvidia.cu13", "nvidia.cuda_nvdisasm", "nvidia.cu12"):
        try:
            spec = importlib.util.find_spec(pkg)
        except ModuleNotFoundError:
            continue
        for root in (spec.submodule_search_locations or []) if spec else []:
            p = Path(root) / "bin" / name
            if p.exists():
                return str(p)
    found = shutil.which(name)
    if found:
        return found
    raise SystemExit(f"gpu_static: no {name}: pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-nvdisasm (or put a CUDA "
                     "toolkit's bin on PATH)")


def _numba_cuda():
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
    from numba import cuda

    if "numba_cuda" not in cuda.__file__:
        raise SystemExit("gpu_static: numba.cuda is numba's built-in target; pip install 'numba-cuda[cu12]'")
    import numba.cuda.dispatcher as nd

    # device functions ask the current device for its compute capability: there is none here (put
    # back by measure(), which runs on a real one)
    _REAL_DEVICE.append(_REAL_DEVICE[0] if _REAL_DEVICE else nd.get_current_device)
    nd.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    return cuda


# -- compiling and reading ptxas / SASS ------------------------------------------------------------
@dataclass
class Compiled:
    registers: int
    spills: int  # spill store + load bytes
    local_bytes: int  # stack frame
    static_smem: int
    sass: list = field(default_factory=list)  # (address, text, (file, line))
    labels: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)  # (file, line) -> text


def compile_sm90(pyfunc, sig, work: Path, tag: str, model: bool = True) -> Compiled:
    """Compile for sm_90 and read ptxas's report; with ``model``, also the SASS with line information
    (NVVM rejects the line information of some kernels, e.g. with a float ``//``: those are compiled
    for the check only)."""
    cuda = _numba_cuda()
    ptx, _ = cuda.compile_ptx(pyfunc, sig, cc=(9, 0), lineinfo=LINEINFO and model)
    p = work / f"{tag}.ptx"
    p.write_text(ptx)
    cubin = work / f"{tag}.cubin"
    out = subprocess.run([_tool("ptxas"), "-arch=sm_90", "-O3", "-v", "-lineinfo", str(p), "-o", str(cubin)],
                         capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", out)
    stack, st, ld = (int(g) for g in m.groups()) if m else (0, 0, 0)
    sm = re.search(r"(\d+) bytes smem", out)
    if not model:
        return Compiled(regs, st + ld, stack, int(sm.group(1)) if sm else 0)
    sass = subprocess.run([_tool("nvdisasm"), "-c", "-g", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    c = Compiled(regs, st + ld, stack, int(sm.group(1)) if sm else 0)
    _parse_sass(sass, c)
    return c


def _parse_sass(text: str, c: Compiled) -> None:
    cur, pend = None, []
    for ln in text.splitlines():
        m = re.match(r'\s*//## File "(.*)", line (\d+)', ln)
        if m:
            cur = (m.group(1), int(m.group(2)))
            continue
        m = re.match(r"\s*(\.L_x_\d+):", ln)
        if m:
            pend.append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", ln)
        if m:
            a = int(m.group(1), 16)
            for lab in pend:
                c.labels[lab] = a
            pend = []
            c.sass.append((a, m.group(2).strip(), cur))
    for _, _, src in c.sass:
        if src and src not in c.source:
            try:
                c.source[src] = Path(src[0]).read_text().splitlines()[src[1] - 1]
            except (OSError, IndexError):
                c.source[src] = ""


def loops(c: Compiled) -> list[tuple[int, int, str]]:
    """(first address, back-branch address, source line text of the back branch) of every loop."""
    out = []
    for a, t, src in c.sass:
        m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", t)
        if m and c.labels.get(m.group(1), 1 << 62) <= a:
            out.append((c.labels[m.group(1)], a, c.source.get(src, "").strip()))
    return out


def _opcode(t: str) -> str:
    t = re.sub(r"^@!?U?P\w+\s+", "", t)
    return t.split()[0] if t else ""


def _own(c: Compiled, lo: int, hi: int) -> list[str]:
    """The instructions of loop [lo, hi] outside the loops nested in it."""
    inner = [lp for lp in loops(c) if lo <= lp[0] and lp[1] <= hi and (lp[0], lp[1]) != (lo, hi)]
    return [t for a, t, _ in c.sass if lo <= a <= hi and not any(s <= a <= e for s, e, _ in inner)]


def _count(c: Compiled, lo: int, hi: int, trips: dict[str, float], rare: float = 1.0) -> tuple[float, float]:
    """(instructions, load/store instructions) of [lo, hi], nested loops times their trip counts, the
    instructions of source lines marked ``# rare`` times ``rare``."""
    inner = [lp for lp in loops(c) if lo <= lp[0] and lp[1] <= hi and (lp[0], lp[1]) != (lo, hi)]
    top = [lp for lp in inner if not any(o[0] <= lp[0] and lp[1] <= o[1] and o != lp for o in inner)]
    n = m = 0.0
    for a, t, src in c.sass:
        if lo <= a <= hi and not any(s <= a <= e for s, e, _ in top):
            op = _opcode(t)
            if op in ("NOP",):
                continue
            text = c.source.get(src, "")
            wt = rare / 32 if "# rarer" in text else rare if "# rare" in text else 1.0
            n += wt
            m += wt * op.startswith(("LD", "ST", "ATOM", "RED"))
    for s, e, line in top:
        k = next((v for frag, v in trips.items() if frag in line), None)
        if isinstance(k, tuple):  # (source trips, marker opcode, markers a source iteration): unrolled by
            k, marker, per = k  # the compiler, the loop runs trips / (markers in its body / per) times
            body = _own(c, s, e)
            u = sum(_opcode(t).startswith(marker) for t in body) / per
            k = k / max(u, 1.0)
        if k is None:
            raise SystemExit(f"gpu_static: a loop at line {line!r} has no trip count in the kernel's spec; its loops: "
                             f"{[(hex(a), hex(b), t) for a, b, t in loops(c)]}")
        ni, nm = _count(c, s, e, trips, rare)
        n += k * ni
        m += k * nm
    return n, m


# -- the model -------------------------------------------------------------------------------------
def occupancy(regs: int, tpb: int, smem: int) -> float:
    warps = -(-tpb // 32)
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = REGS_SM // (per_warp * warps) if regs else BLOCKS_SM
    by_smem = SMEM_SM // (smem + SMEM_RESERVED)
    blocks = min(BLOCKS_SM, WARPS_SM // warps, by_regs, by_smem)
    return blocks * warps / WARPS_SM


def per_row_instructions(c: Compiled, spec: dict) -> tuple[float, float]:
    """Warp instructions and load/store warp instructions per row (see the module docstring)."""
    lps = loops(c)
    if spec["mode"] == "tile":
        hot = [lp for lp in lps if spec["hot"] in lp[2]]
        if not hot:
            raise SystemExit(f"gpu_static: {spec['name']}: no loop at a line with {spec['hot']!r}")
        lo, hi = min(h[0] for h in hot), max(h[1] for h in hot)
        n, m = _count(c, lo, hi, spec.get("trips", {}), spec.get("rare", 1.0))
        return n / spec["rows"], m / spec["rows"]
    # inner: the distance loop: loops with no loop inside, the one with the most global loads per
    # instruction; its loads tell how many (center, feature) pairs an iteration does
    best = None
    for s, e, _ in lps:
        if any(s <= o[0] and o[1] <= e and (o[0], o[1]) != (s, e) for o in lps):
            continue
        ops = [_opcode(t) for a, t, _ in c.sass if s <= a <= e]
        ldg = sum(o.startswith("LDG") for o in ops)
        if ldg and (best is None or ldg / len(ops) > best[0]):
            best = (ldg / len(ops), len(ops), ldg, sum(o.startswith(("LD", "ST")) for o in ops))
    _, n, ldg, mem = best
    pairs = spec["k"] * spec["d"]
    return pairs * n / ldg / 32, pairs * mem / ldg / 32


def model_row(name: str, c: Compiled, spec: dict, baseline: bool) -> dict:
    n, d, k = spec["n"], spec["d"], spec["k"]
    instr, mem = per_row_instructions(c, spec)
    bytes_ = n * spec["bytes_per_row"]
    flops = n * spec["flops_per_row"]
    t_mem, t_flop = bytes_ / HBM_BW, flops / FP32_PEAK
    t_issue = n * instr / ISSUE_RATE
    attainable = max(t_mem, t_flop)
    predicted = max(t_mem, t_flop, t_issue)
    smem = c.static_smem + spec.get("dynamic_smem", 0)
    return {"kernel": name, "shape": {"n": n, "d": d, "k": k, "dtype": spec["dtype"]},
            "registers": c.registers, "spills": c.spills, "local_bytes": c.local_bytes, "shared_bytes": smem,
            "threads": spec["tpb"], "occupancy": round(occupancy(c.registers, spec["tpb"], smem), 4),
            "sass_per_row": round(instr * 32, 1), "memory_s": t_mem, "flop_s": t_flop, "issue_s": t_issue,
            "lsu_s": n * mem / LSU_RATE, "predicted_s": predicted,
            "predicted_fraction": round(attainable / predicted, 4), "baseline": baseline,
            "counted": "the hot loop" if spec["mode"] == "tile" else "the inner loop only (an upper bound)"}


# -- what is modelled --------------------------------------------------------------------------------
def _types():
    from numba.core import types as t

    def arr(dt, nd=1, layout="C"):
        return t.Array(dt, nd, layout)

    return t, arr


def _kmeans_rows(n: int, d: int, ks: list[int]) -> list[tuple]:
    """(name, pyfunc, signature, spec, baseline) of the K-means pass, rewritten and frozen."""
    import _frozen_kmeans_cuda as fk

    from gdask.ml.kernels import _cuda_common as cuc
    from gdask.ml.kernels import _lloyd_cuda as lc

    t, A = _types()
    f64, i64, i32, b, f32 = t.float64, t.int64, t.int32, t.boolean, t.float32
    rows = []
    for k in ks:
        tpb = lc._threads(k, d, 4)
        common = {"n": n, "d": d, "k": k, "dtype": "float32", "itemsize": 4, "bytes_per_row": 4 * d,
                  "flops_per_row": 2 * k * d + d}
        kern = cuc.kernel("lloyd-pass", "float32", (d, k, tpb, lc.SEG, False))
        sig = (A(f32, 2), A(f64), A(f32), A(f32), A(f64), f64, A(f64), A(f64), A(f64), A(f64), A(i64), A(i32))
        g, v, _, h, m, _ = lc._geometry(d, tpb)
        spec = {**common, "name": "lloyd-pass", "mode": "tile", "hot": "for tt in range(", "rows": g, "tpb": tpb,
                "trips": {"while rb <": (g // h, "FADD", m * v), "rb += uint32(H)": (g // h, "FADD", m * v),
                          "while c < uint32(K)": (k // 4, "FFMA", 4 * d), "c += uint32(4)": (k // 4, "FFMA", 4 * d),
                          "for c in range(K % 4)": (k % 4, "FFMA", d), "for rr in range(G)": g,
                          "for j in range(D)": d, "for j in range(1, D)": d - 1, "for t in range(1, q)": 7},
                "rare": _rare(n, tpb, g)}
        spec["trips"]["for c in range(K % 4)"] = (k % 4, "FFMA", d)
        rows.append(("kmeans_pass", kern.py_func, sig, spec, False))
        fk.cuc.numba_cuda()
        old = fk.cuc.kernel("lloyd-stats", "float32")
        parts = (i64, A(f64), A(f64), A(f64), A(f64), A(i64), A(i32))
        sig = (A(f32, 2), A(f64), A(f32), *parts, b, b, b)
        sh_sums, sh_c, shmem = fk._layout(k, d, 256, 4)
        spec = {**common, "name": "lloyd-stats (frozen)", "mode": "inner", "tpb": 256, "dynamic_smem": shmem}
        rows.append(("kmeans_pass", old.py_func, sig, spec, True))
    return rows


def _rare(n: int, tpb: int, g: int, q: int = 8) -> float:
    """How often a thread block's tile takes the lines marked ``# rare`` of the K-means pass (rows
    that may be among their group's ``q`` farthest): in rows in random order, a group of ``m`` rows
    sees about ``q (1 + ln(m / q))`` new members of its top ``q``; the group's ``g`` rows of a tile
    take the rare path when any of them does (counted as if all ``g`` then did)."""
    import math

    groups = 4 * SMS * (tpb // g)
    m = max(n / groups, q)
    return min(1.0, g * q * (1 + math.log(m / q)) / m)


def _logistic_rows(n: int, d: int) -> list[tuple]:
    import _frozen_logistic_cuda as fl

    from gdask.ml.kernels import _cuda_common as cuc
    from gdask.ml.kernels import _logreg_cuda as lr

    t, A = _types()
    f64, i64, i32, b, f32 = t.float64, t.int64, t.int32, t.boolean, t.float32
    common = {"n": n, "d": d, "k": 1, "dtype": "float32", "itemsize": 4, "bytes_per_row": 4 * d + 4,
              "flops_per_row": 4 * d}
    tpb = lr._threads()
    kern = cuc.kernel("logistic-binary", "float32", (d, tpb, lr.SEG, False, False))
    sig = (A(f32, 2), A(i32), A(f32), A(f32), A(f64), A(f64), A(f64), A(f64))
    spec = {**common, "name": "logistic-binary", "mode": "tile", "hot": "for tt in range(", "rows": 32, "tpb": tpb,
            "dynamic_smem": 0, "trips": {"for j in range(D)": d, "for j in range(D1)": d + 1}}
    rows = [("logistic_grad", kern.py_func, sig, spec, False)]
    fl.cuc.numba_cuda()
    old = fl.cuc.kernel("logistic", "float32")
    sig = (A(f32, 2), A(i32), A(f32), A(f32), A(f64), A(f64), A(f64), A(f64), b, b, b, b, i64)
    spec = {**common, "name": "logistic (frozen)", "mode": "inner", "tpb": 256, "k": 1, "d": 2 * d,
            "dynamic_smem": 8 * 256 * 2 + 8 * 7 * 33 + 4 * d}
    spec["shape_d"] = d
    rows.append(("logistic_grad", old.py_func, sig, spec, True))
    return rows


def compile_all(work: Path) -> int:
    """Compile every numba.cuda kernel of gdask for sm_90 (both dtypes): the CI's compile check."""
    from gdask.ml.kernels import _cuda_common as cuc
    from gdask.ml.kernels import _hamerly_cuda, _kmeans_cuda, _logistic_cuda  # noqa: F401 - registers them

    t, A = _types()
    f64, i64, i32, b = t.float64, t.int64, t.int32, t.boolean
    done = 0
    for dt in (t.float32, t.float64):
        parts = (i64, A(f64), A(f64), A(f64), A(f64), A(i64), A(i32))
        sigs = {"lloyd-stats": (A(dt, 2), A(f64), A(dt), *parts, b, b, b),
                "first-pass": (A(dt, 2), A(f64), A(dt), A(f64), *parts, A(i32), A(f64), A(f64), f64, b, b, b),
                "assign": (A(dt, 2), A(dt), i64, A(i32), A(f64), b),
                "rowsum": (A(f64, 2), A(f64)),
                "hamerly": (A(dt, 2), A(f64), A(i32), A(f64), A(f64), A(f64), A(f64), A(f64), i64, f64, f64, A(i64),
                            A(i64), A(i32), b),
                "moves": (A(dt, 2), A(f64), A(i64), A(i32), A(i32), A(f64), A(f64), b),
                "logistic": (A(dt, 2), A(i32), A(dt), A(dt), A(f64), A(f64), A(f64), A(f64), b, b, b, b, i64)}
        for name, sig in sigs.items():
            if name == "rowsum" and dt == t.float32:
                continue
            c = compile_sm90(cuc.kernel(name, str(dt)).py_func, sig, work, f"{name}-{dt}", model=False)
            print(f"compiled {name:12s} {dt}: {c.registers} registers, {c.spills} spill bytes, {c.local_bytes} B stack")
            done += 1
    # the kernels compiled per size, in the variants the model rows leave out: float64, weighted
    from gdask.ml.kernels import _lloyd_cuda as lc
    from gdask.ml.kernels import _logreg_cuda as lr

    f32, f64t = t.float32, t.float64
    for dt, nbt in (("float64", f64t), ("float32", f32)):
        tpb = lc._threads(16, 32, 8 if dt == "float64" else 4)
        sig = (A(nbt, 2), A(f64), A(nbt), A(nbt), A(f64), f64, A(f64), A(f64), A(f64), A(f64), A(i64), A(i32))
        c = compile_sm90(cuc.kernel("lloyd-pass", dt, (32, 16, tpb, lc.SEG, True)).py_func, sig, work, f"lp-{dt}",
                         model=False)
        print(f"compiled lloyd-pass   {dt} weighted: {c.registers} registers, {c.spills} spill bytes")
        sig = (A(nbt, 2), A(i32), A(nbt), A(nbt), A(f64), A(f64), A(f64), A(f64))
        c = compile_sm90(cuc.kernel("logistic-binary", dt, (32, lr._threads(), lr.SEG, True, True)).py_func, sig,
                         work, f"lb-{dt}", model=False)
        print(f"compiled logistic-bin {dt} weighted: {c.registers} registers, {c.spills} spill bytes")
        done += 2
    return done


# -- measuring on a GPU (benchmarks/gpu_check.sh) -------------------------------------------------------
def _calls(n: int, d: int, ks: list[int]) -> list[tuple]:
    """(kernel, variant, k, bytes, flops, call) for each modelled kernel, on device data of ``n`` rows."""
    import _frozen_kmeans_cuda as fk
    import _frozen_logistic_cuda as fl
    import cupy
    import numpy as np

    from gdask.ml.kernels import _kmeans_cuda, _logistic_cuda

    rng = cupy.random.default_rng(0)
    X = rng.standard_normal((d, n), dtype=np.float32).T  # feature-major, as gdask's blocks
    y = (rng.random(n) < 0.5).astype(np.int32)
    coef, b = np.random.default_rng(1).standard_normal((1, d)) / d, np.zeros(1)
    out = []
    for k in ks:
        C = np.random.default_rng(k).standard_normal((k, d))
        out.append(("kmeans_pass", "lloyd-pass", k, 4 * d, 2 * k * d + d, lambda C=C: _kmeans_cuda.lloyd_partial(X, C)))
        out.append(("kmeans_pass", "lloyd-stats (frozen)", k, 4 * d, 2 * k * d + d,
                    lambda C=C: fk.lloyd_partial(X, C)))
    out.append(("logistic_grad", "logistic-binary", 1, 4 * d + 4, 4 * d,
                lambda: _logistic_cuda.loss_grad(X, y, coef, b)))
    out.append(("logistic_grad", "logistic (frozen)", 1, 4 * d + 4, 4 * d, lambda: fl.loss_grad(X, y, coef, b)))
    return out


def measure(n: int, d: int, ks: list[int], predicted: list[dict]) -> list[dict]:
    """Time each modelled kernel on the GPU (best of 3 after a warm-up, CUDA events around the block
    function, which includes adding the partials) and print the measured fraction of the roofline
    beside the predicted one."""
    import cupy
    import numba.cuda.dispatcher as nd

    if _REAL_DEVICE:
        nd.get_current_device = _REAL_DEVICE[0]
    rows = []
    for kernel, variant, k, bpr, fpr, call in _calls(n, d, ks):
        call()
        best = float("inf")
        for _ in range(3):
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            e0.record()
            call()
            e1.record()
            e1.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(e0, e1) / 1e3)
        attainable = max(n * bpr / HBM_BW, n * fpr / FP32_PEAK)
        pred = next((p for p in predicted if p.get("variant") == variant and p["shape"]["k"] == k), {})
        rows.append({"kernel": kernel, "variant": variant, "shape": {"n": n, "d": d, "k": k, "dtype": "float32"},
                     "measured_s": best, "measured_fraction": round(attainable / best, 4),
                     "predicted_s": pred.get("predicted_s"), "predicted_fraction": pred.get("predicted_fraction")})
        pf = pred.get("predicted_fraction")
        print(f"{kernel:14s} {variant:22s} k={k:3d}: measured {1e3 * best:8.2f} ms, {attainable / best:5.0%} of the "
              f"roofline; predicted {'n/a' if pf is None else f'{pf:.0%}'}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--rows", type=int, default=100_000_000)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--clusters", default="8,16")
    ap.add_argument("--all", action="store_true", help="also compile every other kernel for sm_90")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the issue's targets hold")
    ap.add_argument("--measure", action="store_true", help="on a GPU: also time the kernels (gpu_check.sh)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (gpu_check.sh --dry-run)")
    ap.add_argument("--predicted", help="with --measure: take the predictions from this --json output (the "
                    "committed benchmarks/gpu_static.json) instead of compiling (minutes)")
    a = ap.parse_args(argv)
    ks = [int(k) for k in a.clusters.split(",")]
    if a.dry_run:
        print(f"gpu_static: would compile for sm_90 and model K-means (k={ks}) and logistic passes at n={a.rows}, "
              f"d={a.features}{', then time them on the GPU' if a.measure else ''}")
        return 0
    if a.measure and a.predicted:
        meas = measure(a.rows, a.features, ks, json.loads(Path(a.predicted).read_text()))
        if a.json:
            Path(a.json).write_text(json.dumps({"measured": meas}, indent=1))
        return 0
    try:
        _tool("ptxas"), _tool("nvdisasm")
        _numba_cuda()
    except SystemExit as e:
        if not a.measure:
            raise
        print(f"{e}: measuring without predictions")
        out = []
    else:
        out = _model(a, ks)
    if a.measure:
        meas = measure(a.rows, a.features, ks, out)
        if a.json:
            Path(a.json).write_text(json.dumps({"predicted": out, "measured": meas}, indent=1))
        return 0
    return _report(a, out)


def _model(a: argparse.Namespace, ks: list[int]) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="gpu-static-"))
    todo = _kmeans_rows(a.rows, a.features, ks)
    todo += _logistic_rows(a.rows, a.features)
    out = []
    for i, (kernel, pyfunc, sig, spec, baseline) in enumerate(todo):
        c = compile_sm90(pyfunc, sig, work, f"k{i}")
        row = model_row(kernel, c, spec, baseline)
        if "shape_d" in spec:
            row["shape"]["d"] = spec["shape_d"]
        row["variant"] = spec["name"]
        out.append(row)
    return out


def _report(a: argparse.Namespace, out: list[dict]) -> int:
    work = Path(tempfile.mkdtemp(prefix="gpu-static-"))
    hdr = f"{'kernel':14s} {'variant':22s} {'n':>10s} {'d':>3s} {'k':>3s} {'regs':>4s} {'spill':>5s} " \
          f"{'local':>5s} {'smem':>6s} {'occ':>5s} {'sass/row':>8s} {'mem ms':>7s} {'issue ms':>8s} " \
          f"{'lsu ms':>7s} {'pred ms':>8s} frac"
    print(hdr)
    for r in out:
        s = r["shape"]
        print(f"{r['kernel']:14s} {r['variant']:22s} {s['n']:10d} {s['d']:3d} {s['k']:3d} {r['registers']:4d} "
              f"{r['spills']:5d} {r['local_bytes']:5d} {r['shared_bytes']:6d} {r['occupancy']:5.2f} "
              f"{r['sass_per_row']:8.0f} {1e3 * r['memory_s']:7.2f} {1e3 * r['issue_s']:8.2f} {1e3 * r['lsu_s']:7.2f} "
              f"{1e3 * r['predicted_s']:8.2f} {r['predicted_fraction']:.0%}")
    if a.all:
        print(f"compiled {compile_all(work)} more kernels for sm_90")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    bad = [f"{r['variant']} k={r['shape']['k']}: {why}" for r in out for why in _violations(r)]
    for b in bad:
        print("TARGET MISSED:", b)
    return 1 if a.check and bad else 0


def _violations(r: dict) -> list[str]:
    if r["baseline"] and r["kernel"] != "kmeans_pass":  # the issue bounds today's K-means kernel only
        return []
    if r["baseline"]:
        return [] if r["predicted_fraction"] <= BASELINE_MAX else [f"baseline predicts {r['predicted_fraction']:.0%}"]
    why = []
    if r["predicted_fraction"] < TARGET:
        why.append(f"predicts {r['predicted_fraction']:.0%} < {TARGET:.0%}")
    if r["spills"] or r["local_bytes"]:
        why.append(f"{r['spills']} spill bytes, {r['local_bytes']} B local memory")
    return why


if __name__ == "__main__":
    sys.exit(main())
