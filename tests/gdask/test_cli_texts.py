"""What a user reads: help texts in plain words, a clean namespace, the demo's compile progress."""

import argparse
import io
import subprocess
import sys

import pytest

from gdask._cli import parser, plain_text, wait_for_compile


def _subparsers(p):
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_every_option_of_every_command_is_explained():
    for name, sub in _subparsers(parser()):
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"gdask {name} {action.option_strings or action.dest} has no help text"


@pytest.mark.parametrize("cmd", ["worker", "demo", "info", "bench"])
def test_help_is_plain_text(cmd):
    out = subprocess.run([sys.executable, "-m", "gdask._cli", cmd, "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "`" not in out.stdout and ":func:" not in out.stdout  # no reStructuredText markup


def test_plain_text():
    assert plain_text("``gdask worker ADDR``: a ``dask worker``\n  (see :func:`~gdask.job`, `x`)") == \
        "gdask worker ADDR: a dask worker (see gdask.job, x)"


def test_the_namespace_lists_the_public_names_only():
    import gdask

    names = dir(gdask)
    for helper in ("Any", "annotations", "importlib"):
        assert helper not in names
    assert [n for n in names if not n.startswith("__")] == sorted(n for n in gdask.__all__ if not n.startswith("__"))


def test_compile_progress_counts_the_kernels_of_every_worker():
    """The demo's wait for the workers' warm-ups: kernels compiled of total, then the seconds each took."""
    states = iter([
        {"a": {"done": False, "compiled": 0, "total": 12}, "b": {"done": False, "compiled": 0, "total": 12}},
        {"a": {"done": False, "compiled": 5, "total": 12}, "b": {"done": False, "compiled": 3, "total": 12}},
        {"a": {"done": True, "compiled": 12, "total": 12, "seconds": 2.0, "error": None},
         "b": {"done": True, "compiled": 12, "total": 12, "seconds": 2.5, "error": None}, "c": None},
    ])
    out = io.StringIO()
    got = wait_for_compile(lambda: next(states), timeout=60, file=out, interval=0)
    assert got == {"a": 2.0, "b": 2.5}
    lines = [x.strip() for x in out.getvalue().splitlines() if x.strip()]
    assert "0 of 24 kernels" in lines[0] and "24 of 24 kernels" in lines[-1] and "2 of 2 worker(s) done" in lines[-1]


def test_compile_progress_without_counts_and_its_bound():
    out = io.StringIO()
    got = wait_for_compile(lambda: {"a": {"done": True, "seconds": 1.5, "error": "ValueError('x')"}}, timeout=60,
                           file=out, interval=0)
    assert got == {"a": 1.5} and "compiling ahead failed (ValueError('x'))" in out.getvalue()
    with pytest.raises(TimeoutError, match="still compiling.*--compile-timeout"):
        wait_for_compile(lambda: {"a": {"done": False}}, timeout=0.05, file=io.StringIO(), interval=0.01)
