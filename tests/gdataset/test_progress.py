import io

import dask
import pytest

from gdask.gdataset import Progress
from gdask.gdataset._progress import format_record, summary


def _records(n=3):
    return [{"iteration": i, "seconds": 0.01 * i, "mode": "client", "inertia": 100.0 / i} for i in range(1, n + 1)]


def test_verbose_0_shows_nothing_but_calls_back():
    out, got = io.StringIO(), []
    p = Progress(0, callback=got.append, total=5, desc="KMeans", file=out)
    for r in _records():
        p.update(r)
    p.close()
    assert out.getvalue() == ""
    assert [r["iteration"] for r in got] == [1, 2, 3] and p.records == got


def test_verbose_1_draws_a_bar_and_prints_a_summary():
    out = io.StringIO()
    p = Progress(1, total=5, desc="KMeans", file=out)
    for r in _records():
        p.update(r)
    p.close()
    text = out.getvalue()
    assert "KMeans" in text and "0/5" in text  # the tqdm bar, of at most 5 iterations
    assert "inertia=33.3333" in text  # the last record on the bar
    # it stopped before 5 without an error: it converged, and its bar ends full
    assert "KMeans converged at iteration 3: 100%" in text and "3/3" in text
    last = text.strip().splitlines()[-1]
    assert last.startswith("KMeans: 3 iterations in ") and "median 20.0 ms/iteration" in last
    assert "converged at iteration 3" in last
    assert "inertia 33.3333" in last and "loop: client" in last
    assert "iteration 2:" not in text  # no per-iteration lines at level 1


def test_verbose_2_prints_one_line_per_iteration():
    out = io.StringIO()
    p = Progress(2, total=5, desc="iterate", bar=False, file=out)
    recs = _records()
    recs[1]["line"] = "iteration 2: custom text"
    for r in recs:
        p.update(r)
    p.close()
    lines = out.getvalue().strip().splitlines()
    assert lines[0] == "iterate iteration 1: seconds 0.01, inertia 100"
    assert lines[1] == "iteration 2: custom text"
    assert lines[3].startswith("iterate: 3 iterations")
    assert len(lines) == 4  # bar=False: no bar


def test_config_turns_the_bar_off():
    out = io.StringIO()
    with dask.config.set({"gdask.progress.bar": False}):
        p = Progress(1, total=5, file=out)
    p.update(_records(1)[0])
    p.close()
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fit: 1 iterations in ") and "1/5" not in lines[0]


def test_close_is_idempotent_and_callback_errors_propagate():
    def boom(rec):
        raise RuntimeError("stop the fit")

    p = Progress(0, callback=boom)
    with pytest.raises(RuntimeError, match="stop the fit"):
        p.update(_records(1)[0])
    p.close()
    p.close()


def test_bad_arguments_name_the_problem():
    with pytest.raises(TypeError, match="callback must be callable"):
        Progress(1, callback=3)
    with pytest.raises(TypeError, match="verbose must be"):
        Progress("loud")


def test_summary_and_format_record():
    recs = [{"iteration": 1, "seconds": 0.5, "mode": "stream", "loss": 0.25, "bytes_h2d": 2048},
            {"iteration": 2, "seconds": 0.1, "mode": "stream", "loss": 0.125, "bytes_h2d": 2048}]
    s = summary(recs, "LogisticRegression", 1.0)
    assert s == ("LogisticRegression: 2 iterations in 1.00 s, median 500.0 ms/iteration, loss 0.125, "
                 "4.00 kiB moved to the devices, loop: stream")
    assert summary([], "x") == "x: no iteration finished"
    assert format_record({"iteration": 4, "change": 0.5, "executed_by_prefix": {"a": 1}}, "iterate") == \
        "iterate iteration 4: change 0.5"


def _bar_lines(text):
    """The bar's states (tqdm rewrites its line with carriage returns)."""
    return [x for line in text.splitlines() for x in line.split("\r") if x.strip()]


def _run(p, n, fail=None):
    try:
        for r in _records(n):
            p.update(r)
        if fail is not None:
            raise fail
    finally:
        p.close()


