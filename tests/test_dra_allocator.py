"""The DRA allocator's device choice as gpu_placement.decide.allocator models it, case by case against what
kube-scheduler v1.37's incubating allocator does (k8s.io/dynamic-resource-allocation v0.37.2,
structured/internal/incubating): first fit in slice order, consumable capacity, policies, taints."""

from __future__ import annotations

from typing import Any

from gpu_placement.decide.allocator import Allocation, consumption, first_fit
from gpu_placement.facts.dra import Device, claim_from_json, slice_from_json

GPU = "gpu.nvidia.com"
TYPES = {GPU: "gpu"}


def devices(*specs: dict[str, Any]) -> tuple[Device, ...]:
    """Devices as a ResourceSlice publishes them, parsed the way the view parses them."""
    raw = [{"name": f"gpu-{i}", "attributes": {"type": {"string": spec.pop("type", "gpu")}}, **spec}
           for i, spec in enumerate(specs)]
    return slice_from_json({"metadata": {"name": "s"}, "spec": {"driver": GPU, "pool": {"name": "n"}, "nodeName": "n",
                                                                "devices": raw}}).devices


def shared(value: str = "1000", **policy: Any) -> dict[str, Any]:
    capacity: dict[str, Any] = {"value": value}
    if policy:
        capacity["requestPolicy"] = policy
    return {"allowMultipleAllocations": True, "capacity": {"share": capacity}}


def ask(count: int = 1, share: str | None = None) -> tuple[str, int, tuple[tuple[str, int], ...]]:
    """A claim's request as the view reads it from the claim (objects.claim_from_json)."""
    exactly: dict[str, Any] = {"deviceClassName": GPU, "count": count}
    if share is not None:
        exactly["capacity"] = {"requests": {"share": share}}
    claim = claim_from_json({"metadata": {"name": "c", "namespace": "ml"},
                             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})
    return claim.asks[0]


def test_a_share_takes_the_first_device_with_room_in_slice_order_not_the_best_fit() -> None:
    found = devices(shared(), shared(), shared())
    consumed = {"gpu-1": {"share": 600_000}}  # gpu-1 has 400 left: a best fit for 400; first fit takes gpu-0
    assert first_fit(found, {}, consumed, [ask(1, "400")], TYPES) == [Allocation(0, "gpu-0", (("share", 400_000),))]
    consumed = {"gpu-0": {"share": 700_000}, "gpu-1": {"share": 600_000}}  # 300 and 400 left
    assert first_fit(found, {}, consumed, [ask(1, "400")], TYPES) == [Allocation(0, "gpu-1", (("share", 400_000),))]


def test_a_claim_naming_no_capacity_consumes_all_of_a_shareable_device() -> None:
    found = devices(shared(), shared())
    # fillEmptyRequest: no request and no policy default consumes the capacity's whole value.
    assert first_fit(found, {}, {}, [ask(1)], TYPES) == [Allocation(0, "gpu-0", (("share", 1_000_000),))]
    # so a partly used device cannot give a whole GPU: the next one does
    assert first_fit(found, {}, {"gpu-0": {"share": 1}}, [ask(1)], TYPES)[0].device == "gpu-1"  # type: ignore[index]


def test_n_devices_are_n_distinct_devices_and_a_node_short_of_them_fits_not() -> None:
    found = devices(shared(), shared(), shared())
    given = first_fit(found, {}, {"gpu-1": {"share": 500_000}}, [ask(2)], TYPES)
    assert [a.device for a in given or ()] == ["gpu-0", "gpu-2"]
    assert first_fit(found, {}, {"gpu-1": {"share": 500_000}}, [ask(3)], TYPES) is None


def test_exclusive_devices_held_by_a_claim_are_in_use() -> None:
    found = devices({}, {}, {})
    assert [a.device for a in first_fit(found, {"gpu-0": 1}, {}, [ask(2)], TYPES) or ()] == ["gpu-1", "gpu-2"]
    assert first_fit(found, {"gpu-0": 1, "gpu-2": 1}, {}, [ask(2)], TYPES) is None


def test_request_policies_round_the_amount_up_and_refuse_what_they_forbid() -> None:
    step = devices(shared(validRange={"min": "100", "step": "100"}))[0]
    assert consumption(step, {"share": 250_000}) == {"share": 300_000}  # roundUpRange
    assert consumption(step, {"share": 50_000}) == {"share": 100_000}  # below min: min
    values = devices(shared(validValues=["250", "500", "1000"]))[0]
    assert consumption(values, {"share": 260_000}) == {"share": 500_000}  # roundUpValidValues
    capped = devices(shared(validRange={"min": "100", "max": "500"}))[0]
    assert consumption(capped, {"share": 600_000}) is None  # violatesPolicy: above max
    default = devices(shared(default="200"))[0]
    assert consumption(default, {}) == {"share": 200_000}  # fillEmptyRequest: the policy's default
    assert consumption(default, {"memory": 1}) is None  # a capacity the device does not have


def test_rounded_amounts_decide_the_fit() -> None:
    found = devices(shared(validRange={"min": "250", "step": "250"}), shared())
    # 300 rounds up to 500 on gpu-0, which has 400 left: it goes to gpu-1 (where 300 is taken as asked)
    given = first_fit(found, {}, {"gpu-0": {"share": 600_000}}, [ask(1, "300")], TYPES)
    assert given == [Allocation(0, "gpu-1", (("share", 300_000),))]


def test_tainted_devices_and_other_types_are_skipped() -> None:
    found = devices({"taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]},
                    {"type": "mig"}, {})
    assert [a.device for a in first_fit(found, {}, {}, [ask(1)], TYPES) or ()] == ["gpu-2"]
    assert first_fit(found, {}, {}, [ask(2)], TYPES) is None


def test_a_later_request_backtracks_the_earlier_ones() -> None:
    # request 0 (a share) fits either device; request 1 (a whole GPU of an exclusive-only class) only fits gpu-0;
    # first fit gives request 0 gpu-0, finds nothing for request 1, and tries request 0 on gpu-1.
    found = devices(shared(), shared())
    whole = ("gpu.nvidia.com", 1, ())
    given = first_fit(found, {}, {"gpu-1": {"share": 1}}, [ask(1, "500"), whole], TYPES)
    assert [(a.request, a.device) for a in given or ()] == [(0, "gpu-1"), (1, "gpu-0")]


def test_the_fill_binpack_and_spread_score_counts_shares_of_any_consumable_capacity() -> None:
    """A driver whose shares are not memory (the replay's devices publish `share`): the node's fill is
    what allocations use of it, so binpack and spread tell a half-used node from an empty one."""
    from gpu_placement.decide.dra_fit import fit
    from gpu_placement.facts.dra import Alternative

    found = devices(shared(), shared())
    half = Alternative("", GPU, 1, (("share", 500_000),))
    empty = fit(found, {}, {}, set(), [(half,)], TYPES)
    used = fit(found, {}, {"gpu-1": {"share": 1_000_000}}, set(), [(half,)], TYPES)
    assert empty is not None and used is not None
    assert empty.fill == 0.25  # the pod's own half of one of two devices
    assert used.fill == 0.75  # and a whole device already used
