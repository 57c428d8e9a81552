"""Times and durations, each read by one parser (gpu_placement/base/timestamps.py): what the API server
writes, what people type on the command line, and what values.yaml's alert thresholds say."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpu_placement.app.cli import main
from gpu_placement.base.timestamps import format_duration, format_time, parse_datetime, parse_duration, parse_time

NOON = datetime(2026, 12, 3, 12, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("text", "seconds"), [
    ("2026-12-03T12:00:00Z", NOON),  # what the API server writes
    ("2026-12-03T12:00:00.123456Z", NOON + 0.123456),  # a Lease's MicroTime
    ("2026-12-03T12:00:00.123456789Z", NOON + 0.123456),  # Go's RFC3339Nano: cut to microseconds
    ("2026-12-03T13:00:00+01:00", NOON),
])
def test_rfc3339_times_with_their_zone(text: str, seconds: float) -> None:
    assert parse_time(text) == pytest.approx(seconds, abs=1e-6)
    assert parse_datetime(text) == datetime.fromtimestamp(seconds, UTC)


@pytest.mark.parametrize("value", ["2026-12-03T12:00:00", "2026-12-03", "yesterday", "", None, 1733227200])
def test_anything_else_is_no_time_a_time_without_a_zone_too(value: object) -> None:
    """RFC 3339 requires the zone; the API server always writes it. Without one the moment is unknown."""
    assert parse_time(value) is None and parse_datetime(value) is None


def test_format_time_reads_back() -> None:
    assert format_time(NOON) == "2026-12-03T12:00:00Z" and parse_time(format_time(NOON)) == NOON


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90.0), ("10m", 600.0), ("1h30m", 5400.0), ("365d", 365 * 86400.0), ("2w", 14 * 86400.0),
    ("500ms", 0.5), ("1m30s", 90.0), ("0s", 0.0),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("seconds", "text"), [
    (3650 * 86400.0, "3650d"), (5400.0, "1h30m"), (600.0, "10m"), (60.0, "1m"), (90.0, "1m30s"), (0.0, "0s")])
def test_durations_written_as_they_are_read(seconds: float, text: str) -> None:
    """How the command line's help shows a default it holds in seconds."""
    assert format_duration(seconds) == text and parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "units"), [
    ("", "smhd"), ("10", "smhd"), ("1.5h", "smhd"), ("10 m", "smhd"), ("-5s", "smhd"), ("5x", "smhd"),
    ("2w", "smhd"), ("90s", "mhdw"), ("500ms", "smhd"),
])
def test_what_is_not_a_duration_of_those_units(text: str, units: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text, units)


def test_report_refuses_a_time_without_its_zone(capsys: pytest.CaptureFixture[str]) -> None:
    """It was taken as UTC: an engineer in UTC+2 asking for 10:00 got a window two hours off, silently."""
    status = main(["report", "--prometheus", "http://127.0.0.1:9", "--until", "2026-03-02T10:00:00"])
    assert status == 2
    assert "'2026-03-02T10:00:00' is not a time: now, YYYY-MM-DD or RFC 3339 with its zone" in capsys.readouterr().err
