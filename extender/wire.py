"""kube-scheduler extender wire types (`k8s.io/kube-scheduler/extender/v1`).

The Go structs carry no JSON tags, so keys are the Go field names, capitalised. /prioritize's HostPriorityList
is joined from pre-encoded bytes (Placement.scores_json) and /bind answers one `Error` field, so neither
answer has a type here.
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["ExtenderArgs", "ExtenderBindingArgs", "ExtenderFilterResult", "ExtenderPreemptionArgs",
           "ExtenderPreemptionResult", "MetaPod", "MetaVictims", "Victims"]


class ExtenderArgs(TypedDict, total=False):
    Pod: dict[str, Any]
    Nodes: dict[str, Any] | None  # a v1.NodeList when the extender is not nodeCacheCapable
    NodeNames: list[str] | None  # when it is


class ExtenderFilterResult(TypedDict, total=False):
    Nodes: dict[str, Any] | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class ExtenderBindingArgs(TypedDict):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class Victims(TypedDict):
    Pods: list[dict[str, Any]] | None  # v1.Pod objects, highest priority first
    NumPDBViolations: int


class MetaPod(TypedDict):
    UID: str


class MetaVictims(TypedDict):
    Pods: list[MetaPod] | None
    NumPDBViolations: int


class ExtenderPreemptionArgs(TypedDict, total=False):
    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, Victims] | None  # when the extender is not nodeCacheCapable
    NodeNameToMetaVictims: dict[str, MetaVictims] | None  # when it is


class ExtenderPreemptionResult(TypedDict):
    NodeNameToMetaVictims: dict[str, MetaVictims]  # always this form: kube-scheduler maps UIDs back to its pods
