"""Mapping blocks to devices in proportion to device throughput (a pure policy, no I/O)."""

from __future__ import annotations

from typing import Sequence


def proportional_mapping(block_sizes: Sequence[float], speeds: Sequence[float]) -> list[int]:
    """Assign blocks to devices so each device's work is proportional to its speed.

    Greedy: blocks in decreasing size go to the device whose finish time (assigned work / speed)
    would be earliest; ties keep block order so the mapping is deterministic.

    Parameters
    ----------
    block_sizes : sequence of float
        Work per block (rows, bytes or seconds: any unit, the same for all).
    speeds : sequence of float
        Relative throughput per device (> 0).

    Returns
    -------
    list of int
        Device index per block.
    """
    if not speeds:
        raise ValueError("proportional_mapping needs at least one device")
    if any(s <= 0 for s in speeds):
        raise ValueError(f"device speeds must be > 0, got {list(speeds)}")
    load = [0.0] * len(speeds)
    out = [0] * len(block_sizes)
    order = sorted(range(len(block_sizes)), key=lambda i: (-block_sizes[i], i))
    for i in order:
        d = min(range(len(speeds)), key=lambda j: ((load[j] + block_sizes[i]) / speeds[j], j))
        load[d] += block_sizes[i]
        out[i] = d
    return out
