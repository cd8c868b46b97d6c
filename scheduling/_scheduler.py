"""Scheduler side of gdask's scheduling: the placement plugin (``gdask-placement``).

It is thin: they turn scheduler events into calls on the pure policies of
:mod:`gdask.scheduling._placement` and :mod:`gdask.scheduling._mapping`, and their decisions into
``TaskState.worker_restrictions`` and block moves.

How placement reaches Dask (verified against distributed 2026.8, see the team's dask-internals
notes): ``update_graph`` runs after the new TaskStates exist and before ``decide_worker``; a strict
``worker_restrictions`` set there is honoured, and work stealing never moves strictly restricted
tasks. Tasks strictly pinned to a worker that dies sit in ``no-worker``; ``remove_worker`` (which
runs after the scheduler's own transitions) re-places them and moves them on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from typing import Any

from distributed import SchedulerPlugin

from gdask import config, protocol
from gdask.scheduling._mapping import proportional_mapping, rebalance_plan
from gdask.scheduling._placement import DurationModel, EarliestFinish

logger = logging.getLogger("gdask.scheduling")

__all__ = ["GPUPlacement", "is_gpu_task"]

class GatherDuringRecompute(logging.Filter):
    """Demotes to DEBUG the scheduler's "Couldn't gather keys: {key: state}" when it only raced a
    lost worker: a client asked for a result whose worker had just left, the scheduler computes it
    again, and the client asks again once it is back (distributed's ``Client._gather`` retries).
    Nothing is lost; the ERROR line only alarms users of fits that survived a lost worker.

    * Every key being computed again (``waiting``, ``queued``, ``processing``, ``no-worker``):
      demoted at once.
    * Keys still ``memory`` (the rest being computed again): the worker holding them did not answer,
      most often because it died a moment ago and the scheduler has not heard yet. With its
      ``scheduler`` given, the filter holds such a record until every worker that held those keys has
      left (:meth:`worker_left`, then demoted) or ``settle`` seconds passed (config
      ``gdask.timeouts.gather-settle``; then it is logged as the ERROR it was if one of them is
      still there). :meth:`close` settles what is held: nothing is dropped.
    * Anything else (forgotten, released, erred keys; no scheduler) keeps its ERROR.

    One per :class:`GPUPlacement`, installed on ``distributed.scheduler`` at its start."""

    MESSAGE = "Couldn't gather keys"
    RECOMPUTING = frozenset({"waiting", "queued", "processing", "no-worker"})

    def __init__(self, scheduler: Any = None, settle: float = 10.0) -> None:
        super().__init__()
        self.scheduler, self.settle = scheduler, settle
        self._held: dict[int, tuple[logging.LogRecord, set[str], Any]] = {}  # id -> (record, holders, timer)

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "gdask_settled", False) or record.levelno < logging.ERROR \
                or not str(record.msg).startswith(self.MESSAGE):
            return True
        states = record.args[0] if isinstance(record.args, tuple) and record.args else record.args
        if not isinstance(states, dict) or not states:
            return True
        if set(states.values()) <= self.RECOMPUTING:
            return self._demote(record)
        holders = self._holders(states)
        if holders is None:
            return True
        try:
            timer = asyncio.get_running_loop().call_later(self.settle, self._settle, id(record))
        except RuntimeError:  # not on the scheduler's event loop: nothing to wait with
            return True
        self._held[id(record)] = (record, holders, timer)
        return False

    def _holders(self, states: dict) -> set[str] | None:
        """The workers holding this record's ``memory`` keys, when every other key is being computed
        again and the scheduler knows them all; else None (the record stays an ERROR)."""
        tasks = getattr(self.scheduler, "tasks", None)
        if tasks is None or not set(states.values()) <= self.RECOMPUTING | {"memory"}:
            return None
        holders: set[str] = set()
        for key, state in states.items():
            if state == "memory":
                ts = tasks.get(key)
                if ts is None or not ts.who_has:
                    return None
                holders |= {ws.address for ws in ts.who_has}
        return holders

    @staticmethod
    def _demote(record: logging.LogRecord) -> bool:
        # handlers at level NOTSET (distributed's own) would print a relabelled record: it is kept
        # only where the logger is set to show DEBUG
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)

    def worker_left(self, address: str) -> None:
        """A worker left the cluster: held records whose holders have all left are demoted now."""
        for rid, (record, holders, timer) in list(self._held.items()):
            holders.discard(address)
            if not holders:
                timer.cancel()
                self._emit(rid, demote=True)

    def _settle(self, rid: int) -> None:
        held = self._held.get(rid)
        if held is not None:
            workers = getattr(self.scheduler, "workers", {})
            self._emit(rid, demote=not any(a in workers for a in held[1]))

    def _emit(self, rid: int, demote: bool) -> None:
        record = self._held.pop(rid)[0]
        record.gdask_settled = True
        if demote and not self._demote(record):
            return
        logging.getLogger(record.name).handle(record)

    def close(self) -> None:
        """Settle every held record now (the scheduler is closing)."""
        for rid, (_, _, timer) in list(self._held.items()):
            timer.cancel()
            self._settle(rid)


#: states from which a task may still be (re-)placed
_PLACEABLE = frozenset({"released", "waiting", "no-worker"})
#: states in which a task no longer occupies its device's queue
_DONE = frozenset({"memory", "released", "forgotten", "erred"})


def is_gpu_task(ts: Any) -> bool:
    """Whether a scheduler TaskState runs device work: it carries the ``gdask_gpu`` annotation
    (every GDataSet task does; user tasks may ask for it) or belongs to a ``gdask.job``."""
    ann = ts.annotations
    return bool(ann) and bool(ann.get(protocol.ANN_GPU) or ann.get(protocol.ANN_JOB))


def _block_index(key: Any) -> int | None:
    if type(key) is tuple and len(key) == 2 and type(key[1]) is int:
        return key[1]
    return None


def _arg_bytes(ts: Any) -> int:
    """Bytes of array arguments embedded in a task (the host data a source block copies to its device)."""
    total = 0
    for a in getattr(ts.run_spec, "args", ()) or ():
        n = getattr(a, "nbytes", None)
        if isinstance(n, int):
            total += n
    return total


def _compute_seconds(startstops: Any) -> float | None:
    if not startstops:
        return None
    total, seen = 0.0, False
    for ss in startstops:
        if ss.get("action") == "compute":
            total += ss["stop"] - ss["start"]
            seen = True
    return total if seen else None


class GPUPlacement(SchedulerPlugin):
    """Place GDataSet (GPU) tasks on devices; leave every other task to stock Dask.

    * Source blocks (block tasks without dependencies: host data copied to a device) are mapped to devices
      in proportion to each device's speed (:func:`proportional_mapping`).
    * Every other GPU task goes to the device with the earliest predicted finish
      (:class:`EarliestFinish`): the device's queue of predicted work, a duration learned per
      (task kind, input size class, device) from measured ``startstops``
      (:class:`DurationModel`), the bytes of its inputs not already there, and free memory.
      Inputs cost a transfer elsewhere, so blocks keep their device across iterations.
    * When no GPU work is outstanding, cached blocks (blocks that later graphs reused) are
      rebalanced if the measured speeds drifted so that moving them pays back within
      ``horizon`` iterations (:func:`rebalance_plan`).
    * Decisions are strict ``worker_restrictions`` (work stealing leaves them alone); tasks pinned
      to a worker that dies are re-placed.

    Parameters
    ----------
    use_configured_speeds : bool, optional
        Seed each device's speed with the speed it reports (emulated ``device_speeds``) before
        measurements exist, and share a dataset's blocks among emulated devices by their configured
        speeds: an emulated device runs at its configured speed by construction, while its measured
        speed also counts the load of the devices it shares the machine's cores with (identical
        emulated devices measured up to 3x apart run to run on a 2-core machine, and a share by
        those measurements gave one of them up to three times the other's blocks). Default config
        ``gdask.scheduling.use-configured-speeds``.
    rebalance : bool, optional
        Move cached blocks when speeds drift. Default config ``gdask.scheduling.rebalance``.
    horizon : float, optional
        Iterations a block move must pay back in. Default config ``gdask.scheduling.horizon``.
    min_gain : float, optional
        Minimum relative makespan gain for a rebalance. Default config ``gdask.scheduling.min-gain``.
    interval : float, optional
        Minimum seconds between rebalance checks. Default config ``gdask.scheduling.interval``.
    alpha : float, optional
        Weight of the newest measurement in the duration model (config ``gdask.scheduling.alpha``).
    latency : float, optional
        Seconds a task is assumed to pay to fetch inputs from another device (config
        ``gdask.scheduling.latency``): small tasks stay with their data.
    """

    name = protocol.PLUGIN_PLACEMENT
    idempotent = True

    def __init__(self, *, use_configured_speeds: bool | None = None, rebalance: bool | None = None,
                 horizon: float | None = None, min_gain: float | None = None,
                 interval: float | None = None, alpha: float | None = None,
                 latency: float | None = None) -> None:
        def conf(value, key, default):
            return value if value is not None else config.get(f"scheduling.{key}", default)

        self.use_configured_speeds = bool(conf(use_configured_speeds, "use-configured-speeds", True))
        self.rebalance = bool(conf(rebalance, "rebalance", True))
        self.horizon = float(conf(horizon, "horizon", 5.0))
        self.min_gain = float(conf(min_gain, "min-gain", 0.1))
        self.interval = float(conf(interval, "interval", 1.0))
        self.alpha = float(conf(alpha, "alpha", 0.3))
        self.latency = float(conf(latency, "latency", 0.01))
        if self.horizon <= 0 or self.min_gain < 0 or self.interval < 0 or self.latency < 0:
            raise ValueError(
                f"gdask.scheduling needs horizon > 0 and min-gain, interval, latency >= 0; got horizon="
                f"{self.horizon}, min_gain={self.min_gain}, interval={self.interval}, latency={self.latency}"
            )
        self.scheduler: Any = None
        self.model = DurationModel(alpha=self.alpha, warmup=1, min_speed_seconds=0.005)
        self.placer: EarliestFinish | None = None
        self._meta: dict[Any, tuple[str, float]] = {}  # placed, unfinished key -> (kind, input bytes)
        self._pinned: dict[Any, str] = {}  # key -> address we restricted it to (until forgotten)
        self._families: dict[str, set[Any]] = defaultdict(set)  # cached block families
        self._stats: dict[str, dict[str, float]] = defaultdict(lambda: {"placed": 0, "done": 0, "busy": 0.0})
        self._configured: dict[str, float] = {}  # emulated devices' configured speeds (what they run at)
        self._last_check = 0.0
        self._rebalancing: asyncio.Task | None = None
        self._recheck = False  # a check came while a rebalance ran: plan again when it ends
        self.moves = 0  # blocks moved by rebalancing
        self.replaced = 0  # tasks re-placed after a worker died
        self.last_moves: list[tuple[str, str, str]] = []
        self.gather_log: GatherDuringRecompute | None = None  # the scheduler log's filter (at start)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.placer = EarliestFinish(self.model, bandwidth=float(scheduler.bandwidth), latency=self.latency)
        for ws in scheduler.workers.values():
            self._add(ws)
        scheduler.handlers[protocol.HANDLER_DEVICE_TABLE] = self._handle_table
        scheduler.handlers[protocol.HANDLER_PLACEMENT_STATS] = self._handle_stats
        scheduler.handlers[protocol.HANDLER_OBSERVE] = self._handle_observe
        from gdask.scheduling._dashboard import register

        register(scheduler)  # the /gdask page of the dashboard
        self.gather_log = GatherDuringRecompute(scheduler, settle=float(config.get("timeouts.gather-settle", 10)))
        logging.getLogger("distributed.scheduler").addFilter(self.gather_log)

    async def before_close(self) -> None:
        """Stop a rebalance under way: its workers are about to close (the blocks stay where they are)."""
        self.rebalance = False
        if self.rebalancing:
            self._rebalancing.cancel()
            await asyncio.gather(self._rebalancing, return_exceptions=True)

    async def close(self) -> None:
        if self.gather_log is not None:
            logging.getLogger("distributed.scheduler").removeFilter(self.gather_log)
            self.gather_log.close()

    def add_worker(self, scheduler: Any, worker: str) -> None:
        if self.placer is not None and worker in scheduler.workers:
            self._add(scheduler.workers[worker])

    def _add(self, ws: Any) -> None:
        self.placer.add_device(ws.address, streams=_streams(ws))
        self._refresh(ws)

    def _refresh(self, ws: Any) -> None:
        if ws.address in self.placer.devices:  # the stream executor's live K (nthreads is its maximum)
            self.placer.devices[ws.address].streams = _streams(ws)
        dev = (ws.metrics or {}).get(protocol.METRIC_DEVICE) or {}
        speed = dev.get("speed")
        if self.use_configured_speeds and isinstance(speed, (int, float)) and speed > 0:
            self.model.set_prior(ws.address, float(speed))
            if str(dev.get("backend", "")).startswith("emulated"):
                self._configured[ws.address] = float(speed)
        total, used = dev.get("memory"), dev.get("memory_used")
        if isinstance(total, (int, float)) and isinstance(used, (int, float)):
            self.placer.set_memory_free(ws.address, total - used)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        if self.gather_log is not None:
            self.gather_log.worker_left(worker)
        if self.placer is None:
            return
        self.placer.remove_device(worker)
        self.model.forget_device(worker)
        self._configured.pop(worker, None)
        running = self._candidates()
        recs = {}
        for key in [k for k, a in self._pinned.items() if a == worker]:
            ts = scheduler.tasks.get(key)
            if ts is None:
                self._pinned.pop(key, None)
                continue
            if not running or ts.state not in _PLACEABLE:
                # held elsewhere, done or failed (or nobody left to pin to): drop the dead pin and
                # let Dask place it should it ever run again
                ts.worker_restrictions = set()
                self._pinned.pop(key, None)
                continue
            self._place(ts, self._job_devices(ts, running), {})
            self.replaced += 1
            if ts.state == "no-worker":
                recs[key] = "processing"
        if recs:
            scheduler.transitions(recs, stimulus_id=f"gdask-replace-{time.time()}")

    # -- placement ------------------------------------------------------------------------------
    def _candidates(self) -> list[str]:
        s = self.scheduler
        return sorted((ws.address for ws in s.running), key=lambda a: (str(s.workers[a].name), a))

    def update_graph(self, scheduler: Any, *, tasks: Any = (), **kwargs: Any) -> None:
        if self.placer is None:
            return
        stasks = scheduler.tasks
        pinned = self._pinned
        found = False
        for key in tasks:
            ts = stasks.get(key)
            if ts is not None and (key in pinned or is_gpu_task(ts)):
                found = True
                if (ts.state == "memory" and _block_index(key) is not None and ts.who_wants and ts.dependents
                        and not (ts.annotations or {}).get(protocol.ANN_JOB)):
                    # a cached block reused by a new graph: a candidate for rebalancing (a job's
                    # blocks stay on the devices granted to it)
                    self._families[key[0]].add(key)
        if not found:
            return  # plain Dask work: nothing to do
        # GPU tasks: device functions, and tasks fed by GPU tasks (fused block tasks, e.g. after
        # dask.array's optimizer, keep their GDataSet inputs); priorities order dependencies first
        level: dict[Any, int] = {}  # depth among this graph's GPU tasks
        gpu = []
        for ts in sorted((stasks[k] for k in tasks if k in stasks), key=lambda t: t.priority or ()):
            if not (is_gpu_task(ts) or ts.key in pinned
                    or any(d.key in level or d.key in pinned for d in ts.dependencies)):
                continue
            # data already in memory has no depth: a task's level must not depend on how the
            # scheduler's priorities of old and new keys happen to compare
            level[ts.key] = (1 + max((level[d.key] for d in ts.dependencies if d.key in level), default=-1)
                             if ts.state in _PLACEABLE else -1)
            if ts.state in _PLACEABLE:
                if (ts.worker_restrictions or ts.host_restrictions) and ts.key not in pinned:
                    continue  # the user's restrictions win
                gpu.append(ts)
        if not gpu:
            return
        running = self._candidates()
        if not running:
            return
        for ws in scheduler.running:
            self._refresh(ws)
        # level by level (all block tasks, then their combines, ...): a combine is placed knowing
        # when and where every one of its inputs is predicted to be ready
        # largest inputs first within a level (LPT list scheduling): a few big grouped tasks placed
        # in key order let a small one take the idle fast device that a big one needs
        gpu.sort(key=lambda t: (level[t.key], -sum(max(d.nbytes, 0) for d in t.dependencies)))
        sources: dict[str, list] = defaultdict(list)
        planned: dict[Any, tuple[str, float]] = {}  # key -> (address, predicted finish)
        for ts in gpu:
            if not ts.dependencies and _block_index(ts.key) is not None:
                sources[ts.key[0]].append(ts)
        for members in sources.values():
            members.sort(key=lambda t: t.key[1])
            sizes = [float(_arg_bytes(t) or 1) for t in members]
            devs = self._job_devices(members[0], running)
            mapping = proportional_mapping(sizes, self._share_speeds(devs))
            for t, d in zip(members, mapping):
                self._pin(t, devs[d], t.prefix.name, 0.0, strict=True)
                planned[t.key] = (devs[d], 0.0)
        confident = sum(self.model.measured(a) for a in running) >= min(2, len(running))
        for ts in gpu:
            if ts.key not in planned:
                devs = self._job_devices(ts, running)
                # a job's tasks are pinned strictly: stealing must not take them off its devices
                planned[ts.key] = self._place(ts, devs, planned, confident or devs is not running)

    def _share_speeds(self, devs: list[str]) -> list[float]:
        """The speeds to share a dataset's blocks among ``devs`` by: the configured ones when every
        device is emulated with a configured speed (see ``use_configured_speeds``), else as measured."""
        if devs and all(a in self._configured for a in devs):
            return [self._configured[a] for a in devs]
        return [self.model.speed(a) for a in devs]

    def _job_devices(self, ts: Any, running: list[str]) -> list[str]:
        """``running`` narrowed to the devices granted to the task's ``gdask.job``, if any."""
        jobs = self.scheduler.plugins.get(protocol.PLUGIN_JOBS) if self.scheduler is not None else None
        devices = jobs.devices_for(ts) if jobs is not None else None
        if not devices:
            return running
        return [a for a in running if a in devices] or running

    def _place(self, ts: Any, running: list[str], planned: dict[Any, tuple[str, float]],
               confident: bool = True) -> tuple[str, float]:
        local: dict[str, float] = defaultdict(float)
        nbytes = ready = 0.0
        for dts in ts.dependencies:
            who = dts.who_has
            if who:
                b = max(dts.nbytes, 0)
                for ws in who:
                    local[ws.address] += b
            else:  # not made yet: its kind's measured output, else (none measured) the data it carries
                b = self.model.output_nbytes(dts.prefix.name, default=-1.0)
                if b < 0:
                    b = float(_arg_bytes(dts))
                plan = planned.get(dts.key)
                addr = plan[0] if plan else self._pinned.get(dts.key)
                if plan:
                    ready = max(ready, plan[1])
                if addr is not None:
                    local[addr] += b
            nbytes += b
        kind = ts.prefix.name
        addr, _ = self.placer.choose(kind, nbytes, local, candidates=running, ready=ready)
        finish = self.placer.finish_time(addr, kind, nbytes, local, ready)
        # until durations are measured the choice is a guess: let work stealing correct it (not
        # for a job's tasks, which must stay on the job's devices)
        strict = confident and (self.model.known(kind) or bool((ts.annotations or {}).get(protocol.ANN_JOB)))
        self._pin(ts, addr, kind, nbytes, strict=strict)
        return addr, finish

    def _pin(self, ts: Any, addr: str, kind: str, nbytes: float, strict: bool = True) -> None:
        ts.worker_restrictions = {addr}
        ts.loose_restrictions = not strict
        self._pinned[ts.key] = addr
        self._meta[ts.key] = (kind, nbytes)
        self.placer.assign(ts.key, addr, self.model.predict(kind, nbytes, addr))
        self._stats[addr]["placed"] += 1

    # -- feedback -------------------------------------------------------------------------------
    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish not in _DONE:
            return
        if finish == "forgotten":
            self._pinned.pop(key, None)
            if self._families:
                i = _block_index(key)
                if i is not None and key[0] in self._families:
                    fam = self._families[key[0]]
                    fam.discard(key)
                    if not fam:
                        del self._families[key[0]]
        meta = self._meta.pop(key, None)
        if meta is None:
            return
        self.placer.finished(key)
        if start != "processing" or finish != "memory":
            return
        worker = kwargs.get("worker")
        seconds = _compute_seconds(kwargs.get("startstops"))
        if worker is None or seconds is None:
            return
        kind, nbytes = meta
        out = kwargs.get("nbytes")
        self._observe(kind, nbytes, worker, seconds, out if isinstance(out, int) else None)
        self._check_balance()

    def _observe(self, kind: str, nbytes: float, worker: str, seconds: float, out_nbytes: int | None = None) -> None:
        self.model.observe(kind, nbytes, worker, seconds, out_nbytes=out_nbytes)
        st = self._stats[worker]
        st["done"] += 1
        st["busy"] += seconds

    def _check_balance(self) -> None:
        """Start a rebalance of the cached blocks when no placed task is outstanding (at most one
        check per ``interval``); a check while a rebalance runs is planned when that one ends."""
        if self._balance_due():
            if self.rebalancing:  # its moves may have skipped blocks a task was about to read
                self._recheck = True
                return
            now = time.monotonic()
            if now - self._last_check >= self.interval:
                self._last_check = now
                self._rebalancing = asyncio.get_running_loop().create_task(self._rebalance())

    def _balance_due(self) -> bool:
        """Whether the cached blocks may be rebalanced now: rebalancing is on, there are cached
        blocks, and no placed task is outstanding."""
        return bool(self.rebalance and self._families and not self._meta)

    @property
    def rebalancing(self) -> bool:
        """Whether a rebalance is under way."""
        return self._rebalancing is not None and not self._rebalancing.done()

    def log_event(self, topic: Any, msg: Any) -> None:
        # a loop on the workers sends its passes' durations as an event of its last rank-0 step, ahead of its
        # task's end on the same stream: learned before the client sees the loop finish
        if topic == protocol.EVENT_OBSERVE and isinstance(msg, dict):
            self._handle_observe(msg.get("records"))

    def _handle_observe(self, records: list | None = None, **kwargs: Any) -> int:
        """Durations of device work that ran inside other tasks (a loop on the workers runs every
        iteration's block work in one long task), as ``(kind, input bytes, worker, seconds)``:
        learned as if those had been tasks, so speeds and rebalancing see that work too."""
        n = 0
        for kind, nbytes, worker, seconds in records or ():
            if worker in self.scheduler.workers and math.isfinite(seconds) and seconds >= 0:
                self._observe(str(kind), float(nbytes), worker, float(seconds))
                n += 1
        if n:
            self._check_balance()
        return n

    # -- rebalancing ----------------------------------------------------------------------------
    def plan_moves(self) -> list[tuple[Any, list[str], str]]:
        """Block moves ``(key, holders, target)`` that pay for themselves now (empty if none).

        A block held by several workers (a task elsewhere fetched it) counts on the holder where
        it balances best; after a move only ``target`` keeps it.
        """
        s = self.scheduler
        running = self._candidates()
        spb = self.model.seconds_per_byte()
        if len(running) < 2 or not spb or sum(self.model.measured(a) for a in running) < 2:
            return []
        index = {a: i for i, a in enumerate(running)}
        speeds = self._share_speeds(running)
        moves = []
        for keys in list(self._families.values()):
            single, multi = [], []
            for k in sorted(keys, key=lambda k: k[1]):
                ts = s.tasks.get(k)
                if ts is None or ts.state != "memory" or not ts.who_has or ts.nbytes <= 0:
                    continue
                holders = sorted((ws.address for ws in ts.who_has if ws.address in index), key=index.get)
                if holders:
                    (single if len(holders) == 1 else multi).append((ts, holders))
            if len(single) + len(multi) < 2:
                continue
            load = [0.0] * len(running)
            blocks, current = [], []
            for ts, holders in single:
                load[index[holders[0]]] += ts.nbytes
                blocks.append((ts, holders))
                current.append(index[holders[0]])
            for ts, holders in multi:  # replicated: on its home (its device holds it), else where it balances best
                home = _home(s, ts)
                h = index[home] if home in holders else min(
                    (index[a] for a in holders), key=lambda d: ((load[d] + ts.nbytes) / speeds[d], d))
                load[h] += ts.nbytes
                blocks.append((ts, holders))
                current.append(h)
            plan = rebalance_plan([t.nbytes * spb for t, _ in blocks], current, speeds,
                                  move_cost=[self.placer.latency + t.nbytes / self.placer.bandwidth
                                             for t, _ in blocks],
                                  horizon=self.horizon, min_gain=self.min_gain)
            final = plan or current
            for (ts, holders), p in zip(blocks, final):
                if plan is not None or len(holders) > 1:
                    target = running[p]
                    if holders != [target]:
                        moves.append((ts.key, holders, target))
        return moves

    async def _rebalance(self) -> None:
        """Move blocks by :meth:`plan_moves`; plan again when a check came meanwhile (and nothing
        placed is outstanding: else the check at the end of those tasks plans)."""
        while True:
            self._recheck = False
            await self._rebalance_once()
            if not (self._recheck and self._balance_due()):
                return
            self._last_check = time.monotonic()

    async def _rebalance_once(self) -> None:
        moves: list[tuple[Any, list[str], str]] = []  # what the except below asks about when planning failed
        try:
            moves = self.plan_moves()
            if not moves:
                return
            self.last_moves = [(str(k), h, t) for k, h, t in moves]
            by_dest: dict[str, list[tuple[Any, list[str]]]] = defaultdict(list)
            for key, holders, dst in moves:
                by_dest[dst].append((key, list(holders)))
            stim = f"gdask-rebalance-{time.time()}"
            done = await asyncio.gather(*[self._move_to(d, blocks, stim) for d, blocks in by_dest.items()])
            moved = sum(len(drop.get(None, ())) for drop in done)
            self.moves += moved
            logger.info("gdask: rebalanced %d blocks", moved)
        except Exception as e:  # noqa: BLE001 - a failed move leaves data where it was
            if self._moves_overtaken(moves):  # the scheduler closes, or a worker of the moves left: nothing lost
                logger.debug("gdask: block rebalancing stopped (%r): the scheduler closes or a worker left", e)
            else:
                logger.exception("gdask: block rebalancing failed")

    def _moves_overtaken(self, moves: list[tuple[Any, list[str], str]]) -> bool:
        """Whether a failed rebalance was overtaken by events (the scheduler closing, a worker of its
        moves gone) rather than a fault to report."""
        from distributed.core import Status

        s = self.scheduler
        if s.status in (Status.closing, Status.closed, Status.closing_gracefully, Status.failed):
            return True
        return any(a not in s.workers for _, holders, dst in moves for a in (*holders, dst))

    async def _move_to(self, dst: str, blocks: list[tuple[Any, list[str]]], stimulus_id: str) -> dict[Any, list]:
        """Copy ``blocks`` (``(key, holders)``) to ``dst``, then ask the other holders to drop their
        copies, in the same step as the new copies became known (no ``await`` in between), so a
        client asking where the blocks are (``block_groups``, the next iteration's graph) never sees a
        block on two workers, nor on a worker about to free it.

        The old holders are asked the way distributed's active memory manager asks (``remove-replicas``):
        the scheduler forgets their copies at once, and a holder where a task that reads the block is
        already queued keeps its copy and says so (the scheduler then counts it again). A ``free-keys``
        there would delete the block under that task. Returns ``{old holder: keys asked to drop}``,
        and under ``None`` the keys that moved."""
        s = self.scheduler
        fetch = {key: holders for key, holders in blocks if dst not in holders}
        failed = await s.gather_on_worker(dst, fetch) if fetch else set()
        # no await from here on: this runs in the step in which gather_on_worker recorded the copies
        drop: dict[Any, list] = defaultdict(list)
        for key, holders in blocks:
            ts = s.tasks.get(key)
            if key in failed or ts is None or ts.state != "memory" or ts.waiters:
                continue  # keep the old copies: a task is about to read them
            who = {ws.address for ws in ts.who_has or ()}
            if dst in who:
                if key in fetch:
                    drop[None].append(key)
                for h in holders:
                    if h != dst and h in who and h in s.workers:
                        drop[h].append(key)
        for addr, keys in drop.items():
            if addr is not None and keys:
                s.request_remove_replicas(addr, keys, stimulus_id=stimulus_id)
        residency = s.plugins.get(protocol.PLUGIN_RESIDENCY)
        if residency is not None:  # a block moved on purpose: its new holder is its home
            for key in drop.get(None, ()):
                residency.rehome(key, dst)
        return drop

    # -- RPC handlers ---------------------------------------------------------------------------
    def placement_stats(self) -> dict[str, dict[str, Any]]:
        """Per worker address: measured relative speed, tasks placed/done, busy and backlog seconds."""
        snap = self.placer.snapshot() if self.placer else {}
        rel = self.model.relative_speeds(list(snap))
        out = {}
        for addr, d in snap.items():
            st = self._stats.get(addr, {})
            out[addr] = {
                "speed_measured": round(rel[addr], 4) if self.model.measured(addr) else None,
                "placed": int(st.get("placed", 0)),
                "gpu_tasks_done": int(st.get("done", 0)),
                "gpu_busy_s": round(st.get("busy", 0.0), 4),
                "backlog_s": round(d["backlog"], 4),
            }
        return out

    def _handle_table(self, **kwargs: Any) -> list[dict[str, Any]]:
        from gdask.scheduling._registry import device_rows

        s = self.scheduler
        workers = {addr: {"name": ws.name, "nthreads": ws.nthreads, "metrics": ws.metrics}
                   for addr, ws in s.workers.items()}
        return device_rows(workers, self.placement_stats())

    def _handle_stats(self, **kwargs: Any) -> dict[str, Any]:
        return {"workers": self.placement_stats(), "moves": self.moves, "last_moves": self.last_moves,
                "replaced": self.replaced, "rebalancing": self.rebalancing,
                "pinned": len(self._pinned), "outstanding": self.placer.outstanding() if self.placer else 0}


def _home(scheduler: Any, ts: Any) -> str | None:
    """The address of the worker whose device holds ``ts``'s original (the window cache's residency
    plugin knows it), when it holds a replica; else None."""
    residency = scheduler.plugins.get(protocol.PLUGIN_RESIDENCY)
    ws = residency.home_of(ts) if residency is not None else None
    return None if ws is None else ws.address


def _streams(ws: Any) -> int:
    """Tasks a worker runs at once: its stream executor's current K, else its thread count."""
    k = ((ws.metrics or {}).get(protocol.METRIC_STREAMS) or {}).get("streams")
    return max(1, int(k)) if isinstance(k, (int, float)) and k >= 1 else max(1, ws.nthreads)
