"""`POST /preempt`: kube-scheduler's `ExtenderPreemptionArgs` in, `ExtenderPreemptionResult` out.

kube-scheduler calls it after its own dry run (DefaultPreemption) found candidate nodes and victims,
with `NodeNameToMetaVictims` (victims as UIDs) when the extender is `nodeCacheCapable`, else
`NodeNameToVictims` (victims as v1.Pod objects). It always reads the answer as `NodeNameToMetaVictims`
and maps each UID back to a pod it holds on that node, so only nodes it asked about and pods bound
there may be named, and a node must keep at least one victim (an empty list fails the whole
preemption: "expected at least one victim pod on node"). Nodes left out are not preempted on.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.requests import Request

from extender.args import WireError, json_object, pod_label
from extender.state import extender
from extender.wire import ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaVictims
from gpu_placement.decide.preemption import NodePlan, Proposal
from gpu_placement.decide.preemption import preempt as preempt_on
from gpu_placement.facts.pods import pod_priority
from gpu_placement.observe import metrics
from gpu_placement.web import shape
from gpu_placement.web.edge import Unavailable
from gpu_placement.web.http import ORJSONResponse
from gpu_placement.web.shape import ShapeError

__all__ = ["PreemptWireError", "encode_result", "parse_preemption_args", "preempt"]

log = logging.getLogger("gpu_placement.extender")


class PreemptWireError(WireError):
    """The request is not an ExtenderPreemptionArgs; the message says what is wrong (a 400, as every WireError)."""


def parse_preemption_args(args: ExtenderPreemptionArgs) -> tuple[dict[str, Any], dict[str, Proposal]]:
    """(pod, node -> kube-scheduler's proposal) from either form; UIDs are all the UID-only form gives."""
    pod = args.get("Pod")
    if not isinstance(pod, dict):
        raise PreemptWireError("ExtenderPreemptionArgs.Pod is missing or not a v1.Pod object")
    try:  # what /filter reads of the pod, checked the same way (gpu_placement/web/shape.py)
        shape.check_pod(pod, "Pod")
    except ShapeError as exc:
        raise PreemptWireError(str(exc)) from None
    meta = args.get("NodeNameToMetaVictims")
    full = args.get("NodeNameToVictims")
    form, victims = ("NodeNameToMetaVictims", meta) if meta is not None else ("NodeNameToVictims", full)
    if victims is None:
        return pod, {}
    if not isinstance(victims, dict):
        raise PreemptWireError(f"ExtenderPreemptionArgs.{form} must be an object of node name to victims")
    proposals = {}
    for node, entry in victims.items():
        where = shape.key(f"ExtenderPreemptionArgs.{form}", node)
        if not isinstance(entry, dict):
            raise PreemptWireError(f"{where} must be an object with Pods and NumPDBViolations")
        pods = entry.get("Pods")
        pods = [] if pods is None else pods  # Go marshals an empty slice it never appended to as null
        violations = entry.get("NumPDBViolations", 0)
        if not isinstance(pods, list) or not isinstance(violations, int) or isinstance(violations, bool):
            raise PreemptWireError(f"{where} must have a Pods list and an integer NumPDBViolations")
        uids: list[str] = []
        priorities: list[int | None] = []
        for index, victim in enumerate(pods):
            if form == "NodeNameToMetaVictims":
                uid = victim.get("UID") if isinstance(victim, dict) else None
            else:
                if isinstance(victim, dict) and not (isinstance(victim.get("metadata"), dict | None) and
                                                     isinstance(victim.get("spec"), dict | None)):
                    raise PreemptWireError(f"{where}.Pods[{index}]: metadata and spec must be objects")
                uid = (victim.get("metadata") or {}).get("uid") if isinstance(victim, dict) else None
                priorities.append(pod_priority(victim.get("spec") or {}) if isinstance(victim, dict) else None)
            if not isinstance(uid, str) or not uid:
                field = "UID" if form == "NodeNameToMetaVictims" else "metadata.uid"
                raise PreemptWireError(f"{where}.Pods[{index}] has no {field}")
            uids.append(uid)
        proposals[node] = Proposal(tuple(uids), violations, tuple(priorities))
    return pod, proposals


def encode_result(plans: dict[str, NodePlan]) -> bytes:
    """`NodeNameToMetaVictims` of the nodes kept; kube-scheduler prefers the fewest PDB violations."""
    kept: dict[str, MetaVictims] = {
        node: {"Pods": [{"UID": victim.uid} for victim in plan.victims], "NumPDBViolations": plan.pdb_violations}
        for node, plan in plans.items() if plan.ok and plan.victims}
    result: ExtenderPreemptionResult = {"NodeNameToMetaVictims": kept}
    return orjson.dumps(result)


async def preempt(request: Request) -> ORJSONResponse:
    ex = extender(request)
    pod, proposals = parse_preemption_args(json_object(await ex.body(request), "ExtenderPreemptionArgs"))
    up, why = ex.ready()
    if not up:  # an answer from a partial view could evict the wrong pods; kube-scheduler retries
        raise Unavailable(f"gpu-placement is not ready: {why}")
    spec = pod.get("spec") or {}
    placement = ex.placement
    if spec.get("preemptionPolicy") == "Never":
        # kube-scheduler never preempts for such a pod (PodEligibleToPreemptOthers): if one arrives
        # anyway, no node is a candidate.
        plans: dict[str, NodePlan] = {}
    else:
        plans = preempt_on(placement, placement.requirements(pod), pod_priority(spec), proposals)
    for node, plan in plans.items():
        outcome = "dropped" if not plan.ok else "victims_added" if any(v.added for v in plan.victims) else "kept"
        metrics.PREEMPTION_NODES.labels(outcome).inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("preempt pod=%s node=%s outcome=%s victims=%s reason=%s", pod_label(pod), node, outcome,
                      [v.pod or v.uid for v in plan.victims], plan.reason)
    log.info("preempt pod=%s priority=%d: %d of %d proposed nodes kept", pod_label(pod), pod_priority(spec),
             sum(plan.ok for plan in plans.values()), len(proposals))
    return ORJSONResponse(encode_result(plans))
