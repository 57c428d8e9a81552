"""Quoting what users wrote inside the sentences we send back, in every component.

Values come from pods and annotations anyone with edit rights can set: they may be a megabyte long,
hold control characters, bidirectional marks (U+200F, U+202E) that reorder the rest of a terminal
line, or look-alike characters (a full-width `４` for `4`). Messages show at most `QUOTE_LIMIT`
characters of a value, such characters as `\\u200f` escapes, and name the first non-ASCII one, so the
user sees what is really there and no value inflates an answer, a log line or a cache: the extender
repeats a reason once per node asked about.
"""

from __future__ import annotations

import unicodedata

__all__ = ["MAX_ANNOTATION_VALUE", "QUOTE_LIMIT", "first_non_ascii", "json_type", "quoted", "shown", "units"]

QUOTE_LIMIT = 120
# Our annotations are short lists; anything longer is a mistake or an attack, refused by both edges.
MAX_ANNOTATION_VALUE = 4096


def quoted(value: str, limit: int = QUOTE_LIMIT) -> str:
    """The value in double quotes, invisible and control characters escaped, cut at `limit` characters
    of what is shown (escapes count: `\u202e` is six), so no value shows longer than the limit."""
    parts: list[str] = []
    size = 0
    for ch in value[:limit]:  # each character shows as one or more: never more than `limit` are needed
        part = _visible(ch)
        if size + len(part) > limit:
            break
        parts.append(part)
        size += len(part)
    return f'"{"".join(parts)}{"..." if len(parts) < len(value) else ""}"'


def shown(value: object, limit: int = QUOTE_LIMIT) -> str:
    """Any value a user sent, for a message: a string quoted, a number as written, both cut at `limit`."""
    if isinstance(value, str):
        return quoted(value, limit)
    if value is None or isinstance(value, bool):
        return json_type(value)
    if not isinstance(value, int | float):
        return json_type(value)  # never str() a structure: it may be nested a thousand levels deep
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} digits)"


def json_type(value: object) -> str:
    """What a JSON value is, as a message says it: `a string`, `an object`, `null`, `true`."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return _JSON_TYPES.get(type(value), type(value).__name__)


_JSON_TYPES = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}


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
