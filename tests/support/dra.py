"""DRA: GPU nodes with ResourceSlices, pods with claims from a template, the webhook's namespaces set up
for DRA (templates, quotas), as the DRA tests of both components build them."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

from gpu_placement.decide.claims import wanted_templates
from gpu_placement.samples.cluster import make_node, make_pod, namespace
from gpu_placement.samples.dra import Gpu, device_classes
from tests.support.webhook import NAMESPACES, Webhook

Obj = dict[str, Any]
GFD_FACTS = ("nvidia.com/cuda.driver-version.full", "nvidia.com/cuda.driver-version.major",
             "nvidia.com/cuda.driver-version.minor", "nvidia.com/cuda.driver-version.revision",
             "nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev",
             "nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor",
             "nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor", "nvidia.com/gpu.product",
             "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor")
OLD_DRIVER = Gpu(driver="535.104.5", cuda="12.2.0")


def dra_node(name: str, *, labels: dict[str, str] | None = None, bare: bool = False, **kwargs: Any) -> Obj:
    """A GPU node whose GPUs only the DRA driver gives: no device-plugin resource; `bare`: no GFD
    driver, CUDA or product labels either (facts come from the ResourceSlice)."""
    return make_node(name, "h100", labels=labels, allocatable={}, drop=GFD_FACTS if bare else (), **kwargs)


def template(ns: str, name: str, *classes: str, first_available: bool = False) -> Obj:
    if first_available:
        requests = [{"name": "gpu", "firstAvailable": [{"name": c.split(".")[0], "deviceClassName": c}
                                                       for c in classes]}]
    else:
        requests = [{"name": f"r{i}", "exactly": {"deviceClassName": c}} for i, c in enumerate(classes)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns}, "spec": {"spec": {"devices": {"requests": requests}}}}


def claim_pod(ns: str, name: str, template_name: str | None = None, claim: str | None = None,
              image: str = "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04", node: str | None = None,
              annotations: dict[str, str] | None = None) -> Obj:
    pod = make_pod(ns, name, image=image, node=node, annotations=annotations)
    ref: Obj = {"name": "gpu"}
    if template_name:
        ref["resourceClaimTemplateName"] = template_name
    if claim:
        ref["resourceClaimName"] = claim
    pod["spec"]["resourceClaims"] = [ref]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return pod


def verdicts(answer: Obj) -> dict[str, str]:
    out = {name: "pass" for name in answer["NodeNames"] or ()}
    for name, reason in {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}.items():
        out[name] = reason.split(":", 1)[0]
    return out


def templates_for(hook: Webhook, name: str) -> list[Obj]:
    """What the service keeps in namespace `name` (gpu_placement/controllers/templates.py), as the API server
    stores it."""
    policy = hook.app.state.admission.policy(name)
    return [t.body(hook.config.dra.driver) for t in wanted_templates(policy, set(), hook.config)]


def set_namespaces(hook: Webhook, extra: list[Obj]) -> None:
    with hook.view.lock:
        hook.ingest.replace(hook.view, "namespaces", copy.deepcopy(NAMESPACES) + copy.deepcopy(extra))


TEMPLATES = [template("team-a", "one-gpu", "gpu.nvidia.com"), template("team-a", "nic", "nic.example.com"),
             template("web", "one-gpu", "gpu.nvidia.com")]


def bare(pod: dict) -> dict:
    """As a user writes it: no namespace, status, uid or scheduler."""
    pod = copy.deepcopy(pod)
    for key in ("namespace", "uid"):
        pod["metadata"].pop(key, None)
    pod.pop("status", None)
    pod["spec"].pop("schedulerName", None)
    return pod


@contextlib.contextmanager
def dra_namespace(hook: Webhook, quota: str, classes: list[Obj] | None = None, sharing: str | None = None,
                  pods: list[Obj] = (), name: str = "team",  # type: ignore[assignment]
                  products: str | None = "NVIDIA-H100-80GB-HBM3") -> Iterator[Webhook]:
    """Namespace `name` on DRA with this quota, NVIDIA's classes and its templates in the view. With a
    product list (the default) its whole-GPU pods get claims; without one, where gpu.nvidia.com serves
    nvidia.com/gpu, they keep it (gpu_placement/decide/claims.py `keeps_resource`)."""
    annotations = {"gpu-placement.io/allocation": "dra", "gpu-placement.io/quota": quota}
    if products:
        annotations["gpu-placement.io/gpu-products"] = products
    if sharing:
        annotations["gpu-placement.io/sharing"] = sharing
    set_namespaces(hook, [namespace(name, annotations)])
    with hook.view.lock:
        hook.ingest.replace(hook.view, "deviceclasses", copy.deepcopy(device_classes() if classes is None else classes))
        hook.ingest.replace(hook.view, "resourceclaimtemplates", templates_for(hook, name))
        for pod in pods:
            hook.ingest.event(hook.view, "pods", "ADDED", copy.deepcopy(pod))
    yield hook
    with hook.view.lock:
        for kind in ("deviceclasses", "resourceclaimtemplates", "resourceclaims"):
            hook.ingest.replace(hook.view, kind, [])
        hook.view.dra.active = False
        hook.view.listed -= {"deviceclasses", "resourceclaimtemplates", "resourceclaims"}


# nvidia.com/gpu=3: the mirror gives the namespace 3 devices of gpu.nvidia.com. Its product list makes its pods
# claim pods (only a claim's selector holds one device to a product: gpu_placement/decide/claims.py keeps_resource).
TEAM = namespace("team", {"gpu-placement.io/allocation": "dra", "gpu-placement.io/quota": "nvidia.com/gpu=3",
                          "gpu-placement.io/gpu-products": "NVIDIA-H100-80GB-HBM3"})


@contextlib.contextmanager
def quota_namespace(hook: Webhook) -> Iterator[Webhook]:
    """Namespace `team` (DRA, 3 devices of gpu.nvidia.com) with NVIDIA's classes and its templates in
    the view; all gone afterwards."""
    set_namespaces(hook, [TEAM])
    with hook.view.lock:
        hook.ingest.replace(hook.view, "deviceclasses", copy.deepcopy(device_classes()))
        hook.ingest.replace(hook.view, "resourceclaimtemplates", templates_for(hook, "team"))
    yield hook
    with hook.view.lock:
        for kind in ("deviceclasses", "resourceclaimtemplates", "resourceclaims"):
            hook.ingest.replace(hook.view, kind, [])
        hook.view.dra.active = False
        hook.view.listed -= {"deviceclasses", "resourceclaimtemplates", "resourceclaims"}
