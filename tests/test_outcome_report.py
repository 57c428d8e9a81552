"""The metrics, `gpu-placement report` and the dashboard show the same figures, through a real Prometheus.

A day of a cluster's life (gpu_placement/samples/history.py) is replayed into the fake API server,
timestamps in the objects; two replicas watch it, the leader crashes at 08:30, a fresh process joins at
11:00. Every turn (2 minutes of the replay's clock) each live replica is scraped, and its samples are
stamped with that time, as Prometheus would have stored them (the crashed one's simply stop);
promtool turns them into TSDB blocks, a real Prometheus serves them, and promtool backfills the
chart's recording rules over them (the documented way to give new rules a history). Then
`gpu-placement report` runs against it, and so does the PromQL behind each figure and each panel of
the dashboard's Outcomes row.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpu_placement.app.cli import main
from gpu_placement.facts.launch import NODE_CAUSES
from gpu_placement.outcomes.idle import IdleGpus
from gpu_placement.outcomes.record import BUCKETS
from gpu_placement.outcomes.report import quantile
from gpu_placement.samples.history import Truth, day
from tests.fakeapi import FakeApiServer
from tests.outcome_replay import Clock, exposition
from tests.prometheus import PrometheusServer, openmetrics, tool
from tests.support.chart import VARIABLES, dashboard, rule_groups
from tests.support.outcomes import Cluster

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # slow: a simulated day, then a Prometheus backfill

HOUR = 3600.0
# The day ends an hour before now (backfilled blocks stay in the past); the window holds all of it.
START = math.floor(time.time() / HOUR) * HOUR - 27 * HOUR
END = START + 26 * HOUR
SINCE = "27h"


class Scrapes:
    """Each live replica's /metrics at each turn, as (metric, labels + pod, [(time, value)])."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
        self.idle: dict[str, IdleGpus] = {}  # one per replica, as the service has one per process

    def __call__(self, cluster: Cluster) -> None:
        for replica in cluster.replicas.values():
            idle = self.idle.setdefault(replica.identity, IdleGpus(replica.outcomes))
            text = exposition(replica.outcomes) + _text(idle.families())
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    labels = tuple(sorted({**sample.labels, "pod": replica.identity}.items()))
                    self.series.setdefault((sample.name, labels), []).append((cluster.clock.now, sample.value))
            # What each replica's /metrics also holds from its start: the sign `report` reads that Prometheus
            # scraped gpu-placement's outcome counter.
            leading = (("lease", "gpu-placement-outcomes"), ("pod", replica.identity))
            self.series.setdefault(("gpu_placement_outcomes_leading", leading), []).append(
                (cluster.clock.now, float(replica.counter.leading)))

    def openmetrics(self) -> str:
        return openmetrics([(name, dict(labels), samples) for (name, labels), samples in self.series.items()])

    def idle_hours(self, start: float, end: float) -> dict[tuple[str, str], float]:
        """What the record gpu_placement:idle_gpus:max, sampled each minute, integrates to: at each minute
        mark the latest sample of each replica (5-minute lookback), the max across replicas."""
        by_key: dict[tuple[str, str], list[list[tuple[float, float]]]] = {}
        for (name, labels), samples in self.series.items():
            if name == "gpu_placement_idle_gpus":
                found = dict(labels)
                by_key.setdefault((found["resource"], found["reason"]), []).append(samples)
        hours: dict[tuple[str, str], float] = {}
        marks = [start + 60 * (i + 1) for i in range(int((end - start) // 60))]
        for key, replicas in by_key.items():
            total = 0.0
            for mark in marks:
                values = [v for samples in replicas if (v := _latest(samples, mark)) is not None]
                total += max(values) if values else 0.0
            if total:
                hours[key] = total / 60
        return hours


def _latest(samples: list[tuple[float, float]], at: float) -> float | None:
    found = None
    for when, value in samples:
        if when > at:
            break
        found = value if at - when <= 300 else None
    return found


def _text(families: list[Any]) -> str:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from tests.outcome_replay import _One

    registry = CollectorRegistry()
    registry.register(_One(families))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, Scrapes]]:
    scrapes = Scrapes()
    fake = FakeApiServer().start()
    cluster = Cluster(fake, Clock(START - 3 * HOUR))
    try:
        changes, _ = day(START)
        cluster.start("a")
        cluster.start("b")
        cluster.run(changes, END, {START + 8.5 * HOUR: lambda c: c.retire("a", crash=True),
                                   START + 11 * HOUR: lambda c: c.start("a2")}, scrapes)
    finally:
        cluster.close()
        fake.stop()
    work = Path(tmp_path_factory.mktemp("prometheus"))
    server = PrometheusServer(work, scrapes.openmetrics(), retention="30d")
    try:
        rules = work / "records.yaml"
        rules.write_text(yaml.safe_dump({"groups": [g for g in rule_groups() if g["name"].endswith(".records")]}))
        subprocess.run([tool("promtool"), "tsdb", "create-blocks-from", "rules", f"--url={server.url}",
                        f"--start={int(START - 3 * HOUR)}", f"--end={int(END)}", "--eval-interval=60s",
                        f"--output-dir={work / 'records'}", str(rules)], check=True, capture_output=True, timeout=300)
        server.add_blocks(work / "records")
        yield server, scrapes
    finally:
        server.stop()


@pytest.fixture(scope="module")
def report(served: tuple[PrometheusServer, Scrapes]) -> dict[str, Any]:
    server, _ = served
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", "--prometheus", server.url, "--since", SINCE, "--until", str(_iso(END)),
                     "-o", "json"]) == 0
    figures: dict[str, Any] = json.loads(out.getvalue())["figures"]
    return figures


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def query(server: PrometheusServer, promql: str) -> list[tuple[dict[str, str], float]]:
    answer = httpx.get(f"{server.url}/api/v1/query", params={"query": promql, "time": END}, timeout=30).json()
    assert answer["status"] == "success", answer
    return [(r["metric"], float(r["value"][1])) for r in answer["data"]["result"]]


