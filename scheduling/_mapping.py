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


def makespan(block_work: Sequence[float], mapping: Sequence[int], speeds: Sequence[float]) -> float:
    """Finish time of the slowest device: ``max_d sum(work of d's blocks) / speed_d``."""
    load = [0.0] * len(speeds)
    for w, d in zip(block_work, mapping):
        load[d] += w
    return max((load[d] / speeds[d] for d in range(len(speeds))), default=0.0)


def rebalance_plan(block_work: Sequence[float], current: Sequence[int], speeds: Sequence[float], *,
                   move_cost: Sequence[float] | float = 0.0, horizon: float = 5.0,
                   min_gain: float = 0.05) -> list[int] | None:
    """A new block-to-device mapping when moving blocks pays for itself, else ``None``.

    Blocks keep their device (affinity) unless moving them shortens the predicted makespan of one
    iteration. Greedy: the most loaded device gives one block at a time to the device where it
    would finish earliest, while that lowers the makespan. The plan is returned only if the
    relative gain is at least ``min_gain`` (the speeds drifted far enough) and the time saved over
    ``horizon`` iterations exceeds the time to move the blocks (moves run in parallel; a device's
    cost is the sum of what it sends and receives).

    Parameters
    ----------
    block_work : sequence of float
        Work per block per iteration in seconds at speed 1.
    current : sequence of int
        Device index of each block now.
    speeds : sequence of float
        Relative throughput per device (> 0), e.g. measured.
    move_cost : float or sequence of float
        Seconds to move each block (one value for all, or one per block).
    horizon : float
        Iterations over which a move must pay back.
    min_gain : float
        Minimum relative makespan reduction worth acting on.

    Returns
    -------
    list of int or None

    Examples
    --------
    >>> rebalance_plan([1.0] * 8, [0, 0, 0, 0, 1, 1, 1, 1], [1.0, 0.25])
    [0, 0, 0, 0, 0, 0, 0, 1]
    >>> rebalance_plan([1.0] * 8, [0] * 7 + [1], [1.0, 0.25]) is None
    True
    """
    costs = _checked_costs(block_work, current, speeds, move_cost)
    plan = list(current)
    load = _loads(block_work, plan, len(speeds))
    before = _span(load, speeds)
    for _ in range(len(block_work) * len(speeds)):
        move = _best_move(block_work, plan, load, speeds, costs)
        if move is None:
            break
        i, t = move
        load[plan[i]] -= block_work[i]
        load[t] += block_work[i]
        plan[i] = t
    gain = before - _span(load, speeds)
    if gain <= 0 or gain < min_gain * before:
        return None
    if horizon * gain <= max(_traffic(plan, current, costs, len(speeds))):
        return None
    return plan


def _checked_costs(block_work: Sequence[float], current: Sequence[int], speeds: Sequence[float],
                   move_cost: Sequence[float] | float) -> list[float]:
    """The per-block move costs, after checking :func:`rebalance_plan`'s arguments agree."""
    n, m = len(block_work), len(speeds)
    if len(current) != n:
        raise ValueError(f"current has {len(current)} entries for {n} blocks")
    if not speeds or any(not s > 0 for s in speeds):
        raise ValueError(f"device speeds must be > 0, got {list(speeds)}")
    if any(not 0 <= d < m for d in current):
        raise ValueError(f"current maps blocks to devices outside 0..{m - 1}: {sorted(set(current))}")
    costs = [float(move_cost)] * n if isinstance(move_cost, (int, float)) else [float(c) for c in move_cost]
    if len(costs) != n:
        raise ValueError(f"move_cost has {len(costs)} entries for {n} blocks")
    return costs


def _loads(block_work: Sequence[float], plan: Sequence[int], m: int) -> list[float]:
    load = [0.0] * m
    for w, d in zip(block_work, plan):
        load[d] += w
    return load


def _span(load: Sequence[float], speeds: Sequence[float]) -> float:
    return max((load[d] / speeds[d] for d in range(len(speeds))), default=0.0)


def _best_move(block_work: Sequence[float], plan: Sequence[int], load: Sequence[float], speeds: Sequence[float],
               costs: Sequence[float]) -> tuple[int, int] | None:
    """``(block, target device)``: the most loaded device's block whose move lowers the makespan
    most (cheapest move first among equals), or None when no move does."""
    m = len(speeds)
    src = max(range(m), key=lambda d: (load[d] / speeds[d], -d))
    span = load[src] / speeds[src]
    best = None
    seen: set[tuple[float, float]] = set()
    for i in (i for i in range(len(plan)) if plan[i] == src):
        w = block_work[i]
        if (w, costs[i]) in seen:  # equal blocks are equal candidates: O(m) per step for them
            continue
        seen.add((w, costs[i]))
        for t in range(m):
            if t == src:
                continue
            new = max((load[src] - w) / speeds[src], (load[t] + w) / speeds[t])
            if new < span - 1e-12 and (best is None or (new, costs[i], i, t) < best):
                best = (new, costs[i], i, t)
    return None if best is None else (best[2], best[3])


def _traffic(plan: Sequence[int], current: Sequence[int], costs: Sequence[float], m: int) -> list[float]:
    """Seconds each device spends sending and receiving the moved blocks."""
    traffic = [0.0] * m
    for i, (new, old) in enumerate(zip(plan, current)):
        if new != old:
            traffic[new] += costs[i]
            traffic[old] += costs[i]
    return traffic
