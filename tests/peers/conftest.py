"""A pytest plugin that runs the peers' own test modules (from the installed packages, never
copied) against gdask.ml: the suites and their expected failures are in ``suites.py``.

* Collection: ``suites.py`` becomes a collector with one module per suite. Each module is imported
  by its own name while its subject's names are swapped for gdask's in the modules it imports them
  from (restored right after: only the test module keeps gdask's), so its tests call gdask.ml.
* Selection: a test whose code never reaches a swapped name (directly, through a module-level
  helper, or as a parametrized value) tests the peer itself and is deselected; ``Suite.skip`` leaves
  out more (CI cost), and every xfail rule marks the tests that cannot pass, with its reason.
* scikit-learn's conftest is loaded for its fixtures (``global_random_seed``, ``global_dtype``, ...),
  as ``-p sklearn.conftest`` would.
* At the end, one line per suite: passed / xfailed / failed / skipped / deselected.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

_HERE = Path(__file__).resolve().parent
_MISSING = object()


def _table() -> types.ModuleType:
    name = "gdask_peer_suites"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _HERE / "suites.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up while the file executes
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _resolve(path: str) -> Any:
    mod, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(mod), attr)


@contextlib.contextmanager
def swapped(swap: dict[str, dict[str, str]]) -> Iterator[dict[str, Any]]:
    """Point ``module.name`` at gdask's objects for the duration; yields ``{name: gdask object}``."""
    saved, objs = [], {}
    try:
        for modname, names in swap.items():
            mod = importlib.import_module(modname)
            for name, target in names.items():
                objs[name] = _resolve(target)
                saved.append((mod, name, mod.__dict__.get(name, _MISSING)))
                setattr(mod, name, objs[name])
        yield objs
    finally:
        for mod, name, old in reversed(saved):
            if old is _MISSING:
                delattr(mod, name)
            else:
                setattr(mod, name, old)


class PeerModule(pytest.Module):
    """A peer's test module, imported with its subject swapped for gdask's."""

    suite: Any = None

    def _getobj(self):
        name = self.suite.module
        sys.modules.pop(name, None)
        with swapped(self.suite.swap):
            if self.suite.source is None:
                return importlib.import_module(name)
            return _load_file(name, self.path)


