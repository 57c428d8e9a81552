"""Devices that a namespace's ResourceClaims ask for, counted the way ResourceQuota charges them
(`<class>.deviceclass.resource.k8s.io/devices`), followed as claims come and go, and exported."""

from __future__ import annotations

import copy
from typing import Any

from gpu_placement.cluster_metrics import tracker_for
from gpu_placement.config import Config
from gpu_placement.demo_cluster import namespace
from gpu_placement.dra.published import device_classes
from gpu_placement.dra.state import MadeForPod
from gpu_placement.service import core_from_objects

Obj = dict[str, Any]


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
