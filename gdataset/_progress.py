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

How a bar ends says how the fit ended (:meth:`Progress.close`):

* converged (told by ``close(converged=True)`` or a record's ``converged: True``; or the loop ended
  before ``total`` without an error: every gdask loop stops early only when it met its stopping
  criterion, as scikit-learn's estimators do): the bar is filled, reads "converged at iteration n",
  and is green (the widget's ``success`` style; a green bar in a colour terminal);
* failed (an exception ended the fit, or ``converged=False``: ``max_iter`` reached where
  scikit-learn would warn that the fit did not converge): red (``danger``), with what happened;
* otherwise (``max_iter`` reached, nothing said about convergence): the full bar, as tqdm leaves it.

In Jupyter the widget's saved text (what a notebook file keeps) is updated to the bar's last state.
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
_HIDDEN = ("iteration", "mode", "line", "executed_by_prefix", "converged")
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


def summary(records: list[dict], desc: str = "fit", elapsed: float | None = None, *,
            setup: float | None = None, outcome: str | None = None) -> str:
    """The summary line of a fit from its records (iterations, time per iteration, last metric).

    Parameters
    ----------
    records : list of dict
    desc : str
    elapsed : float, optional
        Seconds from the fit's start to its end.
    setup : float, optional
        Seconds before the first iteration started (persisting, compiling, starting the loop's
        tasks): said apart when it is a noticeable part of ``elapsed``.
    outcome : str, optional
        How the fit ended (e.g. "converged"), shown after the iteration count.
    """
    if not records:
        return f"{desc}: no iteration finished" + (f" ({outcome})" if outcome else "")
    secs = sorted(float(r.get("seconds") or 0.0) for r in records)
    median = secs[len(secs) // 2]
    last = records[-1]
    parts = [f"{desc}: {last.get('iteration', len(records))} iterations"]
    if elapsed is not None:
        parts[0] += f" in {elapsed:.2f} s"
        if setup is not None and setup >= max(0.5, 0.2 * elapsed):
            parts[0] += f" ({setup:.2f} s of it before the first iteration: data placement, compiling, starting)"
    if outcome:
        parts[0] += f", {outcome}"
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


#: ``close(error=...)`` not given: the exception propagating through the caller's ``finally`` is the fit's
_UNSET: Any = object()


def _display_widget(bar: Any) -> Any:
    """Show a notebook bar's widget with a display id (so its saved text can be updated at the end)."""
    from IPython.display import display

    return display(bar.container, display_id=True)


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
        copied to the devices in that iteration); ``converged`` (bool) where the loop says whether
        it met its stopping criterion. An exception it raises stops the fit.
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
    outcome : str or None
        After :meth:`close`: ``"converged"``, ``"not converged"``, ``"failed"`` or ``"finished"``
        (``total`` iterations, nothing said about convergence).
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
        self.outcome: str | None = None
        self._tqdm: Any = None
        self._handle: Any = None  # the notebook display of the widget bar
        self._t0 = time.perf_counter()
        self._setup: float | None = None  # seconds before the first iteration started
        self._converged: bool | None = None  # what the records said
        # an exception being handled when the fit started is not the fit's (a fit run in an ``except``)
        self._outer_error = sys.exc_info()[1]
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
        widget = _widgets_usable()
        try:
            if widget:  # Jupyter with ipywidgets: tqdm's widget bar
                from tqdm.notebook import tqdm
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
        if widget:
            kw["display"] = False  # shown here, with a display id
        bar = tqdm(**kw)
        if widget:
            self._handle = _display_widget(bar)
        return bar

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
        if self._setup is None:
            secs = record.get("seconds")
            secs = float(secs) if isinstance(secs, (int, float)) else 0.0
            self._setup = max(0.0, time.perf_counter() - secs - self._t0)
        if isinstance(record.get("converged"), bool):
            self._converged = record["converged"]
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

    def close(self, converged: bool | None = None, error: BaseException | None = _UNSET) -> None:
        """The fit ended (also on error): end the bar as the fit ended and, at ``verbose >= 1``,
        print the summary. Only the first call counts.

        Parameters
        ----------
        converged : bool, optional
            Whether the fit met its stopping criterion (default: what the records said; else a
            loop that ended before ``total`` without an error converged). ``False`` where
            scikit-learn would warn that the fit did not converge: the bar ends red.
        error : BaseException or None, optional
            The exception that ended the fit, or None when it ended normally. Not given: the
            exception propagating while ``close`` runs (``close()`` in a ``finally`` clause), if
            it arose during the fit.
        """
        if self._closed:
            return
        self._closed = True
        if error is _UNSET:
            error = sys.exc_info()[1]
            if error is self._outer_error:
                error = None
        self.outcome, label, style = self._ending(converged, error)
        bar, self._tqdm = self._tqdm, None
        if bar is not None:
            self._end_bar(bar, label, style)
        if self.verbose >= 1:
            said = {"converged": label, "not converged": label, "failed": label}.get(self.outcome)
            print(summary(self.records, self.desc, time.perf_counter() - self._t0, setup=self._setup, outcome=said),
                  file=self._out(), flush=True)

    def _ending(self, converged: bool | None, error: BaseException | None) -> tuple[str, str | None, str | None]:
        """``(outcome, label, style)``: how the fit ended, the bar's words for it and its style."""
        done = int(self.records[-1].get("iteration", len(self.records))) if self.records else 0
        if error is not None:
            what = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
            return "failed", f"{what} in iteration {done + 1} ({type(error).__name__})", "danger"
        if converged is None:
            converged = self._converged
        if converged is False:
            return "not converged", f"did not converge in {done} iterations", "danger"
        if converged or (self.total is not None and done < self.total):
            return "converged", f"converged at iteration {done}", "success"
        return "finished", None, None

    def _end_bar(self, bar: Any, label: str | None, style: str | None) -> None:
        widget = hasattr(bar, "container")  # tqdm.notebook's bar
        if style == "success" and bar.n:  # the work is done: a full bar, n of n
            bar.total = bar.n
            if widget:
                bar.container.children[1].max = bar.n
        if label is not None:
            bar.set_description(f"{self.desc} {label}", refresh=False)
        if style is not None and not widget and getattr(bar.fp, "isatty", lambda: False)():
            bar.colour = "green" if style == "success" else "red"
        bar.refresh()
        if widget and style == "danger":  # tqdm marks only a bar short of its total
            bar.disp(bar_style="danger", check_delay=False)
        bar.close()
        if self._handle is not None:  # the notebook's saved text: the bar's last state
            self._handle.update(bar.container)
            self._handle = None
