"""Kubernetes timestamps (RFC 3339, `2026-12-03T10:17:58Z`) as Unix seconds."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["format_time", "parse_time"]


def parse_time(value: object) -> float | None:
    """Unix seconds, or None for a missing or malformed value (the API server writes these fields;
    a hand-made object may not)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


def format_time(seconds: float) -> str:
    """Unix seconds as the API server writes them (`2026-12-03T10:17:58Z`)."""
    return datetime.fromtimestamp(int(seconds), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
