"""Tiered device/host block store with the variable sliding window (work in progress, see the
window_cache issue). Nothing is exported yet."""

from __future__ import annotations

__all__: list[str] = []