def test_a_fit_that_fails_ends_its_bar_as_failed():
    out = io.StringIO()
    p = Progress(1, total=5, desc="KMeans", file=out)
    with pytest.raises(ValueError, match="bad pass"):
        _run(p, 2, ValueError("bad pass"))
    states = _bar_lines(out.getvalue())
    assert states[-2].startswith("KMeans failed in iteration 3 (ValueError):") and "2/5" in states[-2]
    assert p.outcome == "failed" and "converged" not in out.getvalue()


def test_a_fit_run_inside_an_except_clause_is_not_failed():
    out = io.StringIO()
    try:
        raise KeyError("the caller's own")
    except KeyError:
        p = Progress(1, total=5, desc="KMeans", file=out)
        _run(p, 2)
    assert p.outcome == "converged" and "KMeans converged at iteration 2" in out.getvalue()


def test_max_iter_reached_and_convergence_said_explicitly():
    out = io.StringIO()
    p = Progress(1, total=3, desc="LogisticRegression", file=out)
    _run(p, 3)  # nothing said: the full bar, as tqdm leaves it
    assert p.outcome == "finished" and _bar_lines(out.getvalue())[-2].startswith("LogisticRegression: 100%")
    out = io.StringIO()
    p = Progress(1, total=3, desc="LogisticRegression", file=out)
    for r in _records(3):
        p.update(r)
    p.close(converged=False, error=None)  # max_iter reached where scikit-learn warns
    assert p.outcome == "not converged"
    assert "LogisticRegression did not converge in 3 iterations: 100%" in out.getvalue()
    out = io.StringIO()
    p = Progress(1, total=3, desc="iterate", file=out)
    recs = _records(3)
    recs[-1]["converged"] = True  # a record says so (at the last allowed iteration)
    for r in recs:
        p.update(r)
    p.close()
    assert p.outcome == "converged" and "iterate converged at iteration 3" in out.getvalue()


def test_the_summary_says_the_setup_before_the_first_iteration():
    out = io.StringIO()
    p = Progress(1, total=4, desc="LSTMRegressor", bar=False, file=out)
    p._t0 -= 3.0  # the fit started 3 s before its first iteration (persisting, compiling)
    _run(p, 2)
    last = out.getvalue().strip().splitlines()[-1]
    assert "before the first iteration" in last
    setup = float(last.split(" in ")[1].split("(")[1].split(" s ")[0])
    assert 2.9 < setup < 3.9
    assert summary(_records(2), "x", 1.0, setup=0.01) == summary(_records(2), "x", 1.0)  # small: not said


class _Handle:
    def __init__(self):
        self.updates = []

    def update(self, obj):
        self.updates.append(repr(obj))


@pytest.mark.parametrize("fail", [None, ValueError("boom")])
def test_the_widget_bar_ends_green_or_red_and_its_saved_text_follows(monkeypatch, fail):
    pytest.importorskip("ipywidgets")
    from gdask.gdataset import _progress

    handle = _Handle()
    monkeypatch.setattr(_progress, "_widgets_usable", lambda: True)
    monkeypatch.setattr(_progress, "_display_widget", lambda bar: handle)
    p = Progress(1, total=300, desc="KMeans", file=io.StringIO())
    bars = []
    orig = p._make_bar
    monkeypatch.setattr(p, "_make_bar", lambda: bars.append(orig()) or bars[-1])
    try:
        _run(p, 2, fail)
    except ValueError:
        pass
    (bar,) = bars
    _, ibar, _ = bar.container.children
    if fail is None:
        assert ibar.bar_style == "success" and ibar.value == ibar.max == 2
        assert handle.updates[-1].startswith("KMeans converged at iteration 2: 100%") and "2/2" in handle.updates[-1]
    else:
        assert ibar.bar_style == "danger" and ibar.max == 300
        assert handle.updates[-1].startswith("KMeans failed in iteration 3 (ValueError)") and "2/300" in \
            handle.updates[-1]