def expected_quantiles(seconds: list[float], metric: str, qs: tuple[float, ...]) -> dict[str, float]:
    bounds = [*BUCKETS[metric], math.inf]
    buckets = {bound: float(sum(1 for s in seconds if s <= bound)) for bound in bounds}
    return {f"p{round(q * 100)}": quantile(q, buckets) for q in qs}


def close(a: float, b: float) -> bool:
    """Equal: a window's figure is the exact difference of the cluster's totals (no extrapolation)."""
    return math.isclose(a, b, rel_tol=1e-9)


def test_launches_are_the_story_counted_once_across_a_crash_and_a_second_replica(report: dict[str, Any]) -> None:
    _, truth = day(START)
    launches = report["launches"]
    started = sum(n for (outcome, *_), n in truth.starts.items() if outcome == "started")
    total = sum(truth.starts.values())
    assert (launches["total"], launches["started"]) == (total, started) == (112, 100)
    assert launches["failed"] == {cause: n for cause, n in _causes(truth).items()}
    assert launches["placed"] == {
        flag: {"started": sum(n for (o, _, _, p), n in truth.starts.items() if p == flag and o == "started"),
               "launches": sum(n for (_, _, _, p), n in truth.starts.items() if p == flag)}
        for flag in ("true", "false")}
    assert close(launches["success"], started / total)
    node = sum(n for (_, cause, _, _), n in truth.starts.items() if cause in NODE_CAUSES)
    assert close(launches["node_failure_share"], node / total)


def _causes(truth: Truth) -> Counter[str]:
    causes: Counter[str] = Counter()
    for (outcome, cause, _, _), n in truth.starts.items():
        if outcome == "failed":
            causes[cause] += n
    return causes


