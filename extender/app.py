"""The extender's HTTP edge: parse what kube-scheduler sends, ask `Placement`, encode the answer.

One endpoint per verb (`filter_`, `prioritize`, `bind`, and `preempt` in extender/preempt.py), each a
plain function of the request that answers 200; what they share is `app.state.extender`
(extender/state.py). A request refused is raised (`BodyTooLarge`, `WireError`, `ShapeError`,
`Unavailable`) and answered by the app's exception handlers with the protocol's `Error` field; `_EDGE`
(gpu_placement/web/edge.py) says how, times each verb and answers a bug with a 500 whose body says so.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from itertools import islice
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request

from extender.args import WireError, json_object, pod_label
from extender.binding import Binder, BindError
from extender.preempt import preempt
from extender.sample import OUTSIDE_SAMPLE, may_be_cut, outside_sample, refused_as_unresolvable
from extender.state import BIND_REFUSED, DEFAULT_MAX_BODY, Extender, extender, pod_key_of
from extender.wire import ExtenderBindingArgs, ExtenderFilterResult
from gpu_placement.decide.nominated import keep_for_nominated
from gpu_placement.decide.placement import FilterResult, Placement
from gpu_placement.decide.requirements import Requirements
from gpu_placement.decide.rules import unknown_node
from gpu_placement.facts.pods import pod_key, pod_priority, soft_placement
from gpu_placement.observe import metrics
from gpu_placement.view.cluster import ClusterView, same_pod
from gpu_placement.web import shape
from gpu_placement.web.edge import Edge, Refusal, Unavailable
from gpu_placement.web.http import BodyTooLarge, ORJSONResponse, ops_routes
from gpu_placement.web.shape import ShapeError

__all__ = ["DEFAULT_MAX_BODY", "Recheck", "bind", "create_app", "filter_", "prioritize"]

log = logging.getLogger("gpu_placement.extender")


def create_app(view: ClusterView, placement: Placement, binder: Binder, ready: Callable[[], tuple[bool, str]],
               max_body: int = DEFAULT_MAX_BODY) -> Starlette:
    routes = [_EDGE.route("filter", filter_), _EDGE.route("prioritize", prioritize), _EDGE.route("bind", bind),
              _EDGE.route("preempt", preempt), *ops_routes(ready)]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await binder.aclose()  # its connections belong to this loop

    app = Starlette(routes=routes, exception_handlers=_EDGE.handlers(), lifespan=lifespan)
    app.state.extender = Extender(view, placement, binder, ready, max_body)
    return app


# -- the verbs ---------------------------------------------------------------------------------------------

async def filter_(request: Request) -> ORJSONResponse:
    ex = extender(request)
    pod, names, objects = await ex.args(request)
    waiting = ex.not_ready("filter")
    if waiting is not None:  # 200 with Error: kube-scheduler shows the sentence (a non-200 loses it)
        return ORJSONResponse(_NOT_DECIDED | {"Error": waiting})
    req = ex.placement.requirements(pod)
    if req.wants_gpu and req.error is None:  # a pod no node can take is not bound; and its text is not kept
        ex.remember(pod, req)
        ex.release_held(pod)  # its hold from an earlier cycle (a bind that failed, a retry): judged afresh
    # Answered by the best tier when some node passes: the failure maps are then not built (a partial result)
    tiered = bool(req.wants_gpu and ex.placement.config.scoring.tier_size)
    debug = log.isEnabledFor(logging.DEBUG)
    result, encoded = _decide(ex, pod, req, names, objects, maps=not tiered or debug)
    settle = ex.settle
    assert settle is not None
    if not result.passed and req.error is None and (len(result.failed_json) > 2 or
                                                      len(result.unresolvable_json) > 2):
        # The pod fits nowhere. kube-scheduler may have moved it on an event our watch has not
        # applied yet (a validator turned Ready, a pod deleted): answered from that view, it would
        # wait for the next event or kube-scheduler's 5-minute flush. Where the view is plausibly
        # behind, it gets a moment (budgeted) to take the change, and the pod is judged again.
        meta = pod.get("metadata") or {}
        key, uid, version = pod_key_of(pod), str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
        why = settle.why(key, uid, version, result)
        if why is not None and await settle.wait(key, why, version):
            result, encoded = _decide(ex, pod, req, names, objects, maps=not tiered or debug)
        settle.answered(key, uid, version, result)
        if not result.passed:
            encoded = _outside_sample(ex, pod, req, names, objects, result) or encoded
    elif result.passed:
        settle.forget(pod_key_of(pod))
        ex.samples.forget(pod_key_of(pod))
    if result.passed and tiered:
        encoded = _best_tier(ex, pod, req, result, objects)
    assert encoded is not None  # a partial result passes some node: answered by its tier
    ex.decisions.count_all(result.reasons)  # every refused node's reason, whether the answer lists it or not
    if ex.tracker is not None and req.gpus:
        ex.tracker.filtered(pod_key_of(pod), bool(result.passed), result.reasons)
    if debug:
        short = {name: ex.placement.detail(req, name) for name in islice(orjson.loads(result.failed_json), 20)}
        log.debug("filter pod=%s needs=%s passed=%d rejected=%s short=%s", pod_label(pod), req.describe(),
                  len(result.passed), dict(result.reasons), short)
    return ORJSONResponse(encoded)


async def prioritize(request: Request) -> ORJSONResponse:
    ex = extender(request)
    pod, names, _ = await ex.args(request)
    waiting = ex.not_ready("prioritize")
    if waiting is not None:  # HostPriorityList has no Error field: a non-200 is kube-scheduler's error
        raise Unavailable(waiting, problem=None)  # not the sender's fault: no bad request
    return ORJSONResponse(ex.placement.scores_json(ex.placement.requirements(pod), names))


async def bind(request: Request) -> ORJSONResponse:
    ex = extender(request)
    args: ExtenderBindingArgs = json_object(await ex.body(request), "ExtenderBindingArgs")
    name, node = shape.name(args.get("PodName"), "PodName"), shape.name(args.get("Node"), "Node")
    namespace = shape.name(args.get("PodNamespace"), "PodNamespace", shape.LABEL_LIMIT)
    uid = shape.opt_str(args.get("PodUID"), "PodUID", shape.UID_LIMIT) or ""
    waiting = ex.not_ready("bind")
    if waiting is not None:
        metrics.BINDINGS.labels("error").inc()
        return ORJSONResponse({"Error": waiting})
    error = await _bind(ex, namespace, name, uid, node)
    metrics.BINDINGS.labels("error" if error else "ok").inc()
    if error:
        log.warning("bind %s/%s to %s failed: %s", namespace, name, node, error)
    else:
        log.debug("bound %s/%s to %s", namespace, name, node)  # kube-scheduler logs it, and writes an Event
    return ORJSONResponse({"Error": error})


# -- how the extender refuses: the protocol's Error field, and its status -------------------------------------

def _error_body(refusal: Refusal) -> dict[str, Any]:
    return {"Error": refusal.message}


def _malformed(exc: Exception) -> Refusal:
    return Refusal(400, str(exc), "malformed")


def _wrong_path(request: Request, status: int) -> Refusal:
    return Refusal(status, f"{request.method} {request.url.path} is not an extender verb: use POST /filter, "
                   "/prioritize, /preempt or /bind", "bad_path")


def _internal(exc: Exception) -> Refusal:
    return Refusal(500, f"internal error: {type(exc).__name__}: {exc}", "internal")


_EDGE = Edge("extender", log, _error_body, {
    BodyTooLarge: lambda exc: Refusal(413, f"{exc} (raise it with --extender-max-body-bytes)", "too_large"),
    WireError: _malformed,  # PreemptWireError too
    ShapeError: _malformed,
    Unavailable: lambda exc: Refusal(503, str(exc), exc.problem),
}, _wrong_path, _internal)


# -- /filter's decision and its bytes ------------------------------------------------------------------------

def _decide(ex: Extender, pod: dict[str, Any], req: Requirements, names: list[str],
            objects: list[dict[str, Any]] | None, maps: bool = True) -> tuple[FilterResult, bytes | None]:
    """The verdict and its bytes; raises ShapeError for a passing node too deep to echo back. With `maps`
    False the result may be partial (`Placement.filter`): some node passes, and no bytes (None) are made,
    for the caller answers with the best tier."""
    result = ex.placement.filter(req, names, maps)  # a kind's unchanged answer comes back with its bytes
    # Room preemption made for a nominated pod of equal or higher priority stays its (nominated.py).
    priority, key, uid = (pod_priority(pod.get("spec") or {}), pod_key_of(pod),
                          str((pod.get("metadata") or {}).get("uid") or ""))
    kept = keep_for_nominated(ex.placement, req, result, priority, key, uid)
    if kept is not result and result.partial:  # a node moved to FailedNodes: beside the others' reasons
        kept = keep_for_nominated(ex.placement, req, ex.placement.filter(req, names), priority, key, uid)
    if kept.partial:
        return kept, None
    return kept, _encode_filter(kept, objects)


def _best_tier(ex: Extender, pod: dict[str, Any], req: Requirements, result: FilterResult,
               objects: list[dict[str, Any]] | None) -> bytes:
    """The answer when some node passes: the best tier only (`Placement.tier`), no failure maps. kube-scheduler
    then scores the tier's few nodes with its own plugins, or none when one is answered (schedulePod's
    single-feasible-node path); the nodes left out get no status, which matters only to a pod no node
    passes, and that answer lists them all (docs/performance.md, "One call per pod"). One node answered
    is where kube-scheduler binds it: its GPUs are held there at once, so the next pod's /filter counts
    them before the watch shows the Binding (`Extender.hold`). A pod with soft preferences of its own (a
    ScheduleAnyway spread, a preferred affinity term) gets every node of the best 0..10 score, up to the
    tier's size, for kube-scheduler's plugins to weigh them; the rest get fragmentation's finer order."""
    coarse = soft_placement(pod.get("spec") or {})
    chosen = ex.placement.tier(req, result.passed, coarse=coarse)
    if len(chosen) == 1:
        ex.hold(pod, req, chosen[0])
    return _encode_filter(FilterResult(chosen), objects)


