"""Plots of fits, devices and benchmarks (matplotlib, the optional ``plot`` extra).

Every function returns a :class:`matplotlib.figure.Figure` (shown inline in Jupyter; ``fig.savefig``
elsewhere) and draws into ``ax`` / ``axes`` when given.

* :func:`history`: per-iteration time and every figure a fit records (inertia, rows changed, loss,
  change, bytes moved, ...: a panel each) of ``km``, ``km.history_``, ``gdask.iterate``'s result;
* :func:`device_load`: per-device busy share over time (the dashboard's samples, from the scheduler,
  with one taken when it is called, so a fit that just ended is in it);
* :func:`window`: window-cache hit rate and bytes moved per pass;
* :func:`load_balance`, :func:`window_benchmark`, :func:`sharing`: the figures of
  ``benchmarks/load_balance.py``, ``window.py`` and ``sharing.py`` (their ``--plot out.png``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["device_load", "history", "load_balance", "save", "sharing", "window", "window_benchmark"]

#: record fields that are bookkeeping, not figures of the fit (not drawn by :func:`history`)
_NOT_FIGURES = ("iteration", "seconds", "mode", "line", "converged")
#: the fits' main figures, drawn first (then the others in the order they appear)
_MAIN_FIGURES = ("inertia", "changed", "loss", "change", "validation_score")
#: figures drawn on a log scale when all positive (they shrink by orders of magnitude)
_LOG_FIGURES = ("loss", "change", "center_shift", "grad_max")


def _pyplot():
    try:
        import matplotlib

        if not _interactive():
            matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("gdask.plot needs matplotlib: pip install 'gdask[plot]' (or pip install matplotlib)"
                          ) from None
    return plt


def _interactive() -> bool:
    import sys

    return "ipykernel" in sys.modules or "IPython" in sys.modules


def _two_axes(axes: Any) -> tuple[Any, Any]:
    """The figure and a pair of stacked axes sharing x (new ones unless ``axes`` is given)."""
    if axes is not None:
        return axes[0].figure, axes
    return _pyplot().subplots(2, 1, figsize=(6, 4.5), sharex=True, constrained_layout=True)


def _records(fit: Any) -> list[dict]:
    """Per-iteration records from an estimator (``history_``), a result (``history``) or a list."""
    for attr in ("history_", "history"):
        h = getattr(fit, attr, None)
        if h is not None:
            return list(h)
    if isinstance(fit, Sequence) and all(isinstance(r, Mapping) for r in fit):
        return list(fit)
    raise TypeError(f"expected a fitted gdask estimator (history_), an IterateResult or a list of per-iteration "
                    f"records, got {type(fit).__name__}")


def _figures(recs: list[dict]) -> list[str]:
    """The numeric fields of the records (bookkeeping aside): the main figures first, then the
    others in the order they first appear."""
    out: list[str] = []
    for r in recs:
        for k, v in r.items():
            if k not in _NOT_FIGURES and k not in out and isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append(k)
    return sorted(out, key=lambda k: (_MAIN_FIGURES.index(k) if k in _MAIN_FIGURES else len(_MAIN_FIGURES)))


def _figure_panel(ax: Any, name: str, it: list, recs: list[dict]) -> None:
    pts = [(i, float(r[name])) for i, r in zip(it, recs)
           if isinstance(r.get(name), (int, float)) and not isinstance(r.get(name), bool)]
    ys = [p[1] for p in pts]
    label = name
    if "bytes" in name:  # bytes_h2d, h2d_bytes, channel_bytes, bytes_reused
        ys = [y / 2**20 for y in ys]
        label = f"{name} (MiB)"
    ax.plot([p[0] for p in pts], ys, marker="o", ms=3, color="#e45756")
    ax.set_ylabel(label, fontsize=8)
    if name in _LOG_FIGURES and ys and all(y > 0 for y in ys):
        ax.set_yscale("log")


def history(fit: Any, axes: Sequence[Any] | None = None, title: str | None = None):
    """Time per iteration (bars) and, one panel each, every figure the fit recorded per iteration.

    The figures are the records' numeric fields: K-means ``inertia`` (Lloyd passes), ``changed``
    (rows reassigned on a bounds pass) and ``center_shift``; logistic regression ``loss`` and
    ``grad_max``; :func:`gdask.iterate` ``change``, tasks ``executed`` / ``reused``; ``bytes_h2d``
    of a fit that streamed (in MiB); and any other a ``callback`` received. A figure recorded on
    some iterations only (``inertia`` then ``changed``) is drawn where it was recorded.

    Parameters
    ----------
    fit : estimator, IterateResult or list of dict
        ``KMeans`` / ``LogisticRegression`` after ``fit`` (their ``history_``), the result of
        ``gdask.iterate``, or the records a ``callback`` received.
    axes : sequence of matplotlib Axes, optional
        One for the time and one per figure (default: new ones, stacked).
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure
    """
    recs = _records(fit)
    if not recs:
        raise ValueError("the fit has no per-iteration records (did it run?)")
    names = _figures(recs)
    if axes is None:
        fig, axes = _pyplot().subplots(1 + len(names), 1, figsize=(6, 1.9 + 1.5 * len(names)), sharex=True,
                                       constrained_layout=True, squeeze=False)
        axes = [a[0] for a in axes]
    else:
        axes = list(axes)
        if len(axes) != 1 + len(names):
            raise ValueError(f"history needs {1 + len(names)} axes (the time, then {', '.join(names) or 'none'}), "
                             f"got {len(axes)}")
        fig = axes[0].figure
    it = [r.get("iteration", i + 1) for i, r in enumerate(recs)]
    axes[0].bar(it, [1e3 * float(r.get("seconds") or 0.0) for r in recs], color="#4c78a8")
    axes[0].set_ylabel("ms per iteration", fontsize=8)
    modes = sorted({str(r["mode"]) for r in recs if r.get("mode")})
    name = type(fit).__name__ if hasattr(fit, "history_") else "fit"
    axes[0].set_title(title or (f"{name} (loop: {', '.join(modes)})" if modes else name), fontsize=10)
    for ax, figure in zip(axes[1:], names):
        _figure_panel(ax, figure, it, recs)
    axes[-1].set_xlabel("iteration")
    return fig


def _load_history(dask_scheduler: Any = None, fresh: dict | None = None) -> dict[str, list[tuple[float, float]]]:
    """(on the scheduler) Busy share per device over time from the dashboard's samples; with
    ``fresh`` (``{worker address: its gdask metrics}``) one more sample of those first."""
    from gdask import protocol

    plugin = dask_scheduler.plugins.get(protocol.PLUGIN_DASHBOARD)
    if plugin is None:
        return {}
    if fresh:
        plugin.sample(fresh)
    out = {}
    for addr, h in plugin.history.items():
        ws = dask_scheduler.workers.get(addr)
        if ws is None:
            continue
        streams = ((ws.metrics or {}).get(protocol.METRIC_STREAMS) or {}).get("streams") or 1
        times = [p[0] for p in list(h)[1:]]
        out[str(ws.name)] = list(zip(times, plugin.busy_series(addr, float(streams))))
    return out


def _gdask_metrics(dask_worker: Any = None) -> dict[str, Any]:
    """(on a worker) Its gdask metrics now (what its next heartbeat would carry)."""
    from gdask import protocol

    names = (protocol.METRIC_DEVICE, protocol.METRIC_STREAMS, protocol.METRIC_WINDOW)
    return {n: dask_worker.metrics[n](dask_worker) for n in names if n in dask_worker.metrics}


def _sampled_now(client: Any) -> dict[str, list[tuple[float, float]]]:
    """The dashboard's samples with one more taken now from every worker: the workers' counters
    reach the scheduler with their heartbeats (every second or more), so a fit that just ended would
    be missing. Bounded by config ``gdask.timeouts.metrics``."""
    from gdask import config
    from gdask._compat import run_sync

    timeout = float(config.get("timeouts.metrics", 10))
    try:
        fresh = run_sync(client, _gdask_metrics, timeout=timeout)
    except TimeoutError as e:
        raise TimeoutError(f"device_load: the workers did not send their device counters within {timeout:g} s "
                           "(config gdask.timeouts.metrics)") from e
    return client.run_on_scheduler(_load_history, fresh={a: m for a, m in fresh.items() if m})


def device_load(source: Any = None, ax: Any = None):
    """Busy share of every device over time (the last five minutes the dashboard sampled, and now).

    Parameters
    ----------
    source : distributed.Client or dict, optional
        A client of a gdask cluster (default: the current client): the dashboard's samples, plus
        one taken from the workers when called (so a fit that just ended is drawn); or
        ``{device name: [(time, busy share), ...]}``.
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib.figure.Figure
    """
    if source is None or hasattr(source, "run_on_scheduler"):
        if source is None:
            from distributed import default_client

            source = default_client()
        series = _sampled_now(source)
    else:
        series = dict(source)
    plt = _pyplot()
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3), constrained_layout=True)
    else:
        fig = ax.figure
    t0 = min((p[0] for s in series.values() for p in s), default=0.0)
    for name, s in sorted(series.items()):
        ax.plot([p[0] - t0 for p in s], [100 * p[1] for p in s], label=f"device {name}")
    ax.set_xlabel("seconds")
    ax.set_ylabel("busy %")
    ax.set_ylim(0, 105)
    if series:
        ax.legend(fontsize=8, loc="upper right")
    return fig


def window(passes: Sequence[Mapping[str, Any]], axes: Sequence[Any] | None = None):
    """Window-cache hit rate and bytes copied to the devices per pass.

    Parameters
    ----------
    passes : list of dict
        One dict per pass with ``hit_rate`` and/or ``bytes_h2d``: e.g. ``window_cache.stats(client,
        reset=True)`` after each pass, or the ``history_`` of a fit that streamed (its records carry
        ``bytes_h2d``).
    axes : pair of matplotlib Axes, optional

    Returns
    -------
    matplotlib.figure.Figure
    """
    passes = list(passes)
    if not passes:
        raise ValueError("no passes to plot")
    fig, axes = _two_axes(axes)
    x = list(range(1, len(passes) + 1))
    hr = [p.get("hit_rate") for p in passes]
    if any(h is not None for h in hr):
        axes[0].plot([i for i, h in zip(x, hr) if h is not None], [100 * h for h in hr if h is not None],
                     marker="o", color="#4c78a8")
    axes[0].set_ylabel("hit rate %")
    axes[0].set_ylim(0, 105)
    axes[1].bar(x, [float(p.get("bytes_h2d") or 0) / 2**20 for p in passes], color="#f58518")
    axes[1].set_ylabel("MiB to the devices")
    axes[1].set_xlabel("pass")
    return fig


# -- benchmark figures ------------------------------------------------------------------------------
def load_balance(result: Mapping[str, Any]):
    """``benchmarks/load_balance.py``'s figure: per workload, makespan / ideal per iteration for
    gdask's placement and stock Dask, and the blocks per device at the end."""
    plt = _pyplot()
    workloads = [w for w in result["gdask"] if isinstance(result["gdask"][w], dict) and "iterations" in
                 result["gdask"][w]]
    fig, axes = plt.subplots(2, max(1, len(workloads)), figsize=(5 * max(1, len(workloads)), 6),
                             constrained_layout=True, squeeze=False)
    for j, w in enumerate(workloads):
        g, s = result["gdask"][w], result["stock"][w]
        ax = axes[0][j]
        for name, r, c in (("gdask", g, "#4c78a8"), ("stock Dask", s, "#e45756")):
            ax.plot(range(1, len(r["iterations"]) + 1), [i["ratio"] for i in r["iterations"]], marker="o",
                    color=c, label=name)
        ax.axhline(1.0, color="#888", lw=0.8, ls="--")
        ax.axhline(1.1, color="#54a24b", lw=0.8, ls=":", label="bar 1.10x")
        ax.set_title(f"{w}: makespan / ideal", fontsize=10)
        ax.set_xlabel("iteration")
        ax.legend(fontsize=8)
        ax = axes[1][j]
        names = sorted(set(g["blocks_end"]) | set(s["blocks_start"]), key=str)
        pos = range(len(names))
        ax.bar([p - 0.2 for p in pos], [g["blocks_end"].get(n, 0) for n in names], width=0.4, color="#4c78a8",
               label="gdask (end)")
        ax.bar([p + 0.2 for p in pos], [s["blocks_start"].get(n, 0) for n in names], width=0.4, color="#e45756",
               label="stock")
        ax.set_xticks(list(pos), [f"dev {n}" for n in names])
        ax.set_ylabel("blocks")
        ax.legend(fontsize=8)
    speeds = (result.get("args") or {}).get("speeds")
    if speeds:
        fig.suptitle(f"load balance, device speeds {speeds} ({result.get('device', '')})", fontsize=11)
    return fig


