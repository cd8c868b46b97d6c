"""Device topology: how well two devices are linked, and the best group of devices for one job.

Pure objects: a link table in (from config on emulated devices, from NVML details on CUDA, or
from the text ``nvidia-smi topo -m`` prints), decisions out. NVML itself is read only by
:mod:`gdask._devices._nvml`; :meth:`Topology.from_nvml` parses what its ``details()`` returns and
:meth:`Topology.from_nvidia_smi` what :func:`parse_nvidia_smi_topo` reads.
"""

from __future__ import annotations

import itertools
import math
import re
import warnings
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

from gdask import GDaskWarning

__all__ = ["LINK_KINDS", "Topology", "link_rank", "parse_nvidia_smi_topo"]

#: Link kinds from best to worst. ``same-device``: two logical devices on one physical GPU.
LINK_KINDS = ("same-device", "nvlink", "pcie-switch", "pcie-host", "socket", "network")

_RANK = {k: len(LINK_KINDS) - i for i, k in enumerate(LINK_KINDS)}  # same-device 6 ... network 1

# NVML / ``nvidia-smi topo -m`` names and short aliases. Every NVML topology level has one:
# INTERNAL (0, two GPUs on one board, joined by the board's PCIe switch), PIX (10), PXB (20),
# PHB (30), NODE (40), SYS (50); SOC is what drivers before NODE existed printed for SYS;
# "sys-internal" is how earlier gdask versions reported INTERNAL.
_ALIASES = {
    "self": "same-device", "same": "same-device", "x": "same-device",
    "nv": "nvlink",
    "internal": "pcie-switch", "sys-internal": "pcie-switch",
    "pix": "pcie-switch", "pxb": "pcie-switch", "switch": "pcie-switch",
    "phb": "pcie-host", "node": "pcie-host", "host-bridge": "pcie-host",
    "sys": "socket", "soc": "socket", "cross-socket": "socket", "numa": "socket",
    "net": "network", "host": "network", "hosts": "network",
}


def _kind(kind: str) -> str:
    if not isinstance(kind, str):
        raise TypeError(f"a link kind must be a string such as 'nvlink', got {kind!r}")
    k = kind.strip().lower()
    if re.fullmatch(r"nv\d+", k) or k.startswith("nvlink"):
        return "nvlink"
    k = _ALIASES.get(k, k)
    if k not in _RANK:
        raise ValueError(f"unknown link kind {kind!r}: use one of {', '.join(LINK_KINDS)} "
                         "(or an NVML name: NV<n>, PIX, PXB, PHB, NODE, SYS)")
    return k


def link_rank(kind: str) -> int:
    """Rank of a link kind, higher is better: same-device > nvlink > pcie-switch > pcie-host >
    socket (across CPU sockets) > network (across hosts).

    Raises
    ------
    ValueError
        For an unknown kind (the message lists the known ones).

    Examples
    --------
    >>> link_rank("nvlink") > link_rank("PIX") > link_rank("SYS") > link_rank("network")
    True
    """
    return _RANK[_kind(kind)]


