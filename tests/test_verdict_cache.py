"""The verdict cache (contract section 3, issue 8): keyed on what decides, bounded by memory.

Two pods that need the same thing share one entry whatever their containers are called; nodes of one
class get one static verdict per kind of pod; the cache holds as many kinds as fit in its memory
budget, not a fixed count.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.base.config import Config
from gpu_placement.decide import placement as placement_module
from gpu_placement.decide.rules import Rejection, check_node
from gpu_placement.samples.cluster import demo_objects, make_pod
from tests.hostile import held_by_the_service


def _pod(name: str, container: str, image: str = "nvcr.io/nvidia/cuda:13.0.0-runtime-ubuntu24.04",
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod = make_pod("research", name, gpus={"nvidia.com/gpu": 1}, image=image, annotations=annotations)
    pod["spec"]["containers"][0]["name"] = container
    return pod


def test_pods_differing_only_in_container_names_share_one_entry() -> None:
    core = core_from_objects(Config(), demo_objects())
    names = sorted(core.view.nodes)
    first = core.placement.filter(core.placement.requirements(_pod("sim-a", "main")), names)
    second = core.placement.filter(core.placement.requirements(_pod("sim-b", "trainer")), names)
    assert len(core.placement._cache) == 1
    assert (sorted(first.passed), first.failed, first.unresolvable) == (sorted(second.passed), second.failed,
                                                                        second.unresolvable)
    too_old = first.unresolvable["h100-single"]
    assert "the image needs CUDA 13.0.0 (image tag)," in too_old  # no container name in a reason
    assert "main" not in too_old and "trainer" not in too_old
    # what decides still splits: another CUDA version is another entry
    core.placement.filter(core.placement.requirements(
        _pod("sim-c", "main", image="nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04")), names)
    assert len(core.placement._cache) == 2


def test_class_verdicts_equal_a_check_of_every_node() -> None:
    core = core_from_objects(Config(), demo_objects())
    view, placement = core.view, core.placement
    pods = [_pod("a", "main"), _pod("b", "main", image="registry.example.com/app:1"),
            _pod("c", "main", annotations={"gpu-placement.io/min-driver": "550",
                                           "gpu-placement.io/gpu-memory": "20Gi"}),
            make_pod("inference", "d", gpus={"nvidia.com/gpu.shared": 1},
                     annotations={"gpu-placement.io/gpu-memory": "2Gi"}),
            make_pod("mig-lab", "e", gpus={"nvidia.com/mig-1g.10gb": 1})]
    for pod in pods:
        req = placement.requirements(pod)
        placement.filter(req, sorted(view.nodes))
        verdicts = placement._cache[placement_module._decision_key(req)]
        for name, facts in view.nodes.items():
            direct = check_node(facts, view.validator_state(name), placement_module._decision_key(req), core.config)
            cached = verdicts.entries[name]
            assert cached == direct, (pod["metadata"]["name"], name)
            assert (cached.__class__ is Rejection) == (direct.__class__ is Rejection)


def test_the_cache_is_bounded_by_memory_not_by_count(monkeypatch: pytest.MonkeyPatch) -> None:
    core = core_from_objects(Config(), demo_objects())
    names = sorted(core.view.nodes)

    def kinds(n: int, start: int = 0) -> None:
        for i in range(start, start + n):  # a different minimum driver each: a different kind
            req = core.placement.requirements(_pod(f"p{i}", "main", annotations={
                "gpu-placement.io/min-driver": f"{400 + i}.1"}))
            core.placement.filter(req, names)

    kinds(100)  # a small cluster: far more than the old 64 kinds fit
    assert len(core.placement._cache) == 100
    sizes = [v.size for v in core.placement._cache.values()]
    assert all(size > 0 for size in sizes) and core.placement._cache_bytes == sum(sizes)
    monkeypatch.setattr(placement_module, "_CACHE_BYTES", 10 * max(sizes))
    kinds(1, start=100)  # the next kind evicts the least recently used until the budget holds
    assert core.placement._cache_bytes <= 10 * max(sizes) and len(core.placement._cache) <= 11
    assert core.placement._cache_bytes == sum(v.size for v in core.placement._cache.values())


def test_a_kinds_answer_is_replayed_until_one_of_its_verdicts_changes() -> None:
    core = core_from_objects(Config(), demo_objects())
    names = sorted(core.view.nodes)
    req = core.placement.requirements(make_pod("team-a", "one", gpus={"nvidia.com/gpu": 1}))
    first = core.placement.filter(req, names)
    # a GPU pod bound where the node still passes: the view changed, this kind's answer did not
    core.ingest.event(core.view, "pods", "ADDED", make_pod("team-a", "x", gpus={"nvidia.com/gpu": 1},
                                                           node="h100-train-1"))
    assert core.placement.filter(req, names) is first
    # kube-scheduler's feasible list is filled by parallel workers: the same nodes in another order
    assert core.placement.filter(req, names[::-1]) is first
    assert core.placement.filter(req, names[:-1]) is not first  # other names asked: another answer
    # the single H100 filled: its verdict flips, the answer is built again and says so
    core.ingest.event(core.view, "pods", "ADDED", make_pod("team-a", "y", gpus={"nvidia.com/gpu": 1},
                                                           node="h100-single"))
    again = core.placement.filter(req, names)
    assert again is not first and "h100-single" in again.failed and "h100-single" in first.passed


def test_an_answer_put_right_for_other_names_equals_one_built_afresh() -> None:
    """Nodes left out and taken back (kube-scheduler's own filters drop a node that fills up), in a
    new order each time, with verdicts changing in between: the answer put right from the last one
    is the answer a new Placement builds from nothing."""
    core = core_from_objects(Config(), demo_objects())
    names = [*sorted(core.view.nodes), "ghost-node"]
    req = core.placement.requirements(make_pod("team-a", "one", gpus={"nvidia.com/gpu": 1}))
    core.placement.filter(req, names)
    steps = [names[1:], names[3:] + names[:1], names[::-1], names[:-2], names, names[2:5], names[::2], names]
    for step, asked in enumerate(steps):
        if step == 3:  # a verdict flips between two requests
            core.ingest.event(core.view, "pods", "ADDED", make_pod("team-a", "y", gpus={"nvidia.com/gpu": 1},
                                                                   node="h100-single"))
        got = core.placement.filter(req, asked)
        fresh = placement_module.Placement(core.view, core.config).filter(req, asked)
        assert sorted(got.passed) == sorted(fresh.passed), step
        assert (got.failed, got.unresolvable, +got.reasons) == (fresh.failed, fresh.unresolvable, +fresh.reasons), step
        assert set(got.passed) | set(got.failed) | set(got.unresolvable) == set(asked), step


def test_what_a_pod_or_a_caller_wrote_is_not_kept() -> None:
    """Issue 36: a stream of /filter requests from no scheduler (the port takes any caller) must not
    fill the cache. A pod whose ask is broken is refused by every node with a sentence quoting it, so
    it gets no kind; an answer naming nodes the view lacks echoes the names, so it is not kept. Both
    still answer as before."""
    core = core_from_objects(Config(), demo_objects())
    names = sorted(core.view.nodes)
    placement = core.placement
    good = placement.requirements(_pod("good", "main"))
    with held_by_the_service() as growth:
        for i in range(300):
            ghost = f"ghost-{i}-" + "x" * 20_000
            broken = placement.requirements(_pod(f"b{i}", "main", annotations={
                "gpu-placement.io/gpu-memory": f"{i} lots"}))
            refused = placement.filter(broken, [*names, ghost])
            assert refused.passed == [] and refused.failed == {}
            assert refused.unresolvable[names[0]] == (
                f'BadAnnotation: gpu-placement.io/gpu-memory="{i} lots" on pod research/b{i}: "{i} lots" is not a '
                "Kubernetes quantity (examples: 2, 20Gi, 512Mi)")
            assert refused.unresolvable[ghost].startswith("UnknownNode:")
            assert refused.reasons == {"BadAnnotation": len(names), "UnknownNode": 1}
            assert placement.scores(broken, names[:2]) == [(names[0], 0), (names[1], 0)]
            answer = placement.filter(good, [*names, ghost])
            assert answer.unresolvable[ghost].startswith("UnknownNode:") and answer.passed
    assert growth[0] < 2**20, f"the cache holds {growth[0] / 2**20:.1f} MiB more after 300 requests"
    assert list(placement._cache) == [placement_module._decision_key(good)]
    assert placement.filter(good, names) is placement.filter(good, names)  # a scheduler's answer is still kept


def test_the_budget_counts_what_a_kind_really_costs() -> None:
    """The cache is bounded by its estimate of each kind's bytes: on a small cluster, where a kind's
    own tables outweigh its nodes, the estimate was less than half of what tracemalloc sees."""
    core = core_from_objects(Config(), demo_objects())
    names = sorted(core.view.nodes)
    kinds = iter(range(10**6))

    def new_kinds(n: int) -> None:
        for _ in range(n):
            req = core.placement.requirements(_pod("p", "main", annotations={
                "gpu-placement.io/min-driver": f"{400 + next(kinds)}.1"}))
            core.placement.filter(req, names)

    new_kinds(20)
    before = core.placement._cache_bytes
    with held_by_the_service() as growth:
        new_kinds(200)
    estimated = core.placement._cache_bytes - before
    assert estimated >= 0.7 * growth[0], f"{estimated} bytes estimated, {growth[0]} held"
