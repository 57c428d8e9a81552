"""Monitors pass through (KEP-5018, admin access GA in 1.36): a DCGM-like pod whose only GPU claim has
`adminAccess: true`, in a namespace labelled `resource.kubernetes.io/admin-access=true`, shares devices
other claims hold and takes none. gpu-placement leaves it as it is (no route, no shape, no charge, no
hold), never counts its claim against a node's free devices, and never against its namespace's quota."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.samples.cluster import namespace
from gpu_placement.samples.dra import device_classes, resource_slice
from tests.support.dra import claim_pod, dra_node, set_namespaces, templates_for
from tests.support.extender import Extender
from tests.support.webhook import Webhook

pytestmark = pytest.mark.timeout(30)
Obj = dict[str, Any]
ADMIN = {"resource.kubernetes.io/admin-access": "true"}


def admin_template(ns: str, name: str = "monitor") -> Obj:
    """What a DCGM exporter (or the GPU Operator's DRA validator) asks: every GPU of the node, admin access."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": True}}]}}}}


def monitor_pod(ns: str, name: str = "dcgm") -> Obj:
    pod = claim_pod(ns, name, "monitor")
    for key in ("namespace", "uid"):
        pod["metadata"].pop(key, None)
    pod.pop("status", None)
    pod["spec"].pop("schedulerName", None)
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]  # as DCGM exporter's DaemonSet tolerates every taint
    return pod


@pytest.fixture
def monitoring(hook: Webhook) -> Iterator[Webhook]:
    """Namespace `monitoring` (admin access, and a GPU quota of 1 whole GPU through DRA) with its templates."""
    set_namespaces(hook, [namespace("monitoring", {"gpu-placement.io/allocation": "dra",
                                                   "gpu-placement.io/quota": "nvidia.com/gpu=1"}, labels=ADMIN)])
    with hook.view.lock:
        hook.ingest.replace(hook.view, "deviceclasses", copy.deepcopy(device_classes()))
        hook.ingest.replace(hook.view, "resourceclaimtemplates",
                            [admin_template("monitoring"), *templates_for(hook, "monitoring")])
    yield hook
    with hook.view.lock:
        for kind in ("deviceclasses", "resourceclaimtemplates", "resourceclaims"):
            hook.ingest.replace(hook.view, kind, [])
        hook.view.dra.active = False
        hook.view.listed -= {"deviceclasses", "resourceclaimtemplates", "resourceclaims"}


def test_a_monitor_pod_is_left_as_it_is(monitoring: Webhook) -> None:
    """On main /mutate moved it to the gpu-placement scheduler (and added tolerations and a record)."""
    pod = monitor_pod("monitoring")
    mutated, ops, _ = monitoring.mutate(pod, "monitoring")
    assert ops == []
    assert mutated == pod
    verdict = monitoring.validate(mutated, "monitoring")
    assert verdict["allowed"] is True and not verdict.get("warnings")
    with monitoring.view.lock:  # nothing held against the namespace's quota
        assert monitoring.app.state.admission.reservations.pending("monitoring") == {}


def test_a_monitor_claim_takes_no_device_from_the_fit_or_the_quota(monitoring: Webhook) -> None:
    """Its claim allocated on a node (every device, admin access) holds none of them for the scores or the
    DRA fit; the namespace's pods still get their whole quota."""
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "dcgm-gpus", "namespace": "monitoring"},
             "spec": admin_template("monitoring")["spec"]["spec"],
             "status": {"allocation": {"devices": {"results": [
                 {"driver": "gpu.nvidia.com", "pool": "n1", "device": f"gpu-{i}", "request": "gpus",
                  "adminAccess": True} for i in range(2)]}}}}
    with monitoring.view.lock:
        monitoring.ingest.replace(monitoring.view, "resourceslices", [resource_slice("n1", 2)])
        monitoring.ingest.replace(monitoring.view, "resourceclaims", [claim])
        assert monitoring.view.dra.used_on("n1") == {}
    _, verdict = monitoring.admit(monitor_pod("monitoring", "train") | {"spec": {"containers": [{
        "name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}, "monitoring")
    assert verdict["allowed"] is True, verdict


def test_the_extender_counts_no_device_a_monitor_holds() -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "dcgm-gpus", "namespace": "monitoring"},
             "spec": admin_template("monitoring")["spec"]["spec"],
             "status": {"allocation": {"devices": {"results": [
                 {"driver": "gpu.nvidia.com", "pool": "one", "device": "gpu-0", "request": "gpus",
                  "adminAccess": True}]}}}}
    from gpu_placement.samples.cluster import validator_pod
    from tests.support.dra import template

    server = Extender([namespace("ml"), *device_classes(), template("ml", "one-gpu", "gpu.nvidia.com"),
                       dra_node("one"), validator_pod("one", True), resource_slice("one", 1), claim])
    try:
        answer = server.filter(claim_pod("ml", "train", "one-gpu"), ["one"])
        assert answer["NodeNames"] == ["one"], answer  # the one device is free for the allocator too
    finally:
        server.close()


def test_the_mirror_gives_a_monitors_claims_room_of_their_own(monitoring: Webhook) -> None:
    """kube-apiserver charges an admin-access claim like any other (resource_claims_test.go "admin"; All
    counts 32 devices): without room a DCGM exporter's claim would be refused by the namespace's quota,
    or take it. The mirror raises each key the claim is charged, from the moment its pod waits for it."""
    from gpu_placement.controllers.quota_mirror import QuotaMirror

    def hard() -> dict[str, str]:
        mirror = QuotaMirror(None, monitoring.view, monitoring.config, "gpu-placement", "r")  # type: ignore[arg-type]
        _, wanted, _ = mirror._wanted("monitoring")
        assert wanted is not None
        return {key: wanted[key] for key in ("requests.nvidia.com/gpu",
                                             "gpu.nvidia.com.deviceclass.resource.k8s.io/devices")}

    assert hard() == {"requests.nvidia.com/gpu": "1", "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "1"}
    waiting = claim_pod("monitoring", "dcgm", "monitor", node=None)
    with monitoring.view.lock:
        monitoring.ingest.event(monitoring.view, "pods", "ADDED", waiting)
    assert hard() == {"requests.nvidia.com/gpu": "33", "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "33"}
    made = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "dcgm-gpus", "namespace": "monitoring", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "dcgm", "uid": waiting["metadata"]["uid"],
                 "controller": True}]},
            "spec": admin_template("monitoring")["spec"]["spec"]}
    recorded = copy.deepcopy(waiting)
    recorded["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "dcgm-gpus"}]
    with monitoring.view.lock:
        monitoring.ingest.event(monitoring.view, "resourceclaims", "ADDED", made)
        monitoring.ingest.event(monitoring.view, "pods", "MODIFIED", recorded)
    assert hard() == {"requests.nvidia.com/gpu": "33", "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "33"}
    with monitoring.view.lock:
        monitoring.ingest.event(monitoring.view, "pods", "DELETED", recorded)
        monitoring.ingest.event(monitoring.view, "resourceclaims", "DELETED", made)
    assert hard() == {"requests.nvidia.com/gpu": "1", "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "1"}


def test_a_monitors_template_is_within_any_policy(monitoring: Webhook) -> None:
    """Its All request (32 devices for quota) takes no device: on main /validate refused the template as more
    than the namespace's quota of 1, on the real API server too (tests/e2e/test_19_dra.py)."""
    from webhook.dra_validate import claim_problems

    policy = monitoring.app.state.admission.policy("monitoring")
    assert claim_problems(admin_template("monitoring"), "resourceclaimtemplates", policy, monitoring.config) == []
