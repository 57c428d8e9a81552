"""Replaying gpu_placement.samples.history's day into a view, on a clock that follows the objects' own
timestamps (not wall time): the helpers the outcome tests share."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from gpu_placement.base.config import Config, parse_config
from gpu_placement.decide.rules import CODES, DRIVER_UPGRADE, MIG_RECONFIGURING, NO_GPU, NODE_NOT_READY, NOT_VALIDATED
from gpu_placement.facts.launch import CAUSES, FAILED, NONE, STARTED
from gpu_placement.outcomes.record import (
    AFFINITY,
    BUCKETS,
    EXCLUSION,
    GATED,
    INSUFFICIENT,
    LABELS,
    NO_WAIT,
    READY,
    RECOVERY,
    STARTS,
    UNKNOWN,
    WAIT,
    Emission,
    Outcomes,
)
from gpu_placement.samples.history import CONFIG, Change, Truth
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest

__all__ = ["START", "Clock", "Held", "ViewReplica", "apply", "exposition", "figures", "held", "histogram_counts",
           "large_cluster", "plural", "truth_histograms"]

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


Held = tuple[dict[tuple[str, ...], float], dict[str, dict[tuple[str, ...], tuple[tuple[int, ...], float, int]]]]


def held(outcomes: Outcomes) -> Held:
    """What an Outcomes exports, read from it directly (an exposition of 13,000 series takes a minute to
    parse): launches by label set; each histogram series' buckets, sum and count; series at zero left out."""
    with outcomes.view.lock:
        return ({labels: value for labels, value in outcomes.counts.items() if value},
                {metric: {labels: (tuple(h.buckets), h.total, h.count) for labels, h in table.items() if h.count}
                 for metric, table in outcomes.histograms.items()})


def histogram_counts(outcomes: Outcomes, metric: str) -> Counter[tuple[str, ...]]:
    """Observations per label set, labels in sorted-name order (as `figures` gives them)."""
    names = LABELS[metric]
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


PRODUCTS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-B200", "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-40GB",
            "NVIDIA-L40S", "NVIDIA-A10G", "Tesla-T4")
NODE_REASONS = (NODE_NOT_READY, NO_GPU, NOT_VALIDATED, DRIVER_UPGRADE, MIG_RECONFIGURING)  # a verdict's codes
WAIT_REASONS = (*CODES, GATED, INSUFFICIENT, AFFINITY, NO_WAIT, UNKNOWN)


def large_cluster(pools: int = 20, products: int = 8, seed: int = 41) -> tuple[Config, list[Emission]]:
    """A large cluster's year of outcomes: `pools` pools (named as teams name them), each with
    `products` GPU products, every launch outcome and cause, every wait reason, every reason a node
    goes out for; a series' observations in the tens to hundreds, launches in the tens of thousands,
    the times spread over the buckets (log-uniform)."""
    rnd = random.Random(seed)
    names = [f"{team}-{kind}-{index:02d}" for index, (team, kind) in enumerate(
        (team, kind) for team in ("research", "inference", "training", "platform", "batch")
        for kind in ("interactive", "batch", "prod", "dev"))][:pools]
    names += [f"pool-{index:04d}" for index in range(len(names), pools)]
    kinds = [*PRODUCTS, *(f"NVIDIA-GPU-{index:03d}" for index in range(len(PRODUCTS), products))][:products]
    config = parse_config({"pools": {name: {"nodeSelector": {"pool": name}} for name in names}})

    def times(metric: str, labels: tuple[str, ...], most: int, low: float, high: float) -> list[Emission]:
        return [Emission(metric, labels, math.exp(rnd.uniform(math.log(low), math.log(high))), 0.0, metric)
                for _ in range(rnd.randint(1, most))]

    events: list[Emission] = []
    for pool in names:
        for placed in ("true", "false"):
            events.append(Emission(STARTS, (STARTED, NONE, pool, placed), float(rnd.randint(10_000, 200_000)), 0.0, ""))
            events += [Emission(STARTS, (FAILED, cause, pool, placed), float(rnd.randint(1, 500)), 0.0, "")
                       for cause in CAUSES]
        for reason in WAIT_REASONS:
            events += times(WAIT, (reason, pool), 300, 1.0, 172800.0)
        for product in kinds:
            events += times(READY, (pool, product), 60, 180.0, 14400.0)
            for reason in NODE_REASONS:
                events += times(RECOVERY, (pool, product, reason), 40, 60.0, 172800.0)
                events += times(EXCLUSION, (pool, product, reason), 40, 0.05, 3600.0)
    return config, events


assert set(BUCKETS) == {"gpu_placement_gpu_pod_wait_seconds", "gpu_placement_node_ready_seconds",
                        "gpu_placement_node_recovery_seconds", "gpu_placement_node_exclusion_seconds"}
