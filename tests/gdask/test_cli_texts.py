"""What a user reads: help texts in plain words, a clean namespace."""

import subprocess
import sys

import pytest

from gdask._cli import plain_text


@pytest.mark.parametrize("cmd", [["worker"], ["demo"], ["info"], []])
def test_help_is_plain_text_and_every_option_is_explained(cmd):
    out = subprocess.run([sys.executable, "-m", "gdask._cli", *cmd, "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "`" not in out.stdout and ":func:" not in out.stdout  # no reStructuredText markup
    # every option has a help line: argparse prints an option without one alone on its line
    options = [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("--")]
    bare = [o for o in options if "  " not in o and not o.endswith(",")]
    assert not bare or cmd == [], bare


def test_plain_text():
    assert plain_text("``gdask worker ADDR``: a ``dask worker``\n  (see :func:`~gdask.job`, `x`)") == \
        "gdask worker ADDR: a dask worker (see gdask.job, x)"


def test_the_namespace_lists_the_public_names_only():
    import gdask

    names = dir(gdask)
    for helper in ("Any", "annotations", "importlib"):
        assert helper not in names
    assert set(gdask.__all__) <= set(names)
    assert [n for n in names if not n.startswith("__")] == sorted(n for n in gdask.__all__ if not n.startswith("__"))
