"""Scenario 20: one annotation moves a namespace between the device plugin and DRA, on the real 1.37
control plane. A pod written the usual way (`nvidia.com/gpu: 1`) in a `gpu-placement.io/allocation: dra`
namespace is admitted with a claim from the template the webhook's leader keeps there; kube-scheduler's
DRA allocator evaluates the template's CEL (products, driver for the namespace's CUDA, device memory,
MIG profile) against what the harness publishes as NVIDIA's kubelet plugin; the API server's quota
refuses claims past the namespace's devices; pods created at the same instant are let in only as far
as the quota goes (each admitted one holds its devices until its claims exist), so none is left Pending
on refused claims; and a namespace switched back gets the old behaviour.

Every node here carries the same H100 labels, so the extender's node rules let all of them through:
only the template's selectors tell the devices apart.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gpu_placement.dra.published import Gpu
from tests.e2e.cluster import DraPlugin, wait_for
from tests.e2e.conftest import E2E
from tests.e2e.test_19_dra import RESOURCE, allocation

Obj = dict[str, Any]
GIB = 2**30
A100 = Gpu(product="NVIDIA A100-SXM4-80GB", architecture="Ampere", compute="8.0.0")
OLD_DRIVER = Gpu(driver="535.129.3", cuda="12.2.0")
SMALL = Gpu(memory_bytes=40 * GIB)
POLICY = {"gpu-placement.io/allocation": "dra", "gpu-placement.io/gpu-products": "NVIDIA-H100-80GB-HBM3",
          "gpu-placement.io/cuda": "12.4", "gpu-placement.io/gpu-memory": "60Gi",
          "gpu-placement.io/quota": "nvidia.com/gpu=2"}


@pytest.fixture(scope="module")
def plugin(e2e: E2E) -> Iterator[DraPlugin]:
    dra = DraPlugin(e2e.api)
    dra.install()
    yield dra
    dra.stop()


def ours(e2e: E2E, ns: str) -> list[Obj]:
    items = e2e.api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates",
                        labelSelector="app.kubernetes.io/managed-by=gpu-placement").get("items", [])
    return list(items)


def dra_namespace(e2e: E2E, prefix: str, annotations: dict[str, str], templates: int = 2) -> str:
    """A namespace with its policy, once the webhook's leader wrote its templates and quota."""
    ns = e2e.namespace(prefix, annotations)
    wait_for(f"the templates of {ns}", lambda: len(ours(e2e, ns)) == templates, timeout=30)
    def counting() -> bool:
        status = e2e.api.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpu-placement").get("status") or {}
        return any(key.endswith(".deviceclass.resource.k8s.io/devices") for key in status.get("used", {}))
    wait_for(f"ResourceQuota {ns}/gpu-placement counting devices", counting, timeout=30)
    return ns


