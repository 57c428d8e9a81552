"""`gpu-placement report`: the before/after table of a GPU cluster, from Prometheus.

Every figure is computed here, in one place, from the chart's recording rules: the cluster's totals of
the outcome counters and histograms (the holder of the outcomes Lease keeps them in it and every
replica exports them, so each record is the cluster's own series, never reset) taken as the exact
difference of their values at the window's ends, and the idle gauges' max integrated over it.
`Prometheus` fetches them with instant queries at the window's end, `Counters` takes them from a
process's own counters (`gpu-placement demo`, which has no Prometheus). Quantiles are interpolated
inside the histogram's buckets exactly as PromQL's histogram_quantile does (`quantile` below is its
bucketQuantile), and each figure comes with the one PromQL expression that gives it in Prometheus
(`-o json`), which is what the dashboard's Outcomes row plots; a test checks that the two agree.

No data is never a zero. Before any figure, `coverage` finds the part of the window the data covers: where
Prometheus holds gpu-placement's own scrapes (`gpu_placement_outcomes_leading`, on every webhook replica from
its start) and, wherever a raw series has samples, the chart's record made from it. A window without them gets
no figures, only the series missing and, where Prometheus has them at all, from when to when; a window whose
data begins inside it is counted from that moment (the records' values then are the baseline).
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from gpu_placement.facts.launch import NODE_CAUSES, NOT_STARTED, POD_CAUSES

__all__ = ["Counters", "Coverage", "Missing", "Prometheus", "ReportError", "Source", "Span", "Window", "compute",
           "gauge_hours", "no_data", "now", "quantile", "render", "window_sum"]

HOUR = 3600.0
STARTS = "gpu_placement:gpu_pod_starts:total"
WAIT = "gpu_placement:gpu_pod_wait_seconds_bucket:total"
READY = "gpu_placement:node_ready_seconds_bucket:total"
RECOVERY = "gpu_placement:node_recovery_seconds_bucket:total"
EXCLUSION = "gpu_placement:node_exclusion_seconds_bucket:total"
IDLE = "gpu_placement:idle_gpus:max"
# The raw series each record takes the max of across replicas (what a process's own counters hold).
RAW = {STARTS: "gpu_placement_gpu_pod_starts_total", WAIT: "gpu_placement_gpu_pod_wait_seconds_bucket",
       READY: "gpu_placement_node_ready_seconds_bucket", RECOVERY: "gpu_placement_node_recovery_seconds_bucket",
       EXCLUSION: "gpu_placement_node_exclusion_seconds_bucket", IDLE: "gpu_placement_idle_gpus"}
# Every webhook replica exports it from its start: Prometheus scraped gpu-placement's outcome counter.
LEADING = "gpu_placement_outcomes_leading"
LATE = 300.0  # a record beginning this long after its raw series: the rules were loaded later
WAITED = 600.0  # "waited more than 10 minutes": a bucket bound of gpu_placement_gpu_pod_wait_seconds
Rows = list[tuple[dict[str, str], float]]


class ReportError(Exception):
    """Prometheus cannot be asked, or answers something else than a vector: one line for the user."""


@dataclass(slots=True, frozen=True)
class Window:
    end: float  # Unix time, a whole minute (the idle gauge's record is sampled per minute)
    seconds: int
    # When the data begins inside the window: the moment whose record values the figures grow from (the
    # series' values at the window's start do not exist; 0 would count what was counted before then).
    baseline: float | None = None

    @classmethod
    def ending(cls, until: float, seconds: float) -> Window:
        if seconds < 60 or seconds % 60:
            raise ReportError(f"a window is whole minutes (30m, 12h, 7d, 2w), not {seconds:g} s")
        return cls(math.floor(until / 60) * 60, int(seconds))

    @property
    def start(self) -> float:
        return self.end - self.seconds

    def from_(self, moment: float) -> Window:
        """The window counted from `moment` on, when the data begins after its start."""
        return Window(self.end, self.seconds, moment if moment > self.start else None)

    def subquery(self, step: str = "1m") -> str:
        """A range holding one mark per `step` of the window: one second short of it, so that a range
        inclusive at both ends (Prometheus 2) or open at its start (Prometheus 3) holds the same marks."""
        return f"[{self.seconds - 1}s:{step}]"

    def describe(self) -> str:
        return f"{_time(self.start)} to {_time(self.end)}"


Matchers = Mapping[str, str]  # label -> value, or "~regex"


def _selector(matchers: Matchers) -> str:
    parts = [f'{k}=~"{v[1:]}"' if v.startswith("~") else f'{k}="{v}"' for k, v in sorted(matchers.items())]
    return "{" + ", ".join(parts) + "}" if parts else ""


def window_sum(record: str, by: Sequence[str], window: Window, matchers: Matchers | None = None) -> str:
    """PromQL: what a total record grew by over the window, per `by`: its last value less its value a
    window earlier (0 where the series is younger than the window), or, when the data begins inside the
    window, less its value then (`@`). A day's lookback bridges a gap in the scrapes (every replica down
    for a while)."""
    now = f"last_over_time({record}{_selector(matchers or {})}[1d])"
    then = f"last_over_time({record}{_selector(matchers or {})}[1d] " + (
        f"offset {window.seconds}s)" if window.baseline is None else f"@ {window.baseline:.0f})")
    inner = f"{now} - ({then} or {now} * 0)"
    return f"sum by ({', '.join(by)}) ({inner})" if by else f"sum({inner})"


def gauge_hours(record: str, by: Sequence[str], window: Window) -> str:
    """PromQL: a gauge's integral in unit-hours over the window, or from where its data begins (`baseline`):
    its value at each minute mark stands for the minute before it, the first mark's for the seconds of
    that minute the data covers only (its marks before the data, or a whole first minute, would count
    what nobody saw)."""
    group = f"sum by ({', '.join(by)})" if by else "sum"
    start = window.start if window.baseline is None else window.baseline
    first = math.ceil(start / 60) * 60  # the first mark; `end` is one too
    part = f"{group} ({record} @ {first:.0f}) * {first - start:.3f} / 3600"
    if first >= window.end:  # the data begins in the window's last minute: its mark is the end
        return part
    marks = Window(window.end, int(window.end - first)).subquery("1m")  # the marks after the first
    whole = f"{group} (sum_over_time({record}{marks})) / 60"
    # The window's start, or data from a whole minute on: no part of a minute to add.
    return whole if first == start else f"({whole} + {part}) or {whole} or {part}"


@dataclass(slots=True, frozen=True)
class Span:
    """From the first sample to the last, Unix seconds."""

    start: float
    end: float

    def describe(self) -> str:
        return f"{_time(self.start)} to {_time(self.end)}"


@dataclass(slots=True, frozen=True)
class Missing:
    """A series the window needs and does not have: what it is, why it is missing and what to do, and
    where Prometheus has it at all (None: nowhere)."""

    series: str
    about: str
    fix: str
    present: Span | None


@dataclass(slots=True, frozen=True)
class Coverage:
    span: Span | None  # the part of the window its data covers; None: no data
    missing: tuple[Missing, ...] = ()


class Source(Protocol):
    def coverage(self, window: Window) -> Coverage: ...

    def window_sum(self, record: str, by: Sequence[str], window: Window, matchers: Matchers | None = None) -> Rows: ...

    def gauge_hours(self, record: str, by: Sequence[str], window: Window) -> Rows: ...

    def describe(self) -> str: ...


class Prometheus:
    """Instant queries of Prometheus's HTTP API at the window's end."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout
        self.queries: list[str] = []

    def describe(self) -> str:
        return f"Prometheus {self.url}"

    def coverage(self, window: Window) -> Coverage:
        """Where in the window gpu-placement was scraped and the chart's records exist beside their raw
        series; every series missing, named."""
        scraped = self.span(LEADING, window.start, window.end)
        missing = [] if scraped else [self._missing(LEADING, _SCRAPE_FIX, "gpu-placement's outcome counter, exported "
                                                    "by every webhook replica")]
        start, end = (scraped.start, scraped.end) if scraped else (window.start, window.end)
        for record, raw in RAW.items():
            made = self.span(record, window.start, window.end)
            under = self.span(raw, window.start, window.end)
            if made is None:
                if under is not None or (record == STARTS and scraped is None):
                    also = f", while {raw} has samples in this window" if under else ""
                    missing.append(self._missing(record, _RULES_FIX, f"the chart's recording rule over {raw}{also}"))
                continue
            if under is not None:  # the rules were loaded after the service was scraped, or dropped before
                start = max(start, made.start) if made.start > under.start + LATE else start
                end = min(end, made.end) if made.end < under.end - LATE else end
        if start > end and not missing:  # the records and the scrapes do not overlap in the window
            missing.append(Missing(LEADING, "gpu-placement's outcome counter, exported by every webhook replica",
                                   "its samples and the chart's records' do not overlap in this window",
                                   scraped))
        return Coverage(None if missing else Span(start, end), tuple(missing))

    def span(self, series: str, start: float, end: float, step: int = 0) -> Span | None:
        """From `series`' first sample to its last between `start` and `end`: marks every `step` (by default
        as many as one query may hold), narrowed to the minute, then to the samples' own times (a mark sees
        the samples of the 5 minutes before it): the raw samples of the minute before the first mark (an
        instant query there would give the last of them), the last sample the last mark sees."""
        step = step or max(60, math.ceil((end - start) / 10_000 / 60) * 60)  # Prometheus: 11,000 points a query
        count = f"count({series})"
        marks = self.marks(count, start, end, step)
        if not marks:
            return None
        first, last = marks[0], marks[-1]
        if step > 60:
            first = (self.marks(count, max(start, first - step), first, 60) or [first])[0]
            last = (self.marks(count, last, min(end, last + step), 60) or [last])[-1]
        if first > start:  # its first sample is in the minute before `first` (the mark before saw none)
            first = min((float(at) for found in self._get("query", f"{series}[60s]", {"time": f"{first:.0f}"})
                         for at, _ in found.get("values", ())), default=first)
        if last < end:
            last = next((value for _, value in self.query(f"max(timestamp({series}))", last)), last)
        return Span(max(first, start), min(last, end))

    def _missing(self, series: str, fix: str, about: str) -> Missing:
        """Where Prometheus has `series` at all (hour marks over 400 days, narrowed)."""
        moment = math.floor(now() / 60) * 60
        return Missing(series, about, fix, self.span(series, moment - 400 * 86400, moment, 3600))

    def marks(self, promql: str, start: float, end: float, step: int) -> list[float]:
        """The times of a range query's points (its first series)."""
        result = self._get("query_range", promql, {"start": f"{start:.0f}", "end": f"{end:.0f}", "step": str(step)})
        return [float(at) for at, _ in result[0]["values"]] if result else []

    def window_sum(self, record: str, by: Sequence[str], window: Window, matchers: Matchers | None = None) -> Rows:
        return self.query(window_sum(record, by, window, matchers), window.end)

    def gauge_hours(self, record: str, by: Sequence[str], window: Window) -> Rows:
        return self.query(gauge_hours(record, by, window), window.end)

    def query(self, promql: str, at: float) -> Rows:
        self.queries.append(promql)
        rows: Rows = []
        for series in self._get("query", promql, {"time": f"{at:.3f}"}):
            value = float(series["value"][1])
            if math.isfinite(value):
                rows.append(({k: v for k, v in series["metric"].items() if k != "__name__"}, value))
        return rows

    def _get(self, endpoint: str, promql: str, params: Mapping[str, str]) -> list[Any]:
        url = f"{self.url}/api/v1/{endpoint}?{urllib.parse.urlencode({'query': promql, **params})}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise ReportError(f"{self.url} answered {exc.code} to {promql}: {_error(exc.read())}") from None
        except (OSError, ValueError) as exc:
            raise ReportError(f"cannot reach Prometheus at {self.url}: {exc}") from None
        try:
            answer = orjson.loads(body)
            result = answer["data"]["result"] if answer.get("status") == "success" else None
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            result = None
        if not isinstance(result, list):
            raise ReportError(f"{self.url} did not answer a Prometheus vector to {promql}")
        return result


