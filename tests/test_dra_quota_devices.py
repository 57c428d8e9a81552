"""Devices that a namespace's ResourceClaims ask for, counted the way ResourceQuota charges them
(`<class>.deviceclass.resource.k8s.io/devices`), followed as claims come and go, and exported."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.base.config import Config
from gpu_placement.controllers.quota_mirror import QuotaMirror
from gpu_placement.controllers.templates import TemplateKeeper
from gpu_placement.report.cluster_metrics import tracker_for
from gpu_placement.samples.cluster import make_pod, namespace
from gpu_placement.samples.dra import device_classes
from gpu_placement.view.dra import MadeForPod
from tests.support.dra import Obj, dra_namespace, set_namespaces, templates_for
from tests.support.webhook import Webhook, user_pod


def claim(ns: str, name: str, *requests: Obj, owner: str | None = None) -> Obj:
    meta: Obj = {"name": name, "namespace": ns}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": f"uid-{ns}-{owner}",
                                    "controller": True}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": list(requests)}}}


def exactly(device_class: str, count: int | None = None, mode: str | None = None) -> Obj:
    request: Obj = {"deviceClassName": device_class}
    if count is not None:
        request["count"] = count
    if mode:
        request["allocationMode"] = mode
    return {"name": "r", "exactly": request}


def exported(core: Any) -> dict[tuple[str, str], float]:
    tracker = tracker_for(core.view)
    assert tracker is not None
    [family] = [f for f in tracker.families() if f.name == "gpu_placement_namespace_dra_devices"]
    return {(s.labels["namespace"], s.labels["device_class"]): s.value for s in family.samples}


def test_claims_are_charged_per_class_as_resourcequota_charges_them() -> None:
    first_available = {"name": "r", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2},
                                                       {"name": "small", "deviceClassName": "mig.nvidia.com"}]}
    claims = [claim("ai", "a", exactly("gpu.nvidia.com"), owner="train"),           # 1 (count defaults to 1)
              claim("ai", "b", exactly("gpu.nvidia.com", 3), owner="train"),         # 3
              claim("ai", "c", exactly("mig.nvidia.com", mode="All")),               # 32: the worst case
              claim("ai", "d", first_available),                                     # 2 gpu and 1 mig, each at most
              claim("web", "e", exactly("nic.example.com", 4))]
    core = core_from_objects(Config(), [namespace("ai"), namespace("web"), *device_classes(), *copy.deepcopy(claims)])
    assert core.view.dra.namespace_devices == {"ai": {"gpu.nvidia.com": 6, "mig.nvidia.com": 33},
                                               "web": {"nic.example.com": 4}}
    assert core.view.dra.made_for_pod == {"uid-ai-train": MadeForPod(2, {"gpu.nvidia.com": 4})}  # by the pod's UID
    assert exported(core)[("ai", "gpu.nvidia.com")] == 6
    with core.view.lock:
        core.ingest.event(core.view, "resourceclaims", "DELETED", claims[1])
        core.ingest.event(core.view, "resourceclaims", "DELETED", claims[0])
    assert core.view.dra.namespace_devices["ai"] == {"gpu.nvidia.com": 2, "mig.nvidia.com": 33}
    assert core.view.dra.made_for_pod == {}
    assert exported(core)[("ai", "gpu.nvidia.com")] == 2


# -- what the API server charges a `dra` namespace's claim pods, and /validate with it (issue 36) ------------

MIXED = "nvidia.com/gpu=1,nvidia.com/gpu.shared=4"  # the contract's quota shape
DEVICES = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"


def without_extended_resource() -> list[Obj]:
    """NVIDIA's classes as a cluster without DRAExtendedResource stores them: the API server drops
    extendedResourceName (pkg/registry/resource/deviceclass/strategy.go at v1.37.2)."""
    classes = device_classes()
    for found in classes:
        found["spec"].pop("extendedResourceName", None)
    return classes


def mirrored(hook: Webhook) -> dict[str, str]:
    _, hard, _ = QuotaMirror(None, hook.view, hook.config, "gpu-placement", "r")._wanted("team")  # type: ignore[arg-type]
    assert hard is not None
    return hard


def admit(hook: Webhook, name: str, sharing: str | None = None, gpus: int = 1) -> Obj:
    """/mutate then /validate, as the API server calls them; the pod stored (seen by the view) when allowed."""
    annotations = {"gpu-placement.io/sharing": sharing} if sharing else {}
    mutated, verdict = hook.admit(user_pod("team", name, gpus={"nvidia.com/gpu": gpus}, annotations=annotations),
                                  "team")
    if verdict["allowed"]:
        with hook.view.lock:
            hook.create(mutated, "team")
    return verdict


@pytest.mark.parametrize("classes", [None, without_extended_resource()], ids=["DRAExtendedResource", "gate-off"])
def test_a_mixed_quota_lets_in_each_level_up_to_its_own_figure(hook: Webhook, classes: list[Obj] | None) -> None:
    """nvidia.com/gpu=1,nvidia.com/gpu.shared=4: one exclusive GPU and four shared ones, whatever the API
    server charges claims (on main: 5 exclusive were let in, and on 1.37 the shared ones' claims refused)."""
    with dra_namespace(hook, MIXED, classes):
        assert admit(hook, "exclusive-0")["allowed"] is True
        refused = admit(hook, "exclusive-1")
        assert refused["allowed"] is False
        assert refused["status"]["message"] == (
            "namespace team may use 1 nvidia.com/gpu (gpu-placement.io/quota); 1 is in use and this pod asks 1 more: "
            "lower the request or raise the quota on the namespace")
        for i in range(4):
            assert admit(hook, f"shared-{i}", "shared")["allowed"] is True, i
        assert "may use 4 nvidia.com/gpu.shared (gpu-placement.io/quota); 4 are in use" in admit(
            hook, "shared-4", "shared")["status"]["message"]


def test_the_mirror_writes_what_the_api_server_charges(hook: Webhook) -> None:
    with dra_namespace(hook, MIXED):
        assert mirrored(hook) == {
            "requests.nvidia.com/gpu.shared": "4",
            # the per-level stand-ins converted pods carry, charged at the pod's create
            "requests.gpu-placement.io/gpu": "1", "requests.gpu-placement.io/gpu.shared": "4",
            DEVICES: "5",
            # DRAExtendedResource charges every claim of gpu.nvidia.com (extendedResourceName nvidia.com/gpu) to
            # requests.nvidia.com/gpu too: never below the class's devices, or the shared claims are refused
            "requests.nvidia.com/gpu": "5"}
    with dra_namespace(hook, MIXED, without_extended_resource()):
        assert mirrored(hook)["requests.nvidia.com/gpu"] == "1"  # claims are not charged there: as the annotation says


def test_the_mirror_waits_for_the_device_classes(hook: Webhook) -> None:
    """Until the classes are listed it cannot know what claims are charged: the quota is left as it is."""
    with dra_namespace(hook, MIXED):
        mirror = QuotaMirror(None, hook.view, hook.config, "gpu-placement", "r")  # type: ignore[arg-type]
        mirror.templates = TemplateKeeper(None, hook.view, hook.config, "v1")  # type: ignore[arg-type]  # DRA watched
        hook.view.listed.discard("deviceclasses")
        assert mirror._wanted("team")[:2] == (False, None)
        hook.view.listed.add("deviceclasses")
        assert mirror._wanted("team")[1] == mirrored(hook)
        # ...and a change of a class's extendedResourceName makes the next turn a full pass.
        assert mirror._classes_changed() is True and mirror._classes_changed() is False
        with hook.view.lock:
            hook.ingest.replace(hook.view, "deviceclasses", without_extended_resource())
        assert mirror._classes_changed() is True
        assert mirror._wanted("team")[1]["requests.nvidia.com/gpu"] == "1"  # type: ignore[index]


def standins(pod: Obj) -> tuple[dict[str, str], dict[str, str]]:
    resources = pod["spec"]["containers"][0].get("resources") or {}
    return ({k: v for k, v in (resources.get("requests") or {}).items() if k.startswith("gpu-placement.io/")},
            {k: v for k, v in (resources.get("limits") or {}).items() if k.startswith("gpu-placement.io/")})


def test_converted_pods_carry_a_stand_in_per_device_of_each_level(hook: Webhook) -> None:
    with dra_namespace(hook, "nvidia.com/gpu=4,nvidia.com/gpu.shared=4"):
        pod, _, _ = hook.mutate(user_pod("team", "train", gpus={"nvidia.com/gpu": 2}), "team")
        assert standins(pod) == ({"gpu-placement.io/gpu": "2"}, {"gpu-placement.io/gpu": "2"})  # requests == limits
        assert pod["spec"]["schedulerName"] == "gpu-placement"
        shared, _, _ = hook.mutate(user_pod("team", "infer", gpus={"nvidia.com/gpu": 1},
                                            annotations={"gpu-placement.io/sharing": "shared"}), "team")
        assert standins(shared) == ({"gpu-placement.io/gpu.shared": "1"}, {"gpu-placement.io/gpu.shared": "1"})
        with hook.view.lock:
            hook.create(pod, "team")
            assert hook.view.namespace_usage["team"] == {"gpu-placement.io/gpu": 2}  # what the API server charges
        # Not on a pod of another scheduler (which would find no node with it) nor a DaemonSet's pod: their
        # claims are charged only when made, and /validate counts them with its holds.
        other = user_pod("team", "other", gpus={"nvidia.com/gpu": 1})
        other["spec"]["schedulerName"] = "volcano"
        assert standins(hook.mutate(other, "team")[0]) == ({}, {})
        daemon = user_pod("team", "agent", gpus={"nvidia.com/gpu": 1})
        daemon["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                                                  "uid": "ds-1", "controller": True}]
        assert standins(hook.mutate(daemon, "team")[0]) == ({}, {})
        # Nor on a pod asking an extended resource a DeviceClass maps: kube-scheduler's DynamicResources plugin
        # would then look for every extended resource of the pod on the node, the stand-in too.
        nic = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "nic.example.com"},
               "spec": {"extendedResourceName": "example.com/nic"}}
        with hook.view.lock:
            hook.ingest.event(hook.view, "deviceclasses", "ADDED", nic)
        both = user_pod("team", "both", gpus={"nvidia.com/gpu": 1})
        both["spec"]["containers"][0]["resources"]["limits"]["example.com/nic"] = "1"
        assert standins(hook.mutate(both, "team")[0]) == ({}, {})
    with dra_namespace(hook, "nvidia.com/mig-1g.10gb=2", sharing="mig-1g.10gb"):
        mig, _, _ = hook.mutate(user_pod("team", "small", gpus={"nvidia.com/gpu": 1}), "team")
        assert standins(mig) == ({"gpu-placement.io/mig-1g.10gb": "1"}, {"gpu-placement.io/mig-1g.10gb": "1"})
    set_namespaces(hook, [namespace("free", {"gpu-placement.io/allocation": "dra"})])
    with hook.view.lock:
        hook.ingest.replace(hook.view, "deviceclasses", copy.deepcopy(device_classes()))
        hook.ingest.replace(hook.view, "resourceclaimtemplates", templates_for(hook, "free"))
    free, _, _ = hook.mutate(user_pod("free", "any", gpus={"nvidia.com/gpu": 1}), "free")
    assert standins(free) == ({}, {})  # no quota, nothing to charge