def test_one_annotation_moves_a_namespace_between_dra_and_the_device_plugin(e2e: E2E, plugin: DraPlugin) -> None:
    group = "s20-policy"
    nodes = e2e.nodes(group, [(suffix, "h100", {"allocatable": {}}) for suffix in ("a100", "old", "small", "h100")])
    for node, gpu in zip(nodes, (A100, OLD_DRIVER, SMALL, Gpu()), strict=True):
        plugin.publish(node, 1, gpu=gpu)
    ns = dra_namespace(e2e, "dra-policy", POLICY)

    # The manifest a team already has: one nvidia.com/gpu.
    r = e2e.gpu_pod(ns, "train", group)
    assert r.status_code == 201, r.text
    pod = r.json()
    [container] = pod["spec"]["containers"]
    assert not [k for k in container["resources"].get("limits", {}) if k.startswith("nvidia.com/")]
    assert container["resources"]["claims"] == [{"name": "gpu-0"}]
    [entry] = pod["spec"]["resourceClaims"]
    assert entry["resourceClaimTemplateName"] in {t["metadata"]["name"] for t in ours(e2e, ns)}
    assert pod["spec"]["schedulerName"] == "gpu-placement"
    # Only the node whose device matches product, driver and memory: the allocator read the template's CEL.
    assert e2e.wait_bound(ns, "train", timeout=60) == nodes[3]
    [device] = allocation(e2e, ns, "train")
    assert (device["driver"], device["pool"], device["device"]) == ("gpu.nvidia.com", nodes[3], "gpu-0")

    # The namespace's quota is 2 devices. A pod asking 2 more is refused by /validate, which counts the
    # devices its claims would take; one asking 1 more fits.
    r = e2e.gpu_pod(ns, "too-many", group, gpus=2)
    assert r.status_code == 403, r.text
    assert ("may use 2 gpu.nvidia.com.deviceclass.resource.k8s.io/devices (gpu-placement.io/quota); 1 is in use and "
            "this pod asks 2 more") in r.json()["message"]
    assert e2e.gpu_pod(ns, "second", group).status_code == 201

    def used() -> dict[str, str]:
        return dict((e2e.api.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpu-placement").get("status") or {})
                    .get("used", {}))
    wait_for("second's claim charged", lambda: used().get("gpu.nvidia.com.deviceclass.resource.k8s.io/devices") == "2",
             timeout=60)
    # DRAExtendedResource charges claims of gpu.nvidia.com (extendedResourceName nvidia.com/gpu) to
    # requests.nvidia.com/gpu too: one quota for the namespace's pods of both worlds.
    assert used().get("requests.nvidia.com/gpu") == "2"
    # The API server holds the line for claims too: a claim written by hand within the policy but past the quota.
    products = [s for s in ours(e2e, ns)[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
                if "productName" in s["cel"]["expression"]]
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "by-hand"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                           "selectors": products}}]}}}
    r = e2e.api.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", claim)
    assert r.status_code == 403 and "exceeded quota: gpu-placement" in r.text, r.text
    assert "gpu.nvidia.com.deviceclass.resource.k8s.io/devices" in r.text
    # ... and one outside the policy is refused by gpu-placement, naming the field.
    del claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    r = e2e.api.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", claim)
    assert r.status_code == 403 and "spec.devices.requests[0].exactly.selectors lacks the products selector" in r.text
    e2e.api.delete(f"/api/v1/namespaces/{ns}/pods/second")
    wait_for("second's claim gone from the quota",
             lambda: used().get("gpu.nvidia.com.deviceclass.resource.k8s.io/devices") == "1", timeout=60)

    # Back to the device plugin: new pods keep nvidia.com/gpu and are placed by the extender's unit fit;
    # the templates go.
    e2e.api.merge_patch(f"/api/v1/namespaces/{ns}",
                        {"metadata": {"annotations": {"gpu-placement.io/allocation": "device-plugin"}}})
    wait_for(f"no templates in {ns}", lambda: not ours(e2e, ns), timeout=30)
    r = e2e.gpu_pod(ns, "classic", group)
    assert r.status_code == 201, r.text
    classic = r.json()
    assert "resourceClaims" not in classic["spec"]
    assert classic["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert classic["spec"]["nodeSelector"]["nvidia.com/gpu.present"] == "true"


def test_a_mig_namespace_gets_a_device_of_its_profile(e2e: E2E, plugin: DraPlugin) -> None:
    group = "s20-mig"
    nodes = e2e.nodes(group, [(suffix, "h100", {"allocatable": {}}) for suffix in ("big", "small")])
    plugin.publish(nodes[0], 1, mig=("3g.40gb", 2, 40 * GIB))
    plugin.publish(nodes[1], 1, mig=("1g.10gb", 7, 10 * GIB))
    ns = dra_namespace(e2e, "dra-mig", {"gpu-placement.io/allocation": "dra",
                                        "gpu-placement.io/sharing": "mig-1g.10gb",
                                        "gpu-placement.io/quota": "nvidia.com/mig-1g.10gb=2"},
                       templates=1)  # its own profile only: 3g.40gb is wider, shared would be a whole GPU
    r = e2e.gpu_pod(ns, "small-job", group)
    assert r.status_code == 201, r.text
    assert e2e.wait_bound(ns, "small-job", timeout=60) == nodes[1]
    [device] = allocation(e2e, ns, "small-job")
    assert device["device"].startswith("gpu-0-mig-1g-10gb-")


def test_pods_created_at_once_are_let_in_only_as_far_as_the_quota_goes(e2e: E2E, plugin: DraPlugin) -> None:
    """Six creates of one GPU each at the same instant, quota 2 devices, one webhook replica: the claims
    come after the pods, so /validate must count the pods it let in a moment ago. Two get in, both run;
    four are refused with the quota sentence; none waits for ever on a claim the API server refuses."""
    group = "s20-burst"
    [node] = e2e.nodes(group, [("h100", "h100", {"allocatable": {}})])
    plugin.publish(node, 4)
    ns = dra_namespace(e2e, "dra-burst", POLICY)
    names = [f"burst-{i}" for i in range(6)]
    start = threading.Barrier(len(names))

    def create(name: str) -> tuple[str, int, str]:
        start.wait(timeout=10)
        r = e2e.gpu_pod(ns, name, group)
        return name, r.status_code, r.text

    with ThreadPoolExecutor(len(names)) as pool:
        answers = list(pool.map(create, names))
    admitted = [name for name, code, _ in answers if code == 201]
    refused = [text for _, code, text in answers if code == 403]
    assert len(admitted) == 2 and len(refused) == 4, answers
    for text in refused:
        assert "may use 2 gpu.nvidia.com.deviceclass.resource.k8s.io/devices (gpu-placement.io/quota)" in text, text
    for name in admitted:
        assert e2e.wait_bound(ns, name, timeout=60) == node

    # The holds ended when the claims were made (the quota now counts them): once one pod is gone, one more
    # fits, which a hold left behind would refuse for ever. (Retried: the webhook's watch of the deleted
    # claim may be a moment behind the API server's quota.)
    e2e.api.delete(f"/api/v1/namespaces/{ns}/pods/{admitted[0]}")

    def used() -> str | None:
        status = e2e.api.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpu-placement").get("status") or {}
        return (status.get("used") or {}).get("gpu.nvidia.com.deviceclass.resource.k8s.io/devices")
    wait_for("the deleted pod's claim gone from the quota", lambda: used() == "1", timeout=60)
    wait_for("one more pod let in", lambda: e2e.gpu_pod(ns, "after", group).status_code == 201, timeout=15,
             interval=0.5)
    assert e2e.wait_bound(ns, "after", timeout=60) == node
