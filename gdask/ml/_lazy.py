"""Names of a package resolved on first use (PEP 562), so that importing one of its modules does not
import the others.

A worker that runs an estimator's block tasks imports their module (``gdask.ml._kmeans._blocks``, say).
Were the package's ``__init__`` to import its estimator, that would bring scikit-learn and every
estimator module along: ~1 s in each fresh worker's first task of a fit (measured: a fresh cluster's
first K-means fit spent 0.7-1.2 s more in its first task when the script had not imported
``gdask.ml.KMeans`` at its top, which the workers' start imports too).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

__all__ = ["exports"]


def exports(package: str, where: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose names ``where`` maps to the modules that
    define them (absolute, or relative to ``package`` with a leading dot)."""
    module = importlib.import_module(package)

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(where))

    return __getattr__, __dir__
