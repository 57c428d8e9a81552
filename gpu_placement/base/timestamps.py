"""Times and durations as people and the API server write them: RFC 3339 timestamps
(`2026-12-03T10:17:58Z`) and durations (`90s`, `1h30m`, `500ms`), each read by one parser here.

A time without a zone (`2026-12-03T10:17:58`) is not RFC 3339, and is read as no time at all: the API
server always writes one (`Z`), and guessing UTC for a person's input could be hours off without a
word. Callers that take something else say so (`report --until` takes a bare date as midnight UTC).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import UTC, datetime

__all__ = ["UNITS", "format_duration", "format_time", "parse_datetime", "parse_duration", "parse_time"]


def parse_datetime(value: object) -> datetime | None:
    """An RFC 3339 time as an aware datetime (any fraction of a second, Go's nanoseconds included), or
    None for a missing or malformed value or one without a zone (the API server writes these fields; a
    hand-made object may not)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)  # Python 3.11 reads "Z" and any number of fraction digits
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def parse_time(value: object) -> float | None:
    """`parse_datetime` as Unix seconds."""
    moment = parse_datetime(value)
    return moment.timestamp() if moment is not None else None


def format_time(seconds: float) -> str:
    """Unix seconds as the API server writes them (`2026-12-03T10:17:58Z`)."""
    return datetime.fromtimestamp(int(seconds), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# A duration's units in seconds, as Prometheus (and values.yaml) writes them.
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+)(ms|[smhdw])")


def parse_duration(text: str, units: Collection[str] = UNITS) -> float:
    """Seconds in a duration: whole numbers, each with its unit ("90s", "10m", "1h30m", "500ms", "2w"),
    of `units` only. Raises ValueError for anything else ("", "1.5h", "10")."""
    parts = _PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text or any(
            unit not in units for _, unit in parts):
        raise ValueError(f"{text!r} is not a duration of whole numbers and units {', '.join(units)}")
    return float(sum(int(number) * UNITS[unit] for number, unit in parts))


def format_duration(seconds: float) -> str:
    """Whole seconds as parse_duration reads them, in days, hours, minutes and seconds ("3650d", "1h30m")."""
    rest, parts = int(seconds), []
    for unit in ("d", "h", "m", "s"):
        count, rest = divmod(rest, int(UNITS[unit]))
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
