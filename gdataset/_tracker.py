"""GTracker: the incremental graph rewriter.

Inside a tracked loop every graph computed with ``.compute()`` / ``dask.compute`` goes through
:meth:`GTracker.get` (the tracker is installed as the Dask scheduler function). Before submission each
task gets a *fingerprint*: the identity of its function, its arguments and the fingerprints of its
inputs (source blocks by content, so a new block version has a new fingerprint). A task whose
fingerprint has a live cached result on the cluster is replaced by that result: its dependents read
the cached key, and the part of the graph only it needed is dropped. Only tasks whose fingerprint
changed run; their results are kept (as futures) for the next submissions, bounded by
:class:`~gdask.gdataset._cachepolicy.ReusePolicy` (idle ageing + LRU by bytes).

Fusion must not destroy reuse: while a tracker is active, dask.array and dask.delayed graphs are
only culled, not fused (fusion renames the intermediate keys and merges static and changing work
into one task), so every block task keeps its own fingerprint.

What ran is counted from the scheduler (:class:`gdask.scheduling.ExecutionLogPlugin` records
processing->memory transitions; :class:`ExecutionLog` reads them through its scheduler handler), not
from what the tracker intended.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Iterable

import dask
import dask.threaded
from dask._task_spec import convert_legacy_graph
from dask.base import tokenize
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import Alias, DataNode, Task, TaskRef
from dask.utils import key_split, parse_bytes
from distributed import default_client, get_client, wait

from gdask import config, protocol
from gdask._compat import scheduler_workers
from gdask.gdataset import _blocks
from gdask.gdataset._cachepolicy import ReusePolicy
from gdask.scheduling import ExecutionLogPlugin, ensure_plugins

__all__ = ["GTracker", "incremental", "ExecutionLog", "active_tracker", "tracked_get"]

_ACTIVE: list[GTracker] = []


def active_tracker() -> GTracker | None:
    """The innermost active tracker, or ``None``."""
    return _ACTIVE[-1] if _ACTIVE else None


def tracked_get(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """The Dask scheduler function installed while a tracker is active: the innermost active
    tracker's :meth:`GTracker.get`.

    dask.config holds this module-level function, never a tracker's bound method: a nanny pickles
    the config to restart a worker, and a bound method holding a Client cannot be pickled (the
    worker would never come back). In a process without an active tracker (a worker started with
    that config) it is the usual choice: the current Client, else Dask's threaded scheduler.
    """
    tracker = active_tracker()
    if tracker is not None:
        return tracker.get(dsk, keys, **kwargs)
    try:
        client = get_client()
    except ValueError:
        return dask.threaded.get(dsk, keys, **kwargs)
    return client.get(dsk, keys, **kwargs)


class ExecutionLog:
    """Counts the tasks the cluster actually computed (for trackers and plain-Dask baselines).

    Examples
    --------
    >>> log = ExecutionLog(client)            # doctest: +SKIP
    >>> log.pop()                             # doctest: +SKIP
    {('matmul-...', 0): 8000, ...}
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        ensure_plugins(client, extra=(ExecutionLogPlugin(),), standard=False)

    def pop(self, keys: Iterable[Any] | None = None, sizes: Iterable[Any] = ()) -> dict[Any, int]:
        """Executed ``{key: nbytes}`` recorded since the last pop (of these keys, or all)."""
        return self.pop_with_sizes(keys, sizes)[0]

    def pop_with_sizes(self, keys: Iterable[Any] | None, sizes: Iterable[Any]) -> tuple[dict, dict]:
        """``({key: nbytes} executed, popped for ``keys`` (all when None), {key: nbytes} of the keys in
        ``sizes`` in memory now)``, in one round trip to the scheduler's execution log."""
        done, mem = self.client.sync(getattr(self.client.scheduler, protocol.HANDLER_EXECUTION_LOG),
                                     keys=None if keys is None else list(keys), sizes=list(sizes))
        return dict(done), dict(mem)


# -- fingerprints --------------------------------------------------------------------------------
def _external(key: Any) -> str:
    """The fingerprint of a key outside the graph (a held result: persisted, scattered): its name."""
    return tokenize("ext", str(key))