def window_benchmark(result: Mapping[str, Any]):
    """``benchmarks/window.py``'s figure: hit rate, bytes moved per pass and time per iteration of
    each configuration (sliding window, LRU, spill, all fits, optimal)."""
    plt = _pyplot()
    rows = list(result["results"])
    names = [r["name"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), constrained_layout=True)
    y = range(len(rows))
    axes[0].barh(y, [100 * r["hit_rate"] for r in rows], color="#4c78a8")
    axes[0].set_xlabel("hit rate %")
    axes[0].set_yticks(list(y), names, fontsize=8)
    axes[1].barh(y, [100 * r["moved_per_pass"] for r in rows], color="#f58518")
    axes[1].set_xlabel("data moved per pass, % of the data")
    axes[1].set_yticks(list(y), [""] * len(rows))
    axes[2].barh(y, [r["ms_per_iter"] for r in rows], color=["#bbb" if not r.get("measured", True) else "#54a24b"
                                                             for r in rows])
    axes[2].set_xlabel("ms per iteration (grey: modelled)")
    axes[2].set_yticks(list(y), [""] * len(rows))
    for ax in axes:
        ax.invert_yaxis()
    fig.suptitle(f"data = {result.get('data_bytes', 0) / 2**20:.0f} MiB over {result.get('devices')} "
                 f"{result.get('backend')} devices of {result.get('device_memory', 0) / 2**20:.0f} MiB", fontsize=11)
    return fig


def sharing(result: Mapping[str, Any]):
    """``benchmarks/sharing.py``'s figure: mean job completion time, makespan and device
    utilisation per sharing policy on the emulated cluster."""
    plt = _pyplot()
    rows = list(result.get("results") or [])
    if not rows:
        raise ValueError("the sharing result has no emulated-cluster runs (run it with the emulated world)")
    pol = [r["policy"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5), constrained_layout=True)
    colors = ["#888", "#f58518", "#4c78a8", "#54a24b"][:len(rows)]
    axes[0].bar(pol, [r["mean_jct"] for r in rows], color=colors)
    axes[0].set_ylabel("mean job completion time, s")
    axes[1].bar(pol, [r["makespan"] for r in rows], color=colors)
    axes[1].set_ylabel("makespan, s")
    axes[2].bar(pol, [100 * r["utilisation"] for r in rows], color=colors)
    axes[2].set_ylabel("device utilisation %")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"{len(result.get('jobs') or [])} jobs on 4 emulated devices", fontsize=11)
    return fig


def save(fig: Any, path: str) -> str:
    """Write ``fig`` to ``path`` (PNG, SVG, PDF by extension), close it and return the path."""
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path
