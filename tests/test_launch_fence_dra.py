"""Launch fences for pods that take their GPUs through DRA (docs/rules.md, LaunchFailures): the extender refuses
the node, and a DeviceTaintRule carries the same verdict to every scheduler's DRA allocator: on the node's
devices, or on the devices the failed pods' kubelet named, and only until the fence lifts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.app.assembly import discover_dra
from gpu_placement.base.config import Config
from gpu_placement.base.timestamps import format_time
from gpu_placement.controllers.dra_taints import TaintController
from gpu_placement.decide.dra_fit import excluded_devices
from gpu_placement.decide.placement import Placement
from gpu_placement.samples.cluster import namespace, validator_pod
from gpu_placement.samples.dra import device_classes, resource_slice
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import KINDS, Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import FakeApiServer
from tests.support.dra import claim_pod, template
from tests.support.dra_taints import QUICK, dra_node, rules, taint
from tests.support.fence import ADMISSION, ready_validator
from tests.support.live import FAST
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)
ROUTED = {"gpu-placement.io/admitted": '{"claims":["gpu.nvidia.com"],"scheduler":"gpu-placement"}'}
FENCED = ("LaunchFailures: 2 GPU pods with DRA claims in a row failed to start on the node for the node's reasons "
          "(device_plugin: ")


def failed_claim_pod(name: str, at: float, device: str | None = None) -> dict[str, Any]:
    """A claim pod gpu-placement routed, refused on d1: by admission, or (`device`) its device reported Unhealthy."""
    pod = claim_pod("ml", name, "one-gpu", node="d1", annotations=ROUTED)
    if device is None:
        pod["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": ADMISSION,
                         "startTime": format_time(at)}
        return pod
    health = [{"name": "claim:gpu", "resources": [{"resourceID": f"gpu.nvidia.com/d1/{device}", "health": "Unhealthy",
                                                   "message": "XID 79"}]}]
    pod["status"] = {"phase": "Failed", "startTime": format_time(at), "containerStatuses": [
        {"name": "main", "allocatedResourcesStatus": health,
         "state": {"terminated": {"exitCode": 1, "startedAt": format_time(at + 1), "finishedAt": format_time(at + 2),
                                  "message": "CUDA error: unknown error"}}}]}
    return pod


class Replica:
    def __init__(self, fake: FakeApiServer) -> None:
        self.config = Config()
        self.view = ClusterView(self.config)
        self.api = fake.api_client()
        dra = discover_dra(self.api, tries=1)
        self.source = LiveSource(self.view, Ingest(self.config), self.api, FAST, kinds=(*KINDS, *dra.paths()),
                                 paths=dra.paths(), selectors={"resourceslices": "spec.driver=gpu.nvidia.com"})
        self.source.start()
        wait_for(lambda: self.source.ready, what="the first full lists")
        self.placement = Placement(self.view, self.config)
        self.taints = TaintController(self.api, self.view, self.config, "gpu-placement", "replica-a", QUICK,
                                      fences=self.placement.fences)

    def refused(self) -> dict[str, str]:
        req = self.placement.requirements(claim_pod("ml", "next", "one-gpu"))
        result = self.placement.filter(req, ["d1", "d2"])
        return {**result.failed, **result.unresolvable}

    def stop(self) -> None:
        self.taints.stop()
        self.source.stop()
        self.api.close()


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer(dra="v1", taint_rules="v1").start()
    server.load([namespace("gpu-placement"), namespace("gpu-operator"), namespace("ml"), *device_classes(),
                 template("ml", "one-gpu", "gpu.nvidia.com"),
                 *(o for n in ("d1", "d2") for o in (dra_node(n), resource_slice(n, 2), validator_pod(n)))])
    yield server
    server.stop()


def test_a_dra_node_whose_claim_pods_fail_is_refused_and_tainted_until_revalidated(fake: FakeApiServer) -> None:
    now = time.time()
    fake.load([failed_claim_pod("a", now - 30), failed_claim_pod("b", now - 20)])
    replica = Replica(fake)
    try:
        refused = replica.refused()
        assert list(refused) == ["d1"] and refused["d1"].startswith(FENCED)
        replica.taints.step()
        rule = rules(fake)["gpu-placement-d1"]
        assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "d1"}  # every device of d1
        assert taint(rule) == ("gpu-placement.io/unverified", "LaunchFailures", "NoSchedule")
        assert rule["metadata"]["annotations"]["gpu-placement.io/reason"] == refused["d1"]
        assert "gpu-placement-d2" not in rules(fake)

        fake.add(ready_validator("d1", time.time()), keep_created=True)  # the GPU Operator revalidated d1
        wait_for(lambda: replica.refused() == {}, what="the fence lifted")
        replica.taints.step()
        assert "gpu-placement-d1" not in rules(fake)
    finally:
        replica.stop()


def test_devices_the_failed_pods_named_are_tainted_alone_and_the_node_keeps_the_others(fake: FakeApiServer) -> None:
    now = time.time()
    fake.load([failed_claim_pod("a", now - 30, "gpu-0"), failed_claim_pod("b", now - 20, "gpu-0")])
    replica = Replica(fake)
    try:
        assert replica.refused() == {}  # d1's other GPU still serves the claim
        with replica.view.lock:
            assert excluded_devices(replica.view, "d1") == {"gpu-0"}  # the fit leaves the named one out
        assert replica.view.fenced_devices["d1"]["gpu-0"].startswith(
            "LaunchFailures: 2 GPU pods with DRA claims in a row failed to start on the node for the node's "
            "reasons (device_unhealthy: a device given to the pod reported Unhealthy)")
        replica.taints.step()
        rule = rules(fake)["gpu-placement-d1-gpu-0"]
        assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "d1", "device": "gpu-0"}
        assert taint(rule)[1] == "LaunchFailures" and "gpu-placement-d1" not in rules(fake)
    finally:
        replica.stop()
