"""DRA pods through the extender (docs/dra.md): a pod whose claims ask for a GPU class, or
whose `nvidia.com/gpu` a DeviceClass serves where the device plugin does not, gets the node rules and
scoring, never unit or memory fit; facts missing from labels come from the node's ResourceSlice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_placement.app.explain import explain_pod
from gpu_placement.base.config import Config, parse_config
from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod
from gpu_placement.samples.dra import device_classes, resource_slice
from tests.support.dra import OLD_DRIVER, Obj, claim_pod, dra_node, template, verdicts
from tests.support.extender import Extender

NODES = {
    "dra-ok": (dra_node("dra-ok"), True, resource_slice("dra-ok", 2)),
    "dra-bare": (dra_node("dra-bare", bare=True), True, resource_slice("dra-bare", 2)),
    "dra-old-driver": (dra_node("dra-old-driver", bare=True), True, resource_slice("dra-old-driver", 2, OLD_DRIVER)),
    "dra-not-validated": (dra_node("dra-not-validated"), False, resource_slice("dra-not-validated", 2)),
    "dra-upgrading": (dra_node("dra-upgrading", labels={"nvidia.com/gpu-driver-upgrade-state": "drain-required"}),
                      True, resource_slice("dra-upgrading", 2)),
    "dra-mig-pending": (dra_node("dra-mig-pending", labels={"nvidia.com/mig.config.state": "pending"}), True,
                        resource_slice("dra-mig-pending", 2)),
    "dra-no-slices": (dra_node("dra-no-slices"), True, None),
    "plugin-node": (make_node("plugin-node", "h100"), True, None),  # the device plugin's nvidia.com/gpu
}


def objects() -> list[Obj]:
    found: list[Obj] = [namespace("ml"), *device_classes(), template("ml", "one-gpu", "gpu.nvidia.com"),
                        template("ml", "gpu-or-mig", "mig.nvidia.com", "gpu.nvidia.com", first_available=True),
                        template("ml", "nic", "nic.example.com")]
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


@pytest.mark.parametrize("template_name", ["one-gpu", "gpu-or-mig"])
def test_a_claim_for_a_gpu_class_gets_the_node_rules_and_no_fit(extender: Extender, template_name: str) -> None:
    answer = extender.filter(claim_pod("ml", "train", template_name), list(NODES))
    assert verdicts(answer) == {
        "dra-ok": "pass", "dra-bare": "pass", "dra-old-driver": "pass",  # a 12.2 image runs on a 12.2 driver
        "dra-not-validated": "NotValidated", "dra-upgrading": "DriverUpgrade", "dra-mig-pending": "MIGReconfiguring",
        "dra-no-slices": "NoGPU", "plugin-node": "NoGPU"}
    assert answer["FailedNodes"] == {}  # nothing preemption could fix: the allocator owns devices
    no_slices = answer["FailedAndUnresolvableNodes"]["dra-no-slices"]
    assert "no ResourceSlice of gpu.nvidia.com publishes devices" in no_slices


def test_cuda_is_judged_on_labels_else_on_the_slices_driver(extender: Extender) -> None:
    """dra-ok's labels say driver 550.54.15 (CUDA 12.4), its slice 570 (12.8): labels win. dra-bare has
    no such labels: its slice's 570.124.6 / 12.8 decide; dra-old-driver's slice says 535 / 12.2."""
    pod = claim_pod("ml", "new-cuda", "one-gpu", annotations={"gpu-placement.io/cuda": "12.6"})
    answer = extender.filter(pod, ["dra-ok", "dra-bare", "dra-old-driver"])
    assert verdicts(answer) == {"dra-ok": "DriverTooOld", "dra-bare": "pass", "dra-old-driver": "DriverTooOld"}
    assert "driver 550.54.15 supports CUDA up to 12.4" in answer["FailedAndUnresolvableNodes"]["dra-ok"]
    assert "driver 535.104.05 supports CUDA up to 12.2" in answer["FailedAndUnresolvableNodes"]["dra-old-driver"]


def test_a_claim_for_another_class_is_not_a_gpu_pod(extender: Extender) -> None:
    answer = extender.filter(claim_pod("ml", "nic-user", "nic"), list(NODES))
    assert sorted(answer["NodeNames"]) == sorted(NODES)


def test_a_claim_not_in_the_view_is_refused_everywhere_until_it_is(extender: Extender) -> None:
    answer = extender.filter(claim_pod("ml", "early", claim="not-yet"), ["dra-ok", "plugin-node"])
    assert set(verdicts(answer).values()) == {"UnknownClaim"}
    assert "ResourceClaim ml/not-yet" in answer["FailedAndUnresolvableNodes"]["dra-ok"]


def test_nvidia_gpu_served_by_dra_where_the_device_plugin_does_not_offer_it(extender: Extender) -> None:
    """DRAExtendedResource: gpu.nvidia.com names extendedResourceName nvidia.com/gpu, so a node without
    nvidia.com/gpu in allocatable serves it through DRA (node rules only); a device-plugin node as before."""
    pod = make_pod("ml", "classic", gpus={"nvidia.com/gpu": 1})
    answer = extender.filter(pod, list(NODES))
    assert verdicts(answer) == {
        "dra-ok": "pass", "dra-bare": "pass", "dra-old-driver": "pass", "plugin-node": "pass",
        "dra-not-validated": "NotValidated", "dra-upgrading": "DriverUpgrade", "dra-mig-pending": "MIGReconfiguring",
        "dra-no-slices": "NoGPU"}


def test_without_dra_the_same_pod_fits_only_the_device_plugin_nodes() -> None:
    """The same cluster without its resource.k8s.io objects: exactly the old decisions."""
    server = Extender([o for o in objects() if not o["apiVersion"].startswith("resource.k8s.io")])
    try:
        answer = server.filter(make_pod("ml", "classic", gpus={"nvidia.com/gpu": 1}), list(NODES))
        assert answer["NodeNames"] == ["plugin-node"]
        assert set(verdicts(answer).values()) == {"pass", "NoGPU"}
        claim_only = server.filter(claim_pod("ml", "train", "one-gpu"), list(NODES))
        assert sorted(claim_only["NodeNames"]) == sorted(NODES)  # not a GPU pod where DRA is not served
    finally:
        server.close()


def test_scores_fill_nodes_by_devices_claims_hold() -> None:
    allocated = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "busy-gpu", "namespace": "ml"},
                 "spec": {"devices": {"requests": [{"name": "r0", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
                 "status": {"allocation": {"devices": {"results": [
                     {"request": "r0", "driver": "gpu.nvidia.com", "pool": "dra-ok", "device": "gpu-0"}]}}}}
    server = Extender([*objects(), allocated])
    try:
        response = server.post("prioritize", {"Pod": claim_pod("ml", "train", "one-gpu"), "Nodes": None,
                                              "NodeNames": ["dra-ok", "dra-bare"]})
        scores = {row["Host"]: row["Score"] for row in response.json()}
        # binpack: 2 of 2 held once it lands, against 1 of 2: 10 and 5, less the lowest (left out)
        assert scores == {"dra-ok": 5}
    finally:
        server.close()


def test_explain_says_dra_and_where_facts_come_from(extender: Extender) -> None:
    text = explain_pod(extender.core, claim_pod("ml", "train", "one-gpu"), "ml")
    assert "a ResourceClaim for gpu.nvidia.com" in text
    assert "devices held by claims (DRA allocates)" in text


def test_config_names_other_classes() -> None:
    config = parse_config({"dra": {"deviceClasses": ["nic.example.com"]}})
    server = Extender(objects(), config=config)
    try:
        answer = server.filter(claim_pod("ml", "nic-user", "nic"), ["dra-ok", "dra-not-validated"])
        assert verdicts(answer) == {"dra-ok": "pass", "dra-not-validated": "NotValidated"}
    finally:
        server.close()
    assert Config().dra.device_classes == ("gpu.nvidia.com", "mig.nvidia.com")
