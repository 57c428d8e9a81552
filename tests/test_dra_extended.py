"""Extended resources backed by DRA (KEP-5004, DRAExtendedResource GA and locked in 1.37).

A DeviceClass naming `extendedResourceName: nvidia.com/gpu` lets an unchanged `nvidia.com/gpu` pod be
served by DRA devices where a node's allocatable lacks the resource (kube-scheduler makes a claim for
it), and every class answers to `deviceclass.resource.kubernetes.io/<class>` as well. Such pods get the
node rules of any GPU pod, the fit counted from the node's ResourceSlices and allocated claims; a node
serving the resource both ways is judged by the way kube-scheduler uses there (the device plugin's,
where its allocatable has it); the webhook keeps such pods as written where the cluster maps the
resource; their quota is counted as kube-apiserver charges it."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.app.explain import explain_pod
from gpu_placement.base.config import Config
from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod
from gpu_placement.samples.dra import device_classes, resource_slice
from tests.support.dra import OLD_DRIVER, dra_node, set_namespaces, templates_for, verdicts
from tests.support.extender import Extender
from tests.support.webhook import Webhook, user_pod

pytestmark = pytest.mark.timeout(60)
Obj = dict[str, Any]
IMPLICIT = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"


def implicit_claim(ns: str, pod: str, node: str, device: str = "gpu-0") -> Obj:
    """The claim kube-scheduler makes for a pod's extended resources (extendeddynamicresources.go
    `preFilterExtendedResources`), allocated on `node`."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"{pod}-extended-resources-x1", "namespace": ns,
                         "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod,
                                              "uid": f"uid-{ns}-{pod}", "controller": True}]},
            "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "container-0-request-0", "driver": "gpu.nvidia.com", "pool": node, "device": device}]}}}}


NODES = {
    "ok": (dra_node("ok"), True, resource_slice("ok", 2)),
    "bare": (dra_node("bare", bare=True), True, resource_slice("bare", 2)),  # no GFD labels: facts from the slice
    "old": (dra_node("old", bare=True), True, resource_slice("old", 2, OLD_DRIVER)),
    "unverified": (dra_node("unverified"), False, resource_slice("unverified", 2)),
    "full": (dra_node("full"), True, resource_slice("full", 1)),  # its one device held (FULL_CLAIM)
    "both": (make_node("both", "h100", allocatable={"nvidia.com/gpu": "4"}), True,
             resource_slice("both", 2)),  # the device plugin's 4 and DRA's 2
    "plugin": (make_node("plugin", "h100"), True, None),
}
FULL_CLAIM = implicit_claim("ml", "earlier", "full")


def objects() -> list[Obj]:
    found: list[Obj] = [namespace("ml"), *device_classes(), FULL_CLAIM]
    for node, ready, slice_ in NODES.values():
        found += [node, validator_pod(node["metadata"]["name"], ready)]
        if slice_:
            found.append(slice_)
    return found


@pytest.fixture(scope="module")
def extender() -> Iterator[Extender]:
    server = Extender(objects())
    yield server
    server.close()


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", IMPLICIT])
def test_a_pod_served_by_dra_gets_the_verdicts_of_any_gpu_pod(extender: Extender, resource: str) -> None:
    """On main the implicit name was no GPU resource (every node passed), and a DRA node whose devices all
    claims held passed the nvidia.com/gpu pod too."""
    answer = extender.filter(make_pod("ml", "train", gpus={resource: 1}), list(NODES))
    plugin = "pass" if resource == "nvidia.com/gpu" else "NoGPU"  # no device plugin advertises the implicit name
    assert verdicts(answer) == {"ok": "pass", "bare": "pass", "old": "pass", "unverified": "NotValidated",
                                "full": "InsufficientGPU", "both": "pass", "plugin": plugin}
    full = answer["FailedAndUnresolvableNodes"]["full"]  # kube-scheduler does not preempt for DRA devices
    assert full.startswith("InsufficientGPU: no free DRA device of gpu.nvidia.com on the node")
    newer = make_pod("ml", "train", gpus={resource: 1}, annotations={"gpu-placement.io/cuda": "12.6"})
    answer = extender.filter(newer, ["ok", "bare", "old"])
    assert verdicts(answer) == {"ok": "DriverTooOld",  # its labels: 550.54.15, CUDA 12.4
                                "bare": "pass",  # no such labels; its slice: 570.124.6, CUDA 12.8
                                "old": "DriverTooOld"}  # its slice: 535.104.5, CUDA 12.2