class Topology:
    """Links between devices.

    Parameters
    ----------
    links : mapping
        ``{(a, b): kind}`` (symmetric: ``(b, a)`` need not be given) or, as in YAML config,
        ``{a: {b: kind}}``. Kinds are those of :func:`link_rank`.
    default : str
        Kind of a link not listed (``"network"``: assume the worst).

    Examples
    --------
    >>> t = Topology({(0, 1): "nvlink", (0, 2): "pcie-switch", (1, 2): "socket"})
    >>> t.link(1, 0), t.link(2, 2)
    ('nvlink', 'same-device')
    >>> t.best_group([0, 1, 2], 2)
    (0, 1)
    """

    def __init__(self, links: Mapping[Any, Any] | None = None, default: str = "network") -> None:
        self.default = _kind(default)
        self._links: dict[frozenset, str] = {}
        for key, value in (links or {}).items():
            if isinstance(value, Mapping):  # nested {a: {b: kind}}
                for other, kind in value.items():
                    self.set_link(key, other, kind)
            elif isinstance(key, tuple) and len(key) == 2:
                self.set_link(key[0], key[1], value)
            else:
                raise ValueError(f"Topology links must be {{(a, b): kind}} or {{a: {{b: kind}}}}, got entry "
                                 f"{key!r}: {value!r}")

    def set_link(self, a: Hashable, b: Hashable, kind: str) -> None:
        """Record the link between devices ``a`` and ``b`` (both directions)."""
        if a == b:
            raise ValueError(f"a link needs two different devices, got {a!r} twice")
        self._links[frozenset((a, b))] = _kind(kind)

    @classmethod
    def from_nvml(cls, details: Mapping[int, Mapping[str, Any]],
                  devices: Mapping[Hashable, int] | None = None,
                  hosts: Mapping[Hashable, str] | None = None, default: str = "network") -> Topology:
        """Build from NVML details per physical GPU index, as returned by
        ``gdask._devices._nvml.details(index)`` (``{"topology": "GPU1:NV18,GPU2:SYS", ...}``).

        Parameters
        ----------
        details : mapping
            ``{physical index: details dict}``; entries without ``"topology"`` add no links.
        devices : mapping, optional
            ``{device name (e.g. worker address): physical index}``. Several logical devices on
            one GPU are linked ``"same-device"``. Default: the physical indices themselves.
        hosts : mapping, optional
            ``{device name: host}``: devices on different hosts are linked ``"network"``.
        default : str
            Kind of links that NVML did not report.

        Raises
        ------
        ValueError
            For a malformed topology string.

        Warns
        -----
        GDaskWarning
            For a link name this gdask does not know (a newer driver's): that link is ``default``.
            Where the two GPUs' reports differ, the worse link is kept.
        """
        physical: dict[frozenset, str] = {}
        unknown: dict[frozenset, str] = {}
        for index, info in details.items():
            text = (info or {}).get("topology") or ""
            for entry in filter(None, (e.strip() for e in text.split(","))):
                m = re.fullmatch(r"GPU(\d+):(\S+)", entry)
                if m is None:
                    raise ValueError(f"cannot parse NVML topology entry {entry!r} of GPU {index} "
                                     "(expected 'GPU<j>:<NV<n>|INTERNAL|PIX|PXB|PHB|NODE|SYS>')")
                pair = frozenset((int(index), int(m.group(1))))
                try:
                    kind = _kind(m.group(2))
                except ValueError:
                    kind = _kind(default)
                    unknown.setdefault(pair, m.group(2))
                if pair in physical:
                    kind = min(kind, physical[pair], key=link_rank)
                physical[pair] = kind
        if unknown:
            listed = ", ".join(f"GPU{min(p)}-GPU{max(p)}: {name!r}" for p, name in sorted(
                unknown.items(), key=lambda item: sorted(item[0])))
            warnings.warn(f"unknown link kind(s) ({listed}) taken as {_kind(default)!r} (the default); "
                          "a newer gdask may know them", GDaskWarning, stacklevel=2)
        names = dict(devices) if devices is not None else {int(i): int(i) for i in details}
        topo = cls(default=default)
        for a, b in itertools.combinations(names, 2):
            ia, ib = names[a], names[b]
            if hosts is not None and hosts.get(a) != hosts.get(b):
                topo.set_link(a, b, "network")
            elif ia == ib:
                topo.set_link(a, b, "same-device")
            else:
                kind = physical.get(frozenset((ia, ib)))
                if kind is not None:
                    topo.set_link(a, b, kind)
        return topo

    @classmethod
    def from_nvidia_smi(cls, text: str, devices: Mapping[Hashable, int] | None = None,
                        hosts: Mapping[Hashable, str] | None = None, default: str = "network") -> Topology:
        """Build from the text ``nvidia-smi topo -m`` prints (GPU rows and columns only).

        Parameters
        ----------
        text : str
            The command's output, legend included or not (see :func:`parse_nvidia_smi_topo`).
        devices, hosts, default
            As for :meth:`from_nvml`; devices are named by GPU index by default.

        Raises
        ------
        ValueError
            If ``text`` is not a ``nvidia-smi topo -m`` matrix (the message says what is wrong).

        Examples
        --------
        >>> t = Topology.from_nvidia_smi("\\tGPU0\\tGPU1\\tCPU Affinity\\nGPU0\\t X \\tNV4\\t0-7\\n"
        ...                              "GPU1\\tNV4\\t X \\t0-7\\n")
        >>> t.link(0, 1)
        'nvlink'
        """
        matrix = parse_nvidia_smi_topo(text)
        details = {i: {"topology": ",".join(f"GPU{j}:{cell}" for j, cell in row.items())}
                   for i, row in matrix.items()}
        return cls.from_nvml(details, devices=devices, hosts=hosts, default=default)

    # -- decisions ------------------------------------------------------------------------------
    def link(self, a: Hashable, b: Hashable) -> str:
        """Kind of the link between ``a`` and ``b`` (``"same-device"`` when ``a == b``)."""
        if a == b:
            return "same-device"
        return self._links.get(frozenset((a, b)), self.default)

    def worst_link(self, group: Iterable[Hashable]) -> str:
        """The worst link among the devices of ``group`` (``"same-device"`` for one device)."""
        group = list(group)
        kinds = [self.link(a, b) for a, b in itertools.combinations(group, 2)]
        return min(kinds, key=link_rank, default="same-device")

    def best_group(self, candidates: Sequence[Hashable], size: int,
                   load: Mapping[Hashable, float] | None = None, max_combinations: int = 50_000) -> tuple:
        """Choose ``size`` of ``candidates`` whose worst link is best; ties: lowest total ``load``,
        then earliest in ``candidates``.

        For tasks of one job that exchange data. Exhaustive when there are at most
        ``max_combinations`` groups, otherwise greedy (grow from each device, adding the device
        whose worst link to the group is best).

        Raises
        ------
        ValueError
            If ``size`` is not in [1, len(candidates)].
        """
        cands = list(dict.fromkeys(candidates))
        if not 1 <= size <= len(cands):
            raise ValueError(f"cannot choose a group of {size} devices from {len(cands)} candidates")
        load = load or {}
        order = {d: i for i, d in enumerate(cands)}

        def key(group: Sequence[Hashable]) -> tuple:
            return (-link_rank(self.worst_link(group)), sum(float(load.get(d, 0.0)) for d in group),
                    [order[d] for d in group])

        if math.comb(len(cands), size) <= max_combinations:
            return tuple(min(itertools.combinations(cands, size), key=key))
        groups = []
        for start in cands:
            group = [start]
            rest = [d for d in cands if d != start]
            while len(group) < size:
                nxt = min(rest, key=lambda d: (-min(link_rank(self.link(d, g)) for g in group),
                                               float(load.get(d, 0.0)), order[d]))
                group.append(nxt)
                rest.remove(nxt)
            groups.append(tuple(sorted(group, key=order.get)))
        return min(groups, key=key)


