"""`explain` for a pod of a `dra` namespace: the claims the webhook gives it, the template each comes from
with its selectors, and which devices on the nodes that pass match them (and why the others do not)."""

from __future__ import annotations

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.app.explain import explain_pod
from gpu_placement.base.config import Config
from gpu_placement.decide.claims import wanted_templates
from gpu_placement.facts.namespaces import namespace_from_json
from gpu_placement.facts.policy import parse_policy
from gpu_placement.samples.cluster import make_pod, namespace, validator_pod
from gpu_placement.samples.dra import Gpu, device_classes, resource_slice
from tests.support.dra import dra_node

POLICY = {"gpu-placement.io/allocation": "dra", "gpu-placement.io/gpu-products": "NVIDIA-H100-80GB-HBM3",
          "gpu-placement.io/cuda": "12.4"}


def test_explain_shows_the_claims_and_the_devices_that_match_the_policy() -> None:
    config = Config()
    ns = namespace("ai", POLICY)
    policy = parse_policy(namespace_from_json(ns), "ai", config)
    templates = [t.body(config.dra.driver) for t in wanted_templates(policy, set(), config)]
    old = resource_slice("b", 2, Gpu(driver="535.129.3"))
    core = core_from_objects(config, [ns, *device_classes(), *templates, dra_node("a"), validator_pod("a"),
                                      resource_slice("a", 2), dra_node("b"), validator_pod("b"), old])
    pod = make_pod("ai", "train", gpus={"nvidia.com/gpu": 1})
    del pod["status"]
    text = explain_pod(core, pod, "ai")
    assert "/spec/resourceClaims" in text  # the webhook's patch, shown
    assert "claims from namespace ai's templates" in text
    assert "where device.attributes['gpu.nvidia.com'].driverVersion.compareTo(semver('550.54.14')) >= 0" in text
    rows = [line.split() for line in text.split("DEVICES THAT MATCH")[1].splitlines()[1:] if line.strip()]
    by_node = {row[1]: " ".join(row[2:]) for row in rows}
    assert by_node["a"].startswith("gpu-0, gpu-1 -")
    # b's devices hold a driver below the template's floor: the DRA fit reads the selector as the allocator
    # does, so b does not pass, and its line says which device fails what.
    assert "b" not in by_node
    [b] = [line for line in text.splitlines() if line.startswith("b ")]
    assert "InsufficientGPU" in b and "gpu-0 driver 535.129.3; gpu-1 driver 535.129.3" in b
