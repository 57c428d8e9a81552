"""/mutate routes DRA GPU pods (claims for a configured GPU class) to the gpu-placement scheduler, with
the namespace's pools and the GPU tolerations, and no resource rewrite or GPU node label; pods
whose claims ask for something else, and every pod where resource.k8s.io is not served, as before."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import orjson
import pytest

from gpu_placement.samples.dra import device_classes
from tests.support.dra import TEMPLATES, bare, claim_pod
from tests.support.webhook import Webhook, user_pod

pytestmark = pytest.mark.timeout(30)
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TRAINING_TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}


@pytest.fixture
def dra(hook: Webhook) -> Iterator[Webhook]:
    with hook.view.lock:
        hook.ingest.replace(hook.view, "deviceclasses", copy.deepcopy(device_classes()))
        hook.ingest.replace(hook.view, "resourceclaimtemplates", copy.deepcopy(TEMPLATES))
    yield hook
    with hook.view.lock:
        for kind in ("deviceclasses", "resourceclaimtemplates"):
            hook.ingest.replace(hook.view, kind, [])
        hook.view.dra.active = False
        hook.view.listed -= {"deviceclasses", "resourceclaimtemplates"}


def test_a_claim_for_a_gpu_class_is_routed_with_the_namespace_pools(dra: Webhook) -> None:
    pod = bare(claim_pod("team-a", "train", "one-gpu"))
    mutated, _, _ = dra.mutate(pod, "team-a")
    spec = mutated["spec"]
    assert spec["schedulerName"] == "gpu-placement"
    assert spec["tolerations"] == [GPU_TOLERATION, TRAINING_TOLERATION]
    assert spec["nodeSelector"] == {"pool": "training"}  # the pool's; no nvidia.com/gpu.present: DRA knows where
    assert spec["containers"] == pod["spec"]["containers"]
    assert orjson.loads(mutated["metadata"]["annotations"]["gpu-placement.io/admitted"]) == {
        "claims": ["gpu.nvidia.com"], "pools": ["training"], "scheduler": "gpu-placement"}


def test_a_namespace_without_pools_gets_scheduler_and_tolerations_only(dra: Webhook) -> None:
    mutated, _, _ = dra.mutate(bare(claim_pod("web", "serve", "one-gpu")), "web")
    assert mutated["spec"]["schedulerName"] == "gpu-placement"
    assert "nodeSelector" not in mutated["spec"]


def test_a_claim_for_another_class_is_any_other_pod(dra: Webhook) -> None:
    mutated, ops, _ = dra.mutate(bare(claim_pod("team-a", "nic-user", "nic")), "team-a")
    assert ops == [] and "schedulerName" not in mutated["spec"]


def test_an_unknown_template_is_left_alone_with_a_warning(dra: Webhook) -> None:
    response = dra.answer("/mutate", {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "team-a", "operation": "CREATE",
        "object": bare(claim_pod("team-a", "early", "not-yet"))}})
    assert response["allowed"] and "patch" not in response
    assert "ResourceClaimTemplate team-a/not-yet" in response["warnings"][0]


def test_without_dra_a_claim_pod_is_not_a_gpu_pod(hook: Webhook) -> None:
    _, ops, _ = hook.mutate(bare(claim_pod("team-a", "train", "one-gpu")), "team-a")
    assert ops == []


def test_a_gpu_pod_a_device_class_serves_is_not_held_to_gfds_label(dra: Webhook) -> None:
    """gpu.nvidia.com names extendedResourceName nvidia.com/gpu: kube-scheduler serves the pod through DRA
    on a node whose allocatable lacks it, and such a node may carry no GPU Feature Discovery label at all.
    The pod is shaped as before, without the nvidia.com/gpu.present selector that would keep it off it."""
    mutated, _, _ = dra.mutate(user_pod("team-a", None, gpus={"nvidia.com/gpu": 2}), "team-a")
    assert mutated["spec"]["nodeSelector"] == {"pool": "training"}
    assert mutated["spec"]["schedulerName"] == "gpu-placement"
    assert mutated["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    # A resource no class serves (the shared one): held to GPU nodes by the label, as always.
    shared, _, _ = dra.mutate(user_pod("team-a", None, gpus={"nvidia.com/gpu.shared": 1}), "team-a")
    assert shared["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "training"}


def test_device_plugin_pods_unchanged_where_no_class_serves_them(dra: Webhook) -> None:
    with dra.view.lock:  # v1beta2 classes: the API server dropped extendedResourceName (1.34, 1.35)
        dra.ingest.replace(dra.view, "deviceclasses", copy.deepcopy(device_classes("v1beta2")))
    mutated, _, _ = dra.mutate(user_pod("team-a", None, gpus={"nvidia.com/gpu": 2}), "team-a")
    assert mutated["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "training"}
