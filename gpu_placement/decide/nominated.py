"""Room preemption made for a pod is kept for it: `/filter` counts what pods nominated to a node will take.

After kube-scheduler's preemption evicts victims for pod P on node N, it sets P's
`status.nominatedNodeName` to N and P waits for the victims to go. Meanwhile every other pod is
filtered too; kube-scheduler's own filters add the pods nominated to N with a priority at least the
filtered pod's (and not the pod itself) before judging N (`RunFilterPluginsWithNominatedPods`,
`addGENominatedPods`, v1.37), so a lower-priority pod cannot take the room first. The extender
judges GPU memory, which kube-scheduler does not see, so it does the same: the nominated pods' GPU
units and memory, as they would be charged there, count as taken until the pod binds (its own charge
counts then), is nominated elsewhere, gives up or is deleted. A nominated pod with a reservation (its
`/bind` in flight) is already counted by it.

The view keeps nominated GPU pods by node (`ClusterView.nominated`); nominations are few, so this is
a lookup per request, and a walk only on the nodes that have one.
"""

from __future__ import annotations

from collections import Counter

import orjson

from gpu_placement.decide.placement import FilterResult, Freed, Placement
from gpu_placement.decide.requirements import Requirements, parse_memory
from gpu_placement.decide.rules import HELD_FOR_NOMINATED, Need
from gpu_placement.facts.nodes import charge
from gpu_placement.view.cluster import ClusterView, same_pod

__all__ = ["held_for_nominated", "keep_for_nominated"]



def held_for_nominated(view: ClusterView, node: str, priority: int, pod_key: str, uid: str) -> Freed:
    """(units, MiB) per resource the pods nominated to `node` with at least `priority`, other than the
    pod being judged (`pod_key`, `uid`), will hold there, as negative figures (what is free, less them).
    Call under `view.lock`."""
    facts = view.nodes.get(node)
    held: dict[str, tuple[int, int]] = {}
    for key in view.nominated.get(node, ()):
        pod = view.pods.get(key)
        if pod is None or pod.priority < priority or (key == pod_key and same_pod(pod.uid, uid)) or (
                key in view.reservations):
            continue
        ask = view.ask_of(pod)
        try:
            ask_mib = parse_memory(ask) if ask is not None else None
        except ValueError:
            ask_mib = None  # charged by the unit's memory, as the view charges a broken annotation
        for resource, count in pod.gpus:
            mib = charge(facts, resource, count, ask_mib) if facts is not None else None
            units, total = held.get(resource, (0, 0))
            held[resource] = (units - count, total - (mib or 0))
    return held


def keep_for_nominated(placement: Placement, req: Requirements, result: FilterResult, priority: int,
                       pod_key: str, uid: str) -> FilterResult:
    """`result` (a /filter answer), with the passing nodes where what the nominated pods will take leaves
    too little for this pod moved to FailedNodes (preemption may help: a resolvable reason). The same
    object when no node changes, which is the case whenever no pod is nominated."""
    view = placement.view
    if not view.nominated or not result.passed or not req.wants_gpu:
        return result
    moved: dict[str, str] = {}
    with view.lock:
        passed = set(result.passed) & view.nominated.keys()
        for node in passed:
            need = placement.entry(req, node)
            held = held_for_nominated(view, node, priority, pod_key, uid)
            if not held or type(need) is not Need:
                continue
            shortfall = placement.shortfall(node, need, held)
            if shortfall is not None:
                moved[node] = shortfall + HELD_FOR_NOMINATED
    if not moved:
        return result
    reasons = Counter(result.reasons)
    reasons.update(message.split(":", 1)[0] for message in moved.values())
    pieces = b",".join(orjson.dumps(node) + b":" + orjson.dumps(message) for node, message in moved.items())
    failed = b"{%b}" % pieces if result.failed_json == b"{}" else result.failed_json[:-1] + b"," + pieces + b"}"
    return FilterResult([node for node in result.passed if node not in moved], failed, result.unresolvable_json,
                        reasons)