def _arg_token(a: Any, fps: dict) -> Any:
    # a reference is its target's fingerprint, whether the target is in the graph or held outside it:
    # a task reading a persisted block directly and one reading it through an Alias (a new version
    # of the dataset, update_blocks) are the same work
    if isinstance(a, TaskRef):  # also distributed.Future: an external key (scattered / held)
        k = a.key
        return ("ref", fps[k] if k in fps else _external(k))
    if isinstance(a, DataNode):
        return ("data", tokenize(a.value))
    if isinstance(a, Alias):
        return ("ref", fps[a.target] if a.target in fps else _external(a.target))
    if isinstance(a, Task):
        return (tokenize(a.func), tuple(_arg_token(x, fps) for x in a.args),
                tuple(sorted((k, _arg_token(v, fps)) for k, v in a.kwargs.items())))
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_arg_token(x, fps) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple(sorted((str(k), _arg_token(v, fps)) for k, v in a.items())))
    return tokenize(a)


def fingerprint(node: Any, fps: dict) -> str:
    """Fingerprint of one graph node given the fingerprints ``fps`` of its dependencies.

    Function identity + arguments + input fingerprints; the node's own key is not part of it, so
    the same work under another name (a new dataset version, a renamed layer) matches.
    """
    if isinstance(node, Alias):
        t = node.target
        return fps[t] if t in fps else _external(t)
    return tokenize(_arg_token(node, fps))


def _toposort(dsk: dict) -> list:
    order, seen = [], set()
    for root in dsk:
        if root in seen:
            continue
        stack = [(root, False)]
        while stack:
            k, done = stack.pop()
            if done:
                order.append(k)
                continue
            if k in seen:
                continue
            seen.add(k)
            stack.append((k, True))
            for d in dsk[k].dependencies:
                if d in dsk and d not in seen:
                    stack.append((d, False))
    return order


def _cull_only(dsk, keys, **kwargs):
    """Optimizer used while tracking: cull, never fuse (fusion renames keys and merges static and
    changing work, which destroys reuse)."""
    keys = list(flatten(keys)) if isinstance(keys, list) else [keys]
    if isinstance(dsk, HighLevelGraph):
        return dsk.cull(set(keys))
    return dask.optimization.cull(dict(dsk), keys)[0]


def _user_tasks_on_devices(run: dict) -> dict:
    """The graph to submit with every user task (a plain ``Task`` of a function outside gdask and Dask)
    wrapped in :func:`gdask.gdataset._blocks.user_task`, which moves its host arguments to the device
    when it reads device blocks. Applied after fingerprinting: reuse is unchanged."""
    out = {}
    for k, node in run.items():
        top = (getattr(node.func, "__module__", None) or "").split(".")[0] if type(node) is Task else "dask"
        if top not in ("gdask", "dask", "distributed"):
            node = Task(node.key, _blocks.user_task, node.func, *node.args, **node.kwargs)
        out[k] = node
    return out


def _materialize(expr: Any) -> dict:
    dsk = expr.__dask_graph__() if hasattr(expr, "__dask_graph__") else expr
    return convert_legacy_graph(dict(dsk))


