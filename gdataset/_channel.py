"""The iteration channel: loop state goes to the workers once per iteration, by version.

Instead of embedding the state (centroids, weights, rank vectors) in every task of every
iteration's graph, the channel sends each *changed* part once, as a small task that holds it (key
derived from its content), and tasks reference it by its key (a small token). A part whose content
did not change keeps its key and is not sent again, so tasks that depend only on unchanged parts
keep their fingerprints and GTracker reuses their results. Parts are tasks, not scattered data: the
scheduler keeps each part's task, so a part lost with a worker is computed again (lineage) instead
of failing every task that reads it.
"""

from __future__ import annotations

import pickle
from typing import Any, Sequence

from dask.base import tokenize
from dask.task_spec import Task

from gdask._compat import scheduler_workers

__all__ = ["IterationChannel"]


def _part(x: Any) -> Any:
    """A published part: the task that holds it (rerun from the scheduler's copy when lost)."""
    return x


def _nbytes(x: Any) -> int:
    nb = getattr(x, "nbytes", None)
    if nb is not None:
        return int(nb)
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    return len(pickle.dumps(x, protocol=5))


class IterationChannel:
    """Versioned broadcast of loop state to the workers of ``client``.

    Parameters
    ----------
    client : distributed.Client

    Attributes
    ----------
    history : list of dict
        One dict per :meth:`publish` / :meth:`publish_blocks` call: ``version``, ``name``,
        ``parts_sent``, ``parts_total``, ``bytes_sent`` (payload bytes times the number of workers
        it went to) and ``bytes_state`` (size of the whole state).

    Examples
    --------
    >>> ch = IterationChannel(client)                       # doctest: +SKIP
    >>> refs = ch.publish_blocks("rank", rank_blocks)       # doctest: +SKIP
    >>> X.map_blocks(f, refs[0], dtype=..., ncols=...)      # doctest: +SKIP
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.history: list[dict] = []
        self._parts: dict[tuple[str, int], tuple[str, Any]] = {}  # (name, part) -> (token, future)
        self.version = 0
        self._nworkers: int | None = None

    def _n_workers(self) -> int:
        """Workers a broadcast reaches (asked from the scheduler every 16 versions: one RPC less per
        iteration)."""
        if self._nworkers is None or self.version % 16 == 1:
            try:
                self._nworkers = max(1, len(scheduler_workers(self.client)))
            except Exception:  # noqa: BLE001 - unknown: count one
                self._nworkers = 1
        return self._nworkers

    def publish_blocks(self, name: str, parts: Sequence[Any]) -> list[Any]:
        """Publish a list of parts (e.g. one per block); only changed parts are sent.

        Returns the parts' futures, usable as task arguments (``TaskRef`` s).
        """
        self.version += 1
        tokens = [tokenize(p) for p in parts]
        send = [j for j, t in enumerate(tokens) if self._parts.get((name, j), (None,))[0] != t]
        nworkers = self._n_workers() if send else 0
        sent = 0
        if send:
            keys = [f"channel-{name}-{tokens[j]}" for j in send]
            dsk = {k: Task(k, _part, parts[j]) for k, j in zip(keys, send)}
            futs = self.client.get(dsk, keys, sync=False)
            for j, f in zip(send, futs):
                # old versions are dropped, not release()d: equal parts share one Future object
                self._parts[(name, j)] = (tokens[j], f)
                sent += _nbytes(parts[j])
        for j in [j for (n, j) in self._parts if n == name and j >= len(parts)]:
            del self._parts[(name, j)]
        self.history.append({"version": self.version, "name": name, "parts_sent": len(send),
                             "parts_total": len(parts), "bytes_sent": sent * nworkers,
                             "bytes_state": sum(_nbytes(p) for p in parts)})
        return [self._parts[(name, j)][1] for j in range(len(parts))]

    def publish(self, name: str, value: Any) -> Any:
        """Publish one value; returns its future (unchanged content: same future, nothing sent)."""
        return self.publish_blocks(name, [value])[0]

    def bytes_sent(self, since: int = 0) -> int:
        """Bytes sent by publishes with ``version > since``."""
        return sum(h["bytes_sent"] for h in self.history if h["version"] > since)

    def close(self) -> None:
        """Release every published part (dropping the last reference releases a Future)."""
        self._parts.clear()

    def __enter__(self) -> IterationChannel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