# -- ``nvidia-smi topo -m`` ------------------------------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal attributes, e.g. an underlined header
_GPU = re.compile(r"GPU(\d+)")
_AFTER_DEVICES = {"CPU", "NUMA", "GPU", "Affinity"}  # "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"


def parse_nvidia_smi_topo(text: str) -> dict[int, dict[int, str]]:
    """The GPU-to-GPU cells of ``nvidia-smi topo -m`` output.

    Reads the header line (``GPU0 GPU1 ... [NIC0 ... | mlx5_0 ...] CPU Affinity [NUMA Affinity]
    [GPU NUMA ID]``, tab- or space-separated) and the ``GPU<i>`` rows under it; NIC rows and
    columns, CPU / NUMA affinity columns and everything from ``Legend:`` on are ignored, as are
    terminal escape codes.

    Returns
    -------
    dict
        ``{i: {j: cell}}`` for every GPU row ``i`` and every other GPU ``j``, cells as printed
        (``NV18``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``, ``SOC`` ...); the ``X`` of the
        diagonal is checked and left out.

    Raises
    ------
    ValueError
        If there is no header with GPU columns, a GPU row is short, the GPU rows and columns differ,
        or the diagonal is not ``X``; the message quotes the line.

    Examples
    --------
    >>> parse_nvidia_smi_topo("\\tGPU0\\tGPU1\\tCPU Affinity\\nGPU0\\t X \\tPIX\\t0-7\\n"
    ...                       "GPU1\\tPIX\\t X \\t0-7\\n\\nLegend:\\n\\n  X    = Self\\n")
    {0: {1: 'PIX'}, 1: {0: 'PIX'}}
    """
    columns: list[str] | None = None
    rows: dict[int, dict[int, str]] = {}
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        tokens = line.split()
        if not tokens:
            continue
        if tokens[0].rstrip(":").lower() == "legend":
            break
        if columns is None:
            # the header: starts with GPU0 and, unlike a row, has no X (the diagonal)
            if _GPU.fullmatch(tokens[0]) and "X" not in tokens:
                columns = []
                for t in tokens:
                    if t in _AFTER_DEVICES:
                        break
                    columns.append(t)
            continue
        m = _GPU.fullmatch(tokens[0])
        if m is None:
            continue  # a NIC row
        cells = tokens[1:1 + len(columns)]
        if len(cells) < len(columns):
            raise ValueError(f"nvidia-smi topo row {line.strip()!r} has {len(cells)} cells but the header "
                             f"has {len(columns)} device columns ({' '.join(columns)})")
        i = int(m.group(1))
        if i in rows:
            raise ValueError(f"nvidia-smi topo output has two rows for GPU{i}")
        rows[i] = {int(g.group(1)): cell for col, cell in zip(columns, cells) if (g := _GPU.fullmatch(col))}
    if columns is None:
        raise ValueError("no header line with GPU columns ('GPU0  GPU1 ... CPU Affinity') found: "
                         "pass the output of `nvidia-smi topo -m`")
    gpu_columns = sorted(int(g.group(1)) for c in columns if (g := _GPU.fullmatch(c)))
    if sorted(rows) != gpu_columns:
        raise ValueError(f"nvidia-smi topo output has GPU rows {sorted(rows)} but GPU columns {gpu_columns}")
    for i, row in rows.items():
        if row.pop(i).upper() != "X":
            raise ValueError(f"nvidia-smi topo output: GPU{i}'s own cell should be 'X'")
    return rows
