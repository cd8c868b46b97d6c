"""Reprs for Jupyter: GDataSet (block diagram, persisted state), IterateResult, LocalGPUCluster."""

import re

import dask
import numpy as np

import gdask
from gdask.gdataset import IterateResult
from gdask.gdataset._repr import _diagram, _persisted_state


def test_gdataset_repr_right_after_persist_shows_every_block_on_its_device(client):
    x = np.arange(24_000, dtype=np.float32).reshape(6_000, 4)
    X = gdask.from_array(x, block_rows=1_000)
    assert "not persisted" in X._repr_html_()
    P = X.persist()
    # no wait before: the repr waits for the blocks to land, at most gdask.timeouts.repr seconds (a
    # bound generous enough for a loaded machine here: blocks still computing are another test's case)
    with dask.config.set({"gdask.timeouts.repr": 120}):
        h = P._repr_html_()
    assert "persisted: all 6 blocks in cluster memory" in h and "6 on device" in h
    rects = re.findall(r'<rect x="[^"]+" y="0" width="[^"]+" height="22" fill="(#[0-9a-f]{6})"', h)
    assert len(rects) == 6 and len(set(rects)) == 2  # one rectangle per block, one colour per device
    legend = re.findall(r"device (\d+): (\d+) blocks, ([\d,]+) rows", h)
    assert sorted(d for d, _, _ in legend) == ["0", "1"]
    assert sum(int(b) for _, b, _ in legend) == 6 and sum(int(r.replace(",", "")) for _, _, r in legend) == 6_000
    assert "93.75 kiB" in h  # bytes per block (1,000 rows x 4 float32)


class _Fake:
    nblocks = 4
    row_blocks = (10, 10, 10, 5)
    shape = (35, 2)
    ndim = 2
    dtype = np.dtype("float64")


def test_diagram_marks_tiers_and_blocks_still_computing():
    where = {0: {"worker": "a", "name": "0", "tier": "device"}, 1: {"worker": "a", "name": "0", "tier": "host"},
             2: {"worker": "b", "name": "1", "tier": "disk"}, 3: {"worker": None, "name": None, "tier": "computing"}}
    svg = _diagram(_Fake(), where, {"a": "#111111", "b": "#222222"})
    assert svg.count('fill="url(#gd-hatch)"') == 2  # host and disk blocks hatched
    assert 'stroke-dasharray="2,2"' in svg  # the block still computing
    assert "block 1: 10 rows, 160 B on device 0, host tier" in svg
    assert _persisted_state(where, 4) == ("persisting: 3 of 4 blocks in cluster memory (1 on device, 1 on disk, "
                                          "1 on host), 1 computing")
    assert _persisted_state(None, 4).startswith("not persisted")


def test_iterate_result_repr_is_a_summary():
    hist = [{"iteration": i, "change": 1.0 / i, "submitted": 10, "executed": 4, "reused": 6, "seconds": 0.01,
             "active_blocks": 2} for i in range(1, 31)]
    r = IterateResult([np.zeros(4)] * 3, 30, True, hist)
    text = repr(r)
    assert text.startswith("IterateResult(converged after 30 iteration(s) in 0.3 s")
    assert "120 executed, 180 reused of 300 submitted (60%)" in text and "list of 3 x array(4,) float64" in text
    assert "'change'" not in text and len(text) < 300  # not the history
    h = r._repr_html_()
    assert h.count("<tr>") == 1 + 5 + 1 + 4  # header, 5 first iterations, "...", 4 last


def test_cluster_repr_shows_devices_and_the_gdask_page(client):
    cluster = client.cluster
    h = cluster._repr_html_()
    assert "gdask LocalGPUCluster</strong>: 2 emulated device(s)" in h
    assert "512.00 MiB" in h and h.count("<td>emulated</td>") == 4
    assert "/gdask" in h
