"""A pod's DRA requests fit a node where the allocator finds an allocation: its depth-first search
(k8s.io/dynamic-resource-allocation v0.37.2, structured/internal/incubating `allocateOne`), not first fit
request by request. A node with an 80 GB and a 40 GB GPU, and requests that compete for the big one."""

from __future__ import annotations

from gpu_placement.decide.dra_fit import SEARCH_LIMIT, fit
from gpu_placement.facts.dra import Alternative, Device, slice_from_json
from gpu_placement.samples.dra import H100, Gpu, resource_slice

GPU = "gpu.nvidia.com"
TYPES = {GPU: "gpu"}
A100_40GB = Gpu(product="NVIDIA A100-SXM4-40GB", memory_bytes=42_949_672_960)
BIG = f"device.capacity['{GPU}'].memory.compareTo(quantity('70Gi')) >= 0"  # as gpu-placement's templates write it


def node(*gpus: Gpu) -> tuple[Device, ...]:
    """One ResourceSlice, the devices in this order (the allocator's order)."""
    devices = []
    for minor, gpu in enumerate(gpus):
        device = resource_slice("n", 1, gpu)["spec"]["devices"][0]
        devices.append({**device, "name": f"gpu-{minor}"})
    raw = resource_slice("n", 0)
    raw["spec"]["devices"] = devices
    return slice_from_json(raw).devices


def any_gpu(count: int = 1) -> Alternative:
    return Alternative("", GPU, count)


def big_gpu(name: str = "") -> Alternative:
    return Alternative(name, GPU, 1, selectors=(BIG,))


def test_first_fit_is_the_answer_when_it_works() -> None:
    found = fit(node(H100, A100_40GB), {}, {}, frozenset(), [(any_gpu(),), (any_gpu(),)], TYPES)
    assert found is not None and found.devices == ("gpu-0", "gpu-1") and found.rank == 0


def test_an_earlier_request_gives_up_the_device_a_later_one_needs() -> None:
    # First fit gives the first request gpu-0 (the 80 GB), and the second, which needs 70 GiB or more,
    # finds nothing; the allocator goes back and gives the first request gpu-1.
    found = fit(node(H100, A100_40GB), {}, {}, frozenset(), [(any_gpu(),), (big_gpu(),)], TYPES)
    assert found is not None and found.devices == ("gpu-1", "gpu-0")


def test_a_first_available_request_falls_back_when_its_first_choice_leaves_the_rest_nothing() -> None:
    # Request 0 prefers a big GPU, else any; request 1 needs the big one. The allocator tries request 0's
    # first choice on every big device, then its second: request 0 gets the 40 GB, at its fallback.
    requests = [(big_gpu("big"), any_gpu()), (big_gpu(),)]
    found = fit(node(H100, A100_40GB), {}, {}, frozenset(), requests, TYPES)
    assert found is not None and found.chosen == (1, 0) and found.devices == ("gpu-1", "gpu-0")
    assert found.rank == 1 and found.choices == 2


def test_requests_no_allocation_serves_do_not_fit() -> None:
    devices = node(H100, A100_40GB)
    assert fit(devices, {}, {}, frozenset(), [(big_gpu(),), (big_gpu(),)], TYPES) is None
    assert fit(devices, {"gpu-0": 1}, {}, frozenset(), [(any_gpu(),), (big_gpu(),)], TYPES) is None  # held
    assert fit(devices, {}, {}, frozenset({"gpu-0"}), [(any_gpu(),), (big_gpu(),)], TYPES) is None  # kept out
    assert fit(devices, {}, {}, frozenset(), [(any_gpu(2),), (any_gpu(),)], TYPES) is None


def test_more_devices_asked_than_the_node_has_free_is_known_at_once() -> None:
    # Nine one-GPU requests on eight GPUs, or three and then six: no allocation, known from the counts
    # (the search would otherwise try every way of giving the first requests their devices: 8! for nine).
    devices = node(*[H100] * 8)
    assert fit(devices, {}, {}, frozenset(), [(any_gpu(),)] * 9, TYPES) is None
    assert fit(devices, {}, {}, frozenset(), [(any_gpu(),)] * 3 + [(any_gpu(6),)], TYPES) is None
    assert fit(devices, {"gpu-7": 1}, {}, frozenset(), [(any_gpu(),)] * 8, TYPES) is None  # one held
    assert fit(devices, {}, {}, frozenset(), [(any_gpu(),)] * 8, TYPES) is not None


def test_the_search_is_bounded_and_past_its_bound_leaves_the_answer_to_the_allocator() -> None:
    # Eight requests for a big GPU on seven big ones and a small one: the counts allow it, and the search
    # tries every order of giving the first seven the big GPUs (7! = 5,040) before it knows. Past the
    # bound the node counts as fitting: in a cluster kube-scheduler's allocator has judged it already
    # (its DynamicResources filter runs before extenders).
    devices = node(*[H100] * 7, A100_40GB)
    found = fit(devices, {}, {}, frozenset(), [(big_gpu(),)] * 8, TYPES)
    assert found is not None and found.devices == () and found.chosen == (0,) * 8
    assert len(getattr(fit(devices, {}, {}, frozenset(), [(big_gpu(),)] * 7, TYPES), "devices", ())) == 7  # found
    assert fit(devices, {}, {}, frozenset(), [(big_gpu(),)] * 2 + [(any_gpu(6),)], TYPES) is not None
    assert SEARCH_LIMIT < 5_040 * 7
