"""DRA device taints: replicas of the taint writer on the fake API, the rules they write, a node's taint."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpu_placement.app.assembly import discover_dra
from gpu_placement.base.config import Config
from gpu_placement.controllers.dra_taints import TaintController, TaintSettings
from gpu_placement.samples.cluster import make_node, namespace, validator_pod
from gpu_placement.samples.dra import device_classes, resource_slice
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import KINDS, Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import FakeApiServer
from tests.support.live import FAST
from tests.support.waiting import wait_for

QUICK = TaintSettings(lease_name="dra-lock", lease_seconds=1, renew_seconds=0.05, resync_seconds=3600,
                      settle_seconds=0.0, writes_per_second=1000, burst=1000)


def dra_node(name: str, ready: bool = True, **labels: str) -> dict[str, Any]:
    return make_node(name, "h100", labels=labels, allocatable={}, ready=ready)


def waiting_validator(node: str) -> dict[str, Any]:
    """A GPU Operator DRA validator pod as its DaemonSet makes it: not bound yet, pinned by affinity,
    taking a GPU through a claim."""
    pod = validator_pod(node, ready=False)
    pod["metadata"]["name"] = f"nvidia-dra-validator-{node}"
    del pod["spec"]["nodeName"]
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    claim = {"name": "validation-gpu", "resourceClaimTemplateName": "nvidia-dra-validator-gpu"}
    pod["spec"]["resourceClaims"] = [claim]
    return pod


def cluster() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = [namespace("gpu-placement"), namespace("gpu-operator"), *device_classes()]
    for node, ready, labels in (("ok", True, {}), ("unvalidated", False, {}),
                                ("upgrading", True, {"nvidia.com/gpu-driver-upgrade-state": "pod-restart-required"}),
                                ("waiting", None, {}), ("down", True, {})):
        objects += [dra_node(node, node != "down", **labels), resource_slice(node, 2)]  # down: NotReady, no rule
        if ready is not None:
            objects.append(validator_pod(node, ready))
    objects.append(waiting_validator("waiting"))
    objects.append(make_node("plugin", "h100"))  # the device plugin's node: no slice, never a rule
    objects.append(validator_pod("plugin", False))
    return objects


class Replica:
    def __init__(self, fake: FakeApiServer, identity: str, config: Config, settings: TaintSettings = QUICK) -> None:
        self.fake, self.config = fake, config
        self.view = ClusterView(config)
        self.api = fake.api_client()
        dra = discover_dra(self.api, tries=1)
        self.source = LiveSource(self.view, Ingest(config), self.api, FAST, kinds=(*KINDS, *dra.paths()),
                                 paths=dra.paths(), selectors={"resourceslices": "spec.driver=gpu.nvidia.com"})
        self.taints = TaintController(self.api, self.view, config, "gpu-placement", identity, settings)
        self.source.start()
        wait_for(lambda: self.source.ready, what="the first full lists")

    def stop(self) -> None:
        self.taints.stop()
        self.source.stop()
        self.api.close()


@pytest.fixture
def replicas() -> Iterator[Callable[..., Replica]]:
    fakes: list[FakeApiServer] = []
    made: list[Replica] = []

    def make(config: Config | None = None, *, fake: FakeApiServer | None = None, taint_rules: str | None = "v1",
             identity: str = "replica-a", settings: TaintSettings = QUICK,
             device_taint_eviction: bool = False) -> Replica:
        if fake is None:
            fake = FakeApiServer(dra="v1", taint_rules=taint_rules,
                                 device_taint_eviction=device_taint_eviction).start()
            fake.load(cluster())
            fakes.append(fake)
        replica = Replica(fake, identity, config or Config(), settings)
        made.append(replica)
        return replica

    yield make
    for replica in made:
        replica.stop()
    for fake in fakes:
        fake.stop()


def rules(fake: FakeApiServer) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in fake.list("DeviceTaintRule")}


def taint(rule: dict[str, Any]) -> tuple[str, str, str]:
    t = rule["spec"]["taint"]
    return t["key"], t.get("value", ""), t["effect"]
