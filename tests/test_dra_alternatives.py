"""Ordered alternatives from namespace policy (KEP-4816, DRAPrioritizedList GA and locked in 1.37): a `dra`
namespace's product list becomes `firstAvailable` subrequests in its templates, in the order written; the
extender passes a node where any alternative fits and scores nodes where an earlier one fits above the
others; quota counts the worst case per class, as kube-apiserver does."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.base.config import Config
from gpu_placement.decide.claims import wanted_templates
from gpu_placement.decide.dra_quota import claim_charge
from gpu_placement.facts.namespaces import namespace_from_json
from gpu_placement.facts.policy import parse_policy
from gpu_placement.samples.cluster import namespace, validator_pod
from gpu_placement.samples.dra import Gpu, device_classes, resource_slice
from tests.support.dra import claim_pod, dra_node, verdicts
from tests.support.extender import Extender
from webhook.dra_validate import claim_problems

pytestmark = pytest.mark.timeout(60)
Obj = dict[str, Any]
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
A100_GPU = Gpu(product="NVIDIA A100-SXM4-80GB", architecture="Ampere", compute="8.0.0")
L4_GPU = Gpu(product="NVIDIA L4", architecture="Ada", compute="8.9.0", memory_bytes=24 * 2**30)


def templates(products: str) -> list[Any]:
    ns = namespace("ai", {"gpu-placement.io/allocation": "dra", "gpu-placement.io/gpu-products": products})
    return wanted_templates(parse_policy(namespace_from_json(ns), "ai", Config()), set(), Config())


def request_of(template: Any) -> Obj:
    return dict(template.body("gpu.nvidia.com")["spec"]["spec"]["devices"]["requests"][0])


@pytest.mark.parametrize("order", [(H100, A100), (A100, H100)])
def test_products_become_first_available_alternatives_in_the_order_written(order: tuple[str, str]) -> None:
    """On main the template held one `exactly` request with both products in one sorted selector: the
    allocator took whichever came first on the node."""
    exclusive = templates(",".join(order))[0]
    request = request_of(exclusive)
    assert "exactly" not in request
    alternatives = request["firstAvailable"]
    assert [a["name"] for a in alternatives] == [p.lower() for p in order]
    for alternative, product in zip(alternatives, order, strict=True):
        assert alternative["deviceClassName"] == "gpu.nvidia.com" and alternative["count"] == 1
        assert alternative["selectors"] == [
            {"cel": {"expression": f"device.attributes['gpu.nvidia.com'].productName.replace(' ', '-') in "
                                   f"['{product}']"}}]
    one = request_of(templates(H100)[0])  # one product: as before, no alternatives
    assert one["exactly"]["selectors"][0]["cel"]["expression"].endswith(f"in ['{H100}']")


def objects() -> list[Obj]:
    ns = namespace("ai", {"gpu-placement.io/allocation": "dra", "gpu-placement.io/gpu-products": f"{H100},{A100}"})
    found: list[Obj] = [ns, *device_classes(),
                        *(t.body("gpu.nvidia.com") for t in templates(f"{H100},{A100}"))]
    for name, gpu in (("h100", Gpu()), ("a100", A100_GPU), ("l4", L4_GPU), ("busy", Gpu())):
        found += [dra_node(name, bare=True), validator_pod(name, True), resource_slice(name, 1, gpu)]
    found.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                  "metadata": {"name": "earlier", "namespace": "ai"},
                  "spec": {"devices": {"requests": [{"name": "gpu",
                                                     "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
                  "status": {"allocation": {"devices": {"results": [
                      {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "busy", "device": "gpu-0"}]}}}})
    return found


def test_a_node_passes_where_any_alternative_fits_and_the_first_scores_higher() -> None:
    """On main every node passed and scored alike: no device was fitted to the claim."""
    server = Extender(objects())
    try:
        template = next(t for t in server.core.view.dra.templates.values() if t.name.startswith("gpu-placement-gpu-"))
        pod = claim_pod("ai", "train", template.name.split("/")[-1])
        answer = server.filter(pod, ["h100", "a100", "l4", "busy"])
        assert verdicts(answer) == {"h100": "pass", "a100": "pass", "l4": "ProductMismatch", "busy": "InsufficientGPU"}
        req = server.core.placement.requirements(pod)
        assert "alternative 2 of its firstAvailable list" in server.core.placement.detail(req, "a100")
        assert "gpu-0 held by a claim" in server.core.placement.detail(req, "busy")
        response = server.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": ["h100", "a100"]})
        scores = {row["Host"]: row["Score"] for row in response.json()}
        assert scores["h100"] > scores.get("a100", 0), scores  # the H100 first: the order written
    finally:
        server.close()


def test_quota_counts_the_worst_case_per_class_as_kube_apiserver_does() -> None:
    """resource_claims.go Usage: a firstAvailable request is charged, for each class, the most any of its
    alternatives of that class could take: a MIG slice else a whole GPU counts one device of each class."""
    either = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
              "metadata": {"name": "slice-or-gpu", "namespace": "ai"},
              "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                  {"name": "slice", "deviceClassName": "mig.nvidia.com"},
                  {"name": "whole", "deviceClassName": "gpu.nvidia.com"},
                  {"name": "two", "deviceClassName": "gpu.nvidia.com", "count": 2}]}]}}}}
    core = core_from_objects(Config(), [namespace("ai"), *device_classes(), either])
    spec = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "slice-or-gpu"}]}
    with core.view.lock:
        charge = claim_charge(core.view.dra, "ai", spec, ())
    assert dict(charge.asks) == {"gpu.nvidia.com.deviceclass.resource.k8s.io/devices": 2,
                                 "mig.nvidia.com.deviceclass.resource.k8s.io/devices": 1,
                                 # both names of gpu.nvidia.com (addExtendedResourceQuota)
                                 "requests.nvidia.com/gpu": 2,
                                 "requests.deviceclass.resource.kubernetes.io/gpu.nvidia.com": 2}


def test_a_claim_written_by_hand_may_name_the_products_in_its_own_alternatives() -> None:
    ns = namespace("ai", {"gpu-placement.io/allocation": "dra", "gpu-placement.io/gpu-products": f"{H100},{A100}"})
    policy = parse_policy(namespace_from_json(ns), "ai", Config())

    def claim(*products: str) -> Obj:
        return {"metadata": {"name": "mine"}, "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": f"p{i}", "deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {
                "expression": f"device.attributes['gpu.nvidia.com'].productName.replace(' ', '-') in ['{p}']"}}]}
            for i, p in enumerate(products)]}]}}}

    assert claim_problems(claim(A100, H100), "resourceclaims", policy, Config()) == []
    [problem] = claim_problems(claim(H100, "NVIDIA-L4"), "resourceclaims", policy, Config())
    assert problem.startswith("ResourceClaim ai/mine: spec.devices.requests[0].firstAvailable[1].selectors lacks "
                              "the products selector of namespace ai")