def _load_file(name: str, path: Path) -> types.ModuleType:
    """The module of the file ``path`` imported under ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _origin(suite: Any, pm: Any) -> Path | None:
    """The file of ``suite``'s test module: an installed module's, or, for a peer whose wheel ships no
    tests, ``<$suite.source>/<last part of its name>.py`` (its ``conftest.py`` there registered for its
    fixtures); None when not available."""
    if suite.source is None:
        spec = importlib.util.find_spec(suite.module)
        return None if spec is None or spec.origin is None else Path(spec.origin)
    folder = os.environ.get(suite.source)
    if not folder:
        return None
    path = Path(folder) / (suite.module.rpartition(".")[2] + ".py")
    if not path.is_file():
        return None
    conftest = path.parent / "conftest.py"
    plugin = suite.module.rpartition(".")[0] + ".conftest"
    if conftest.is_file() and not pm.has_plugin(plugin):
        pm.register(_load_file(plugin, conftest), plugin)
    return path


class PeerSuites(pytest.File):
    """``suites.py``: one :class:`PeerModule` per suite whose packages are installed."""

    def collect(self):
        table = _table()
        pm = self.config.pluginmanager
        if not pm.has_plugin("gdask-peers"):
            if importlib.util.find_spec("sklearn") is not None and not pm.has_plugin("sklearn.conftest"):
                pm.import_plugin("sklearn.conftest")
            pm.register(Tracker(table), "gdask-peers")
        for suite in table.SUITES:
            if any(importlib.util.find_spec(r) is None for r in suite.requires):
                continue
            origin = _origin(suite, pm)
            if origin is None:
                continue
            mod = PeerModule.from_parent(self, path=origin, name=suite.module.replace(".", "/") + ".py")
            mod.suite = suite
            yield mod


def pytest_collect_file(file_path: Path, parent: Any):
    if file_path.name == "suites.py" and file_path.resolve().parent == _HERE:
        return PeerSuites.from_parent(parent, path=file_path)
    return None


def matches(name: str, pattern: str) -> bool:
    """``pattern`` with ``*`` as the only wildcard (brackets literal: test names carry ``[params]``)."""
    return re.fullmatch(".*".join(re.escape(p) for p in pattern.split("*")), name) is not None


def _names(code: types.CodeType) -> set[str]:
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def _reaches(func: Any, targets: set[str], module: types.ModuleType, depth: int = 3, seen: set | None = None) -> bool:
    """Whether ``func``'s code names one of ``targets``, itself or through the module's own helpers."""
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    seen = set() if seen is None else seen
    names = _names(code)
    if names & targets:
        return True
    if depth == 0:
        return False
    for n in names - seen:
        seen.add(n)
        g = module.__dict__.get(n)
        if isinstance(g, types.FunctionType) and g.__module__ == module.__name__ and \
                _reaches(g, targets, module, depth - 1, seen):
            return True
    return False


def _holds(value: Any, objs: tuple) -> bool:
    if isinstance(value, (list, tuple, set)):
        return any(_holds(v, objs) for v in value)
    if isinstance(value, dict):
        return any(_holds(v, objs) for v in value.values())
    return (isinstance(value, type) and value in objs) or type(value) in objs or \
        (callable(value) and getattr(value, "func", None) in objs)


class Tracker:
    """Selection, expected failures and the per-suite counts of the peers' suites."""

    def __init__(self, table: types.ModuleType) -> None:
        self.suites = {s.module.replace(".", "/") + ".py": s for s in table.SUITES}
        self.counts: dict[str, Counter] = {k: Counter() for k in self.suites}
        self.keys: dict[str, str] = {}  # node id -> suite, for the reports

    def _suite_of(self, nodeid: str) -> str | None:
        return self.keys.get(nodeid)

    def _key_of(self, item: Any) -> str | None:
        """The suite of a collected item: that of its peer module. (Not read from the node id, which
        starts with the module's path when the peer is installed under the rootdir, as in a virtual
        environment inside the checkout.)"""
        mod = item.getparent(PeerModule)
        suite = getattr(mod, "suite", None)
        if suite is None:
            return None
        key = suite.module.replace(".", "/") + ".py"
        self.keys[item.nodeid] = key
        return key

    def _keep(self, item: Any, suite: Any) -> bool:
        targets = {n for names in suite.swap.values() for n in names}
        gdask_objs = [_resolve(t) for names in suite.swap.values() for t in names.values()]
        # the names the module bound them to (``from dask_ml.cluster import KMeans as DKKMeans``)
        targets |= {n for n, v in item.module.__dict__.items() if any(v is g for g in gdask_objs)}
        objs = tuple(item.module.__dict__[n] for n in targets if n in item.module.__dict__)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and _holds(list(callspec.params.values()), objs):
            return True
        return _reaches(getattr(item, "obj", None), targets, item.module)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: Any, config: Any, items: list) -> None:
        kept, dropped = [], []
        for item in items:
            key = self._key_of(item)
            if key is None:
                kept.append(item)
                continue
            suite = self.suites[key]
            name = item.name
            if not self._keep(item, suite) or any(matches(name, p) for r in suite.skip for p in r.patterns):
                dropped.append(item)
                self.counts[key]["deselected"] += 1
                continue
            for rule in suite.xfail:
                if any(matches(name, p) for p in rule.patterns):
                    item.add_marker(pytest.mark.xfail(reason=rule.reason, strict=rule.strict))
                    break
            kept.append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    def pytest_runtest_logreport(self, report: Any) -> None:
        key = self._suite_of(report.nodeid)
        if key is None:
            return
        c = self.counts[key]
        xfail = hasattr(report, "wasxfail")
        if report.when == "call":
            c["xpassed" if xfail and report.passed else "xfailed" if xfail else report.outcome] += 1
        elif report.when == "setup" and not report.passed:
            c["xfailed" if xfail else "skipped" if report.skipped else "error"] += 1
        elif report.when == "teardown" and report.failed:
            c["error"] += 1

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not any(self.counts.values()):
            return
        tr = terminalreporter
        tr.section("peers' own test suites against gdask.ml")
        for key, c in self.counts.items():
            tr.write_line(f"{key}: {c['passed']} passed, {c['xfailed']} xfailed, {c['failed']} failed, "
                          f"{c['error']} errors, {c['xpassed']} xpassed, {c['skipped']} skipped, "
                          f"{c['deselected']} deselected (not about a swapped estimator, or left out)")
