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
    assert "KMeans" in text and "3/5" in text  # the tqdm bar, at 3 of at most 5 iterations
    assert "inertia=33.3333" in text  # the last record on the bar
    last = text.strip().splitlines()[-1]
    assert last.startswith("KMeans: 3 iterations in ") and "median 20.0 ms/iteration" in last
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
