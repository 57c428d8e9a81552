"""Quoting what users wrote inside the sentences we send back.

Values come from annotations anyone with edit rights can set: they may hold control characters,
bidirectional marks (U+200F, U+202E) that reorder the rest of a terminal line, or look-alike
characters (a full-width `４` for `4`). Messages show such characters as `\\u200f` escapes and name
the first non-ASCII one, so the user sees what is really there.
"""

from __future__ import annotations

import unicodedata

__all__ = ["first_non_ascii", "quoted", "units"]

_LIMIT = 120


def quoted(value: str, limit: int = _LIMIT) -> str:
    """The value in double quotes, invisible and control characters escaped, cut at `limit` characters."""
    cut = value if len(value) <= limit else value[:limit]
    shown = "".join(_visible(ch) for ch in cut)
    return f'"{shown}{"..." if len(value) > limit else ""}"'


def _visible(ch: str) -> str:
    if ch == '"' or ch == "\\":
        return "\\" + ch
    # C*: control, format (bidi marks, zero-width), unassigned, private use; Z* but space: odd separators.
    category = unicodedata.category(ch)
    if category[0] == "C" or (category[0] == "Z" and ch != " "):
        code = ord(ch)
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return ch


def first_non_ascii(value: str) -> str | None:
    """`U+FF14 FULLWIDTH DIGIT FOUR at position 16`, or None when the value is plain ASCII."""
    for position, ch in enumerate(value, 1):
        if not 0x20 <= ord(ch) <= 0x7E:
            name = unicodedata.name(ch, "a control character" if unicodedata.category(ch) == "Cc" else "unnamed")
            return f"U+{ord(ch):04X} {name} at position {position}"
    return None


def units(count: int, what: str = "") -> str:
    """`1 is` / `3 are`: the verb agrees with the figure."""
    return f"{count} {what + ' ' if what else ''}{'is' if count == 1 else 'are'}"