def test_node_times_and_waits_are_the_storys(report: dict[str, Any]) -> None:
    _, truth = day(START)
    preparation = expected_quantiles([s for *_, s in truth.ready], "gpu_placement_node_ready_seconds", (0.5, 0.9))
    assert {k: report["preparation"][k] for k in preparation} == pytest.approx(preparation, rel=1e-9)
    assert report["preparation"]["count"] == len(truth.ready)
    for reason in ("NotValidated", "NodeNotReady"):
        wanted = expected_quantiles([s for *_, r, s in truth.recovery if r == reason],
                                    "gpu_placement_node_recovery_seconds", (0.5, 0.9))
        assert {k: report["recovery"][reason][k] for k in wanted} == pytest.approx(wanted, rel=1e-9)
    exclusion = expected_quantiles([s for *_, s in truth.exclusion], "gpu_placement_node_exclusion_seconds",
                                   (0.5, 0.99))
    assert {k: report["exclusion"][k] for k in exclusion} == pytest.approx(exclusion, rel=1e-9)
    waited = Counter(reason for reason, _, seconds in truth.waits if seconds > 600)
    assert report["waited_over_10m"]["by_reason"] == dict(waited) == {"InsufficientGPU": 2, "NotValidated": 1}


def test_idle_gpu_hours_are_the_gauge_integrated(report: dict[str, Any],
                                                  served: tuple[PrometheusServer, Scrapes]) -> None:
    _, scrapes = served
    hours = scrapes.idle_hours(END - int(SINCE[:-1]) * HOUR, END)
    by_reason: Counter[str] = Counter()
    for (_, reason), value in hours.items():
        by_reason[reason] += value
    assert report["idle_gpu_hours"]["by_reason"] == pytest.approx(
        {reason: round(value, 2) for reason, value in by_reason.items()}, abs=0.011)
    assert report["idle_gpu_hours"]["by_reason"]["fragmented"] > 10  # the 8-GPU pods' wait, 34 GPUs in pieces


def test_the_promql_behind_each_figure_gives_the_figure(report: dict[str, Any],
                                                        served: tuple[PrometheusServer, Scrapes]) -> None:
    """What `-o json` prints is what a dashboard would plot: evaluated in Prometheus, the same numbers."""
    server, _ = served
    launches = report["launches"]
    [(_, success)] = query(server, launches["promql"]["success"])
    assert math.isclose(success, launches["success"], rel_tol=1e-9)
    [(_, share)] = query(server, launches["promql"]["node_failure_share"])
    assert math.isclose(share, launches["node_failure_share"], rel_tol=1e-9)
    for figures in (report["preparation"], report["exclusion"], *report["recovery"].values()):
        for name, promql in figures["promql"].items():
            values = [v for labels, v in query(server, promql)
                      if labels.get("reason") in (None, *report["recovery"]) and not math.isnan(v)]
            assert any(math.isclose(v, figures[name], rel_tol=1e-9) for v in values), (name, values, figures)
    waited = {labels["reason"]: v for labels, v in query(server, report["waited_over_10m"]["promql"]) if v}
    assert {reason: round(v) for reason, v in waited.items()} == report["waited_over_10m"]["by_reason"]
    idle = query(server, report["idle_gpu_hours"]["promql"])
    assert sum(v for _, v in idle) == pytest.approx(sum(report["idle_gpu_hours"]["by_reason"].values()), abs=0.05)


def test_the_dashboards_outcomes_row_plots_the_same_series(report: dict[str, Any],
                                                           served: tuple[PrometheusServer, Scrapes]) -> None:
    server, _ = served
    panels = _outcome_panels()
    assert {"Launch success (last 7 days)", "Failed launches by cause (per hour)", "Node preparation p50 / p90 by pool "
            "(7 days)", "Node recovery by reason (7 days)", "Exclusion latency (7 days)",
            "GPU pods that waited more than 10 minutes (per day)", "Idle GPUs while pods wait, by reason",
            "Nodes in preparation (minutes)"} <= set(panels)
    for title, targets in panels.items():
        for expr in targets:
            answer = httpx.get(f"{server.url}/api/v1/query_range", timeout=30, params={
                "query": expr, "start": START, "end": END, "step": 600}).json()
            assert answer["status"] == "success", (title, answer)
            assert answer["data"]["result"], f"{title}: {expr} is empty all day"
    # The 7-day stat holds the whole replayed day: the report's launch success over its window.
    [(_, success)] = query(server, panels["Launch success (last 7 days)"][0])
    assert math.isclose(success, report["launches"]["success"], rel_tol=1e-9)


