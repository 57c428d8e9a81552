"""Idle GPUs while GPU pods wait (gpu_placement/outcomes/idle.py): on a cluster whose free GPUs are scattered,
the gauge says the room is fragmented and `explain` says it in words."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.app.explain import explain_json, explain_pod
from gpu_placement.base.config import Config
from gpu_placement.outcomes.idle import IdleGpus, idle_while_waiting
from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod
from tests.outcome_replay import _One

GPU = "nvidia.com/gpu"
SCATTERED = [2, 2, 2, 1, 1, 1, 1, 1, 1]  # free GPUs on nine verified 8-GPU nodes: 12 in all, at most 2 on one


def pending(name: str, gpus: int, message: str | None = None, reason: str = "Unschedulable") -> dict[str, Any]:
    pod = make_pod("ml", name, gpus={GPU: gpus})
    if message is not None:
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": reason,
                                        "message": message}]
    return pod


def cluster(*pods: dict[str, Any]) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = [namespace("ml")]
    for index, free in enumerate(SCATTERED):
        node = f"gpu-{index}"
        objects += [make_node(node, "h100x8"), validator_pod(node),
                    make_pod("ml", f"busy-{index}", gpus={GPU: 8 - free}, node=node)]
    # Free GPUs on an unverified node do not count: nothing may go there.
    objects += [make_node("gpu-broken", "h100x8"), validator_pod("gpu-broken", ready=False)]
    return [*objects, *pods]


def gauges(core: Any) -> dict[tuple[str, str, str], float]:
    text_families = IdleGpus(core.outcomes).families()
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(_One(text_families))  # type: ignore[arg-type]
    return {(sample.name, sample.labels["resource"], sample.labels["reason"]): sample.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for sample in family.samples}


def test_scattered_free_gpus_are_fragmented_room_while_a_big_pod_waits() -> None:
    waiting = pending("big", 4, "0/10 nodes are available: 9 InsufficientGPU: the pod asks 4 nvidia.com/gpu, more than "
                      "the node has free, 1 NotValidated: the nvidia-operator-validator pod on the node is not Ready.")
    core = core_from_objects(Config(), cluster(waiting))
    found = gauges(core)
    assert found[("gpu_placement_idle_gpus", GPU, "fragmented")] == 12
    assert found[("gpu_placement_idle_gpu_memory_bytes", GPU, "fragmented")] == 12 * 81559 * 2**20
    assert {reason for (name, _, reason), value in found.items() if value and name == "gpu_placement_idle_gpus"} \
        == {"fragmented"}


def test_each_reason_of_a_wait_and_no_gauge_without_one() -> None:
    quiet = core_from_objects(Config(), cluster())
    assert idle_while_waiting(quiet.outcomes) == {}  # no pod waits: no GPU is idle "while pods wait"
    cases = {
        "capacity": pending("huge", 16, "0/10 nodes are available: 9 InsufficientGPU: the pod asks 16."),
        "quota": pending("gated", 1, "Scheduling is blocked due to non-empty scheduling gates", "SchedulingGated"),
        "policy": pending("picky", 1, "0/10 nodes are available: 9 ProductMismatch: the node's GPU is not one of x."),
        "unverified": pending("early", 1, "0/10 nodes are available: 10 NotValidated: the validator is not Ready."),
    }
    for reason, pod in cases.items():
        core = core_from_objects(Config(), cluster(pod))
        figures = idle_while_waiting(core.outcomes)
        assert {r: units for (_, r), (units, _) in figures.items() if units} == {reason: 12}, reason
    # A pod with no PodScheduled message yet waits on nothing we can name.
    assert idle_while_waiting(core_from_objects(Config(), cluster(pending("new", 4))).outcomes) == {}


def test_the_strongest_reason_takes_the_room_once() -> None:
    core = core_from_objects(Config(), cluster(
        pending("big", 4, "0/10 nodes are available: 9 InsufficientGPU: the pod asks 4."),
        pending("gated", 1, "blocked", "SchedulingGated")))
    figures = idle_while_waiting(core.outcomes)
    assert {reason: units for (_, reason), (units, _) in figures.items()} == {
        "fragmented": 12, "quota": 0, "policy": 0, "unverified": 0, "capacity": 0}


def test_explain_says_the_room_is_there_but_not_in_one_piece() -> None:
    core = core_from_objects(Config(), cluster())
    text = explain_pod(core, pending("big", 4), "ml")
    assert ("12 GPUs free across 9 verified nodes, at most 2 on one: the pod asks 4 (fragmented: it would fit if the "
            "free ones were on one node)") in text
    assert explain_json(core, pending("big", 4), "ml")["fragmented"] == [
        "12 GPUs free across 9 verified nodes, at most 2 on one: the pod asks 4 (fragmented: it would fit if the free "
        "ones were on one node)"]
    # Two fit on a node: nothing to say. Thirteen exceed what is free in all: not fragmentation either.
    assert "fragmented" not in explain_pod(core, pending("small", 2), "ml")
    assert explain_json(core, pending("huge", 13), "ml")["fragmented"] == []
