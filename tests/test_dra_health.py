"""Device health in pod status (KEP-4680, ResourceHealthStatus beta and on since 1.36): the kubelet writes
`status.containerStatuses[].allocatedResourcesStatus` from the DRA driver's health stream. A pod whose
device is reported Unhealthy is shown by `explain`, its launch counted with cause `device_unhealthy`, and
the device kept out as an XID device is: a DeviceTaintRule for that device alone, and no fit there."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.app.explain import explain_pod
from gpu_placement.base.config import Config
from gpu_placement.controllers.dra_taints import DEVICE_UNHEALTHY, desired_rules
from gpu_placement.facts.launch import DEVICE_UNHEALTHY as CAUSE
from gpu_placement.facts.launch import FAILED, classify
from gpu_placement.facts.pods import pod_from_json
from gpu_placement.samples.cluster import namespace, validator_pod
from gpu_placement.samples.dra import device_classes, resource_slice
from tests.support.dra import claim_pod, dra_node, template, verdicts
from tests.support.extender import Extender

pytestmark = pytest.mark.timeout(60)
Obj = dict[str, Any]
SHARE = {"requests": {"memory": "20Gi"}}


def share_template() -> Obj:
    found = template("ml", "share", "gpu.nvidia.com")
    found["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = SHARE
    return found


def sick_pod(node: str = "n1", device: str = "gpu-0") -> tuple[Obj, Obj]:
    """A pod running on `node` with a share of `device` through claim `sick-share`, which its kubelet
    reports Unhealthy: the resourceID is the CDI device NVIDIA's driver names `<claim uid>-<device>`."""
    pod = claim_pod("ml", "sick", "share", node=node,
                    annotations={"gpu-placement.io/admitted": orjson.dumps({"claims": ["gpu.nvidia.com"]}).decode()})
    pod["spec"]["schedulerName"] = "gpu-placement"
    pod["status"].update({
        "phase": "Running", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "sick-share"}],
        "containerStatuses": [{"name": "main", "ready": True,
                               "state": {"running": {"startedAt": "2026-09-01T10:00:00Z"}},
                               "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [
                                   {"resourceID": f"k8s.gpu.nvidia.com/claim=uid-claim-{device}",
                                    "health": "Unhealthy", "message": "XID 79: GPU has fallen off the bus"}]}]}]})
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "sick-share", "namespace": "ml", "uid": "uid-claim", "ownerReferences": [
                 {"apiVersion": "v1", "kind": "Pod", "name": "sick", "uid": pod["metadata"]["uid"],
                  "controller": True}]},
             "spec": share_template()["spec"]["spec"],
             "status": {"allocation": {"devices": {"results": [
                 {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": device, "shareID": "s1",
                  "consumedCapacity": {"memory": "20Gi"}}]}}}}
    return pod, claim


def objects(devices: int = 2) -> list[Obj]:
    pod, claim = sick_pod()
    return [namespace("ml"), *device_classes(), share_template(), dra_node("n1"), validator_pod("n1", True),
            resource_slice("n1", devices, consumable=True), pod, claim]


def test_the_launch_of_a_pod_on_an_unhealthy_device_failed_on_the_node() -> None:
    """On main the pod was counted started: every container runs."""
    pod, _ = sick_pod()
    assert classify(pod["status"]) == (FAILED, CAUSE)
    record = pod_from_json(pod, Config().is_gpu_resource, lambda _ns, _labels: False,
                           scheduler=Config().scheduler_name)
    assert record.launch is not None and record.launch.cause == CAUSE  # a claim pod the webhook routed counts too


def test_the_device_is_tainted_alone_and_left_out_of_the_fit() -> None:
    """On main nothing read the pod's health: no rule, and gpu-0's room (60 GiB) took the next share."""
    core = core_from_objects(Config(), objects(devices=1))
    with core.view.lock:
        rules, _ = desired_rules(core.view, core.config, "n1")
        assert [(r.device, r.reason) for r in rules] == [("gpu-0", DEVICE_UNHEALTHY)]
        assert "pod ml/sick reports gpu-0 Unhealthy (claim:gpu: XID 79: GPU has fallen off the bus)" in (
            rules[0].sentence)
    server = Extender(objects(devices=1))
    try:
        answer = server.filter(claim_pod("ml", "next", "share"), ["n1"])
        assert verdicts(answer) == {"n1": "InsufficientGPU"}
        req = server.core.placement.requirements(claim_pod("ml", "next", "share"))
        assert "gpu-0 kept out by gpu-placement" in server.core.placement.detail(req, "n1")
    finally:
        server.close()
    healthy = copy.deepcopy(objects(devices=1))
    healthy[-2]["status"]["containerStatuses"][0].pop("allocatedResourcesStatus")
    server = Extender(healthy)
    try:
        assert server.filter(claim_pod("ml", "next", "share"), ["n1"])["NodeNames"] == ["n1"]
    finally:
        server.close()


def test_explain_shows_the_unhealthy_device() -> None:
    core = core_from_objects(Config(), objects())
    pod, _ = sick_pod()
    text = explain_pod(core, copy.deepcopy(pod), "ml", existing=True)
    assert "devices reported Unhealthy by its kubelet" in text
    assert ("claim:gpu (k8s.gpu.nvidia.com/claim=uid-claim-gpu-0) is Unhealthy: XID 79: GPU has fallen off the bus: "
            "device gpu-0 of node n1") in text
