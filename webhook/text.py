"""Quoting what users wrote inside the sentences we send back: the core's helpers, which the webhook's
messages and the core's shared parsers (sharing levels) both use."""

from __future__ import annotations

from gpu_placement.text import first_non_ascii, quoted, units

__all__ = ["first_non_ascii", "quoted", "units"]
