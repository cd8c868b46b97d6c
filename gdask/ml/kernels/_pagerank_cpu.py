"""PageRank on the host: numba kernels for the sweep order, the blocked transpose and the sweeps.

The graph comes as SciPy CSR ``A`` (row = source, ``A[s, t]`` = weight of ``s -> t``). The sweeps
need ``M = A.T`` (row = destination: a row's update gathers from its sources), renumbered by the
sweep order: :func:`transpose_renumber` builds it in one counting-sort pass over ``A`` (no SciPy
transpose and no permuted copy of ``A`` first). :func:`sweep_block` is one Gauss-Seidel sweep over
the rows of one block of ``M``, in place; it reads the values of the columns outside the block
from the previous sweep (``xprev``), those inside from the sweep itself, so a block's update does not
depend on which other blocks share its worker.

One block needs no transpose: :func:`push_sweep` runs the same Gauss-Seidel sweep over ``A`` itself,
row by row in the sweep order, each node pushing its new value to its destinations' accumulators
(``acc[t]`` sums what ``t`` receives from the nodes after it in the order during the last sweep and
from those before it during this one, reset when ``t`` is updated). On graphs whose links spread
over every node the scattered adds run as fast as the gathered ones, and the transpose, 3 to 10
sweeps' time on such graphs, is not made; on graphs where most links end in a few hubs the adds
queue on the hubs' accumulators and the gathers of :func:`sweep_block` win.

A node's link to itself is solved for in its own update, as Gauss-Seidel solves each row for its
unknown: the sweeps take the sorted nodes with such links (``loops``, found by :func:`self_links`) and
their weights (``loop_w``), and a node's new value is ``(d * s' + c) / (1 - d * w / out)`` with ``s'``
what it receives from the others. Read from the last sweep instead, such a link holds the node back
at ``damping``'s rate each sweep: a sink whose only link is to itself, holding most of the rank of a
graph whose links follow an order, took 30 sweeps against 6 without the link.

Index arrays are unsigned (``uint32``/``uint64`` views of SciPy's ``int32``/``int64`` ones): numba
then skips its negative-index wraparound on every gathered or scattered element, which halves the
time of a sweep (the sweep then runs at SciPy's SpMV speed).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["finish_sweep", "inverse_out_weights", "ones_except", "order_estimate", "order_share_keys",
           "order_shares", "push_init", "push_sweep", "received_weights", "scale_block", "self_links", "sort_by_key",
           "sweep_block", "sweep_folded", "transpose_fold", "transpose_renumber", "unsigned", "weight_kind"]


def unsigned(a: np.ndarray) -> np.ndarray:
    """An index array (non-negative) as its unsigned view, for the kernels."""
    return a.view(np.dtype(a.dtype.str.replace("i", "u")))


@njit(nogil=True, cache=True)
def order_shares(indptr, indices, data, inv):  # pragma: no cover - compiled
    """The inverse out-weight of every node into ``inv`` (0 for dangling nodes), and the transition
    weight on links to lower-numbered nodes, to higher-numbered ones, and in all."""
    n = indptr.shape[0] - 1
    down = 0.0
    up = 0.0
    for s in range(n):
        o = 0.0
        for k in range(indptr[s], indptr[s + 1]):
            o += data[k]
        w0 = 1.0 / o if o > 0 else 0.0
        inv[s] = w0
        for k in range(indptr[s], indptr[s + 1]):
            t = np.int64(indices[k])
            w = data[k] * w0
            if t < s:
                down += w
            elif t > s:
                up += w
    return down, up, down + up


@njit(nogil=True, cache=True)
def received_weights(indptr, indices, data, inv, received):  # pragma: no cover - compiled
    """``received[t]`` = the transition weight into node ``t`` (one step of uniform rank)."""
    n = indptr.shape[0] - 1
    received[:] = 0.0
    for s in range(n):
        w0 = inv[s]
        for k in range(indptr[s], indptr[s + 1]):
            received[np.uint64(indices[k])] += data[k] * w0


@njit(nogil=True, cache=True)
def sort_by_key(keys, descending_ties):  # pragma: no cover - compiled
    """The node indices ordered by ``keys`` (uint32, ascending), equal keys by index (ascending, or
    descending with ``descending_ties``): a stable LSD radix sort, three passes of 11 bits (NumPy's
    sort of the 64-bit key-and-index pairs took 50 ms for 1M nodes, this 6)."""
    n = keys.shape[0]
    a = np.empty(n, np.uint32)
    b = np.empty(n, np.uint32)
    for i in range(n):
        a[i] = n - 1 - i if descending_ties else i
    counts = np.empty(2048, np.int64)
    for shift in (0, 11, 22):
        counts[:] = 0
        for i in range(n):
            counts[(keys[a[i]] >> np.uint32(shift)) & np.uint32(2047)] += 1
        total = 0
        for d in range(2048):
            c = counts[d]
            counts[d] = total
            total += c
        for i in range(n):
            v = a[i]
            d = (keys[v] >> np.uint32(shift)) & np.uint32(2047)
            b[counts[d]] = v
            counts[d] += 1
        a, b = b, a
    return a


@njit(nogil=True, cache=True)
def order_share_keys(indptr, indices, data, inv, keys, descending_ties, sample_bits):  # pragma: no cover - compiled
    """Transition weight on links ``s -> t`` forward in the order of :func:`sort_by_key` (``keys[s] <
    keys[t]``, equal keys by index), and on every link but self-loops: ``(forward, total)``, without
    sorting. With ``sample_bits`` > 0, over the sources a multiplicative hash of the index picks (one
    in ``2 ** sample_bits``, the same every call)."""
    n = indptr.shape[0] - 1
    fwd = 0.0
    tot = 0.0
    mult = np.uint64(2654435761)
    mask = np.uint64(0xFFFFFFFF)
    drop = np.uint64(32 - sample_bits)
    for s in range(n):
        if sample_bits > 0 and ((np.uint64(s) * mult) & mask) >> drop != 0:
            continue
        w0 = inv[s]
        ks = keys[s]
        for k in range(indptr[s], indptr[s + 1]):
            t = np.int64(indices[k])
            if t == s:
                continue
            w = data[k] * w0
            tot += w
            kt = keys[t]
            if ks < kt or (ks == kt and ((t < s) if descending_ties else (s < t))):
                fwd += w
    return fwd, tot


@njit(nogil=True, cache=True)
def order_estimate(indptr, indices, data, sample_bits, received):  # pragma: no cover - compiled
    """Estimates of the share of the transition weight on links to lower-numbered nodes, to
    higher-numbered ones, and on the forward links of the in-degree order, from two disjoint samples
    of the sources, each one in ``2 ** sample_bits`` runs of 1024 consecutive sources (a
    multiplicative hash of the run's index picks, the same every call; runs, not single sources, so
    that the sample's links are read in order: 100 -> 25 ms on 20M links): the first gives the links'
    directions and the nodes' received weight, the second is scored by that received weight, which
    its own links took no part in (scored by keys its links made, a sample scores its forward share
    far too high: 0.9 against 0.64 on random links). The keys are noisy (an eighth of each node's
    links): the in-degree share differs from the one with whole keys by up to ~0.15 either way (0.60
    against 0.72 on a preferential-attachment graph, 0.86 against under 0.73 on an R-MAT one); the
    node order's shares are close (within 0.01 on every graph measured). ``received`` (n floats) is
    scratch."""
    n = indptr.shape[0] - 1
    mult = np.uint64(2654435761)
    mask = np.uint64(0xFFFFFFFF)
    drop = np.uint64(32 - sample_bits)
    run = 1024
    received[:] = 0.0
    down = 0.0
    up = 0.0
    fwd = 0.0
    tot = 0.0
    for second in (False, True):
        for b in range((n + run - 1) // run):
            if ((np.uint64(b) * mult) & mask) >> drop != (1 if second else 0):
                continue
            for s in range(b * run, min(n, (b + 1) * run)):
                o = 0.0
                for k in range(indptr[s], indptr[s + 1]):
                    o += data[k]
                if o <= 0:
                    continue
                w0 = 1.0 / o
                ks = received[s]
                for k in range(indptr[s], indptr[s + 1]):
                    t = np.int64(indices[k])
                    w = data[k] * w0
                    if not second:
                        received[t] += w
                        if t < s:
                            down += w
                        elif t > s:
                            up += w
                    elif t != s:
                        tot += w
                        kt = received[t]
                        if ks < kt or (ks == kt and s < t):
                            fwd += w
    links = down + up
    return (down / links if links > 0 else 0.0, up / links if links > 0 else 0.0, fwd / tot if tot > 0 else 0.0)


@njit(nogil=True, cache=True)
def transpose_renumber(indptr, indices, data, pos, out_ptr, out_idx, out_val, stop):  # pragma: no cover - compiled
    """``M = (P A P^T).T`` as CSR into ``out_ptr`` (n + 1), ``out_idx`` and ``out_val`` (nnz, or
    length 0: no weights written), where ``P`` moves node ``s`` to ``pos[s]`` (``pos`` of length 0:
    no renumbering). Within a row the sources keep their order in ``A``. ``stop[0]`` set by another
    thread (a transpose nobody will use) ends it early: returns False then (the output is partial),
    else True."""
    n = indptr.shape[0] - 1
    nnz = indptr[n]
    renum = pos.shape[0] > 0
    weighted = out_val.shape[0] > 0
    counts = out_ptr
    counts[:] = 0
    one = np.uint64(1)
    for k in range(nnz):
        if k & 0xFFFFF == 0 and stop[0]:
            return False
        t = np.uint64(indices[k])
        counts[(np.uint64(pos[t]) if renum else t) + one] += 1
    for r in range(n):
        counts[r + 1] += counts[r]
    for s in range(n):
        if s & 0xFFFF == 0 and stop[0]:
            return False
        ps = np.uint64(pos[s]) if renum else np.uint64(s)
        for k in range(indptr[s], indptr[s + 1]):
            t = np.uint64(indices[k])
            r = np.uint64(pos[t]) if renum else t
            q = np.uint64(counts[r])
            out_idx[q] = ps
            if weighted:
                out_val[q] = data[k]
            counts[r] = q + one
    for r in range(n, 0, -1):  # counts[r] ran to the end of row r: shift back to the starts
        counts[r] = counts[r - 1]
    counts[0] = 0
    return True


@njit(nogil=True, cache=True)
def self_links(indptr, indices, lo):  # pragma: no cover - compiled
    """The positions (ascending) of the links of a CSR block from row ``i`` to column ``lo + i``: a node's
    links to itself (``lo``: the block's first row, columns global; unsigned indices)."""
    n = indptr.shape[0] - 1
    count = 0
    for i in range(n):
        r = np.uint64(lo + i)
        for k in range(np.uint64(indptr[i]), np.uint64(indptr[i + 1])):
            if np.uint64(indices[k]) == r:
                count += 1
    out = np.empty(count, np.int64)
    if count == 0:
        return out
    count = 0
    for i in range(n):
        r = np.uint64(lo + i)
        for k in range(np.uint64(indptr[i]), np.uint64(indptr[i + 1])):
            if np.uint64(indices[k]) == r:
                out[count] = k
                count += 1
    return out


@njit(inline="always")
def _own_link(v, w, xr, invr, damping):  # pragma: no cover - compiled
    """A node's value ``v = d * s + c0``, whose sum ``s`` read its link to itself (weight ``w``) at its
    old value ``xr = inv * y``, as the solution of its own equation: ``(d * s' + c0) / (1 - d * w * inv)``."""
    return (v - damping * w * xr) / (1.0 - damping * w * invr)


@njit(inline="always")
def _next_own(loops, c, none):  # pragma: no cover - compiled
    """``loops[c]``, or ``none`` past either end: one compare a row in the sweeps' loops."""
    return loops[c] if 0 <= c < loops.shape[0] else none


@njit(nogil=True, cache=True)
def sweep_block(indptr, indices, values, lo, x, xprev, inv, y, damping, teleport, descending,
                alone, loops, loop_w):  # pragma: no cover - compiled
    """One Gauss-Seidel sweep of ``y = damping * M @ x + teleport`` (``x = inv * y``) over the rows
    ``lo .. lo + nrows`` of ``M`` (this block's CSR, rows local, columns global, unsigned indices), in
    place on ``y`` and ``x``. Columns inside the block read ``x`` (this sweep's values), the others
    ``xprev`` (the previous sweep's); ``alone``: no other block of ``x`` changes during the sweep
    (``x`` and ``xprev`` agree outside the block), so every column reads ``x``. ``values`` of length
    0: every weight is 1. ``loops``: the block's rows (local, ascending) with a link to themselves,
    ``loop_w`` those links' weights (see the module). Returns the L1 change of the block's ``y``, the
    sum of its new values and that of its dangling nodes' (``inv == 0``)."""
    nrows = indptr.shape[0] - 1
    ulo = np.uint64(lo)
    span = np.uint64(nrows)
    weighted = values.shape[0] > 0
    change = 0.0
    total = 0.0
    dangling = 0.0
    step = -1 if descending else 1
    cl = loops.shape[0] - 1 if descending else 0  # the next row with a link to itself, in the sweep's direction
    nxt = _next_own(loops, cl, nrows)
    for t in range(nrows):
        i = nrows - 1 - t if descending else t
        a = np.uint64(indptr[i])
        z = np.uint64(indptr[i + 1])
        s = 0.0
        if alone and not weighted:
            for k in range(a, z):
                s += x[np.uint64(indices[k])]
        elif alone:
            for k in range(a, z):
                s += values[k] * x[np.uint64(indices[k])]
        else:
            for k in range(a, z):
                c = np.uint64(indices[k])
                v = x[c] if c - ulo < span else xprev[c]  # unsigned: one compare for lo <= c < hi
                s += values[k] * v if weighted else v
        r = lo + i
        v = damping * s + teleport
        if i == nxt:
            v = _own_link(v, loop_w[cl], x[r], inv[r], damping)
            cl += step
            nxt = _next_own(loops, cl, nrows)
        change += abs(v - y[r])
        total += v
        y[r] = v
        w0 = inv[r]
        if w0 == 0.0:
            dangling += v
        x[r] = w0 * v
    return change, total, dangling


@njit(nogil=True, cache=True)
def transpose_fold(indptr, indices, data, pos, inv, out_ptr, out_idx, out_val, pre, own,
                   rows):  # pragma: no cover - compiled
    """:func:`transpose_renumber` (``pos`` a renumbering) with the links of the nodes that receive
    none and come first in the new numbering (the first ``p``) left out of ``M``: each row's sum
    ``pre[r] = sum of w * inv[c]`` over them instead (``inv`` renumbered; each such node's value in a
    sweep is the sweep's constant term, the same for all: :func:`sweep_folded`). Returns ``p``, the
    number of links left in ``M`` and that of the links from a node to itself, whose positions in ``A``
    (ascending) go to ``own`` as far as it holds them. ``pre[r]`` adds its terms in the order of
    ``M``'s row (the sources' order in ``A``), and the rows keep their other links in that order.

    Those nodes' links go to ``pre`` as ``A`` is read, not through the transpose's scattered writes
    and a pass over ``M`` after it: on a graph whose links end in a few thousand hubs they are ~80%
    of the links (1M nodes, 4.2M links: 181 + 51 ms for the transpose and that pass, measured on a
    worker). The row counts of the links left come from the counts of all links less those of the
    first ``p`` nodes' links, or from counting the links left, whichever reads fewer links.

    ``rows`` (one per link, scratch) takes each link's renumbered destination in the first pass, so
    the later passes read it in order instead of looking ``pos`` up at random again; the row counts
    are kept in ``out_ptr`` itself, whose type (4 bytes when the links fit) halves their cache lines
    (6.4M links into 1M nodes: 0.75 -> 0.25 s with both)."""
    n = indptr.shape[0] - 1
    nnz = indptr[n]
    weighted = out_val.shape[0] > 0
    counts = out_ptr
    counts[:] = 0
    one = np.uint64(1)
    for k in range(nnz):
        r = pos[np.uint64(indices[k])]
        rows[k] = r
        counts[np.uint64(r) + one] += 1
    p = 0
    while p < n and counts[p + 1] == 0:
        p += 1
    up = np.uint64(p)
    folded = 0
    for s in range(n):
        if np.uint64(pos[s]) < up:
            folded += indptr[s + 1] - indptr[s]
    if 2 * folded <= nnz:  # the counts less the first p nodes' links
        for s in range(n):
            if np.uint64(pos[s]) < up:
                for k in range(indptr[s], indptr[s + 1]):
                    counts[np.uint64(rows[k]) + one] -= 1
    else:  # the links left, counted
        counts[:] = 0
        for s in range(n):
            if np.uint64(pos[s]) >= up:
                for k in range(indptr[s], indptr[s + 1]):
                    counts[np.uint64(rows[k]) + one] += 1
    for r in range(n):
        counts[r + 1] += counts[r]
    nown = 0
    for s in range(n):
        ps = np.uint64(pos[s])
        if ps < up:
            c = inv[ps]
            for k in range(indptr[s], indptr[s + 1]):
                r = np.uint64(rows[k])
                pre[r] += data[k] * c if weighted else c
        else:
            for k in range(indptr[s], indptr[s + 1]):
                r = np.uint64(rows[k])
                q = np.uint64(counts[r])
                out_idx[q] = ps
                if weighted:
                    out_val[q] = data[k]
                counts[r] = q + one
                if r == ps:
                    if nown < own.shape[0]:
                        own[nown] = k
                    nown += 1
    for r in range(n, 0, -1):  # counts[r] ran to the end of row r: shift back to the starts
        counts[r] = counts[r - 1]
    counts[0] = 0
    return p, nnz - folded, nown


@njit(nogil=True, cache=True)
def sweep_folded(indptr, indices, values, pre, p, p_dangling, x, inv, y, damping, teleport,
                 prev, loops, loop_w):  # pragma: no cover - compiled
    """One Gauss-Seidel sweep of ``y = damping * M @ x + teleport`` (``x = inv * y``) over all of
    ``M``, ascending, as :func:`sweep_block` alone, when :func:`transpose_fold` took the links of the
    first ``p`` nodes (no links in: each is ``teleport`` after the sweep, ``prev`` before it; of them
    ``p_dangling`` have no links out) out of ``M``: each row adds ``teleport * pre[r]`` for them, and
    their rows are not visited (their ``y`` and ``x`` are not written). ``loops``/``loop_w``: the
    rows (ascending) with a link to themselves and its weight (see the module). Returns the L1 change
    of ``y``, the sum of its new values and that of the dangling nodes'."""
    n = indptr.shape[0] - 1
    weighted = values.shape[0] > 0
    change = p * abs(teleport - prev)
    total = p * teleport
    dangling = p_dangling * teleport
    c = 0
    while c < loops.shape[0] and loops[c] < p:
        c += 1
    nxt = _next_own(loops, c, n)
    for r in range(p, n):
        s = teleport * pre[r]
        if weighted:
            for k in range(np.uint64(indptr[r]), np.uint64(indptr[r + 1])):
                s += values[k] * x[np.uint64(indices[k])]
        else:
            for k in range(np.uint64(indptr[r]), np.uint64(indptr[r + 1])):
                s += x[np.uint64(indices[k])]
        v = damping * s + teleport
        if r == nxt:
            v = _own_link(v, loop_w[c], x[r], inv[r], damping)
            c += 1
            nxt = _next_own(loops, c, n)
        change += abs(v - y[r])
        total += v
        y[r] = v
        w0 = inv[r]
        if w0 == 0.0:
            dangling += v
        x[r] = w0 * v
    return change, total, dangling


@njit(nogil=True, cache=True)
def scale_block(y, inv, x, xprev, lo, hi):  # pragma: no cover - compiled
    """``x = xprev = inv * y`` over ``lo .. hi`` (values received from another rank)."""
    for r in range(lo, hi):
        v = inv[r] * y[r]
        x[r] = v
        xprev[r] = v


@njit(nogil=True, cache=True)
def finish_sweep(y, yprev, x, xprev, inv, total, prev_total, scale):  # pragma: no cover - compiled
    """After a sweep, in one pass: the L1 change of the ranks ``y / total`` from ``yprev / prev_total``
    and ``yprev = y``; with ``scale``, ``y`` divided by ``total`` (a sum of 1), ``x = inv * y`` and
    ``xprev = x`` (``xprev`` may be ``x``). Returns the change and the sum of the dangling nodes'
    (``inv == 0``) ``y`` as it is now."""
    a = 1.0 / total
    b = 1.0 / prev_total
    change = 0.0
    dangling = 0.0
    for r in range(y.shape[0]):
        v = y[r]
        change += abs(v * a - yprev[r] * b)
        yprev[r] = v
        if scale:
            v *= a
            y[r] = v
            w = inv[r] * v
            x[r] = w
            xprev[r] = w
        if inv[r] == 0.0:
            dangling += v
    return change, dangling


@njit(nogil=True, cache=True)
def weight_kind(data):  # pragma: no cover - compiled
    """The narrowest type that holds every weight exactly: 0 for integers 0 to 255 (uint8), 1 for
    float32, 2 for float64 (it stops at the first weight that needs float64)."""
    small = True
    single = True
    for k in range(data.shape[0]):
        v = data[k]
        if small and not (0.0 <= v <= 255.0 and v == np.floor(v)):
            small = False
        if single and np.float64(np.float32(v)) != v:
            single = False
        if not small and not single:
            return 2
    return 0 if small else 1


@njit(nogil=True, cache=True)
def inverse_out_weights(indptr, values, inv):  # pragma: no cover - compiled
    """Into ``inv`` the inverse out-weight of every node of ``A`` (0 for dangling nodes)."""
    weighted = values.shape[0] > 0
    for s in range(indptr.shape[0] - 1):
        a = np.uint64(indptr[s])
        z = np.uint64(indptr[s + 1])
        o = 0.0
        if weighted:
            for k in range(a, z):
                o += values[k]
        else:
            o = float(z - a)
        inv[s] = 1.0 / o if o > 0 else 0.0


@njit(nogil=True, cache=True)
def ones_except(data, limit):  # pragma: no cover - compiled
    """The positions of the weights in ``data`` other than 1, ascending, if there are at most
    ``limit`` of them (else None): the links that :func:`push_sweep` corrects when the others all
    weigh 1 (duplicate links summed by SciPy leave a few weights of 2 among millions of 1)."""
    out = np.empty(limit, np.int64)
    m = 0
    for k in range(data.shape[0]):
        if data[k] != 1.0:
            if m == limit:
                return None
            out[m] = k
            m += 1
    return out[:m].copy()


@njit(nogil=True, cache=True)
def push_init(indptr, indices, values, extra, extra_w, descending, y, inv, acc, own):  # pragma: no cover - compiled
    """Into ``inv`` the inverse out-weight of every node (0 for dangling nodes), and into ``acc``
    what each node ``t`` receives from ``x = inv * y`` of the nodes swept after it, or itself: the
    accumulators as they stand before ``t``'s first update in :func:`push_sweep` (node order,
    descending with ``descending``). The weights as in :func:`push_sweep`. Returns the sum of the
    dangling nodes' ``y`` and the number of links from a node to itself, whose positions (ascending)
    go to ``own`` as far as it holds them."""
    n = indptr.shape[0] - 1
    weighted = values.shape[0] > 0
    acc[:] = 0.0
    dangling = 0.0
    nown = 0
    c = 0
    for s in range(n):
        a = np.uint64(indptr[s])
        z = np.uint64(indptr[s + 1])
        o = 0.0
        if weighted:
            for k in range(a, z):
                o += values[k]
        else:
            o = float(z - a)
            e = c
            while e < extra.shape[0] and np.uint64(extra[e]) < z:
                o += extra_w[e] - 1.0
                e += 1
        w0 = 1.0 / o if o > 0 else 0.0
        inv[s] = w0
        if w0 == 0.0:
            dangling += y[s]
        xs = w0 * y[s]
        for k in range(a, z):
            t = np.uint64(indices[k])
            if (t >= np.uint64(s)) if descending else (t <= np.uint64(s)):
                acc[t] += values[k] * xs if weighted else xs
                if t == np.uint64(s):
                    if nown < own.shape[0]:
                        own[nown] = k
                    nown += 1
        while c < extra.shape[0] and np.uint64(extra[c]) < z:
            t = np.uint64(indices[np.uint64(extra[c])])
            if (t >= np.uint64(s)) if descending else (t <= np.uint64(s)):
                acc[t] += (extra_w[c] - 1.0) * xs
            c += 1
    return dangling, nown


@njit(nogil=True, cache=True)
def push_sweep(indptr, indices, values, extra, extra_w, descending, inv, acc, y, damping,
               teleport, loops, loop_w):  # pragma: no cover - compiled
    """One Gauss-Seidel sweep of ``y = damping * A.T @ (inv * y) + teleport`` over ``A`` (CSR, row =
    source, unsigned indices), in place on ``y`` and the accumulators ``acc`` (see :func:`push_init`),
    in node order (descending with ``descending``). The weights: ``values``, or (``values`` of length
    0) 1 but at the ascending positions ``extra`` of the links, which weigh ``extra_w`` (each such
    link's add corrected after its node's links: ``(w - 1) * x``). ``loops``/``loop_w``: the nodes
    (ascending) with a link to themselves and its weight (see the module; ``acc`` holds that link's
    add from the node's last value). Returns the L1 change of ``y``, the sum of its new values and
    that of the dangling nodes' (``inv == 0``)."""
    n = indptr.shape[0] - 1
    weighted = values.shape[0] > 0
    ne = extra.shape[0]
    c = ne - 1 if descending else 0  # the next correction: the nodes come in the order of the positions
    step = -1 if descending else 1
    cl = loops.shape[0] - 1 if descending else 0
    nxt = np.uint64(_next_own(loops, cl, n))
    change = 0.0
    total = 0.0
    dangling = 0.0
    for i in range(n):
        j = np.uint64(n - 1 - i if descending else i)
        v = damping * acc[j] + teleport
        if j == nxt:
            v = _own_link(v, loop_w[cl], inv[j] * y[j], inv[j], damping)
            cl += step
            nxt = np.uint64(_next_own(loops, cl, n))
        acc[j] = 0.0
        change += abs(v - y[j])
        total += v
        y[j] = v
        w0 = inv[j]
        if w0 == 0.0:
            dangling += v
        xj = w0 * v
        a = np.uint64(indptr[j])
        z = np.uint64(indptr[j + 1])
        if weighted:
            for k in range(a, z):
                acc[np.uint64(indices[k])] += values[k] * xj
        else:
            for k in range(a, z):
                acc[np.uint64(indices[k])] += xj
        if descending:
            while c >= 0 and np.uint64(extra[c]) >= a:
                acc[np.uint64(indices[np.uint64(extra[c])])] += (extra_w[c] - 1.0) * xj
                c -= 1
        else:
            while c < ne and np.uint64(extra[c]) < z:
                acc[np.uint64(indices[np.uint64(extra[c])])] += (extra_w[c] - 1.0) * xj
                c += 1
    return change, total, dangling
