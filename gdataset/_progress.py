"""Progress of iterative fits: one mechanism for every loop of gdask.

The iteration engine hands every finished iteration's record to a :class:`Progress` in the thread
that called the fit (also when the loop runs on the workers: their records travel back as events
and are shown from the calling thread, so output lands in the notebook cell running the fit).

What is shown follows scikit-learn's ``verbose`` levels:

* ``0``: nothing (the ``callback`` still gets every record);
* ``1``: a progress bar (``tqdm.auto``: a widget in Jupyter where ipywidgets is installed, text in
  terminals and elsewhere) and one summary line at the end;
* ``2`` and more: one line per iteration as well.

Config ``gdask.progress.bar: false`` replaces the bar by nothing (the lines and the summary stay),
e.g. for logs of batch jobs.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import time
from typing import Any, Callable

from dask.utils import format_bytes

from gdask import config

__all__ = ["Progress", "format_record", "summary"]

logger = logging.getLogger("gdask.progress")

#: record fields that are not shown in a generic line (bookkeeping or too long)
_HIDDEN = ("iteration", "mode", "line", "executed_by_prefix")
#: fields shown on the bar, in this order, when the record has them
_BAR_FIELDS = ("inertia", "loss", "change", "changed", "bytes_h2d")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def format_record(record: dict, desc: str = "fit") -> str:
    """One line for one iteration's record: its ``line`` if the algorithm wrote one, else its fields."""
    line = record.get("line")
    if line is not None:
        return str(line)
    fields = ", ".join(f"{k} {_fmt(v)}" for k, v in record.items()
                       if k not in _HIDDEN and not isinstance(v, (dict, list, tuple)))
    return f"{desc} iteration {record.get('iteration')}: {fields}"


def _bytes(n: float) -> str:
    return format_bytes(int(n))


