"""The room preemption made for a pod is kept for it (gpu_placement/decide/nominated.py): `/filter` counts what
pods nominated to a node (`status.nominatedNodeName`) with at least the filtered pod's priority will
take there, as kube-scheduler's own filters do, until the nominated pod binds or gives up.

A time-sliced T4 (15360 MiB, two shares). `hi` (priority 1000, 10 GiB) preempted `victim` there and
is nominated to it; the victim is gone, and 15 GiB are free for a moment.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod
from tests.support.extender import Extender, api_pod

SHARED = "nvidia.com/gpu.shared"
T4, SPARE = "t4", "t4-spare"
ASK = {"gpu-placement.io/gpu-memory": "10Gi"}


def _t4(name: str) -> dict[str, Any]:
    return make_node(name, "t4-timeslicing", labels={"nvidia.com/gpu.replicas": "2",
                                                     "nvidia.com/gpu.sharing-strategy": "time-slicing"},
                     shared_resource=SHARED)


def _pending(name: str, priority: int, nominated: str | None = None) -> dict[str, Any]:
    pod = make_pod("serve", name, gpus={SHARED: 1}, annotations=ASK, priority=priority,
                   image="registry.example.com/chat:1")
    if nominated:
        pod["status"]["nominatedNodeName"] = nominated
    return pod


def _asking(name: str, priority: int) -> dict[str, Any]:
    """The pod as kube-scheduler sends it to /filter."""
    pod = api_pod(name, namespace="serve", resource=SHARED, image="registry.example.com/chat:1", annotations=ASK)
    pod["metadata"]["uid"] = f"uid-serve-{name}"
    pod["spec"]["priority"] = priority
    return pod


@pytest.fixture
def extender() -> Iterator[Extender]:
    server = Extender([namespace("serve", {"gpu-placement.io/sharing": "shared"}), _t4(T4), _t4(SPARE),
                       validator_pod(T4), validator_pod(SPARE), _pending("hi", 1000, nominated=T4),
                       make_pod("serve", "full", gpus={SHARED: 2}, node=SPARE)])  # the spare T4 is full
    yield server
    server.close()


def test_a_lower_priority_pod_cannot_take_the_room_preemption_made(extender: Extender) -> None:
    answer = extender.filter(_asking("lo", 0), [T4, SPARE])
    assert answer["NodeNames"] == [], answer
    assert answer["FailedNodes"][T4] == (
        f"InsufficientGPUMemory: the pod needs 10240 MiB of {SHARED} memory free and the node has less (per-node "
        "figures: gpu-placement explain); part of what is free there is held for a pod of equal or higher priority "
        "that preemption made room for (status.nominatedNodeName)")
    # Equal priority: held too (kube-scheduler adds nominated pods of >= priority); higher: not held.
    assert extender.filter(_asking("peer", 1000), [T4])["NodeNames"] == []
    assert extender.filter(_asking("boss", 2000), [T4])["NodeNames"] == [T4]
    # The nominated pod itself is not kept out by its own nomination (by UID; by name when it has none).
    assert extender.filter(_asking("hi", 1000), [T4])["NodeNames"] == [T4]
    unnamed = _asking("hi", 1000)
    del unnamed["metadata"]["uid"]
    assert extender.filter(unnamed, [T4])["NodeNames"] == [T4]


def test_the_hold_ends_when_the_pod_binds_or_gives_up(extender: Extender) -> None:
    view, ingest = extender.core.view, extender.core.ingest
    gave_up = _pending("hi", 1000)  # kube-scheduler cleared the nomination (nominated elsewhere, or gone)
    ingest.event(view, "pods", "MODIFIED", gave_up)
    assert extender.filter(_asking("lo", 0), [T4])["NodeNames"] == [T4]
    ingest.event(view, "pods", "MODIFIED", _pending("hi", 1000, nominated=T4))
    assert extender.filter(_asking("lo", 0), [T4])["NodeNames"] == []
    bound = copy.deepcopy(_pending("hi", 1000))
    bound["spec"]["nodeName"] = T4
    ingest.event(view, "pods", "MODIFIED", bound)  # bound: its own charge holds the memory now
    assert not view.nominated
    answer = extender.filter(_asking("lo", 0), [T4])
    assert answer["NodeNames"] == [] and "held for a pod" not in answer["FailedNodes"][T4]
    ingest.event(view, "pods", "DELETED", bound)
    assert extender.filter(_asking("lo", 0), [T4])["NodeNames"] == [T4]
