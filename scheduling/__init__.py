"""Device-aware scheduling: pure policies (block-to-device mapping, stream count)."""

from __future__ import annotations

from gdask.scheduling._mapping import proportional_mapping
from gdask.scheduling._streams import StreamController

__all__ = ["StreamController", "proportional_mapping"]