def _outside_sample(ex: Extender, pod: dict[str, Any], req: Requirements, names: list[str],
                    objects: list[dict[str, Any]] | None, result: FilterResult) -> bytes | None:
    """The answer when no name sent passes, the names can be kube-scheduler's sample cut short, and nodes
    outside them pass: every refusal unresolvable, so preemption evicts nothing for a pod that fits elsewhere
    (extender/sample.py). None: answer as the verdict says."""
    asked = frozenset(names)
    all_nodes = len(ex.view.nodes)
    if not may_be_cut(len(asked), all_nodes, ex.placement.config.percentage_of_nodes_to_score):
        return None
    outside = ex.placement.passing_outside(req, asked)
    if outside:  # room kept for nominated pods is not room for this one
        kept = keep_for_nominated(ex.placement, req, FilterResult(outside), pod_priority(pod.get("spec") or {}),
                                  pod_key_of(pod), str((pod.get("metadata") or {}).get("uid") or ""))
        outside = kept.passed
    if not outside:
        return None
    key, uid = pod_key_of(pod), str((pod.get("metadata") or {}).get("uid") or "")
    if not ex.samples.allow(key, uid, len(asked), all_nodes):
        log.info("filter pod=%s: none of the %d nodes sent fits, %d outside them do, answered as is (preemption "
                 "may act): its samples have gone round the %d nodes", pod_label(pod), len(asked), len(outside),
                 all_nodes)
        return None
    ex.decisions.count(OUTSIDE_SAMPLE)
    log.info("filter pod=%s: none of the %d nodes sent fits, %d outside them do (of %d): answered %s",
             pod_label(pod), len(asked), len(outside), all_nodes, OUTSIDE_SAMPLE)
    sentence = outside_sample(len(outside), len(asked), result.reasons)
    return _encode_filter(refused_as_unresolvable(result, sentence), objects)