_SCRAPE_FIX = ("Prometheus did not scrape gpu-placement then; if it never did, point --prometheus at the one that "
               "does, or have it scrape the webhook's /metrics (chart: serviceMonitor.enabled=true, with "
               "serviceMonitor.labels that its serviceMonitorSelector matches, e.g. release: kube-prometheus-stack)")
_RULES_FIX = ("the chart's recording rules did not run then; if they never did, this Prometheus does not load the "
              "chart's PrometheusRule: give it the labels its ruleSelector matches (chart: prometheusRule.labels, "
              "e.g. release: kube-prometheus-stack), or load the rules of charts/gpu-placement/templates/"
              "prometheusrule.yaml as a rules file")


def _error(body: bytes) -> str:
    try:
        return str(orjson.loads(body).get("error") or body[:200].decode(errors="replace"))
    except (orjson.JSONDecodeError, AttributeError):
        return body[:200].decode(errors="replace")


@dataclass
class Counters:
    """A process's own counters as the window's sums: what it counted since it started counting (the
    window is taken to hold all of it), and the idle gauge's integral the caller kept (`idle_hours`)."""

    samples: Iterable[tuple[str, dict[str, str], float]]  # (name, labels, value) of its exposition
    idle_hours: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (resource, reason) -> unit-hours
    what: str = "this process's own counters"

    def describe(self) -> str:
        return self.what

    def coverage(self, window: Window) -> Coverage:
        return Coverage(Span(window.start, window.end))  # a process's counters hold all it counted

    def window_sum(self, record: str, by: Sequence[str], window: Window, matchers: Matchers | None = None) -> Rows:
        sums: dict[tuple[str, ...], float] = {}
        for name, labels, value in self.samples:
            if name == RAW[record] and _matches(labels, matchers or {}):
                key = tuple(labels.get(label, "") for label in by)
                sums[key] = sums.get(key, 0.0) + value
        return [(dict(zip(by, key, strict=True)), value) for key, value in sums.items()]

    def gauge_hours(self, record: str, by: Sequence[str], window: Window) -> Rows:
        sums: dict[tuple[str, ...], float] = {}
        for (resource, reason), hours in self.idle_hours.items():
            labels = {"resource": resource, "reason": reason}
            key = tuple(labels[label] for label in by)
            sums[key] = sums.get(key, 0.0) + hours
        return [(dict(zip(by, key, strict=True)), value) for key, value in sums.items()]


