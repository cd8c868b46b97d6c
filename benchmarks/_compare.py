"""What the estimator benchmarks (decomposition, linear_model, mixture) share: interleaved timed
fits, the table against a reference, agreement figures, JSON.

Every implementation's fit is a callable returning the fitted model; the fits run ``repeat`` times,
interleaved (each implementation's i-th fit under about the same machine load), the fastest counts.
Agreement is measured by the script's ``compare(model, reference) -> {column: value}``.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import _common


def timed_fits(fits: dict[str, Callable[[], Any]], repeat: int) -> dict[str, dict]:
    """``{name: {"fit_s": best seconds, "model": the model of that fit}}``."""
    runs: dict[str, list] = {}
    for _ in range(repeat):
        for name, fit in fits.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ConvergenceWarnings of short runs: the table shows iterations
                t = time.perf_counter()
                model = fit()
                runs.setdefault(name, []).append({"fit_s": time.perf_counter() - t, "model": model})
    return {name: min(rs, key=lambda r: r["fit_s"]) for name, rs in runs.items()}


def table(title: str, results: dict[str, dict], reference: str, compare: Callable[[Any, Any], dict],
          setup: dict) -> list[dict]:
    """Print the table (fit seconds, ratio to the reference, agreement columns); its rows."""
    ref = results[reference]
    rows = []
    for name, r in results.items():
        rows.append({"name": name, "fit_s": r["fit_s"], "ratio": r["fit_s"] / ref["fit_s"],
                     **compare(r["model"], ref["model"])})
    cols = [k for k in rows[0] if k not in ("name", "fit_s", "ratio")]
    print(f"\n{title}; ratio: fit time over {reference}'s")
    _common.print_setup(setup)
    print(f"{'implementation':<34}{'fit s':>9}{'ratio':>9}" + "".join(f"{c:>18}" for c in cols))
    for row in rows:
        cells = "".join(f"{row[c]:>18.3g}" if isinstance(row[c], float) else f"{str(row[c]):>18}" for c in cols)
        print(f"{row['name']:<34}{row['fit_s']:>9.3f}{row['ratio']:>9.3f}{cells}")
    return rows
