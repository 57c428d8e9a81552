"""`gpu-placement report` against a real Prometheus that lacks gpu-placement's series: no data is never a zero.

Two Prometheus servers, fed backfilled samples: one that never scraped gpu-placement (only a node
exporter's `up`), and one that scraped it for twelve hours while the chart's recording rules ran only for
the last three (a PrometheusRule its ruleSelector ignored, fixed three hours ago).
"""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from gpu_placement.app.cli import main
from gpu_placement.outcomes.report import Prometheus
from tests.prometheus import PrometheusServer, Series, openmetrics

pytestmark = pytest.mark.timeout(300)

HOUR = 3600.0
T = math.floor(time.time() / HOUR) * HOUR - HOUR  # the data ends an hour ago (backfilled blocks stay in the past)
RAW = "gpu_placement_gpu_pod_starts_total"
RECORD = "gpu_placement:gpu_pod_starts:total"
STARTED = {"outcome": "started", "cause": "", "pool": "a100", "placed": "true"}


def _minutes(start: float, end: float) -> list[float]:
    return [start + 60 * i for i in range(int((end - start) // 60) + 1)]


def _launches(at: float) -> float:
    """The cluster's total of started launches at `at`: one every 10 minutes since T-12h."""
    return float((at - (T - 12 * HOUR)) // 600)


def _at(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


def _minute(moment: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(moment))


def report(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(["report", *args])
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def unrelated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """A Prometheus that scrapes a node exporter, never gpu-placement."""
    series: list[Series] = [("up", {"job": "node-exporter", "instance": "h100-1:9100"},
                             [(at, 1.0) for at in _minutes(T - 6 * HOUR, T)])]
    server = PrometheusServer(Path(tmp_path_factory.mktemp("unrelated")), openmetrics(series))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def late_rules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """gpu-placement scraped from T-12h; its records only from T-3h."""
    scraped = _minutes(T - 12 * HOUR, T)
    series: list[Series] = [
        ("gpu_placement_outcomes_leading", {"lease": "gpu-placement-outcomes", "pod": "gpu-placement-0"},
         [(at, 1.0) for at in scraped]),
        (RAW, {**STARTED, "pod": "gpu-placement-0"}, [(at, _launches(at)) for at in scraped]),
        (RECORD, STARTED, [(at, _launches(at)) for at in scraped if at >= T - 3 * HOUR]),
    ]
    server = PrometheusServer(Path(tmp_path_factory.mktemp("late-rules")), openmetrics(series))
    yield server
    server.stop()


def test_a_prometheus_that_never_scraped_gpu_placement_gives_no_data_not_zeros(unrelated: PrometheusServer) -> None:
    status, out, _ = report("--prometheus", unrelated.url, "--since", "6h", "--until", _at(T))
    assert status == 3, out
    lines = out.splitlines()
    assert lines[1].split() == ["FIGURE", "VALUE"] and lines[2].split() == ["Data", "no", "data"]
    assert "GPU pod launches" not in out and "Launch success" not in out and " 0\n" not in out
    assert f"no data for {_minute(T - 6 * HOUR)} to {_minute(T)}, so no figures; missing:" in out
    assert ("  gpu_placement_outcomes_leading (gpu-placement's outcome counter, exported by every webhook replica): "
            "none in this window; not in this Prometheus at all: Prometheus did not scrape gpu-placement then; if it "
            "never did, point --prometheus at the one that does") in out
    assert (f"  {RECORD} (the chart's recording rule over {RAW}): none in this window; not in this Prometheus at "
            "all: the chart's recording rules did not run then") in out

    status, out, _ = report("--prometheus", unrelated.url, "--since", "6h", "--until", _at(T), "-o", "json")
    assert status == 3
    figures = json.loads(out)["figures"]
    assert figures["coverage"] is None and "launches" not in figures
    assert [m["series"] for m in figures["missing"]] == ["gpu_placement_outcomes_leading", RECORD]
    assert all(m["in_prometheus"] is None for m in figures["missing"])

    status, out, _ = report("--prometheus", unrelated.url, "--since", "6h", "--until", _at(T), "-o", "markdown")
    assert status == 3
    assert "| Data | no data |" in out and "| GPU pod launches" not in out
    assert f"\n- no data for {_minute(T - 6 * HOUR)} to {_minute(T)}, so no figures; missing:\n" in out
    assert "\n  - gpu_placement_outcomes_leading (gpu-placement's outcome counter" in out


def test_a_window_before_the_recording_rules_ran_names_the_record_and_since_when(late_rules: PrometheusServer) -> None:
    """Scraped, but the records begin at T-3h: the window T-10h..T-4h has the raw series only."""
    status, out, _ = report("--prometheus", late_rules.url, "--since", "6h", "--until", _at(T - 4 * HOUR))
    assert status == 3, out
    assert "GPU pod launches" not in out
    assert (f"  {RECORD} (the chart's recording rule over {RAW}, while {RAW} has samples in this window): none in "
            f"this window; Prometheus has it from {_minute(T - 3 * HOUR)} to {_minute(T)}: the chart's recording "
            "rules did not run then; if they never did, this Prometheus does not load the chart's PrometheusRule: "
            "give it the labels its ruleSelector matches (chart: prometheusRule.labels") in out
    assert "gpu_placement_outcomes_leading" not in out  # it was scraped: only the record is missing


def test_a_window_the_records_cover_in_part_counts_from_where_they_begin(late_rules: PrometheusServer) -> None:
    """Window T-6h..T; the records begin at T-3h with the cluster's totals then: the figures are their growth
    since, not the totals (which hold everything counted since T-12h)."""
    status, out, _ = report("--prometheus", late_rules.url, "--since", "6h", "--until", _at(T))
    assert status == 0, out
    lines = out.splitlines()
    column = lines[1].index("VALUE")
    rows = {line[:column].strip(): line[column:] for line in lines[2:]}
    assert rows["Data"] == (f"{_minute(T - 3 * HOUR)} to {_minute(T)} (3h of 6h: gpu-placement's series exist only "
                            "then)")
    grown = _launches(T) - _launches(T - 3 * HOUR)
    assert rows["GPU pod launches"] == str(round(grown)) == "18"
    status, out, _ = report("--prometheus", late_rules.url, "--since", "6h", "--until", _at(T), "-o", "json")
    figures = json.loads(out)["figures"]
    assert figures["coverage"] == {"start": _minute(T - 3 * HOUR), "end": _minute(T), "seconds": 3 * 3600,
                                   "whole_window": False}
    assert figures["launches"]["total"] == 18 and f"@ {T - 3 * HOUR:.0f}" in figures["launches"]["promql"]["success"]


IDLE_RAW, IDLE = "gpu_placement_idle_gpus", "gpu_placement:idle_gpus:max"
FRAGMENTED = {"resource": "nvidia.com/gpu", "reason": "fragmented"}
GPUS = 32  # every GPU of the cluster idle while pods wait, the most the gauge can read


@pytest.fixture(scope="module")
def late_start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """gpu-placement scraped every 5 s for the last 145 s before T only (a fresh install), every GPU idle."""
    scraped = [T - 145 + 5 * i for i in range(30)]
    series: list[Series] = [
        ("gpu_placement_outcomes_leading", {"lease": "gpu-placement-outcomes", "pod": "gpu-placement-0"},
         [(at, 1.0) for at in scraped]),
        (IDLE_RAW, {**FRAGMENTED, "pod": "gpu-placement-0"}, [(at, GPUS) for at in scraped]),
        (IDLE, FRAGMENTED, [(at, GPUS) for at in scraped]),
    ]
    server = PrometheusServer(Path(tmp_path_factory.mktemp("late-start")), openmetrics(series))
    yield server
    server.stop()


@pytest.mark.parametrize(("until", "covered", "shown"), [(T - 120, 25, "0.2"), (T, 145, "1.3")])
def test_data_beginning_late_in_a_window_counts_only_the_covered_seconds(
        late_start: PrometheusServer, until: float, covered: int, shown: str) -> None:
    """Data from 25 s before a 10-minute window's end (or 2 min 25 s): the coverage starts at the first
    sample (not the last one before the first minute mark), and the idle GPU-hours are every GPU idle for
    the seconds covered, no more (not a whole minute for the first mark, nor the window's marks before)."""
    status, out, _ = report("--prometheus", late_start.url, "--since", "10m", "--until", _at(until), "-o", "json")
    assert status == 0, out
    figures = json.loads(out)["figures"]
    assert figures["coverage"]["seconds"] == covered and figures["coverage"]["whole_window"] is False
    idle = figures["idle_gpu_hours"]
    assert idle["by_reason"] == {"fragmented": round(GPUS * covered / HOUR, 2)}  # 32 GPUs for those seconds
    [(_, hours)] = Prometheus(late_start.url).query(idle["promql"], until)
    assert hours == pytest.approx(GPUS * covered / HOUR)  # the PromQL shown gives the figure
    status, out, _ = report("--prometheus", late_start.url, "--since", "10m", "--until", _at(until))
    assert f"\nGPU-hours idle while pods waited  {shown}: fragmented {shown}\n" in out, out


def test_since_takes_whole_minutes_and_says_so(late_rules: PrometheusServer) -> None:
    with pytest.raises(SystemExit) as exit_, redirect_stderr(io.StringIO()) as err:
        main(["report", "--prometheus", late_rules.url, "--since", "90s"])
    assert exit_.value.code == 2
    assert ("'90s' is not a window of whole minutes such as 30m, 12h, 7d, 2w or 1d12h (units m, h, d, w)"
            in err.getvalue())
    status, out, _ = report("--prometheus", late_rules.url, "--since", "1w", "--until", _at(T))
    assert status == 0 and "GPU pod launches" in out  # 1w holds all twelve hours
