"""What the extender's routes share, kept on `app.state.extender`: the view and the deciders, the binder,
what /filter remembered for /bind, and the three steps every verb begins with (read the body, parse it,
check the view is whole). The first two raise what is wrong (`BodyTooLarge`, `WireError`, `ShapeError`),
which the app answers in the protocol's own error field (extender/app.py, gpu_placement/web/edge.py)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from extender.args import ParsedArgs, parse_extender_args
from extender.binding import Binder
from extender.sample import Samples
from extender.settle import Settle
from gpu_placement.decide.placement import Placement
from gpu_placement.decide.requirements import Requirements
from gpu_placement.facts.pods import pod_key
from gpu_placement.report.cluster_metrics import ClusterMetrics, tracker_for
from gpu_placement.view.cluster import ClusterView
from gpu_placement.web import shape
from gpu_placement.web.edge import Decisions
from gpu_placement.web.http import read_body

__all__ = ["BIND_REFUSED", "DEFAULT_MAX_BODY", "VIEW_NOT_READY", "Extender", "extender", "pod_key_of"]

log = logging.getLogger("gpu_placement.extender")
DEFAULT_MAX_BODY = shape.EXTENDER_MAX_BODY
# The extender's own decision codes, beside the node reasons of gpu_placement/decide/rules.py:
VIEW_NOT_READY = "ViewNotReady"  # answered before the view's first full list (an Error kube-scheduler retries)
BIND_REFUSED = "BindRefused"  # /bind found the node no longer fits (extender/app.py _recheck_and_reserve)
_RECENT_PODS = 10_000  # pods seen in /filter, so /bind knows their ask before the watch shows them


@dataclass(slots=True, eq=False)
class Extender:
    view: ClusterView
    placement: Placement
    binder: Binder
    ready: Callable[[], tuple[bool, str]]
    max_body: int = DEFAULT_MAX_BODY
    # pod -> (UID, what /filter judged): /bind re-checks the fit the pod was filtered for
    recent: OrderedDict[str, tuple[str, Requirements]] = field(default_factory=OrderedDict)
    tracker: ClusterMetrics | None = None  # pods rejected on every node, for gpu_placement_pods_waiting
    decisions: Decisions = field(default_factory=lambda: Decisions("extender"))  # gpu_placement_decisions_total
    settle: Settle | None = None  # when an answer that passes no node waits for the view (extender/settle.py)
    samples: Samples = field(default_factory=Samples)  # pods answered OutsideSample in a row (extender/sample.py)
    listed: bool = False  # latched: a view once listed in full keeps serving (a dead API server changes nothing)

    def __post_init__(self) -> None:
        self.tracker = tracker_for(self.view)
        if self.settle is None:
            self.settle = Settle(self.view)

    async def body(self, request: Request) -> bytes:
        """The body; raises BodyTooLarge past --extender-max-body-bytes."""
        return await read_body(request, self.max_body)

    async def args(self, request: Request) -> ParsedArgs:
        """The `ExtenderArgs` of /filter and /prioritize; raises what is wrong with them (BodyTooLarge,
        WireError, ShapeError)."""
        return parse_extender_args(await self.body(request))

    def not_ready(self, verb: str) -> str | None:
        """Why the view cannot decide yet: before every kind's first full list (a restart, a leader
        failover) a verdict would miss validators, nodes or the pods holding memory."""
        if self.listed:
            return None
        ok, why = self.ready()
        if ok:
            self.listed = True
            return None
        self.decisions.count(VIEW_NOT_READY)
        log.info("extender %s answered Error: view not ready: %s", verb, why)
        return f"view not ready: {why}; kube-scheduler retries the pod with backoff"

    def remember(self, pod: dict[str, Any], req: Requirements) -> None:
        key = pod_key_of(pod)
        self.recent[key] = (str((pod.get("metadata") or {}).get("uid") or ""), req)
        self.recent.move_to_end(key)
        if len(self.recent) > _RECENT_PODS:
            self.recent.popitem(last=False)

    def hold(self, pod: dict[str, Any], req: Requirements, node: str) -> None:
        """Hold the pod's GPUs on the one node /filter answered: kube-scheduler binds it there (its binding
        cycle runs behind the next pods' scheduling), and until the watch shows the pod bound the view
        would count those GPUs free. Released when the pod is seen bound or deleted, at its next /filter
        (a bind that failed: kube-scheduler retries it), at /bind (which holds again after its recheck),
        or after reservationTTLSeconds. Not for DRA asks: the allocator's devices are not units the view
        can hold, and kube-scheduler's DynamicResources counts its in-flight claims itself."""
        if not req.gpus or req.dra_requests or req.dra_resources:
            return
        meta = pod.get("metadata") or {}
        memory = f"{req.memory_mib}Mi" if req.memory_mib is not None else None
        self.view.reserve(pod_key_of(pod), node, req.gpus, memory, str(meta.get("uid") or ""))

    def release_held(self, pod: dict[str, Any]) -> None:
        """The pod's hold from an earlier /filter, dropped before it is judged again."""
        key = pod_key_of(pod)
        if key in self.view.reservations:
            self.view.release(key, str((pod.get("metadata") or {}).get("uid") or ""))


def extender(request: Request) -> Extender:
    """The routes' shared state, from the app that received the request."""
    state: Extender = request.app.state.extender
    return state


def pod_key_of(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return pod_key(meta.get("namespace") or "default", meta.get("name") or "")
