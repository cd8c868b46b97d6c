"""Device-aware scheduling: block-to-device mapping policies."""

from __future__ import annotations

from gdask.scheduling._mapping import proportional_mapping

__all__ = ["proportional_mapping"]
