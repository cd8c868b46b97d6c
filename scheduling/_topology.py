"""Device topology: how well two devices are linked, and the best group of devices for one job.

Pure objects: a link table in (from config on emulated devices, from NVML details on CUDA),
decisions out. NVML itself is read only by :mod:`gdask._devices._nvml`; :meth:`Topology.from_nvml`
parses what its ``details()`` returns.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any, Hashable, Iterable, Mapping, Sequence

__all__ = ["LINK_KINDS", "Topology", "link_rank"]

#: Link kinds from best to worst. ``same-device``: two logical devices on one physical GPU.
LINK_KINDS = ("same-device", "nvlink", "pcie-switch", "pcie-host", "socket", "network")

_RANK = {k: len(LINK_KINDS) - i for i, k in enumerate(LINK_KINDS)}  # same-device 6 ... network 1

# NVML names (``nvidia-smi topo -m``) and short aliases
_ALIASES = {
    "self": "same-device", "same": "same-device", "x": "same-device",
    "nv": "nvlink",
    "pix": "pcie-switch", "pxb": "pcie-switch", "sys-internal": "pcie-switch", "switch": "pcie-switch",
    "phb": "pcie-host", "node": "pcie-host", "host-bridge": "pcie-host",
    "sys": "socket", "cross-socket": "socket", "numa": "socket",
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
        """
        physical: dict[tuple[int, int], str] = {}
        for index, info in details.items():
            text = (info or {}).get("topology") or ""
            for entry in filter(None, (e.strip() for e in text.split(","))):
                m = re.fullmatch(r"GPU(\d+):(\S+)", entry)
                if m is None:
                    raise ValueError(f"cannot parse NVML topology entry {entry!r} of GPU {index} "
                                     "(expected 'GPU<j>:<NV<n>|PIX|PXB|PHB|NODE|SYS>')")
                try:
                    kind = _kind(m.group(2))
                except ValueError:
                    kind = _kind(default)  # a level this gdask does not know yet: assume the default
                physical[(int(index), int(m.group(1)))] = kind
        names = dict(devices) if devices is not None else {int(i): int(i) for i in details}
        topo = cls(default=default)
        for a, b in itertools.combinations(names, 2):
            ia, ib = names[a], names[b]
            if hosts is not None and hosts.get(a) != hosts.get(b):
                topo.set_link(a, b, "network")
            elif ia == ib:
                topo.set_link(a, b, "same-device")
            else:
                kind = physical.get((ia, ib)) or physical.get((ib, ia))
                if kind is not None:
                    topo.set_link(a, b, kind)
        return topo

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
