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

__all__ = ["Counters", "Prometheus", "ReportError", "Window", "compute", "quantile", "render"]

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
WAITED = 600.0  # "waited more than 10 minutes": a bucket bound of gpu_placement_gpu_pod_wait_seconds
Rows = list[tuple[dict[str, str], float]]


class ReportError(Exception):
    """Prometheus cannot be asked, or answers something else than a vector: one line for the user."""


@dataclass(slots=True, frozen=True)
class Window:
    end: float  # Unix time, a whole minute (the idle gauge's record is sampled per minute)
    seconds: int

    @classmethod
    def ending(cls, until: float, seconds: float) -> Window:
        if seconds < 60 or seconds % 60:
            raise ReportError(f"a window is whole minutes (1h, 12h, 7d), not {seconds:g} s")
        return cls(math.floor(until / 60) * 60, int(seconds))

    @property
    def start(self) -> float:
        return self.end - self.seconds

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
    window earlier (0 where the series is younger than the window). A day's lookback bridges a gap in
    the scrapes (every replica down for a while)."""
    now = f"last_over_time({record}{_selector(matchers or {})}[1d])"
    then = f"last_over_time({record}{_selector(matchers or {})}[1d] offset {window.seconds}s)"
    inner = f"{now} - ({then} or {now} * 0)"
    return f"sum by ({', '.join(by)}) ({inner})" if by else f"sum({inner})"


def gauge_hours(record: str, by: Sequence[str], window: Window) -> str:
    """PromQL: a gauge's integral over the window in unit-hours (its 1-minute samples / 60)."""
    inner = f"sum_over_time({record}{window.subquery('1m')})"
    return f"sum by ({', '.join(by)}) ({inner}) / 60" if by else f"sum({inner}) / 60"


class Source(Protocol):
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

    def window_sum(self, record: str, by: Sequence[str], window: Window, matchers: Matchers | None = None) -> Rows:
        return self.query(window_sum(record, by, window, matchers), window.end)

    def gauge_hours(self, record: str, by: Sequence[str], window: Window) -> Rows:
        return self.query(gauge_hours(record, by, window), window.end)

    def query(self, promql: str, at: float) -> Rows:
        self.queries.append(promql)
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql, 'time': f'{at:.3f}'})}"
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
        rows: Rows = []
        for series in result:
            value = float(series["value"][1])
            if math.isfinite(value):
                rows.append(({k: v for k, v in series["metric"].items() if k != "__name__"}, value))
        return rows


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
    counts = []
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
    """Every figure of the table for one window, with the PromQL behind it."""
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
        "window": {"start": _time(window.start), "end": _time(window.end), "seconds": window.seconds},
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
        "source": source.describe(),
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
    """One window: its table; two (before, after): side by side with the change."""
    if output == "json":
        body: dict[str, Any] = {"since": since, "source": reports[0]["source"]}
        body.update({"figures": reports[0]} if len(reports) == 1 else {"before": reports[0], "after": reports[1]})
        return orjson.dumps(body, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    rows = [_rows(report) for report in reports]
    names = [name for name, _ in rows[0]]
    for other in rows[1:]:
        names += [name for name, _ in other if name not in names]
    columns = [dict(r) for r in rows]
    if len(reports) == 1:
        header, table = ["FIGURE", "VALUE"], [[name, columns[0].get(name, "-")] for name in names]
    else:
        header = ["FIGURE", "BEFORE", "AFTER"]
        table = [[name, columns[0].get(name, "-"), columns[1].get(name, "-")] for name in names]
    windows = " | ".join(f"{r['window']['start']} to {r['window']['end']}" for r in reports)
    title = f"GPU cluster outcomes, {windows} ({reports[0]['source']})"
    if output == "markdown":
        lines = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table]
        return "\n".join(lines)
    from gpu_placement.report.tables import table as text_table

    return f"{title}\n{text_table(header, table)}"


def _rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    launches = report["launches"]
    rows = [("GPU pod launches", str(launches["total"])),
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
