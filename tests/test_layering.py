"""The package layering: packages use each other's public API only, in one direction.

* No module of one gdask package imports a ``_``-prefixed module of another (``gdask.ml`` ->
  ``gdask.gdataset._core`` is not allowed; ``gdask.gdataset`` -> ``gdask.gdataset._core`` is).
* Dependencies point down: ``gdask`` runtime (devices, config, protocol) <- ``window_cache``,
  ``scheduling`` <- ``gdataset`` <- ``gdask.ml`` and the facade (cluster, cli).
* ``scheduling`` names no gdataset module or function.
* ``gdask.ml`` reaches the window cache and placement only through the engine (``gdask.gdataset``).
* Sizes a newcomer can read: no function over 80 lines outside the kernel modules, no class with more
  than 30 methods (dunders aside).
* No guessing: no interpreter frames (``sys._getframe``, ``inspect``) and no reference counts.
* distributed's private API (underscored names of its modules and objects, replacing a worker's
  executors or data) is used in ``gdask/_compat.py`` only.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: folder -> (package name, the packages it may import)
PACKAGES = {
    "gdask/_devices": ("runtime", {"runtime"}),
    "window_cache": ("window_cache", {"runtime"}),
    "scheduling": ("scheduling", {"runtime", "window_cache"}),  # window_cache: the preload hook, its plugins
    "gdataset": ("gdataset", {"runtime", "scheduling", "window_cache"}),
    "gdask/ml": ("ml", {"runtime", "gdataset"}),  # placement and the window cache: through the engine
    "gdask": ("facade", {"runtime", "scheduling", "window_cache", "gdataset", "ml"}),
}
#: modules of the gdask folder that are the lowest layer (imported by every package)
RUNTIME_MODULES = {"gdask.config", "gdask.protocol", "gdask.devices", "gdask._errors", "gdask._devices",
                   "gdask._compat", "gdask._shm"}
RUNTIME_FILES = {"gdask/__init__.py", "gdask/config.py", "gdask/protocol.py", "gdask/devices.py", "gdask/_errors.py",
                 "gdask/_compat.py", "gdask/_shm.py"}
#: private runtime modules every package may import: the one home of distributed's private API, and the
#: files in shared memory that hand arrays to workers on the client's host
SHARED_PRIVATE = {"gdask._compat", "gdask._shm"}


def _package_of_file(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).as_posix()
    if rel in RUNTIME_FILES:
        return "runtime"
    for folder in sorted(PACKAGES, key=len, reverse=True):
        if rel.startswith(folder + "/"):
            return PACKAGES[folder][0]
    raise AssertionError(f"{rel} is in no package")


def _package_of_module(name: str) -> str | None:
    """The package a ``gdask...`` module belongs to (None for modules outside gdask)."""
    parts = name.split(".")
    if parts[0] != "gdask":
        return None
    if len(parts) == 1:
        return "runtime"  # ``import gdask`` / ``from gdask import DeviceMemoryError``: the lazy top level
    top = parts[1]
    if top in ("gdataset", "scheduling", "window_cache", "ml"):
        return top
    if ".".join(parts[:2]) in RUNTIME_MODULES:
        return "runtime"
    return "facade"


def _owner_prefix(name: str) -> str:
    """The part of a module name that names its package (``gdask.gdataset`` for ``gdask.gdataset._core``)."""
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in ("gdataset", "scheduling", "window_cache", "ml"):
        return ".".join(parts[:2])
    return "gdask"


_FOLDERS = {"gdask.gdataset": "gdataset", "gdask.scheduling": "scheduling", "gdask.window_cache": "window_cache"}


def _is_module(name: str) -> bool:
    """Whether ``name`` (``gdask.x.y``) is a module or package of the repository (not an attribute)."""
    parts = name.split(".")
    for prefix, folder in _FOLDERS.items():
        if name == prefix or name.startswith(prefix + "."):
            base = ROOT / folder / pathlib.Path(*parts[2:]) if len(parts) > 2 else ROOT / folder
            break
    else:
        base = ROOT / pathlib.Path(*parts)
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for a in node.names:  # from gdask.gdataset import _blocks: a module imported by name
                if _is_module(f"{node.module}.{a.name}"):
                    yield node.lineno, f"{node.module}.{a.name}"


def _sources():
    for folder in ("gdask", "gdataset", "scheduling", "window_cache"):
        yield from sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", list(_sources()), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_imports_respect_the_layers(path):
    pkg = _package_of_file(path)
    allowed = {folder_pkg for folder, (p, deps) in PACKAGES.items() if p == pkg for folder_pkg in deps} | {pkg}
    problems = []
    for line, name in _imports(path):
        target = _package_of_module(name)
        if target is None:
            continue
        if target not in allowed:
            problems.append(f"line {line}: {pkg} imports {name} ({target} is not below {pkg})")
            continue
        if target != pkg and name not in SHARED_PRIVATE:
            rest = name[len(_owner_prefix(name)):].split(".")
            if any(part.startswith("_") and part != "__version__" for part in rest if part):
                problems.append(f"line {line}: {pkg} imports the private {name} of {target}: use its public API"
                                + (" (gdask.devices, gdask.config, gdask.protocol)" if target == "runtime" else ""))
    assert not problems, "\n".join(problems)


def test_scheduling_names_no_gdataset_module_or_function():
    """No import of gdataset, and no gdataset module or block function named (placement recognises
    device tasks by their annotation, not by the functions they call)."""
    import re

    gdataset = ROOT / "gdataset"
    sources = sorted(gdataset.rglob("*.py"))
    assert any(p.parent != gdataset for p in sources), "the gdataset sub-packages are not scanned"
    # private modules as code names them: ``_core``, ``engine._client`` (a bare ``_client`` is scheduling's own)
    modules = {".".join(p.relative_to(gdataset).with_suffix("").parts) for p in sources
               if p.stem.startswith("_") and p.stem != "__init__"}
    functions = set()
    for p in sources:
        tree = ast.parse(p.read_text())
        functions |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and len(n.name) > 8}
    assert {"_core", "engine._client", "collective._worker"} <= modules and "run_workers_loop" in functions
    # a module as code names it (gdataset._blocks, import _blocks), not a field that ends like one ({tier}_blocks)
    names = "|".join(sorted(map(re.escape, modules | functions)))
    pattern = re.compile(r"gdask\.gdataset|(?<![\w{}\"'])(" + names + r")\b")
    for path in sorted((ROOT / "scheduling").rglob("*.py")):
        found = pattern.findall(path.read_text())
        assert not found, f"{path.name} names {sorted(set(found))}"


# -- sizes, no guessing, distributed's private API ------------------------------------------------------
#: modules of compiled kernels (numba / numba.cuda): a kernel is one long function by nature
KERNEL_FOLDERS = ("gdask/ml/kernels/",)
KERNEL_FILES: set[str] = set()  # single kernel files outside the folder (none)
MAX_FUNCTION_LINES = 80
MAX_METHODS = 30


def _rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _is_kernel_module(path: pathlib.Path) -> bool:
    rel = _rel(path)
    return rel in KERNEL_FILES or rel.startswith(KERNEL_FOLDERS)


@pytest.mark.parametrize("path", list(_sources()), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_functions_and_classes_stay_small(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_kernel_module(path):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                problems.append(f"line {node.lineno}: function {node.name} has {n} lines (> {MAX_FUNCTION_LINES})")
        if isinstance(node, ast.ClassDef):
            methods = [b.name for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and not (b.name.startswith("__") and b.name.endswith("__"))]
            if len(methods) > MAX_METHODS:
                problems.append(f"line {node.lineno}: class {node.name} has {len(methods)} methods (> {MAX_METHODS})")
    assert not problems, "\n".join(problems)


#: names gdask code gives distributed's objects (a Client, Worker, Scheduler, their states)
DISTRIBUTED_OBJECTS = {"client", "worker", "scheduler", "dask_worker", "dask_scheduler", "nanny", "ws", "ts",
                       "state", "cluster"}
#: distributed internals replaced through _compat only (not underscored, but not an extension point)
REPLACED_INTERNALS = {"executors", "memory_manager"}


def _object_name(node: ast.AST) -> str | None:
    """``client`` for ``client`` / ``self.client`` / ``self.comm.worker``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