def test_a_node_serving_it_both_ways_is_judged_the_way_kube_scheduler_uses_there(extender: Extender) -> None:
    """kube-scheduler serves the resource through DRA only where the node's allocatable lacks it
    (extendeddynamicresources.go `filterExtendedResources`): `both` counts the device plugin's units."""
    answer = extender.filter(make_pod("ml", "big", gpus={"nvidia.com/gpu": 3}), ["both", "ok"])
    assert verdicts(answer) == {"both": "pass", "ok": "InsufficientGPU"}  # 4 units there; 2 devices here
    implicit = extender.filter(make_pod("ml", "big", gpus={IMPLICIT: 3}), ["both"])
    assert verdicts(implicit) == {"both": "InsufficientGPU"}  # its implicit name: DRA's 2 devices


def test_explain_and_nodes_say_which_way_a_node_serves_it(extender: Extender) -> None:
    text = explain_pod(extender.core, make_pod("ml", "train", gpus={"nvidia.com/gpu": 1}), "ml")
    [bare] = [line for line in text.splitlines() if line.startswith("bare ")]
    [both] = [line for line in text.splitlines() if line.startswith("both ")]
    assert "nvidia.com/gpu through DRA (DeviceClass gpu.nvidia.com)" in bare and "would take gpu-0" in bare
    assert "nvidia.com/gpu from the device plugin" in both
    from gpu_placement.report.nodes import node_records

    served = {r["node"]: r["served"] for r in node_records(extender.core)}
    assert served["bare"] == {"nvidia.com/gpu": "dra", IMPLICIT: "dra"}
    assert served["both"] == {"nvidia.com/gpu": "device-plugin", IMPLICIT: "dra"}
    assert served["plugin"] == {"nvidia.com/gpu": "device-plugin"}


# -- the webhook ------------------------------------------------------------------------------------------

@pytest.fixture
def cluster(hook: Webhook) -> Iterator[Webhook]:
    """NVIDIA's classes (gpu.nvidia.com names nvidia.com/gpu); namespaces on DRA: `plain` (quota only), `picky`
    (two products: its pods get claims), `mixed` (whole and shared GPUs: claims, for per-level quota)."""
    set_namespaces(hook, [
        namespace("plain", {"gpu-placement.io/allocation": "dra", "gpu-placement.io/quota": "nvidia.com/gpu=2"}),
        namespace("picky", {"gpu-placement.io/allocation": "dra", "gpu-placement.io/quota": "nvidia.com/gpu=2",
                            "gpu-placement.io/gpu-products": "NVIDIA-H100-80GB-HBM3,NVIDIA-A100-SXM4-80GB"}),
        namespace("mixed", {"gpu-placement.io/allocation": "dra",
                            "gpu-placement.io/quota": "nvidia.com/gpu=1,nvidia.com/gpu.shared=2"}),
        namespace("classic", {"gpu-placement.io/quota": "nvidia.com/gpu=2"})])
    with hook.view.lock:
        hook.ingest.replace(hook.view, "deviceclasses", copy.deepcopy(device_classes()))
        hook.ingest.replace(hook.view, "resourceclaimtemplates",
                            [t for ns in ("plain", "picky", "mixed") for t in templates_for(hook, ns)])
    yield hook
    with hook.view.lock:
        for kind in ("deviceclasses", "resourceclaimtemplates", "resourceclaims"):
            hook.ingest.replace(hook.view, kind, [])
        hook.view.dra.active = False
        hook.view.listed -= {"deviceclasses", "resourceclaimtemplates", "resourceclaims"}


