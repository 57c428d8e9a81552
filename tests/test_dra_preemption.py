"""Preemption, honestly, for pods that take devices through DRA: kube-scheduler 1.37 cannot preempt for
DRA devices (no PreFilterExtensions in its DynamicResources plugin; KEP-5690 not merged). /preempt never
proposes victims to free devices for a claim pod, drops a node whose devices the claims do not find
free, and keeps kube-scheduler's own victims where the devices are free (they make room for the rest)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_placement.decide.preemption import NO_DRA_PREEMPTION, explain_preemption
from gpu_placement.samples.cluster import make_pod, namespace, validator_pod
from gpu_placement.samples.dra import device_classes, resource_slice
from tests.support.dra import claim_pod, dra_node, template
from tests.support.extender import Extender

pytestmark = pytest.mark.timeout(60)
Obj = dict[str, Any]


def holder(name: str, node: str, priority: int) -> tuple[Obj, Obj]:
    """A low-priority pod on `node` holding its one device through a claim from `one-gpu`."""
    pod = claim_pod("ml", name, "one-gpu", node=node)
    pod["spec"]["priority"] = priority
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": f"{name}-gpu", "namespace": "ml", "ownerReferences": [
                 {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod["metadata"]["uid"], "controller": True}]},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
             "status": {"allocation": {"devices": {"results": [
                 {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0"}]}}}}
    return pod, claim


@pytest.fixture(scope="module")
def extender() -> Any:
    busy, busy_claim = holder("low", "busy", 0)
    free_pod = make_pod("ml", "cpu-hog", node="free")
    free_pod["spec"]["priority"] = 0
    objects = [namespace("ml"), *device_classes(), template("ml", "one-gpu", "gpu.nvidia.com"), busy, busy_claim,
               free_pod]
    for node in ("busy", "free"):
        objects += [dra_node(node), validator_pod(node, True), resource_slice(node, 1)]
    server = Extender(objects)
    yield server
    server.close()


def test_no_victim_is_proposed_to_free_a_device_for_a_claim_pod(extender: Extender) -> None:
    """kube-scheduler proposes `low` on `busy` (for CPU, say): evicting it frees no device for the preemptor's
    claim in kube-scheduler's eyes, so the node is dropped. On main the node was kept with that victim. On
    `free` the device is free: kube-scheduler's own victim, for the rest, stands."""
    pod = claim_pod("ml", "urgent", "one-gpu")
    pod["spec"]["priority"] = 1000
    body = {"Pod": pod, "NodeNameToVictims": None, "NodeNameToMetaVictims": {
        "busy": {"Pods": [{"UID": "uid-ml-low"}], "NumPDBViolations": 0},
        "free": {"Pods": [{"UID": "uid-ml-cpu-hog"}], "NumPDBViolations": 0}}}
    response = extender.post("preempt", body)
    assert response.status_code == 200, response.text
    assert response.json()["NodeNameToMetaVictims"] == {
        "free": {"Pods": [{"UID": "uid-ml-cpu-hog"}], "NumPDBViolations": 0}}


def test_filter_and_explain_say_kube_scheduler_does_not_preempt_for_devices(extender: Extender) -> None:
    pod = claim_pod("ml", "urgent", "one-gpu")
    pod["spec"]["priority"] = 1000
    answer = extender.filter(pod, ["busy"])
    assert answer["FailedNodes"] == {}  # unresolvable: kube-scheduler would never ask /preempt about it
    assert "kube-scheduler does not preempt for DRA devices" in answer["FailedAndUnresolvableNodes"]["busy"]
    placement = extender.core.placement
    assert explain_preemption(placement, placement.requirements(pod), pod, ["busy"]) == [
        ["busy", "no", NO_DRA_PREEMPTION]]  # explain's preemption table, where the pod fits nowhere