# -- /bind: the fit checked again, then the Binding ------------------------------------------------------------

async def _bind(ex: Extender, namespace: str, name: str, uid: str, node: str) -> str:
    key = pod_key(namespace, name)
    with ex.view.lock:  # the fit is checked and the memory reserved in one step: no other bind in between
        checked = _recheck_and_reserve(ex, key, uid, node)
    if checked.refused:
        return checked.refused
    reserved = checked.reserved
    try:
        # The API call, a coroutine on this loop (no thread, a kept connection): outside the lock.
        await ex.binder.bind(namespace, name, uid, node)
    except BindError as exc:
        if reserved and not exc.ambiguous:
            ex.view.release(key, uid)
        return str(exc) + ("; its GPUs stay reserved until the pod is seen bound or deleted, or "
                           "reservationTTLSeconds passes" if reserved and exc.ambiguous else "")
    return ""


@dataclass(slots=True, frozen=True)
class Recheck:
    """/bind's second look: `refused`, why the Binding is not made (empty: it is); `reserved`, whether the
    pod's GPUs were reserved on the node (released again when the Binding surely failed)."""

    refused: str = ""
    reserved: bool = False


_NOTHING_HELD = Recheck()  # the Binding goes ahead with nothing to reserve
_RESERVED = Recheck(reserved=True)