def test_where_the_cluster_maps_the_resource_the_pod_keeps_it(cluster: Webhook) -> None:
    """On main the pod of `plain` was converted to claims from the namespace's template."""
    pod, verdict = cluster.admit(user_pod("plain", "train", gpus={"nvidia.com/gpu": 1}), "plain")
    assert verdict["allowed"] is True, verdict
    spec = pod["spec"]
    assert "resourceClaims" not in spec and spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "gpu-placement.io/gpu" not in spec["containers"][0]["resources"]["limits"]  # no stand-in: not a claim pod
    assert spec["schedulerName"] == "gpu-placement"
    assert "nvidia.com/gpu.present" not in (spec.get("nodeSelector") or {})


@pytest.mark.parametrize(("ns", "why"), [("picky", "products in order: firstAvailable"),
                                         ("mixed", "whole and shared GPUs both charge requests.nvidia.com/gpu")])
def test_where_the_policy_needs_a_claim_the_pod_still_gets_one(cluster: Webhook, ns: str, why: str) -> None:
    pod, verdict = cluster.admit(user_pod(ns, "train", gpus={"nvidia.com/gpu": 1}), ns)
    assert verdict["allowed"] is True, (why, verdict)
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith("gpu-placement-gpu-"), why


def test_the_implicit_name_of_a_gpu_class_is_a_gpu_pod(cluster: Webhook) -> None:
    """On main it was no GPU pod: left to its own scheduler, unjudged by gpu-placement."""
    mutated, _, _ = cluster.mutate(user_pod("classic", "train", gpus={IMPLICIT: 1}), "classic")
    assert mutated["spec"]["schedulerName"] == "gpu-placement"
    assert mutated["spec"]["containers"][0]["resources"]["limits"][IMPLICIT] == "1"


def test_a_kept_pods_claim_is_not_counted_again(cluster: Webhook) -> None:
    """A pod kept as nvidia.com/gpu is charged requests.nvidia.com/gpu at its create; the claim kube-scheduler
    makes for it is not charged it again (resource_claims.go addExtendedResourceQuota takes off what the pod
    asked). With one such pod running on a DRA node and its claim there, a second fits the quota of 2; a
    third does not. On main the claim was counted on top of the pod, and the second was refused."""
    first = make_pod("plain", "first", gpus={"nvidia.com/gpu": 1}, node="n1")
    with cluster.view.lock:
        cluster.ingest.event(cluster.view, "pods", "ADDED", first)
        cluster.ingest.replace(cluster.view, "resourceclaims", [implicit_claim("plain", "first", "n1")])
    second, verdict = cluster.admit(user_pod("plain", "second", gpus={"nvidia.com/gpu": 1}), "plain")
    assert verdict["allowed"] is True, verdict
    with cluster.view.lock:
        cluster.create(second, "plain")
    _, third = cluster.admit(user_pod("plain", "third", gpus={"nvidia.com/gpu": 1}), "plain")
    assert third["allowed"] is False
    assert third["status"]["message"].startswith("namespace plain may use 2 nvidia.com/gpu (gpu-placement.io/quota); "
                                                 "2 are in use and this pod asks 1 more")


