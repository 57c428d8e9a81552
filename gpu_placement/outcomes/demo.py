"""The outcome table of `gpu-placement demo`: a day of its history replayed through the real counting,
and the table `gpu-placement report` prints, computed by the same code from this process's counters.

The demo has no Prometheus and no API server: the day's objects (gpu_placement/samples/history.py) go
into a view of their own one change at a time, on a clock that follows their timestamps; a
LocalCounter moves the watermark every 30 s of that clock; the idle-GPU gauge is read at each step and
integrated into GPU-hours, as Prometheus' recording rule would sample it.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from gpu_placement.base.config import parse_config
from gpu_placement.outcomes.counter import LocalCounter
from gpu_placement.outcomes.idle import idle_while_waiting
from gpu_placement.outcomes.record import Outcomes
from gpu_placement.outcomes.report import Counters, Window, compute, render
from gpu_placement.samples.history import CONFIG, day
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest

__all__ = ["replay_day", "table"]

_KINDS = {"Pod": "pods", "Node": "nodes", "Namespace": "namespaces"}
STEP = 30.0


class _Families:
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def replay_day(start: float) -> tuple[Counters, Window]:
    """Replay the day from `start`; its counters and idle GPU-hours as a report source."""
    config = parse_config(CONFIG)
    view = ClusterView(config)
    ingest = Ingest(config)
    for kind in ("namespaces", "nodes", "pods"):
        ingest.replace(view, kind, [])
    clock = [start - 3 * 3600]
    outcomes = Outcomes(view, config, clock=lambda: clock[0]).start()
    counter = LocalCounter(outcomes, lambda: clock[0])
    changes, _ = day(start)
    end = start + 26 * 3600
    idle: dict[tuple[str, str], float] = {}
    upcoming = 0
    while clock[0] < end:
        turn = clock[0] + STEP
        while upcoming < len(changes) and changes[upcoming].at <= turn:
            change = changes[upcoming]
            clock[0] = max(clock[0], change.at)
            ingest.event(view, _KINDS[change.kind], "DELETED" if change.deleted else "MODIFIED", change.obj)
            upcoming += 1
        clock[0] = turn
        counter.step()
        for key, (units, _) in idle_while_waiting(outcomes).items():
            idle[key] = idle.get(key, 0.0) + units * STEP / 3600
    registry = CollectorRegistry()
    registry.register(_Families(outcomes.families()))
    samples = [(s.name, s.labels, s.value) for family in text_string_to_metric_families(generate_latest(registry)
                                                                                         .decode())
               for s in family.samples]
    window = Window(math.floor(end / 60) * 60, 27 * 3600)
    return Counters(samples, idle, "the demo's own counters"), window


def table(start: float) -> str:
    source, window = replay_day(start)
    return render([compute(source, window)], "text", "27h")