# -- the tracker ---------------------------------------------------------------------------------
class GTracker:
    """Reuses block results across the graphs of an iterative loop. Create with :func:`incremental`.

    Attributes
    ----------
    history : list of dict
        One dict per computation (per iteration of a loop that computes once per step):
        ``submitted`` (tasks in the graph the program built), ``reused`` (tasks answered by a
        cached result), ``pruned`` (tasks only those needed, dropped), ``executed`` (tasks the
        cluster actually computed, from scheduler transitions), ``recomputed`` (cached results that
        were lost with a worker and rebuilt from their lineage to serve this computation),
        ``bytes_reused``,
        ``executed_by_prefix`` ({task name prefix: count}), ``seconds``.
    """

    def __init__(self, client: Any = None, *, max_bytes: int | str | None = None, max_idle: int | None = None,
                 enabled: bool = True) -> None:
        if client is None:
            client = default_client()
        self.client = client
        if max_bytes is None:
            max_bytes = config.get("tracker.cache-bytes", None) or _default_budget(client)
        if isinstance(max_bytes, str):
            max_bytes = parse_bytes(max_bytes)
        if max_idle is None:
            max_idle = int(config.get("tracker.max-idle", 2))
        self.policy = ReusePolicy(int(max_bytes), int(max_idle))
        self.enabled = enabled
        self.history: list[dict] = []
        self._futures: dict[str, Any] = {}  # fingerprint -> Future holding the result
        self._fp_memo: dict[Any, str] = {}
        self._memo_limit = 200_000
        self._log = ExecutionLog(client)
        self._config = None
        self._n = 0
        self.activate()

    # -- lifecycle --------------------------------------------------------------------------------
    def activate(self) -> GTracker:
        """Route ``.compute()`` / ``dask.compute`` through this tracker (done on creation)."""
        if self._config is None:
            self._config = dask.config.set(scheduler=tracked_get, array_optimize=_cull_only,
                                           delayed_optimize=_cull_only)
            _ACTIVE.append(self)
        return self

    def close(self) -> None:
        """Stop tracking: restore the scheduler setting and release every cached result."""
        if self._config is not None:
            self._config.__exit__(None, None, None)
            self._config = None
            if self in _ACTIVE:
                _ACTIVE.remove(self)
        self.clear()

    def __enter__(self) -> GTracker:
        return self.activate()

    def __exit__(self, *exc) -> None:
        self.close()

    def clear(self) -> None:
        """Release all cached results (they are recomputed when needed again)."""
        self._futures.clear()  # dropping the last reference releases the Future
        self.policy.entries.clear()

    @property
    def cached_bytes(self) -> int:
        return self.policy.nbytes

    def __len__(self) -> int:
        return len(self.policy)

    def __repr__(self) -> str:
        return (f"GTracker<{len(self.policy)} cached results, {self.cached_bytes} bytes, "
                f"{len(self.history)} computations>")

    # -- the rewriter -----------------------------------------------------------------------------
    def fingerprints(self, dsk: dict) -> dict:
        """Fingerprint of every node of a materialised graph (memoised by key across calls: Dask keys
        name their content, as the scheduler assumes too)."""
        fps: dict = {}
        memo = self._fp_memo
        for k in _toposort(dsk):
            fp = memo.get(k)
            if fp is None:
                fp = memo[k] = fingerprint(dsk[k], fps)
            fps[k] = fp
        if len(memo) > self._memo_limit:  # bounded: keep this graph's keys and the newest others
            keep = list(memo)[-self._memo_limit // 2:]
            self._fp_memo = {**{k: memo[k] for k in keep}, **fps}
        return fps

    def _alive(self, fp: str) -> bool:
        f = self._futures.get(fp)
        if f is None:
            return False
        if f.status in ("error", "lost", "cancelled"):
            self._futures.pop(fp, None)
            self.policy.drop(fp)
            return False
        return True

    def rewrite(self, dsk: dict, outputs: list) -> tuple[dict, dict, dict, dict]:
        """Plan one submission: ``(graph to run, {key: fingerprint} of reused keys, fingerprints,
        stats)``."""
        fps = self.fingerprints(dsk)
        hits = {k: fps[k] for k in dsk if self.enabled and self._alive(fps[k])}
        needed: set = set()
        stack = list(outputs)
        while stack:
            k = stack.pop()
            if k in needed or k not in dsk:
                continue
            needed.add(k)
            if k in hits:
                continue
            stack.extend(dsk[k].dependencies)
        reused = {k for k in hits if k in needed}
        subs = {}
        for k in reused:
            ck = self.policy.get(hits[k]).key
            if ck != k:
                subs[k] = ck
        run = {}
        for k in needed:
            if k in reused:
                continue
            node = dsk[k]
            if subs and not subs.keys().isdisjoint(node.dependencies):
                node = node.substitute(subs)
            run[k] = node
        stats = {"submitted": len(dsk), "reused": len(reused), "pruned": len(dsk) - len(needed),
                 "to_run": len(run)}
        return run, {k: hits[k] for k in reused}, fps, stats

    def get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        """Dask scheduler function: rewrite, submit, gather (installed by :meth:`activate`)."""
        t0 = time.perf_counter()
        graph = _materialize(dsk)
        flat = list(flatten(keys)) if isinstance(keys, list) else [keys]
        now = self._n
        self._n += 1
        run, reused, fps, stats = self.rewrite(graph, flat)
        bytes_reused = 0
        for k, fp in reused.items():
            bytes_reused += self.policy.hit(fp, now).nbytes
        # the cached results behind a reused one stay with it: the same graph computed again reuses
        # only its top, but a new version of one block needs the other blocks' results below it
        behind, stack = set(), [d for k in reused for d in graph[k].dependencies]
        while stack:
            k = stack.pop()
            if k in behind or k not in graph:
                continue
            behind.add(k)
            self.policy.touch(fps[k], now)
            stack.extend(graph[k].dependencies)
        run_keys = list(run)
        futures = self.client.get(_user_tasks_on_devices(run), run_keys, sync=False, **kwargs) if run else []
        by_key = dict(zip(run_keys, futures))
        out_set = set(flat)
        try:
            wanted = [by_key[k] if k in by_key else self._futures[fps[k]] for k in flat]
            limit = float(config.get("timeouts.pass", 3600))
            try:
                with self.client.as_current():  # distributed's wait asks the current client: the tracker's
                    wait(wanted, timeout=limit)
            except TimeoutError:
                raise TimeoutError(f"a tracked computation (computation {now}, {len(run)} tasks to run) did not "
                                   f"finish within {limit:g} s (gdask.timeouts.pass)") from None
            results = self.client.gather(wanted)
        finally:
            for k, f in by_key.items():  # cache every computed result
                fp = fps[k]
                if fp not in self._futures:
                    self._futures[fp] = f
                    self.policy.add(fp, k, now)
        # cached keys computed again since the last computation were lost (worker gone) and rebuilt
        hit_keys = {e.key for fp, e in self.policy.entries.items() if e.created < now}
        executed, mem = self._log.pop_with_sizes(run_keys + list(hit_keys - set(run_keys)),
                                                 [self.policy.get(fps[k]).key for k in run_keys
                                                  if fps[k] in self.policy])
        recomputed = [k for k in executed if k in hit_keys]  # cached results lost and rebuilt (lineage)
        for k in recomputed:
            del executed[k]
        key_fp = {self.policy.get(fps[k]).key: fps[k] for k in run_keys if fps[k] in self.policy}
        for k, nb in mem.items():
            if k in key_fp:
                self.policy.set_nbytes(key_fp[k], nb)
                if k in out_set and nb > self.policy.max_bytes // 16:  # a large final result (e.g. a
                    self.policy.drop(key_fp[k])                          # whole concatenated array):
                    self._futures.pop(key_fp[k], None)                   # returned, not kept
        for fp in self.policy.evictions(now):
            self._futures.pop(fp, None)  # the last reference: the result is released
        self.history.append({
            "computation": now, **stats, "executed": len(executed), "recomputed": len(recomputed),
            "bytes_reused": int(bytes_reused),
            "executed_by_prefix": dict(Counter(key_split(k) for k in executed)),
            "cached_results": len(self.policy), "cached_bytes": self.policy.nbytes,
            "seconds": time.perf_counter() - t0,
        })
        return results if isinstance(keys, list) else results[0]

    def compute(self, *collections: Any, **kwargs: Any) -> tuple:
        """``dask.compute`` through this tracker (also when it is not the active one)."""
        _ACTIVE.append(self)  # innermost while it computes
        try:
            with dask.config.set(scheduler=tracked_get, array_optimize=_cull_only, delayed_optimize=_cull_only):
                return dask.compute(*collections, **kwargs)
        finally:
            _ACTIVE.remove(self)


def _default_budget(client: Any) -> int:
    """Half the (emulated or real) device memory of the cluster's workers, or 1 GiB."""
    try:
        info = scheduler_workers(client)
        mem = [w.get("metrics", {}).get("gdask_device", {}) for w in info.values()]
        total = sum(int(m.get("memory", 0) or 0) for m in mem if isinstance(m, dict))
        if total > 0:
            return total // 2
    except Exception:  # noqa: BLE001 - any problem: fixed default
        pass
    return 1 << 30


def incremental(client: Any = None, **kwargs: Any) -> GTracker:
    """Start reusing block results across the graphs of an iterative loop.

    Parameters
    ----------
    client : distributed.Client, optional
        Default: the current client.
    max_bytes : int or str, optional
        Budget for cached results (default config ``gdask.tracker.cache-bytes``, else half the
        devices' memory). Least recently used results beyond it are released.
    max_idle : int, optional
        Release a result not reused during this many computations (default 2).

    Returns
    -------
    GTracker
        Active at once; ``with`` closes it at the end, or call ``tracker.close()`` (notebooks).

    Examples
    --------
    >>> with gdask.incremental(client) as tracker:      # doctest: +SKIP
    ...     for i in range(n_iter):
    ...         w = w - lr * ((X @ w - y) * X).mean(axis=0).compute()
    >>> tracker.history[-1]["executed"]                 # doctest: +SKIP
    """
    return GTracker(client, **kwargs)