def test_a_claim_the_api_server_would_charge_to_the_extended_resource_is_refused_first(hook: Webhook) -> None:
    """A pod asking nvidia.com/gpu from before the namespace moved to DRA still holds requests.nvidia.com/gpu,
    which DRAExtendedResource charges gpu.nvidia.com's claims to as well: a new claim pod would get no claim."""
    old = make_pod("team", "before-dra", gpus={"nvidia.com/gpu": 1}, node="gpu-1")
    with dra_namespace(hook, "nvidia.com/gpu=1", pods=[old]):
        verdict = admit(hook, "after")
        assert verdict["allowed"] is False
        assert verdict["status"]["message"].startswith(
            "namespace team may use 1 requests.nvidia.com/gpu (what pods asking nvidia.com/gpu and claims of a "
            "DeviceClass naming it as extendedResourceName are charged) (gpu-placement.io/quota); 1 is in use")
    with dra_namespace(hook, "nvidia.com/gpu=1", without_extended_resource(), pods=[old]):
        assert admit(hook, "after")["allowed"] is True  # claims are not charged to it there


def test_a_level_the_quota_does_not_list_is_not_in_quota(hook: Webhook) -> None:
    """As for a device-plugin pod: a pod narrowing to `shared` where the quota gives only whole GPUs. Its
    claim would take a device of the same class, but the annotation gives no shared GPU."""
    with dra_namespace(hook, "nvidia.com/gpu=2"):
        verdict = admit(hook, "infer", "shared")
        assert verdict["allowed"] is False
        assert verdict["status"]["message"] == (
            "namespace team may not use nvidia.com/gpu.shared: its gpu-placement.io/quota lists only nvidia.com/gpu=2 "
            "and this pod asks for 1 nvidia.com/gpu.shared: ask for a listed resource, or add "
            "nvidia.com/gpu.shared=<count> to gpu-placement.io/quota on the namespace")