def summary(records: list[dict], desc: str = "fit", elapsed: float | None = None) -> str:
    """The summary line of a fit from its records (iterations, time per iteration, last metric)."""
    if not records:
        return f"{desc}: no iteration finished"
    secs = sorted(float(r.get("seconds") or 0.0) for r in records)
    median = secs[len(secs) // 2]
    last = records[-1]
    parts = [f"{desc}: {last.get('iteration', len(records))} iterations"]
    if elapsed is not None:
        parts[0] += f" in {elapsed:.2f} s"
    parts.append(f"median {median * 1e3:.1f} ms/iteration")
    for k in ("inertia", "loss", "change"):
        if isinstance(last.get(k), (int, float)):
            parts.append(f"{k} {last[k]:.6g}")
            break
    moved = sum(float(r.get("bytes_h2d") or 0) for r in records)
    if moved:
        parts.append(f"{_bytes(moved)} moved to the devices")
    if last.get("mode"):
        parts.append(f"loop: {last['mode']}")
    return ", ".join(parts)


def _widgets_usable() -> bool:
    """Whether tqdm.auto would draw a widget: in an IPython kernel with ipywidgets installed."""
    return "ipykernel" in sys.modules and importlib.util.find_spec("ipywidgets") is not None


def _bar_enabled() -> bool:
    value = config.get("progress.bar", True)
    if isinstance(value, str):
        return value.lower() not in ("false", "0", "no", "off")
    return bool(value)


class Progress:
    """Shows and forwards per-iteration records.

    Parameters
    ----------
    verbose : bool or int
        0: nothing shown; 1 (``True``): a progress bar and a summary line at the end; 2 or more:
        also one line per iteration (the record's ``line``, or its fields).
    callback : callable, optional
        ``callback(record)`` for every record, in the thread that runs the fit: a dict with
        ``iteration`` (1-based), ``seconds`` (wall time of the iteration), ``mode`` (where the loop
        ran: ``"workers"``, ``"client"``, ``"stream"``) and what the algorithm reports: K-means
        ``inertia`` (or ``changed``: rows reassigned on a bounds pass) and ``center_shift``,
        logistic regression ``loss`` and ``grad_max``, :func:`gdask.iterate` ``change``,
        ``executed``, ``reused``; loops streaming through the window cache ``bytes_h2d`` (bytes
        copied to the devices in that iteration). An exception it raises stops the fit.
    total : int, optional
        Iterations at most (the bar's length).
    desc : str
        What is being fitted (the bar's label).
    bar : bool, optional
        Show a bar at ``verbose >= 1``; default config ``gdask.progress.bar`` (true).
    file : file-like, optional
        Where the bar and the lines go (default: the bar to ``sys.stderr`` as tqdm does, lines and
        summary to ``sys.stdout``).

    Attributes
    ----------
    records : list of dict
        Every record received.
    """

    def __init__(self, verbose: bool | int = 0, callback: Callable[[dict], Any] | None = None,
                 total: int | None = None, desc: str = "fit", *, bar: bool | None = None,
                 file: Any = None) -> None:
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        try:
            self.verbose = int(verbose or 0)
        except (TypeError, ValueError):
            raise TypeError(f"verbose must be a bool or an int (0, 1, 2), got {verbose!r}") from None
        self.callback = callback
        self.total = int(total) if total is not None else None
        self.desc = desc
        self.bar = _bar_enabled() if bar is None else bool(bar)
        self.file = file
        self.records: list[dict] = []
        self._tqdm: Any = None
        self._t0 = time.perf_counter()
        self._closed = False

    # -- output ---------------------------------------------------------------------------------
    def _out(self):
        return self.file if self.file is not None else sys.stdout

    def _write(self, text: str) -> None:
        if self._tqdm is not None:  # above the bar, without breaking it
            self._tqdm.write(text, file=self._out())
        else:
            print(text, file=self._out(), flush=True)

    def _make_bar(self) -> Any:
        try:
            # imported when a bar is first drawn: which tqdm depends on where the fit runs
            if _widgets_usable():  # Jupyter with ipywidgets: tqdm's widget bar
                from tqdm.auto import tqdm
            else:  # terminals, and notebooks without ipywidgets: a text bar (no "IProgress not found" warning)
                from tqdm.std import tqdm
        except ImportError:  # tqdm is a dependency; a broken install only loses the bar
            logger.warning("gdask: tqdm is not importable, progress bars are off (pip install tqdm)")
            self.bar = False
            return None
        kw: dict[str, Any] = {"total": self.total, "desc": self.desc, "unit": "it", "leave": True,
                              "dynamic_ncols": True}
        if self.file is not None:
            kw["file"] = self.file
        return tqdm(**kw)

    def _postfix(self, record: dict) -> dict[str, str]:
        post = {}
        for k in _BAR_FIELDS:
            v = record.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                post[k] = _bytes(v) if k == "bytes_h2d" else _fmt(v)
        secs = record.get("seconds")
        if isinstance(secs, (int, float)):
            post["ms/it"] = f"{secs * 1e3:.1f}"
        if record.get("mode"):
            post["loop"] = str(record["mode"])
        return post

    # -- the protocol the engine uses -----------------------------------------------------------
    def update(self, record: dict) -> None:
        """One finished iteration (called in the thread running the fit)."""
        self.records.append(record)
        if self.verbose >= 1 and self.bar:
            if self._tqdm is None:
                self._tqdm = self._make_bar()
            if self._tqdm is not None:
                self._tqdm.set_postfix(self._postfix(record), refresh=False)
                self._tqdm.update(1)
        if self.verbose >= 2:
            self._write(format_record(record, self.desc))
        if self.callback is not None:
            self.callback(record)

    def close(self) -> None:
        """The fit ended (also on error): close the bar and, at ``verbose >= 1``, print the summary."""
        if self._closed:
            return
        self._closed = True
        bar, self._tqdm = self._tqdm, None
        if bar is not None:
            bar.close()
        if self.verbose >= 1:
            print(summary(self.records, self.desc, time.perf_counter() - self._t0), file=self._out(), flush=True)