@pytest.mark.parametrize("path", list(_sources()), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_frames_refcounts_or_private_distributed_api(path):
    text = path.read_text()
    tree = ast.parse(text, filename=str(path))
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("_getframe", "getrefcount", "currentframe", "f_back",
                                                              "f_locals", "stack"):
            base = _object_name(node.value)
            if base in ("sys", "inspect") or node.attr in ("_getframe", "getrefcount", "f_back", "f_locals"):
                problems.append(f"line {node.lineno}: {base}.{node.attr}: know things, do not read frames or counts")
    if _rel(path) != "gdask/_compat.py":
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] == "distributed" and any(p.startswith("_") for p in parts[1:]):
                problems.append(f"line {line}: imports {name}: distributed's private API goes through gdask._compat")
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            base = _object_name(node.value)
            if base in DISTRIBUTED_OBJECTS and node.attr.startswith("_") and not node.attr.startswith("__"):
                problems.append(f"line {node.lineno}: {base}.{node.attr}: distributed's private API goes through "
                                "gdask._compat")
            if base in DISTRIBUTED_OBJECTS and node.attr in REPLACED_INTERNALS:
                problems.append(f"line {node.lineno}: {base}.{node.attr}: replacing distributed's internals goes "
                                "through gdask._compat")
    assert not problems, "\n".join(problems)
