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
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gpu_placement.samples.dra import Gpu
from tests.e2e.cluster import DraPlugin, gate_open, wait_for
from tests.e2e.conftest import E2E
from tests.e2e.dra import RESOURCE, allocation

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
    assert ("may use 2 nvidia.com/gpu (gpu-placement.io/quota); 1 is in use and this pod asks 2 more"
            in r.json()["message"]), r.text
    r = e2e.gpu_pod(ns, "second", group)
    assert r.status_code == 201, r.text
    # The pod carries its stand-in, which the API server's pod quota charged at its create
    # (gpu_placement/decide/dra_quota.py).
    assert r.json()["spec"]["containers"][0]["resources"]["limits"]["gpu-placement.io/gpu"] == "1"

    def used() -> dict[str, str]:
        return dict((e2e.api.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpu-placement").get("status") or {})
                    .get("used", {}))
    wait_for("second's claim charged", lambda: used().get("gpu.nvidia.com.deviceclass.resource.k8s.io/devices") == "2",
             timeout=60)
    # DRAExtendedResource charges claims of gpu.nvidia.com (extendedResourceName nvidia.com/gpu) to
    # requests.nvidia.com/gpu too: one quota for the namespace's pods of both worlds. The stand-ins, per pod.
    assert used().get("requests.nvidia.com/gpu") == "2"
    assert used().get("requests.gpu-placement.io/gpu") == "2"
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
    gate_open(ns, [lambda: e2e.gpu_pod(ns, "gate-probe", group, dryRun="All")])  # the quota's keys as rewritten
    r = e2e.gpu_pod(ns, "classic", group)
    assert r.status_code == 201, r.text
    classic = r.json()
    assert "resourceClaims" not in classic["spec"]
    assert classic["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # gpu.nvidia.com serves nvidia.com/gpu through DRA where a node lacks it: no GFD label is required of the node.
    assert "nvidia.com/gpu.present" not in classic["spec"]["nodeSelector"]


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
    come after the pods, so the pods' stand-ins (charged by the API server's pod quota at their create,
    atomically) decide. Two get in, both run; four are refused, by /validate when its view already shows
    the first two, else by the API server's quota; none waits for ever on a claim the API server refuses."""
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
        assert ("may use 2 nvidia.com/gpu (gpu-placement.io/quota)" in text or
                "exceeded quota: gpu-placement, requested: requests.gpu-placement.io/gpu=1" in text), text
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


# -- issue 36: two webhook replicas, bursts of claim pods, a quota just set --------------------------------

BURST = 20
DEVICES = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"


def fresh_dra_namespace(e2e: E2E, prefix: str, quota: str) -> str:
    """A namespace annotated this instant and used at once: no wait for its templates or its quota (the
    webhook refuses with 503 TemplatePending / QuotaPending until both are there)."""
    ns = f"{prefix}-{time.monotonic_ns() % 10**6}"
    e2e.api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": ns, "labels": {"gpu-placement.io/enabled": "true"}}})
    wait_for(f"serviceaccount {ns}/default",
             lambda: e2e.api.http.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default").status_code == 200)
    e2e.api.merge_patch(f"/api/v1/namespaces/{ns}", {"metadata": {"annotations": {
        "gpu-placement.io/allocation": "dra", "gpu-placement.io/quota": quota}}})
    return ns


def burst(e2e: E2E, ns: str, group: str, pods: list[tuple[str, str | None]]) -> list[tuple[str, int, str]]:
    """(name, sharing) pods created at the same instant: (name, status code, message) each."""
    barrier = threading.Barrier(len(pods))

    def create(pod: tuple[str, str | None]) -> tuple[str, int, str]:
        name, sharing = pod
        barrier.wait(timeout=30)
        r = e2e.gpu_pod(ns, name, group, annotations={"gpu-placement.io/sharing": sharing} if sharing else None,
                        retry=False)  # the 503s counted
        return name, r.status_code, "" if r.status_code == 201 else str(r.json().get("message"))

    with ThreadPoolExecutor(len(pods)) as pool:
        return list(pool.map(create, pods))


def claimed(e2e: E2E, ns: str) -> int:
    """Devices of the namespace's ResourceClaims (each claim of gpu-placement's templates is one device)."""
    return len(e2e.api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims").get("items", []))


def stored(e2e: E2E, ns: str) -> list[Obj]:
    return list(e2e.api.get(f"/api/v1/namespaces/{ns}/pods").get("items", []))


def fill(e2e: E2E, ns: str, group: str, levels: dict[str | None, int], seconds: float = 90.0) -> list[str]:
    """Bursts of BURST pods (split over `levels`: sharing -> quota), one a second, until every level holds its
    quota: never one pod or one device more, after any burst. Returns the pods admitted."""
    history: list[dict[int, int]] = []
    admitted: dict[str | None, list[str]] = {level: [] for level in levels}
    deadline = time.monotonic() + seconds
    while any(len(admitted[level]) < quota for level, quota in levels.items()) and time.monotonic() < deadline:
        round_ = len(history)
        sharings = list(levels)
        pods = [(f"r{round_}-{i:02d}-{sharings[i % len(sharings)] or 'gpu'}", sharings[i % len(sharings)])
                for i in range(BURST)]
        answers = burst(e2e, ns, group, pods)
        history.append(dict(Counter(code for _, code, _ in answers)))
        by_name = dict(pods)
        for name, code, _ in answers:
            if code == 201:
                admitted[by_name[name]].append(name)
        assert {code for _, code, _ in answers} <= {201, 403, 503}, (history, answers)
        for level, quota in levels.items():
            assert len(admitted[level]) <= quota, (level, history, answers)
        assert len(stored(e2e, ns)) <= sum(levels.values()) and claimed(e2e, ns) <= sum(levels.values()), history
        time.sleep(1.0)
    assert {level: len(names) for level, names in admitted.items()} == levels, history
    return [name for names in admitted.values() for name in names]


def test_two_replicas_and_bursts_of_claim_pods_never_exceed_a_quota_just_set(e2e: E2E, plugin: DraPlugin) -> None:
    """Issue 36: 2 webhook replicas, bursts of 20 claim pods created at once in a `dra` namespace annotated a
    moment before. At most the quota is admitted (the gate refuses until every key the pods are charged is in
    force; then the API server's pod quota charges their stand-ins atomically), no more devices are claimed,
    and every admitted pod gets its claims and runs. A mixed quota admits each level up to its own figure."""
    group = "s20-two-replicas"
    [node] = e2e.nodes(group, [("h100", "h100", {"allocatable": {}})])
    plugin.publish(node, 6)
    e2e.start_webhook(1)  # a second replica behind the Service; the proxy spreads connections
    try:
        ns = fresh_dra_namespace(e2e, "dra-two", "nvidia.com/gpu=2")
        pods = fill(e2e, ns, group, {None: 2})
        mixed = fresh_dra_namespace(e2e, "dra-mixed", "nvidia.com/gpu=1,nvidia.com/gpu.shared=2")
        pods_mixed = fill(e2e, mixed, group, {None: 1, "shared": 2})
        # Every admitted pod got its claim and runs: none is Pending on a claim the API server refused.
        for where, names in ((ns, pods), (mixed, pods_mixed)):
            for name in names:
                assert e2e.wait_bound(where, name, timeout=60) == node
            refused = [e for e in e2e.api.get(f"/api/v1/namespaces/{where}/events")["items"]
                       if e.get("reason") == "FailedResourceClaimCreation"]
            assert refused == [], refused
        assert claimed(e2e, ns) == 2 and claimed(e2e, mixed) == 3
        hard = e2e.api.get(f"/api/v1/namespaces/{mixed}/resourcequotas/gpu-placement")["status"]["hard"]
        assert {key: hard.get(key) for key in ("requests.gpu-placement.io/gpu", "requests.gpu-placement.io/gpu.shared",
                                               DEVICES, "requests.nvidia.com/gpu")} == {
            "requests.gpu-placement.io/gpu": "1", "requests.gpu-placement.io/gpu.shared": "2", DEVICES: "3",
            "requests.nvidia.com/gpu": "3"}
    finally:
        e2e.stop_webhook(1)


# -- issue 31: DRA as Kubernetes 1.37 ships it ---------------------------------------------------------------

A100_NAME, H100_NAME = "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"


def test_a_namespace_with_two_products_gets_claims_that_fall_back_in_order(e2e: E2E, plugin: DraPlugin) -> None:
    """gpu-products H100 then A100: the template's request is firstAvailable, one subrequest per product in
    that order; the extender scores the node where the first fits above the other, the allocator takes the
    first alternative it can satisfy there. The first pod gets the H100, the second falls back to the A100."""
    group = "s20-order"
    h100, a100 = e2e.nodes(group, [(suffix, "h100", {"allocatable": {}}) for suffix in ("h100", "a100")])
    plugin.publish(h100, 1)
    plugin.publish(a100, 1, gpu=A100)
    ns = dra_namespace(e2e, "dra-order", {"gpu-placement.io/allocation": "dra",
                                          "gpu-placement.io/gpu-products": f"{H100_NAME},{A100_NAME}",
                                          "gpu-placement.io/quota": "nvidia.com/gpu=2"})
    [exclusive] = [t for t in ours(e2e, ns) if t["metadata"]["annotations"]["gpu-placement.io/sharing"] == "exclusive"]
    alternatives = exclusive["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert [a["name"] for a in alternatives] == [H100_NAME.lower(), A100_NAME.lower()]
    for name, node, product in (("first", h100, H100_NAME), ("second", a100, A100_NAME)):
        r = e2e.gpu_pod(ns, name, group)
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == exclusive["metadata"]["name"]
        assert e2e.wait_bound(ns, name, timeout=60) == node
        [device] = allocation(e2e, ns, name)
        assert (device["pool"], device["request"]) == (node, f"gpu/{product.lower()}")


def test_shared_pods_take_device_capacity(e2e: E2E, plugin: DraPlugin) -> None:
    """NVIDIA's driver with --consumable-shares=memory publishes its GPU shared by memory: a `shared` namespace's
    template asks the namespace's gpu-memory of it (capacity.requests.memory), and two pods share one GPU,
    each consuming 30Gi (consumedCapacity); a third would pass 80 GB and waits."""
    group = "s20-shares"
    [node] = e2e.nodes(group, [("h100", "h100", {"allocatable": {}})])
    plugin.publish(node, 1, consumable=True)
    ns = dra_namespace(e2e, "dra-share", {"gpu-placement.io/allocation": "dra", "gpu-placement.io/sharing": "shared",
                                          "gpu-placement.io/gpu-memory": "30Gi",
                                          "gpu-placement.io/quota": "nvidia.com/gpu.shared=3"}, templates=1)
    [shared] = ours(e2e, ns)
    assert shared["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "30Gi"}}
    for name in ("a", "b"):
        assert e2e.gpu_pod(ns, name, group).status_code == 201
        assert e2e.wait_bound(ns, name, timeout=60) == node
        [device] = allocation(e2e, ns, name)
        assert device["device"] == "gpu-0" and device["consumedCapacity"] == {"memory": "30Gi"} and device["shareID"]
    assert e2e.gpu_pod(ns, "c", group).status_code == 201
    cond = e2e.scheduled_condition(ns, "c")
    assert "cannot allocate all claims" in cond["message"] or "InsufficientGPU" in cond["message"], cond


def test_a_namespace_the_cluster_serves_keeps_nvidia_gpu_and_is_charged_once(e2e: E2E, plugin: DraPlugin) -> None:
    """A `dra` namespace that names no products or device memory, with whole GPUs only in its quota: where
    gpu.nvidia.com serves nvidia.com/gpu its pods keep it (no claims of ours, no stand-in). The API server
    charges each pod requests.nvidia.com/gpu at its create, atomically, and the claim kube-scheduler makes
    for it only its device (addExtendedResourceQuota takes what the pod asked off): the quota counts 2 of 2,
    not 4, and /validate refuses the third with its own sentence, counting the same."""
    group = "s20-kept"
    [node] = e2e.nodes(group, [("h100", "h100", {"allocatable": {}})])
    plugin.publish(node, 3)
    ns = dra_namespace(e2e, "dra-kept", {"gpu-placement.io/allocation": "dra",
                                         "gpu-placement.io/quota": "nvidia.com/gpu=2"})
    for name in ("one", "two"):
        r = e2e.gpu_pod(ns, name, group)
        assert r.status_code == 201, r.text
        spec = r.json()["spec"]
        assert "resourceClaims" not in spec and spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert e2e.wait_bound(ns, name, timeout=60) == node
        assert allocation(e2e, ns, name)  # kube-scheduler's claim for its extended resource

    def used() -> dict[str, str]:
        return dict((e2e.api.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpu-placement").get("status") or {})
                    .get("used", {}))
    wait_for("both claims charged", lambda: used().get(DEVICES) == "2", timeout=60)
    assert used()["requests.nvidia.com/gpu"] == "2"
    r = e2e.gpu_pod(ns, "three", group)
    assert r.status_code == 403, r.text
    assert "namespace " + ns + " may use 2 nvidia.com/gpu (gpu-placement.io/quota); 2 are in use" in r.json()["message"]