def _recheck_and_reserve(ex: Extender, key: str, uid: str, node: str) -> Recheck:
    """Whether the bind may go ahead, and whether a reservation was made. kube-scheduler binds
    asynchronously: other pods may have been bound since this one's /filter, so its verdict is
    taken again now, with every reservation counted."""
    view = ex.view
    view.expire_reservations()
    if node not in view.nodes:
        return Recheck(unknown_node())
    pod = view.pods.get(key)
    # Identity is the UID: the view may still show the pod this one replaced under the same name (a
    # StatefulSet's, with the watch a moment behind), bound elsewhere; that says nothing of this pod.
    if pod is not None and pod.node and same_pod(pod.uid, uid):
        return _NOTHING_HELD  # already bound: the binder says to which node
    known = ex.recent.get(key)
    if known is None:
        if pod is None or not pod.gpus:
            return _NOTHING_HELD  # a pod with no GPU: nothing to check or hold
        return Recheck(f"pod {key} was not filtered by this extender (restarted since its /filter?); "
                       "kube-scheduler retries it")
    filtered_uid, req = known
    if uid and filtered_uid and uid != filtered_uid:
        return Recheck(f"pod {key} has UID {uid}, not {filtered_uid} as filtered: it was replaced; kube-scheduler "
                       "retries")
    if not req.wants_gpu:
        return _NOTHING_HELD
    held = view.reservations.get(key)  # a retry after an ambiguous failure: its own hold does not count
    if held is not None:
        view.release(key)
        if not same_pod(held.uid, uid):
            held = None  # the hold of the pod this one replaced: that pod is gone
    problem = ex.placement.recheck(req, node)
    if problem is not None:
        if held is not None:
            view.reserve(key, held.node, held.gpus, held.memory_annotation, held.uid)
        ex.decisions.count(BIND_REFUSED)
        return Recheck(f"{problem} (checked again at /bind; kube-scheduler retries the pod)")
    memory = f"{req.memory_mib}Mi" if req.memory_mib is not None else None  # the ask /filter judged
    view.reserve(key, node, req.gpus, memory, uid or filtered_uid)
    return _RESERVED


_NOT_DECIDED: ExtenderFilterResult = {"Nodes": None, "NodeNames": None, "FailedNodes": {},
                                      "FailedAndUnresolvableNodes": {}}
_NODE_LIST_DEPTH = 3  # answer, NodeList, items: the levels above a node echoed back


def _encode_filter(result: FilterResult, objects: list[dict[str, Any]] | None) -> bytes:
    if objects is None:  # the common form (nodeCacheCapable): joined from pieces, no re-encoding
        if result.encoded is None:  # a result replayed for an unchanged kind is encoded once
            result.encoded = b"".join((b'{"Nodes":null,"NodeNames":', orjson.dumps(result.passed), b',"FailedNodes":',
                                       result.failed_json, b',"FailedAndUnresolvableNodes":', result.unresolvable_json,
                                       b',"Error":""}'))  # one copy of the (large) maps
        return result.encoded
    keep = set(result.passed)  # answer in the form asked: the passing Node objects themselves
    answer: ExtenderFilterResult = {
        "Nodes": {"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                  "items": [node for node in objects if node["metadata"]["name"] in keep]},
        "NodeNames": None, "FailedNodes": result.failed, "FailedAndUnresolvableNodes": result.unresolvable,
        "Error": "",
    }
    try:
        return orjson.dumps(answer)
    except orjson.JSONEncodeError:  # JSON from orjson.loads fails to encode only by depth: name the node
        for index, node in enumerate(objects):
            if node["metadata"]["name"] in keep:
                shape.check_depth(node, f"Nodes.items[{index}]", shape.ECHO_DEPTH - _NODE_LIST_DEPTH)
        raise


