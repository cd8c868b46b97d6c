"""Contention worlds for scoring gdask's interference model and sharing policies on contention they
were not written for.

A *world* says how much a kernel of one kind slows down beside kernels of other kinds:
``slowdown(own kind, other kinds) -> float``. Three kinds of world:

* ``stated``: the emulator's own contention model (``ContentionModel``), whose terms are the
  interference model's features: the control (a fit there measures only the learning);
* ``roofline``: a synthetic world whose form is outside the model's features: a kernel runs at the
  slower of its compute share (processor sharing once the device is full; kernels below a compute
  threshold barely notice) and its memory time (an M/M/1 queue on the total bandwidth, capped at
  saturation), and when the co-runners' working sets exceed the cache, cache-resident kernels spill
  extra traffic to memory (a threshold);
* ``real``: slowdowns measured on this machine (:mod:`_corun`), looked up by co-location.

:func:`score` trains an :class:`gdask.scheduling.InterferenceModel` on a seeded half of the
co-locations (the model sees each kind's profile and the measured slowdowns of those co-locations)
and gives its mean absolute percentage error on the other half, co-locations it sees for the first
time, next to trivial predictors. :func:`simulate` runs a job mix through the sharing policies
(event by event; a job progresses at ``1 / slowdown`` of its current co-location in the world).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ROOFLINE_KINDS", "Roofline", "TableWorld", "score", "simulate", "split"]

#: kind -> compute and bandwidth fractions alone (as the sharing benchmark's emulated kinds), working
#: set (fraction of the cache) and the extra bandwidth it needs once its working set no longer fits
ROOFLINE_KINDS: dict[str, dict[str, float]] = {
    "kmeans": {"compute": 0.30, "bandwidth": 0.15, "working_set": 0.30, "spill": 0.15},
    "logistic": {"compute": 0.20, "bandwidth": 0.22, "working_set": 0.20, "spill": 0.10},
    "pagerank": {"compute": 0.06, "bandwidth": 0.36, "working_set": 0.60, "spill": 0.20},
    "compute-bound": {"compute": 0.45, "bandwidth": 0.04, "working_set": 0.50, "spill": 0.30},
    "bandwidth-bound": {"compute": 0.04, "bandwidth": 0.45, "working_set": 0.10, "spill": 0.0},
}


@dataclass(frozen=True)
class Roofline:
    """The roofline / queueing world with thresholds (see the module docstring).

    Parameters
    ----------
    kinds : dict
        kind -> ``compute``, ``bandwidth``, ``working_set``, ``spill``.
    compute_threshold : float
        Kernels using less compute than this alone are latency-bound: compute sharing stretches
        them by only ``latency_share`` of the over-subscription.
    rho_max : float
        Memory utilisation at which the queue's growth is capped (beyond it the saturation factor
        ``total bandwidth`` takes over).
    """

    kinds: dict
    compute_threshold: float = 0.15
    latency_share: float = 0.2
    rho_max: float = 0.8

    def slowdown(self, own: str, others: Sequence[str]) -> float:
        ks = [self.kinds[own]] + [self.kinds[o] for o in others]
        me = ks[0]
        thrash = sum(k["working_set"] for k in ks) > 1.0  # the cache no longer holds every working set
        b_eff = [k["bandwidth"] + (k["spill"] if thrash else 0.0) for k in ks]
        total_b = sum(b_eff)
        total_c = sum(k["compute"] for k in ks)
        # memory: M/M/1 waiting time at the total utilisation (capped), over the kernel's own alone,
        # times the saturation factor; it weighs on the kernel's memory-bound share only
        rho = min(total_b, self.rho_max)
        rho0 = min(me["bandwidth"], self.rho_max)
        queue = (1 - rho0) / (1 - rho) * max(1.0, total_b)
        mem_share = b_eff[0] / (b_eff[0] + me["compute"]) if b_eff[0] + me["compute"] > 0 else 0.0
        memory = 1 + mem_share * (queue - 1)
        # compute: processor sharing once the device is full; latency-bound kernels barely notice
        over = max(1.0, total_c)
        compute = over if me["compute"] >= self.compute_threshold else 1 + self.latency_share * (over - 1)
        return max(compute, memory)  # roofline: the binding resource decides


class TableWorld:
    """A world given by a table of slowdowns ``{(colocation, own kind): slowdown}`` (measured).

    Raises
    ------
    KeyError
        From :meth:`slowdown`, for a co-location the table does not have (it was not measured).
    """

    def __init__(self, table: dict[tuple[tuple[str, ...], str], float]) -> None:
        self.table = dict(table)

    def slowdown(self, own: str, others: Sequence[str]) -> float:
        if not others:
            return 1.0
        col = tuple(sorted([own, *others]))
        try:
            return self.table[(col, own)]
        except KeyError:
            raise KeyError(f"co-location {col} was not measured (kind {own!r}): measure larger co-locations "
                           "or ask for larger shares so that fewer jobs share a device") from None


def observations(cols: Sequence[tuple[str, ...]], world: Callable[[str, Sequence[str]], float]):
    """``(colocation, own kind, slowdown)`` for each distinct kind of each co-location."""
    out = []
    for col in cols:
        for own in sorted(set(col)):
            rest = list(col)
            rest.remove(own)
            out.append((col, own, world(own, rest)))
    return out


def split(cols: Sequence[tuple[str, ...]], seed: int = 0) -> tuple[list, list]:
    """Seeded half / half split of co-locations (train, test), each size split on its own so both
    halves hold pairs and triples."""
    rng = random.Random(seed)
    train, test = [], []
    for n in sorted({len(c) for c in cols}):
        group = [c for c in cols if len(c) == n]
        rng.shuffle(group)
        half = (len(group) + 1) // 2
        train += group[:half]
        test += group[half:]
    return train, test


def _mape(pairs) -> float:
    pairs = list(pairs)
    return float(statistics.mean(abs(p - y) / y for p, y in pairs)) if pairs else math.nan


def score(train_obs, test_obs, profiles: dict[str, Any], model_factory: Callable[[], Any]) -> dict[str, Any]:
    """Train an interference model on ``train_obs`` and score it on ``test_obs``.

    Parameters
    ----------
    train_obs : list of (colocation, own kind, slowdown)
        What the model learns from (repeated measurements of a co-location are separate items).
    test_obs : list of (colocation, own kind, slowdown)
        Co-locations the model never saw.
    profiles : dict
        kind -> ``JobProfile``.
    model_factory : callable
        Returns a fresh ``InterferenceModel``.

    Returns
    -------
    dict
        ``mape_new`` (unseen co-locations, by the predictor the model chose: ``predictor``),
        ``mape_linear`` (its linear predictor's, used or not), ``mape_train`` (in-sample), the
        model's prequential errors ``online_errors`` and its errors on co-locations left out of its fit
        ``held_out_errors`` (what chose ``predictor``), and the MAPE on the unseen co-locations of
        two trivial predictors: ``mape_none`` (slowdown 1, no interference) and
        ``mape_mean_by_size`` (the mean training slowdown of co-locations of the same size).
    """
    model = model_factory()

    def others(col, own):
        rest = list(col)
        rest.remove(own)
        return [profiles[o] for o in rest]

    for col, own, y in train_obs:
        model.observe(profiles[own], others(col, own), y)
    by_size: dict[int, list[float]] = {}
    for col, _, y in train_obs:
        by_size.setdefault(len(col), []).append(y)
    mean_size = {n: statistics.mean(v) for n, v in by_size.items()}
    pred = [(model.predict(profiles[own], others(col, own)), y) for col, own, y in test_obs]
    linear = [(model.predict_with("linear", profiles[own], others(col, own)), y) for col, own, y in test_obs]
    return {
        "train_observations": len(train_obs), "test_observations": len(test_obs),
        "mape_new": _mape(pred), "mape_linear": _mape(linear), "predictor": model.predictor,
        "online_errors": model.online_errors(), "held_out_errors": model.held_out_errors(),
        "mape_train": _mape((model.predict(profiles[own], others(col, own)), y) for col, own, y in train_obs),
        "mape_none": _mape((1.0, y) for _, _, y in test_obs),
        "mape_mean_by_size": _mape((mean_size.get(len(col), 1.0), y) for col, _, y in test_obs),
        "coefficients": model.coefficients(),
        "predictions": [{"colocation": list(col), "kind": own, "measured": y, "predicted": p}
                        for (col, own, y), (p, _) in zip(test_obs, pred)],
        "model": model,
    }


# -- job mix simulation ---------------------------------------------------------------------------
def make_mix(kinds: Sequence[str], n: int, seed: int, work: tuple[float, float], gap: float) -> list[dict]:
    """``n`` jobs of random kinds (each kind at least once when ``n`` allows), solo run times
    uniform in ``work`` (s), Poisson arrivals with mean gap ``gap`` (s)."""
    rng = random.Random(seed)
    kinds = list(kinds)
    jobs, t = [], 0.0
    for i in range(n):
        kind = kinds[i] if i < len(kinds) else rng.choice(kinds)
        jobs.append({"name": f"{kind}-{i}", "kind": kind, "arrival": t, "work": rng.uniform(*work)})
        t += rng.expovariate(1.0 / gap)
    return jobs


def simulate(jobs: Sequence[dict], policy: Callable, world: Callable[[str, Sequence[str]], float], *,
             devices: int, requests: dict[str, Any], model: Any = None, memory: str = "16GiB") -> dict[str, Any]:
    """Run ``jobs`` through a placement ``policy`` (``place`` / ``first_fit`` / ``whole_device``)
    on ``devices`` identical devices of ``world``; returns mean JCT, makespan, mean wait.

    Jobs queue in arrival order; whenever a job arrives or finishes, each queued job (in order) is
    offered to the policy and started on the device it picks (if any). A running job progresses at
    ``1 / world(kind, kinds of the other jobs on its device)`` of its solo speed.

    Parameters
    ----------
    requests : dict
        kind -> ``JobRequest`` template (share, memory, profile); each job gets a copy named after it.
    """
    from gdask.scheduling import DeviceCapacity, JobRequest, ShareLedger

    ledger = ShareLedger([DeviceCapacity(d, memory) for d in range(devices)])
    pending = sorted(jobs, key=lambda j: j["arrival"])
    queue: list[dict] = []
    running: dict[str, dict] = {}  # name -> {"job", "device", "left"}
    done: dict[str, dict] = {}
    now = 0.0
    i = 0

    def rates() -> dict[str, float]:
        out = {}
        for name, r in running.items():
            others = [running[o]["job"]["kind"] for o in running if o != name and running[o]["device"] == r["device"]]
            out[name] = 1.0 / world(r["job"]["kind"], others)
        return out

    def dispatch() -> None:
        for job in list(queue):
            t = requests[job["kind"]]
            req = JobRequest(job["name"], gpu=t.gpu, memory=t.memory, profile=t.profile)
            decision = policy(req, None, ledger, model)
            if decision.device is None:
                continue
            ledger.grant(req, decision.device)
            queue.remove(job)
            running[job["name"]] = {"job": job, "device": decision.device, "left": job["work"], "start": now}

    while pending[i:] or queue or running:
        r = rates()
        t_finish = min((now + x["left"] / r[n] for n, x in running.items()), default=math.inf)
        t_arrive = pending[i]["arrival"] if i < len(pending) else math.inf
        t_next = min(t_finish, t_arrive)
        if math.isinf(t_next):
            raise RuntimeError(f"jobs {[j['name'] for j in queue]} can never start: no device can take them")
        for n, x in running.items():
            x["left"] -= (t_next - now) * r[n]
        now = t_next
        for n in [n for n, x in running.items() if x["left"] <= 1e-9]:
            x = running.pop(n)
            ledger.release(n)
            done[n] = {"arrival": x["job"]["arrival"], "start": x["start"], "finish": now, "device": x["device"]}
        while i < len(pending) and pending[i]["arrival"] <= now + 1e-12:
            queue.append(pending[i])
            i += 1
        dispatch()
    jct = [d["finish"] - d["arrival"] for d in done.values()]
    return {"mean_jct": statistics.mean(jct),
            "makespan": max(d["finish"] for d in done.values()) - pending[0]["arrival"],
            "mean_wait": statistics.mean(d["start"] - d["arrival"] for d in done.values())}
