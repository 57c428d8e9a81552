"""Driver rollouts: a wave of nodes and what a soaking wave says."""

from __future__ import annotations

from typing import Any

from gpu_placement.base.config import Config
from gpu_placement.decide.placement import Placement
from gpu_placement.decide.rollout import Rollout
from gpu_placement.samples.cluster import driver_labels, driver_pod, make_node, make_pod, namespace, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest

NOW = 1_800_000_000.0
DAY = 86400.0
OLD, NEW = ("550.54.15", "12.4"), ("580.126.09", "13.0")
GPU = "nvidia.com/gpu"
NODES = ["old", "new-1", "new-2"]
SOAKING_SENTENCE = ("DriverSoaking: driver 580.126.09 is new on the node and is soaking: "
                    'only pods of namespaces annotated gpu-placement.io/canary="true" run on it until it has run 60 '
                    "minutes there without an XID error or a validator restart (rollout.soak: strict)")


class Wave:
    """A view fed one object at a time, with a clock of its own: one node on the old driver, two whose
    driver changed 20 and 50 minutes ago."""

    def __init__(self, config: Config, objects: list[dict[str, Any]] | None = None) -> None:
        self.now = NOW
        self.config = config
        self.view = ClusterView(config)
        self.ingest = Ingest(config)
        self.objects = objects if objects is not None else wave_objects()
        for obj in self.objects:
            self.apply(obj)
        self.rollout = Rollout(self.view, config, clock=lambda: self.now)
        self.placement = Placement(self.view, config, self.rollout)

    def apply(self, obj: dict[str, Any]) -> None:
        kind = Ingest.kind_of(obj)
        assert kind is not None
        self.ingest.event(self.view, kind, "MODIFIED", obj)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.view.delete_pod(f"{namespace}/{name}")

    def requirements(self, ns: str) -> Any:
        return self.placement.requirements(make_pod(ns, "job", gpus={GPU: 1}))

    def filter(self, ns: str, names: list[str] = NODES) -> tuple[set[str], dict[str, str]]:
        result = self.placement.filter(self.requirements(ns), names)
        return set(result.passed), {**result.failed, **result.unresolvable}

    def scores(self, ns: str, names: list[str] = NODES) -> dict[str, int]:
        return dict(self.placement.scores(self.requirements(ns), names))


def wave_objects() -> list[dict[str, Any]]:
    objects = [namespace("team"), namespace("canary", {"gpu-placement.io/canary": "true"}), namespace("gpu-operator")]
    for name, (version, cuda), ready_ago in [("old", OLD, 40 * DAY), ("new-1", NEW, 20 * 60), ("new-2", NEW, 50 * 60)]:
        objects += [make_node(name, "h100x8", labels=driver_labels(version, cuda), created=NOW - 100 * DAY),
                    validator_pod(name), driver_pod(name, version, NOW - ready_ago)]
    return objects
