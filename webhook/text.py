"""Text helpers of the webhook's sentences: the core's quoting, and verb agreement for figures."""

from __future__ import annotations

from gpu_placement.text import first_non_ascii, quoted

__all__ = ["first_non_ascii", "quoted", "units"]


def units(count: int, what: str = "") -> str:
    """`1 is` / `3 are`: the verb agrees with the figure."""
    return f"{count} {what + ' ' if what else ''}{'is' if count == 1 else 'are'}"