def _outcome_panels() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    inside = False
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            inside = panel["title"] == "Outcomes"
            continue
        if inside:  # the dashboard's variables at All, as Grafana sends them
            found[panel["title"]] = [_all(target["expr"]) for target in panel["targets"]]
    return found


def _all(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def test_report_text_markdown_and_compare(served: tuple[PrometheusServer, Scrapes]) -> None:
    server, _ = served
    out = io.StringIO()
    with redirect_stdout(out):
        main(["report", "--prometheus", server.url, "--since", SINCE, "--until", _iso(END)])
    text = out.getvalue()
    assert "Launch success                         89.3 % (100 of 112)" in text
    out = io.StringIO()
    with redirect_stdout(out):
        main(["report", "--prometheus", server.url, "--since", "12h", "--compare",
              f"{_iso(START + 12 * HOUR)}..{_iso(END)}", "-o", "markdown"])
    table = out.getvalue()
    assert "| FIGURE | BEFORE | AFTER |" in table
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in table.splitlines()[4:]}
    before, after = (int(cell.strip(" |")) for cell in rows["GPU pod launches"])
    assert before + after <= 112 and before > 40 and after > 40  # two halves of the day


def test_compare_with_a_before_window_that_has_no_data(served: tuple[PrometheusServer, Scrapes]) -> None:
    """BEFORE ends before gpu-placement was first scraped: no figures for it, the series it lacks named with
    where Prometheus has it, the AFTER figures beside, in every output; exit status 3."""
    server, scrapes = served
    first = min(at for (name, _), samples in scrapes.series.items() if name == "gpu_placement_outcomes_leading"
                for at, _ in samples)
    before, after = START - 4 * HOUR, END
    args = ["report", "--prometheus", server.url, "--since", "12h", "--compare", f"{_iso(before)}..{_iso(after)}"]
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(args) == 3
    text = out.getvalue()
    lines = text.splitlines()
    at_before, at_after = lines[1].index("BEFORE"), lines[1].index("AFTER")
    rows = {line[:at_before].strip(): (line[at_before:at_after].strip(), line[at_after:].strip())
            for line in lines[2:] if line[:1].isalpha() and not line.startswith(("BEFORE:", "AFTER:"))}
    assert rows["Data"] == ("no data", "all of the window")
    assert rows["GPU pod launches"][0] == "no data" and int(rows["GPU pod launches"][1]) > 40
    assert all(before == "no data" for before, _ in rows.values())  # not one zero for BEFORE
    launches = int(rows["GPU pod launches"][1])
    assert (f"BEFORE: no data for {_minute(before - 12 * HOUR)} to {_minute(before)}, so no figures; missing:\n"
            "  gpu_placement_outcomes_leading (gpu-placement's outcome counter, exported by every webhook replica): "
            f"none in this window; Prometheus has it from {_minute(first)} to ") in text
    assert "AFTER: no data" not in text

    out = io.StringIO()
    with redirect_stdout(out):
        assert main([*args, "-o", "markdown"]) == 3
    markdown = out.getvalue()
    assert "| Data | no data | all of the window |" in markdown
    assert f"| GPU pod launches | no data | {launches} |" in markdown
    assert f"- BEFORE: no data for {_minute(before - 12 * HOUR)} to {_minute(before)}" in markdown

    out = io.StringIO()
    with redirect_stdout(out):
        assert main([*args, "-o", "json"]) == 3
    body = json.loads(out.getvalue())
    assert body["before"]["coverage"] is None and "launches" not in body["before"]
    assert body["before"]["missing"][0]["series"] == "gpu_placement_outcomes_leading"
    assert body["before"]["missing"][0]["in_prometheus"]["start"] == _minute(first)
    assert body["after"]["coverage"]["whole_window"] and body["after"]["launches"]["total"] == launches


def _minute(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))
