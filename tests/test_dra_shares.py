"""Shares of a device (KEP-5075, DRAConsumableCapacity beta and on in 1.36 and 1.37): where NVIDIA's driver
publishes its GPUs shared by memory (`allowMultipleAllocations`, capacity `memory` with a requestPolicy:
--consumable-shares=memory), a `shared` namespace's template asks a share of a device, the namespace's
gpu-memory; the extender's fit and scores count the same amounts the allocator counts
(status.allocation.devices.results[].consumedCapacity)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_placement.base.config import Config
from gpu_placement.decide.claims import wanted_templates
from gpu_placement.decide.dra_fit import consumption, fit
from gpu_placement.facts.dra import Alternative, slice_from_json
from gpu_placement.facts.namespaces import namespace_from_json
from gpu_placement.facts.policy import parse_policy
from gpu_placement.samples.cluster import namespace, validator_pod
from gpu_placement.samples.dra import Gpu, device_classes, resource_slice
from tests.support.dra import claim_pod, dra_node, verdicts
from tests.support.extender import Extender

pytestmark = pytest.mark.timeout(60)
Obj = dict[str, Any]
GIB = 2**30
SHARED = {"gpu-placement.io/allocation": "dra", "gpu-placement.io/sharing": "shared",
          "gpu-placement.io/gpu-memory": "20Gi"}


def shared_template(shares: bool) -> Any:
    policy = parse_policy(namespace_from_json(namespace("infer", SHARED)), "infer", Config())
    [template] = wanted_templates(policy, set(), Config(), shares)
    return template


def test_a_shared_template_asks_a_share_where_devices_are_shared_by_memory() -> None:
    """On main a `shared` claim always took a whole GPU (time-sliced among its own containers only)."""
    exactly = shared_template(True).body("gpu.nvidia.com")["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["capacity"] == {"requests": {"memory": "20Gi"}}
    assert "capacity" not in shared_template(False).body("gpu.nvidia.com")["spec"]["spec"]["devices"]["requests"][0][
        "exactly"]
    big = parse_policy(namespace_from_json(namespace("infer", {**SHARED, "gpu-placement.io/gpu-memory": "20480Mi"})),
                       "infer", Config())
    # The form the API server stores a quantity in (20480Mi is stored as 20Gi): the template keeps its digest.
    assert wanted_templates(big, set(), Config(), True)[0].share == "20Gi"


def test_the_share_is_counted_as_the_allocator_counts_it() -> None:
    """What `--consumable-shares=memory` publishes: memory rounded down to MiB, default all of it, steps of
    1Mi. A request asking nothing takes all of it (a whole GPU); a share takes what it asks, rounded up."""
    device = slice_from_json(resource_slice("n", 1, consumable=True)).devices[0]
    assert device.shared and device.capacity_of("memory") is not None
    whole = consumption(device, {})
    assert whole == {"memory": 81559 * 2**20 * 1000}
    share = consumption(device, {"memory": (20 * GIB + 1) * 1000})  # 1 byte over 20Gi: the next MiB
    assert share == {"memory": (20 * GIB + 2**20) * 1000}


def objects(consumed: dict[str, int]) -> list[Obj]:
    """Nodes of one 80 GB GPU shared by memory; `consumed`: node -> GiB its allocations consume."""
    found: list[Obj] = [namespace("infer", SHARED), *device_classes(), shared_template(True).body("gpu.nvidia.com")]
    for node, gib in consumed.items():
        found += [dra_node(node, bare=True), validator_pod(node, True), resource_slice(node, 1, consumable=True)]
        if gib:
            found.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                          "metadata": {"name": f"on-{node}", "namespace": "infer"},
                          "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                              "deviceClassName": "gpu.nvidia.com",
                              "capacity": {"requests": {"memory": f"{gib}Gi"}}}}]}},
                          "status": {"allocation": {"devices": {"results": [
                              {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0",
                               "shareID": "s-1", "consumedCapacity": {"memory": f"{gib}Gi"}}]}}}})
    return found


def test_the_extender_fits_and_scores_shares_by_the_memory_allocations_consume() -> None:
    """70 GiB of `full`'s 79.6 GiB are consumed: a 20 GiB share does not fit there. `half` (40 GiB
    consumed) and `empty` do; binpack scores the fuller `half` first. On main all three passed alike."""
    server = Extender(objects({"full": 70, "half": 40, "empty": 0}))
    try:
        template = shared_template(True)
        pod = claim_pod("infer", "serve", template.name)
        answer = server.filter(pod, ["full", "half", "empty"])
        assert verdicts(answer) == {"full": "InsufficientGPU", "half": "pass", "empty": "pass"}
        detail = server.core.placement.detail(server.core.placement.requirements(pod), "full")
        assert "gpu-0 not enough of its capacity left" in detail
        response = server.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": ["half", "empty"]})
        scores = {row["Host"]: row["Score"] for row in response.json()}
        # 10 x (40+20)/79.6 and 10 x 20/79.6 of its GPU memory, rounded: 8 and 3, less the lowest (left out)
        assert scores == {"half": 5}
    finally:
        server.close()


def test_a_whole_gpu_takes_a_shared_device_only_when_nothing_consumes_it() -> None:
    devices = slice_from_json(resource_slice("n", 2, consumable=True)).devices
    whole = [(Alternative("", "gpu.nvidia.com", 1),)]
    types = {"gpu.nvidia.com": "gpu"}
    consumed = {"gpu-0": {"memory": GIB * 1000}}
    found = fit(devices, {"gpu-0": 1}, consumed, frozenset(), whole, types)
    assert found is not None and found.devices == ("gpu-1",)
    assert fit(devices, {"gpu-0": 1, "gpu-1": 1}, {**consumed, "gpu-1": {"memory": GIB * 1000}}, frozenset(), whole,
               types) is None
    assert Gpu().memory_bytes // 2**20 == 81559


def test_whether_devices_are_shared_by_memory_follows_the_slices() -> None:
    """`shares_memory` (asked by /mutate for every pod of a `shared` dra namespace) is kept per node as slices
    come and go, not found by walking every device each time."""
    from gpu_placement.view.dra import DraState

    dra = DraState(Config().dra)
    assert not dra.shares_memory()
    dra.upsert_slice(resource_slice("a", 1, consumable=True))
    dra.upsert_slice(resource_slice("b", 1))
    assert dra.shares_memory()
    dra.upsert_slice(resource_slice("a", 1))  # the driver restarted without --consumable-shares=memory
    assert not dra.shares_memory()
    dra.upsert_slice(resource_slice("a", 1, consumable=True))
    dra.delete_slice(resource_slice("a", 1)["metadata"]["name"])
    assert not dra.shares_memory()