def test_claims_of_a_class_naming_the_resource_count_against_it(cluster: Webhook) -> None:
    """DRAExtendedResource charges every claim of gpu.nvidia.com to requests.nvidia.com/gpu, in a namespace on
    the device plugin too: one written by hand and one pod take the quota of 2. On main the claim was not
    counted and the pod was let in for the API server to refuse."""
    by_hand = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": "mine", "namespace": "classic"},
               "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    with cluster.view.lock:
        cluster.ingest.replace(cluster.view, "resourceclaims", [by_hand])
        cluster.ingest.event(cluster.view, "pods", "ADDED", make_pod("classic", "one", gpus={"nvidia.com/gpu": 1}))
    _, verdict = cluster.admit(user_pod("classic", "two", gpus={"nvidia.com/gpu": 1}), "classic")
    assert verdict["allowed"] is False
    assert "may use 2 nvidia.com/gpu (gpu-placement.io/quota); 2 are in use" in verdict["status"]["message"]


def test_each_way_of_a_node_serving_it_both_ways_is_counted_on_its_own_books() -> None:
    """`both` serves nvidia.com/gpu from the device plugin (4 units, all held by running pods) and publishes 2 DRA
    devices of gpu.nvidia.com, both free. kube-scheduler does not fall back to DRA for a resource the node's
    allocatable has (extendeddynamicresources.go `filterExtendedResources`: DRA only where allocatable is 0;
    noderesources/fit.go `fitsRequest` counts it against allocatable), so an nvidia.com/gpu pod does not fit
    there, and kube-scheduler may preempt for it (FailedNodes); a pod asking the class's implicit name takes a
    free DRA device. On `held`, the other way round: its DRA devices held, its device plugin's free."""
    busy = [make_pod("ml", f"dp-{i}", gpus={"nvidia.com/gpu": 1}, node="both") for i in range(4)]
    objects_ = [namespace("ml"), *device_classes(),
                make_node("both", "h100", allocatable={"nvidia.com/gpu": "4"}), validator_pod("both"),
                resource_slice("both", 2), *busy,
                make_node("held", "h100", allocatable={"nvidia.com/gpu": "4"}), validator_pod("held"),
                resource_slice("held", 1), implicit_claim("ml", "earlier", "held")]
    placement = core_from_objects(Config(), objects_).placement
    classic = placement.filter(placement.requirements(make_pod("ml", "classic", gpus={"nvidia.com/gpu": 1})),
                               ["both", "held"])
    assert classic.passed == ["held"]
    assert classic.failed["both"].startswith("InsufficientGPU: the pod needs 1 nvidia.com/gpu free")  # resolvable
    implicit = placement.filter(placement.requirements(make_pod("ml", "implicit", gpus={IMPLICIT: 1})),
                                ["both", "held"])
    assert implicit.passed == ["both"]
    assert implicit.unresolvable["held"].startswith("InsufficientGPU: no free DRA device of gpu.nvidia.com")


def test_explain_and_nodes_say_a_node_serves_it_both_ways(extender: Extender) -> None:
    """On the branch before this: `both` read `nvidia.com/gpu from the device plugin` and `0/4 gpu` only, as a
    device-plugin node does; nothing said its DRA devices would not serve the pod."""
    text = explain_pod(extender.core, make_pod("ml", "train", gpus={"nvidia.com/gpu": 1}), "ml")
    [both] = [line for line in text.splitlines() if line.startswith("both ")]
    assert ("nvidia.com/gpu from the device plugin, not from its 2 DRA devices of gpu.nvidia.com "
            "(kube-scheduler uses DRA for it only on nodes whose allocatable lacks it)") in both
    [plugin] = [line for line in text.splitlines() if line.startswith("plugin ")]
    assert "nvidia.com/gpu from the device plugin;" in plugin
    from gpu_placement.report.nodes import _gpus, node_records

    records = {r["node"]: r for r in node_records(extender.core)}
    assert records["both"]["both_ways"] == ["nvidia.com/gpu"]
    assert records["plugin"]["both_ways"] == [] and records["bare"]["both_ways"] == []
    assert _gpus(records["both"]) == "0/4 gpu (device plugin; DRA devices too), 0/2 gpu.nvidia.com (DRA)"
    assert _gpus(records["bare"]) == "0/2 gpu.nvidia.com (DRA), 0/2 gpu (DRA)"
