"""ResourceClaims and ResourceClaimTemplates written by hand in a namespace with a GPU policy: held to the
policy its own templates carry (class for its sharing, products, devices per claim within quota), with
a denial naming the field, or the same text as a warning in audit mode."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.decide.claims import wanted_templates
from gpu_placement.samples.cluster import namespace
from gpu_placement.web.certs import CertBundle
from tests.support.webhook import NAMESPACES, TEST_CONFIG, Webhook, serving

pytestmark = pytest.mark.timeout(30)
Obj = dict[str, Any]
_uids = itertools.count(1)
H100 = "NVIDIA-H100-80GB-HBM3"
PRODUCTS = f"device.attributes['gpu.nvidia.com'].productName.replace(' ', '-') in ['{H100}']"
EXTRA = [namespace("ai", {"gpu-placement.io/allocation": "dra", "gpu-placement.io/gpu-products": H100,
                          "gpu-placement.io/quota": "nvidia.com/gpu=4"})]


def with_extra(hook: Webhook) -> Webhook:
    with hook.view.lock:
        hook.ingest.replace(hook.view, "namespaces", copy.deepcopy(NAMESPACES) + copy.deepcopy(EXTRA))
    return hook


@pytest.fixture
def ai(hook: Webhook) -> Webhook:
    return with_extra(hook)


@pytest.fixture(scope="module")
def audit(bundle: CertBundle) -> Iterator[Webhook]:
    with serving(bundle, {**TEST_CONFIG, "mode": "audit"}) as hook:
        yield with_extra(hook)


def claim(ns: str, device_class: str = "gpu.nvidia.com", count: int = 1, selectors: list[str] | None = None,
          template: bool = False) -> tuple[Obj, str]:
    exactly: Obj = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    kind, resource = ("ResourceClaimTemplate", "resourceclaimtemplates") if template else (
        "ResourceClaim", "resourceclaims")
    body = {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": "mine", "namespace": ns},
            "spec": {"spec": spec} if template else spec}
    return body, resource


def review(obj: Obj, resource: str, ns: str) -> Obj:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": f"c-{next(_uids)}", "kind": {"group": "resource.k8s.io", "version": "v1", "kind": obj["kind"]},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": resource}, "namespace": ns,
        "name": "mine", "operation": "CREATE", "object": obj}}


def check(hook: Webhook, ns: str, **kwargs: Any) -> Obj:
    obj, resource = claim(ns, **kwargs)
    return hook.answer("/validate", review(obj, resource, ns))


def test_a_claim_carrying_the_namespace_policy_is_allowed(ai: Webhook) -> None:
    assert check(ai, "ai", selectors=[PRODUCTS])["allowed"] is True
    assert check(ai, "ai", selectors=[PRODUCTS], template=True)["allowed"] is True


def test_a_claim_without_the_products_selector_is_denied_naming_the_field(ai: Webhook) -> None:
    answer = check(ai, "ai")
    assert answer["allowed"] is False
    message = answer["status"]["message"]
    assert message.startswith("ResourceClaim ai/mine: spec.devices.requests[0].exactly.selectors lacks the products")
    assert PRODUCTS in message
    template = check(ai, "ai", template=True)["status"]["message"]
    assert "spec.spec.devices.requests[0].exactly.selectors" in template


def test_a_claim_for_more_devices_than_the_quota_is_denied(ai: Webhook) -> None:
    answer = check(ai, "ai", count=5, selectors=[PRODUCTS])
    assert answer["allowed"] is False
    assert "exactly.count asks 5 devices of gpu.nvidia.com, more than namespace ai's quota of 4" in \
        answer["status"]["message"]


def test_a_whole_gpu_claim_in_a_mig_namespace_is_denied_and_the_mig_class_allowed(ai: Webhook) -> None:
    answer = check(ai, "mig-lab")
    assert answer["allowed"] is False
    assert "deviceClassName is gpu.nvidia.com, more than namespace mig-lab gives (gpu-placement.io/sharing=" \
           "mig-1g.10gb): ask mig.nvidia.com with profile 1g.10gb" in answer["status"]["message"]
    assert check(ai, "mig-lab", device_class="mig.nvidia.com")["allowed"] is True


def test_claims_for_other_devices_and_namespaces_without_policy_pass(ai: Webhook) -> None:
    assert check(ai, "ai", device_class="nic.example.com", count=9)["allowed"] is True
    assert check(ai, "kube-system", count=64)["allowed"] is True  # exempt


def test_audit_mode_warns_with_the_same_text(audit: Webhook) -> None:
    answer = check(audit, "ai", count=5)
    assert answer["allowed"] is True
    assert any("lacks the products selector" in w for w in answer["warnings"])
    assert any("more than namespace ai's quota of 4" in w for w in answer["warnings"])


def test_the_services_own_templates_pass(ai: Webhook) -> None:
    """What the template keeper writes goes through this same webhook on a real cluster."""
    shared = namespace("pool", {"gpu-placement.io/allocation": "dra", "gpu-placement.io/sharing": "shared",
                                "gpu-placement.io/quota": "nvidia.com/gpu.shared=8"})
    with ai.view.lock:
        ai.ingest.replace(ai.view, "namespaces", copy.deepcopy(NAMESPACES) + copy.deepcopy(EXTRA) + [shared])
    for ns in ("ai", "pool", "mig-lab", "inference", "team-a"):
        policy = ai.app.state.admission.policy(ns)
        for template in wanted_templates(policy, {"1g.10gb", "3g.40gb"}, ai.config):
            body = template.body(ai.config.dra.driver)
            answer = ai.answer("/validate", review(body, "resourceclaimtemplates", ns))
            assert answer["allowed"] is True, (ns, template.name, answer.get("status"))


def test_a_whole_gpu_claim_in_a_shared_namespace_needs_the_sharing_config(ai: Webhook) -> None:
    answer = check(ai, "inference")
    assert answer["allowed"] is False
    assert "more than namespace inference gives (gpu-placement.io/sharing=shared): add the opaque configuration" \
        in answer["status"]["message"]
    assert '"strategy":"TimeSlicing"' in answer["status"]["message"]
