"""Preemption through the extender: a cluster of victims, the /preempt arguments and answers."""

from __future__ import annotations

from typing import Any

from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod
from tests.support.extender import SHARED, Extender, api_pod

PREEMPTOR_PRIORITY = 1000
ASK = "4Gi"  # 4096 MiB; a T4 share is 1920 MiB


def _running(name: str, node: str, mib: int, priority: int) -> dict[str, Any]:
    return make_pod("inference", name, gpus={SHARED: 1}, node=node, priority=priority,
                    annotations={"gpu-placement.io/gpu-memory": f"{mib}Mi"})


def _t4(name: str) -> dict[str, Any]:
    return make_node(name, "t4-timeslicing", labels={"nvidia.com/gpu.sharing-strategy": "time-slicing"},
                     shared_resource=SHARED)


def cluster() -> list[dict[str, Any]]:
    """t4-a: batch-low (prio 5, 2 GiB) is what the in-tree dry run frees; batch-big (prio 10, 6 GiB) is
    what frees the memory. t4-b: one low pod of 1 GiB among pods of higher priority than the preemptor."""
    objects = [namespace("inference", {"gpu-placement.io/sharing": "shared"}), namespace("gpu-operator"),
               _t4("t4-a"), _t4("t4-b"), make_node("h100-1", "h100"),
               validator_pod("t4-a"), validator_pod("t4-b"), validator_pod("h100-1"),
               _running("batch-low", "t4-a", 2048, 5), _running("batch-big", "t4-a", 6144, 10),
               *[_running(f"batch-small-{i}", "t4-a", 1024, 20) for i in range(6)],
               _running("b-low", "t4-b", 1024, 5),
               *[_running(f"critical-{i}", "t4-b", 2048, 2000) for i in range(7)]]
    return objects


def uid(name: str) -> str:
    return f"uid-inference-{name}"


def preemptor(**spec: Any) -> dict[str, Any]:
    pod = api_pod("chat-hi", namespace="inference", resource=SHARED, image="registry.example.com/chat:1",
                  annotations={"gpu-placement.io/gpu-memory": ASK})
    pod["spec"].update({"priority": PREEMPTOR_PRIORITY, "priorityClassName": "inference-critical", **spec})
    return pod


def meta_args(victims: dict[str, list[str]], pdb: dict[str, int] | None = None, **spec: Any) -> dict[str, Any]:
    """ExtenderPreemptionArgs as a nodeCacheCapable HTTPExtender marshals it (convertToMetaVictims)."""
    return {"Pod": preemptor(**spec), "NodeNameToVictims": None, "NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid(name)} for name in names], "NumPDBViolations": (pdb or {}).get(node, 0)}
        for node, names in victims.items()}}


def preempt(extender: Extender, body: Any) -> dict[str, Any]:
    response = extender.post("preempt", body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"NodeNameToMetaVictims"}
    return answer["NodeNameToMetaVictims"]


def victim_uids(answer: dict[str, Any], node: str) -> list[str]:
    return [pod["UID"] for pod in answer[node]["Pods"]]
