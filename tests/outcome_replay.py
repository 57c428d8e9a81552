"""Replaying gpu_placement.samples.history's day into a view, on a clock that follows the objects' own
timestamps (not wall time): the helpers the outcome tests share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from gpu_placement.base.config import Config, parse_config
from gpu_placement.outcomes.record import BUCKETS, Outcomes
from gpu_placement.samples.history import CONFIG, Change, Truth
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest

__all__ = ["START", "Clock", "ViewReplica", "apply", "exposition", "figures", "histogram_counts", "plural",
           "truth_histograms"]

START = 1772409600.0  # 2026-03-02T00:00:00Z: the day's midnight
_PLURAL = {"Pod": "pods", "Node": "nodes", "Namespace": "namespaces"}


def plural(kind: str) -> str:
    return _PLURAL[kind]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def config() -> Config:
    return parse_config(CONFIG)


def apply(ingest: Ingest, view: ClusterView, change: Change) -> None:
    """A change as a watch event would bring it."""
    ingest.event(view, plural(change.kind), "DELETED" if change.deleted else "MODIFIED", change.obj)


class ViewReplica:
    """A view fed straight from the changes (no API server), with its Outcomes."""

    def __init__(self, clock: Clock, **outcome_args: Any) -> None:
        self.config = config()
        self.view = ClusterView(self.config)
        self.ingest = Ingest(self.config)
        for kind in ("namespaces", "nodes", "pods"):
            self.ingest.replace(self.view, kind, [])
        self.outcomes = Outcomes(self.view, self.config, clock=clock, **outcome_args).start()


def run(changes: list[Change], clock: Clock, until: float, step: float,
        on_change: Callable[[Change], None], on_turn: Callable[[], None]) -> None:
    """Walk the clock to `until` in `step`s: the changes due by then, then a turn."""
    pending = iter(changes)
    upcoming = next(pending, None)
    while clock.now < until:
        turn = clock.now + step
        while upcoming is not None and upcoming.at <= turn:
            clock.now = max(clock.now, upcoming.at)  # the view hears of it when the API server stores it
            on_change(upcoming)
            upcoming = next(pending, None)
        clock.now = turn
        on_turn()


class _One:
    def __init__(self, families: Iterable[Any]) -> None:
        self._families = list(families)

    def collect(self) -> list[Any]:
        return self._families


def exposition(outcomes: Outcomes) -> str:
    registry = CollectorRegistry()
    registry.register(_One(outcomes.families()))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def figures(text: str) -> tuple[Counter[tuple[str, ...]], dict[str, Counter[tuple[str, ...]]]]:
    """From an exposition: launches by (outcome, cause, pool, placed), and each histogram's count by labels."""
    starts: Counter[tuple[str, ...]] = Counter()
    counts: dict[str, Counter[tuple[str, ...]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpu_placement_gpu_pod_starts_total" and sample.value:
                labels = sample.labels
                starts[(labels["outcome"], labels["cause"], labels["pool"], labels["placed"])] += int(sample.value)
            elif sample.name.endswith("_seconds_count") and sample.value:
                labels = tuple(v for k, v in sorted(sample.labels.items()))
                counts.setdefault(sample.name.removesuffix("_count"), Counter())[labels] += int(sample.value)
    return starts, counts


def histogram_counts(outcomes: Outcomes, metric: str) -> Counter[tuple[str, ...]]:
    """Observations per label set, labels in sorted-name order (as `figures` gives them)."""
    from gpu_placement.outcomes.record import _LABELS

    names = _LABELS[metric]
    order = sorted(range(len(names)), key=lambda i: names[i])
    return Counter({tuple(labels[i] for i in order): h.count
                    for labels, h in outcomes.histograms[metric].items() if h.count})


def truth_histograms(truth: Truth) -> dict[str, Counter[tuple[str, ...]]]:
    """The story's observations per metric, labels in sorted-name order."""
    return {
        "gpu_placement_node_ready_seconds": Counter((pool, product) for pool, product, _ in truth.ready),
        "gpu_placement_node_recovery_seconds": Counter((pool, product, reason)
                                                       for pool, product, reason, _ in truth.recovery),
        "gpu_placement_node_exclusion_seconds": Counter((pool, product, reason)
                                                        for pool, product, reason, _ in truth.exclusion),
        "gpu_placement_gpu_pod_wait_seconds": Counter((pool, reason) for reason, pool, _ in truth.waits),
    }


assert set(BUCKETS) == {"gpu_placement_gpu_pod_wait_seconds", "gpu_placement_node_ready_seconds",
                        "gpu_placement_node_recovery_seconds", "gpu_placement_node_exclusion_seconds"}
