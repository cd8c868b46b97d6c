"""The kernel package's shape (issue "Renovation"): one place chooses the backend, every backend
module of an algorithm has the same op names, and the modules import each other one way only."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from gdask.ml import kernels
from gdask.ml.kernels import _dispatch

ROOT = pathlib.Path(kernels.__file__).parent

#: op names every backend module of an algorithm defines
OPS = {"kmeans": {"lloyd_partial", "assign"}, "hamerly": {"first_pass", "step", "assigned_sqdist"},
       "logistic": {"loss_grad"}}


def _imports(path: pathlib.Path) -> set[str]:
    """The modules of this package that ``path`` imports (``_name``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "gdask.ml.kernels":
                out |= {a.name for a in node.names if a.name.startswith("_")}
            elif node.module.startswith("gdask.ml.kernels."):
                out.add(node.module.rsplit(".", 1)[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.rsplit(".", 1)[1] for a in node.names if a.name.startswith("gdask.ml.kernels.")}
    return out


def test_no_import_cycle_between_kernel_modules():
    graph = {p.stem: _imports(p) for p in ROOT.glob("*.py")}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        if state.get(node) == 1:
            raise AssertionError(f"import cycle: {' -> '.join(path + [node])}")
        if state.get(node) == 2:
            return
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(graph):
        visit(node, [])
    # backend modules never reach up to the ops or the dispatch
    for name, deps in graph.items():
        if name.endswith(("_cpu", "_cuda", "_xp", "_common")):
            assert not deps & {"_dispatch", "_kmeans", "_hamerly", "_logistic", "__init__"}, (name, deps)


@pytest.mark.parametrize("algorithm", sorted(OPS))
def test_every_backend_has_the_same_ops(algorithm):
    for backend, module in _dispatch._MODULES[algorithm].items():
        missing = {op for op in OPS[algorithm] if not callable(getattr(module, op, None))}
        assert not missing, f"{module.__name__} lacks {sorted(missing)}"


def test_backend_is_chosen_in_one_place():
    assert _dispatch.backend_for(np.zeros((3, 2))) == "cpu"
    array_api_strict = pytest.importorskip("array_api_strict")
    assert _dispatch.backend_for(array_api_strict.asarray([[1.0]])) == "xp"
    for path in ROOT.glob("*.py"):  # nobody else asks what kind of array a block is
        if path.stem not in ("_dispatch", "_cuda_common"):
            text = path.read_text()
            assert "def block_kind" not in text and "__name__ == \"cupy\"" not in text, path.name
