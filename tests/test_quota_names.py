"""A DeviceClass's two names are one count, and the quota gate waits for exactly what the mirror writes
(review of wave 4, finding 1).

kube-apiserver v1.37.2 charges every claim of a class naming `extendedResourceName: X` to both
`requests.X` and `requests.deviceclass.resource.kubernetes.io/<class>` (resource_claims.go
`addExtendedResourceQuota`), so in `gpu-placement.io/quota` the two names limit the same devices: listed
both, the lower figure binds both (gpu_placement/decide/claims.py `one_count`). Each test writes the
mirror's own output (QuotaMirror._wanted) as the quota controller counts it, then runs /mutate and
/validate with the gate on, and reads how many such pods the API server's create-time quota check alone
(pkg/quota/v1/evaluator/core/pods.go: `requests.R` for each extended resource the stored pod asks)
would let in."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.controllers.quota_mirror import QuotaMirror
from gpu_placement.facts.pods import effective_gpu_requests
from gpu_placement.facts.resourcequotas import SETTLE_SECONDS
from gpu_placement.samples.cluster import namespace
from gpu_placement.samples.dra import device_classes
from tests.support.dra import set_namespaces, templates_for
from tests.support.webhook import Webhook, user_pod

Obj = dict[str, Any]

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
IMPLICIT = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
IMPLICIT_MIG = "deviceclass.resource.kubernetes.io/mig.nvidia.com"
MIG = "nvidia.com/mig-1g.10gb"


@contextlib.contextmanager
def quota_namespace(hook: Webhook, quota: str, allocation: str | None, sharing: str | None = None) -> Iterator[None]:
    """Namespace `team` with this quota, NVIDIA's classes (gpu.nvidia.com names nvidia.com/gpu), its templates
    and the quota gate on; no product list, so whole-GPU pods keep nvidia.com/gpu where they may
    (gpu_placement/decide/claims.py `keeps_resource`)."""
    annotations = {"gpu-placement.io/quota": quota}
    if allocation:
        annotations["gpu-placement.io/allocation"] = allocation
    if sharing:
        annotations["gpu-placement.io/sharing"] = sharing
    set_namespaces(hook, [namespace("team", annotations)])
    admission = hook.app.state.admission
    with hook.view.lock:
        hook.ingest.replace(hook.view, "deviceclasses", copy.deepcopy(device_classes()))
        hook.ingest.replace(hook.view, "resourceclaimtemplates", templates_for(hook, "team") if allocation else [])
    admission.quota_gate = True
    try:
        yield
    finally:
        admission.quota_gate = False
        with hook.view.lock:
            for kind in ("deviceclasses", "resourceclaimtemplates", "resourceclaims", "resourcequotas"):
                hook.ingest.replace(hook.view, kind, [])
            hook.view.dra.active = False
            hook.view.listed -= {"deviceclasses", "resourceclaimtemplates", "resourceclaims"}


def counted_mirror(hook: Webhook) -> dict[str, str]:
    """The mirror's spec.hard for `team`, as the quota controller counts it (status.hard = spec.hard, nothing
    used), seen by the webhook's watch for long enough that the gate trusts it."""
    known, hard, _ = QuotaMirror(None, hook.view, hook.config, "gpu-placement", "r")._wanted("team")  # type: ignore[arg-type]
    assert known and hard is not None
    with hook.view.lock:
        hook.ingest.replace(hook.view, "resourcequotas", [{
            "kind": "ResourceQuota", "metadata": {"name": "gpu-placement", "namespace": "team"},
            "spec": {"hard": hard}, "status": {"hard": hard, "used": {key: "0" for key in hard}}}])
    hook.clock[0] += SETTLE_SECONDS
    return hard