def _matches(labels: Mapping[str, str], matchers: Matchers) -> bool:
    import re

    for key, wanted in matchers.items():
        value = labels.get(key, "")
        if wanted.startswith("~"):
            if not re.fullmatch(wanted[1:], value):
                return False
        elif value != wanted:
            return False
    return True


# -- the computation ---------------------------------------------------------------------------
def quantile(q: float, buckets: Mapping[float, float]) -> float:
    """PromQL's histogram_quantile over cumulative bucket counts (upper bound -> count, +Inf included):
    Prometheus's bucketQuantile (promql/quantile.go), monotonicity fix and all. NaN without observations."""
    ordered = sorted(buckets.items())
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return math.nan
    bounds = [b for b, _ in ordered]
    counts: list[float] = []
    for _, count in ordered:  # ensureMonotonic
        counts.append(max(count, counts[-1]) if counts else count)
    observations = counts[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    index = next(i for i, count in enumerate(counts) if count >= rank)
    if index == len(counts) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[index], counts[index]
    if index > 0:
        start = bounds[index - 1]
        count -= counts[index - 1]
        rank -= counts[index - 1]
    return start + (end - start) * (rank / count)


def _buckets(rows: Rows, by: str | None = None) -> dict[str, dict[float, float]]:
    out: dict[str, dict[float, float]] = {}
    for labels, value in rows:
        group = out.setdefault(labels.get(by, "") if by else "", {})
        bound = float(labels["le"])  # "+Inf" parses too
        group[bound] = group.get(bound, 0.0) + value
    return out


def _quantiles(record: str, qs: Sequence[float], source: Source, window: Window,
               by: str | None = None) -> dict[str, dict[str, Any]]:
    """Per group of `by` (or one group ""): the quantiles, the count, and the PromQL of each quantile."""
    labels = ("le", by) if by else ("le",)
    rows = source.window_sum(record, labels, window)
    figures = {}
    for group, buckets in sorted(_buckets(rows, by).items()):
        count = buckets.get(math.inf, 0.0)
        if not count:
            continue
        promql = {f"p{round(q * 100)}": f"histogram_quantile({q:g}, {window_sum(record, labels, window)})"
                  for q in qs}
        figures[group] = {**{f"p{round(q * 100)}": quantile(q, buckets) for q in qs}, "count": round(count),
                          "promql": promql}
    return figures


def compute(source: Source, window: Window) -> dict[str, Any]:
    """Every figure of the table for one window, with the PromQL behind it; none where the window has
    no data (`coverage` null, and `missing` says why)."""
    coverage = source.coverage(window)
    about: dict[str, Any] = {
        "window": {"start": _time(window.start), "end": _time(window.end), "seconds": window.seconds},
        "coverage": None if coverage.span is None else {
            "start": _time(coverage.span.start), "end": _time(coverage.span.end),
            "seconds": round(coverage.span.end - coverage.span.start),
            "whole_window": coverage.span.start <= window.start and coverage.span.end >= window.end},
        "missing": [{"series": m.series, "about": m.about, "fix": m.fix, "in_prometheus": None if m.present is None
                     else {"start": _time(m.present.start), "end": _time(m.present.end)}} for m in coverage.missing],
        "source": source.describe(),
    }
    if coverage.span is None:
        return about
    return {**about, **_figures(source, window.from_(coverage.span.start))}


def no_data(report: Mapping[str, Any]) -> bool:
    return report["coverage"] is None


def _figures(source: Source, window: Window) -> dict[str, Any]:
    by = ("outcome", "cause", "placed")
    launches = source.window_sum(STARTS, by, window)
    started = _sum(launches, outcome="started")
    total = _sum(launches)
    failed = {cause: round(n) for cause in (*NODE_CAUSES, *POD_CAUSES, NOT_STARTED)
              if (n := _sum(launches, outcome="failed", cause=cause))}
    node = sum(failed.get(cause, 0) for cause in NODE_CAUSES)
    placed = {flag: {"started": round(_sum(launches, outcome="started", placed=flag)),
                     "launches": round(_sum(launches, placed=flag))} for flag in ("true", "false")}
    waits = _buckets(source.window_sum(WAIT, ("le", "reason"), window), "reason")
    waited = {reason: round(b.get(math.inf, 0.0) - b.get(WAITED, 0.0)) for reason, b in sorted(waits.items())}
    idle = source.gauge_hours(IDLE, ("resource", "reason"), window)
    return {
        "launches": {
            "total": round(total), "started": round(started),
            "success": started / total if total else None,
            "node_failure_share": node / total if total else None,
            "failed": failed,
            "placed": placed,
            "promql": {
                "success": f"{window_sum(STARTS, (), window, {'outcome': 'started'})} / "
                           f"{window_sum(STARTS, (), window)}",
                "failed": window_sum(STARTS, ("cause",), window, {"outcome": "failed"}),
                "node_failure_share": f"{window_sum(STARTS, (), window, _NODE)} / {window_sum(STARTS, (), window)}",
            },
        },
        "preparation": _quantiles(READY, (0.5, 0.9), source, window).get(""),
        "preparation_by_pool": _quantiles(READY, (0.5, 0.9), source, window, "pool"),
        "recovery": _quantiles(RECOVERY, (0.5, 0.9), source, window, "reason"),
        "exclusion": _quantiles(EXCLUSION, (0.5, 0.99), source, window).get(""),
        "waited_over_10m": {
            "total": sum(waited.values()), "by_reason": {r: n for r, n in waited.items() if n},
            "promql": f"{window_sum(WAIT, ('reason',), window, {'le': '+Inf'})} - "
                      f"{window_sum(WAIT, ('reason',), window, {'le': _le(WAITED)})}",
        },
        "idle_gpu_hours": {
            "by_resource": _by(idle, "resource"), "by_reason": _by(idle, "reason"),
            "promql": gauge_hours(IDLE, ("resource", "reason"), window),
        },
    }


_NODE = {"outcome": "failed", "cause": "~" + "|".join(NODE_CAUSES)}


def _le(bound: float) -> str:
    from prometheus_client.utils import floatToGoString

    return str(floatToGoString(bound))


def _sum(rows: Rows, **wanted: str) -> float:
    return sum(value for labels, value in rows if all(labels.get(k) == v for k, v in wanted.items()))


def _by(rows: Rows, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in rows:
        if value:
            out[labels.get(label, "")] = out.get(labels.get(label, ""), 0.0) + value
    return {key: round(value, 2) for key, value in sorted(out.items())}


# -- output ------------------------------------------------------------------------------------
def render(reports: Sequence[dict[str, Any]], output: str, since: str) -> str:
    """One window: its table; two (before, after): side by side with the change. Each window's first row
    says the part of it the data covers; a window without data has no figures, and the lines under the
    table name the series it lacks."""
    if output == "json":
        body: dict[str, Any] = {"since": since, "source": reports[0]["source"]}
        body.update({"figures": reports[0]} if len(reports) == 1 else {"before": reports[0], "after": reports[1]})
        return orjson.dumps(body, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    rows = [_rows(report) for report in reports]
    names = [name for name, _ in rows[0]]
    for other in rows[1:]:
        names += [name for name, _ in other if name not in names]
    columns = [dict(r) for r in rows]
    cells = [[column.get(name, "no data" if no_data(report) else "-") for column, report in zip(columns, reports,
                                                                                                 strict=True)]
             for name in names]
    header = ["FIGURE", "VALUE"] if len(reports) == 1 else ["FIGURE", "BEFORE", "AFTER"]
    table = [[name, *row] for name, row in zip(names, cells, strict=True)]
    windows = " | ".join(f"{r['window']['start']} to {r['window']['end']}" for r in reports)
    title = f"GPU cluster outcomes, {windows} ({reports[0]['source']})"
    notes = _no_data_lines(reports)
    if output == "markdown":
        lines = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table]
        notes = [f"  - {line[2:]}" if line.startswith("  ") else f"- {line}" for line in notes]
        return "\n".join([*lines, "", *notes] if notes else lines)
    from gpu_placement.report.tables import table as text_table

    return "\n".join([title, text_table(header, table), *notes])


def _no_data_lines(reports: Sequence[dict[str, Any]]) -> list[str]:
    lines = []
    for label, report in zip(("BEFORE: ", "AFTER: ") if len(reports) == 2 else ("",), reports, strict=True):
        if no_data(report):
            window = report["window"]
            lines.append(f"{label}no data for {window['start']} to {window['end']}, so no figures; missing:")
            lines += [f"  {_missing_line(m)}" for m in report["missing"]]
    return lines


def _missing_line(missing: Mapping[str, Any]) -> str:
    present = missing["in_prometheus"]
    where = f"Prometheus has it from {present['start']} to {present['end']}" if present else \
        "not in this Prometheus at all"
    return f"{missing['series']} ({missing['about']}): none in this window; {where}: {missing['fix']}"


def _coverage(report: Mapping[str, Any]) -> str:
    coverage, window = report["coverage"], report["window"]
    if coverage["whole_window"]:
        return "all of the window"
    return (f"{coverage['start']} to {coverage['end']} ({_length(coverage['seconds'])} of {_length(window['seconds'])}:"
            " gpu-placement's series exist only then)")


def _length(seconds: float) -> str:
    minutes = round(seconds / 60)
    parts = [(minutes // 1440, "d"), (minutes % 1440 // 60, "h"), (minutes % 60, "m")]
    return " ".join(f"{n}{unit}" for n, unit in parts if n) or "0m"


def _rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    if no_data(report):
        return [("Data", "no data")]
    launches = report["launches"]
    rows = [("Data", _coverage(report)), ("GPU pod launches", str(launches["total"])),
            ("Launch success", _share(launches["started"], launches["total"]))]
    for flag, what in (("true", "  placed by gpu-placement"), ("false", "  placed by another scheduler")):
        figures = launches["placed"][flag]
        if figures["launches"]:
            rows.append((what, _share(figures["started"], figures["launches"])))
    failed = launches["failed"]
    node = {c: n for c, n in failed.items() if c in NODE_CAUSES}
    rows.append(("Failed on the node", (_pct(launches["node_failure_share"]) + ": " + _list(node)) if node else "0"))
    pod = {c: n for c, n in failed.items() if c in POD_CAUSES}
    rows.append(("Failed, not the node's", _list(pod) if pod else "0"))
    rows.append(("Bound, not started in an hour", str(failed.get(NOT_STARTED, 0))))
    rows.append(("Node preparation p50 / p90", _pair(report["preparation"], "p50", "p90", "nodes")))
    for reason, figures in report["recovery"].items():
        rows.append((f"Node recovery p50 / p90, {reason}", _pair(figures, "p50", "p90", "outages")))
    if not report["recovery"]:
        rows.append(("Node recovery p50 / p90", "none"))
    rows.append(("Exclusion latency p50 / p99", _pair(report["exclusion"], "p50", "p99", "exclusions")))
    waited = report["waited_over_10m"]
    rows.append(("GPU pods that waited > 10 min", f"{waited['total']}" + (
        f": {_list(waited['by_reason'])}" if waited["by_reason"] else "")))
    idle = report["idle_gpu_hours"]
    total = sum(idle["by_resource"].values())
    rows.append(("GPU-hours idle while pods waited", f"{total:.1f}" + (
        f": {', '.join(f'{reason} {hours:.1f}' for reason, hours in idle['by_reason'].items())}" if total else "")))
    return rows


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} % ({part} of {whole})" if whole else "no launches"


def _pct(share: float | None) -> str:
    return f"{100 * share:.1f} %" if share is not None else "-"


def _list(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _pair(figures: Mapping[str, Any] | None, low: str, high: str, what: str) -> str:
    if not figures:
        return "none"
    count = figures["count"]
    return f"{_duration(figures[low])} / {_duration(figures[high])} ({count} {what if count != 1 else what[:-1]})"


def _duration(seconds: float) -> str:
    if seconds != seconds:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")


def now() -> float:
    return time.time()