def api_server_lets_in(hard: dict[str, str], pod: Obj) -> int:
    """How many pods like `pod` (as stored, after /mutate) the API server's quota admits into an empty
    namespace at their create, with no webhook's view in the way: each is charged `requests.R` for every
    extended resource it asks that the ResourceQuota lists."""
    charged = effective_gpu_requests(pod["spec"], lambda resource: f"requests.{resource}" in hard)
    assert charged, f"the API server charges this pod nothing at its create: {pod['spec']['containers']}"
    return min(int(hard[f"requests.{resource}"]) // count for resource, count in charged)


def admit(hook: Webhook, resource: str, name: str, sharing: str | None = None) -> tuple[Obj, Obj]:
    annotations = {"gpu-placement.io/sharing": sharing} if sharing else {}
    return hook.admit(user_pod("team", name, gpus={resource: 1}, annotations=annotations), "team")


# (allocation, quota, namespace sharing, what the pod asks, its own sharing, how many the quota gives it)
SHAPES = [
    ("dra", f"{GPU}=2", None, GPU, None, 2),
    ("dra", f"{GPU}=2,{IMPLICIT}=2", None, GPU, None, 2),  # the review's case: the advice of NotInQuota followed
    ("dra", f"{GPU}=2,{IMPLICIT}=2", None, IMPLICIT, None, 2),
    ("dra", f"{GPU}=3,{IMPLICIT}=2", None, GPU, None, 2),  # one count: the lower figure binds both names
    ("dra", f"{GPU}=3,{IMPLICIT}=2", None, IMPLICIT, None, 2),
    ("dra", f"{IMPLICIT}=2", None, IMPLICIT, None, 2),
    ("dra", f"{GPU}=1,{SHARED}=4", None, GPU, None, 1),  # claims, held by their stand-ins
    ("dra", f"{GPU}=1,{SHARED}=4", None, GPU, "shared", 4),
    ("dra", f"{GPU}=1,{SHARED}=4,{IMPLICIT}=1", None, GPU, None, 1),
    ("dra", f"{GPU}=1,{SHARED}=4,{IMPLICIT}=1", None, GPU, "shared", 4),
    ("dra", f"{SHARED}=4", "shared", GPU, None, 4),
    ("dra", f"{MIG}=2", "mig-1g.10gb", GPU, None, 2),
    ("dra", f"{IMPLICIT_MIG}=2", None, IMPLICIT_MIG, None, 2),
    (None, f"{GPU}=2", None, GPU, None, 2),
    (None, f"{GPU}=2,{IMPLICIT}=2", None, GPU, None, 2),
    (None, f"{GPU}=3,{IMPLICIT}=2", None, GPU, None, 2),
    (None, f"{GPU}=3,{IMPLICIT}=2", None, IMPLICIT, None, 2),
    (None, f"{SHARED}=4", "shared", GPU, None, 4),
    (None, f"{GPU}=1,{SHARED}=4", None, SHARED, None, 4),
]


@pytest.mark.parametrize(("allocation", "quota", "sharing", "resource", "pod_sharing", "given"), SHAPES,
                         ids=[f"{a or 'device-plugin'}:{q}:{r}{':' + p if p else ''}" for a, q, _, r, p, _ in SHAPES])
def test_the_gate_passes_on_the_mirrors_own_output_and_the_api_server_holds_the_quota(
        hook: Webhook, allocation: str | None, quota: str, sharing: str | None, resource: str, pod_sharing: str | None,
        given: int) -> None:
    """On main: `nvidia.com/gpu=2,deviceclass...=2` was written requests.nvidia.com/gpu=4 while the gate waited
    for 2 (503 QuotaPending for good), and `nvidia.com/gpu=3,deviceclass...=2` let 3 pods in at the API server."""
    with quota_namespace(hook, quota, allocation, sharing):
        hard = counted_mirror(hook)
        pod, verdict = admit(hook, resource, "first", pod_sharing)
        assert verdict["allowed"] is True, verdict["status"]["message"]
        assert api_server_lets_in(hard, pod) == given, hard


def test_pods_asking_the_implicit_name_beside_a_shared_level_are_refused_with_the_name_to_ask(hook: Webhook) -> None:
    """Where the quota also gives shared GPUs of the class, their claims are charged to the implicit name too, so
    the mirror writes its key at all the class's devices (5): a pod asking it would be held only by the webhook's
    view. It is refused with the name that gets a claim held by its stand-in."""
    with quota_namespace(hook, f"{GPU}=1,{SHARED}=4,{IMPLICIT}=1", "dra"):
        hard = counted_mirror(hook)
        assert hard[f"requests.{IMPLICIT}"] == hard[f"requests.{GPU}"] == "5"
        assert hard["requests.gpu-placement.io/gpu"] == "1"
        _, verdict = admit(hook, IMPLICIT, "implicit")
        assert verdict["allowed"] is False and verdict["status"]["code"] == 403
        assert verdict["status"]["message"] == (
            f"namespace team may not use {IMPLICIT} beside the other GPUs of DeviceClass gpu.nvidia.com its "
            f"gpu-placement.io/quota gives: the API server charges their claims to requests.{IMPLICIT} as well, so "
            f"that key is written at 5, and a pod asking {IMPLICIT} could not be held to 1 at its create: ask for "
            f"{GPU} instead (gpu-placement gives it a device of gpu.nvidia.com, held to the quota)")


def test_a_dra_namespace_that_follows_the_not_in_quota_advice_gets_its_pods(hook: Webhook) -> None:
    """The review's repro (repro_gate_refuses_forever.py): the refusal of a pod asking the implicit name says to
    list it; listed, the mirror wrote requests.nvidia.com/gpu=4 (devices 2 + 2) and the gate waited for 2 for
    good. Now the two names are one count of 2, written as such, and both kinds of pod are let in."""
    with quota_namespace(hook, f"{GPU}=2", "dra"):
        counted_mirror(hook)
        _, verdict = admit(hook, IMPLICIT, "implicit-0")
        assert verdict["allowed"] is False
        assert verdict["status"]["message"] == (
            f"namespace team may not use {IMPLICIT}: its gpu-placement.io/quota lists only {GPU}=2 and this pod asks "
            f"for 1 {IMPLICIT}: ask for {GPU} instead (the same devices of DeviceClass gpu.nvidia.com), or add "
            f"{IMPLICIT}=2 to gpu-placement.io/quota on the namespace (the two names share one count: listed both, "
            "the lower figure binds both)")
    with quota_namespace(hook, f"{GPU}=2,{IMPLICIT}=2", "dra"):
        hard = counted_mirror(hook)
        assert hard == {f"requests.{GPU}": "2", f"requests.{IMPLICIT}": "2", "requests.gpu-placement.io/gpu": "2",
                        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "2"}
        for attempt, resource in enumerate((GPU, IMPLICIT)):
            _, verdict = admit(hook, resource, f"pod-{attempt}")
            assert verdict["allowed"] is True, verdict["status"]["message"]
