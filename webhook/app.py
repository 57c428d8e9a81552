"""The webhook's HTTP edge: read the AdmissionReview, ask `Admission`, encode the answer.

Answers, by what came in:
- an AdmissionReview (any pod, good or bad): HTTP 200 with an AdmissionReview response;
- a body that is not one: HTTP 400; over 3 MiB: HTTP 413; an unknown path: 404/405; a bug: 500.
  Every non-200 answer has a JSON `v1.Status` body (`kind: Status`, `status: Failure`, `message`,
  `reason`, `code`), the shape the API server uses for its own errors, and is logged and counted.
Query strings (`?timeout=10s`, which the API server appends) are ignored by the routing. One endpoint
per verb (`mutate`, `validate`), each a function of the request that answers 200; what they share is
`app.state.webhook`. A request refused is raised (`BodyTooLarge`, `ReviewError`) and answered by the app's
exception handlers with a `v1.Status`; `_EDGE` (gpu_placement/web/edge.py) says how, times each verb and
answers a bug with a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request

from gpu_placement.base.config import Config
from gpu_placement.view.cluster import ClusterView
from gpu_placement.web.edge import Decisions, Edge, Refusal
from gpu_placement.web.http import BodyTooLarge, ORJSONResponse, ops_routes, read_body
from webhook.admission import Admission, Decision
from webhook.holds import HoldChecker
from webhook.review import AdmissionRequest, ReviewError, encode_review, parse_review, status_body

__all__ = ["MAX_BODY", "Webhook", "create_app", "mutate", "validate"]

log = logging.getLogger("gpu_placement.webhook")
MAX_BODY = 3 * 2**20  # the API server caps objects at about 1.5 MiB; a review holds one, plus its metadata
# (namespace, pod name, pod uid, warnings, the peer's address): see create_app.
Warned = Callable[[str, str, str, list[str], str], None]


def create_app(view: ClusterView, config: Config, ready: Callable[[], tuple[bool, str]], api: Any = None,
               quota_gate: bool = False, dra_version: str | None = None, on_warned: Warned | None = None) -> Starlette:
    """POST /mutate, POST /validate, and the ops routes. Reads `view` (under its lock where it needs
    consistent figures) and never writes it; keeps its own policy cache and quota reservations.
    `api` (a kubernetes ApiClient, None with --snapshot): overdue holds are settled by listing pods
    (webhook/holds.py, a thread that runs while the app does). `quota_gate`: see webhook/quota_gate.py.
    `dra_version`: the resource.k8s.io version the API server serves claims at (webhook/claim_reader.py).
    `on_warned(namespace, name, uid, warnings, peer)`: a pod CREATE /validate allowed with warnings, not a dry
    run (gpu_placement/controllers/events.py PodWarnings puts them on the pod with that uid once it exists,
    bounded per peer); a dict insert, no I/O."""
    admission = Admission(view, config, api, quota_gate, dra_version)
    state = Webhook(admission, HoldChecker(admission.reservations, api) if api is not None else None, on_warned)
    routes = [_EDGE.route("mutate", mutate), _EDGE.route("validate", validate), *ops_routes(ready)]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if state.holds is not None:
            state.holds.start()
        try:
            yield
        finally:
            if state.holds is not None:
                state.holds.stop()

    app = Starlette(routes=routes, exception_handlers=_EDGE.handlers(), lifespan=lifespan)
    app.state.webhook = state
    app.state.admission = admission  # for tests and the demo: the policy cache and reservations
    app.state.holds = state.holds
    return app


@dataclass(slots=True, eq=False)
class Webhook:
    """What the routes share, on `app.state.webhook`: the decisions and their counters, the thread settling
    quota holds, and the hook for admission warnings."""

    admission: Admission
    holds: HoldChecker | None = None
    on_warned: Warned | None = None
    decisions: Decisions = field(default_factory=lambda: Decisions("webhook"))  # gpu_placement_decisions_total


# -- the two verbs -------------------------------------------------------------------------------------------

async def mutate(request: Request) -> ORJSONResponse:
    state: Webhook = request.app.state.webhook
    return await _handle(request, state, "mutate", state.admission.mutate)


async def validate(request: Request) -> ORJSONResponse:
    state: Webhook = request.app.state.webhook
    return await _handle(request, state, "validate", state.admission.validate)


# -- how the webhook refuses: a v1.Status, as the API server answers its own errors ------------------------

def _status(refusal: Refusal) -> bytes:
    return orjson.dumps(status_body(refusal.status, refusal.reason, refusal.message))


def _wrong_path(request: Request, status: int) -> Refusal:
    return Refusal(status, f"{request.method} {request.url.path} is not a webhook endpoint: the API server calls "
                   "POST /mutate and POST /validate", "bad_path", "NotFound" if status == 404 else "MethodNotAllowed")


def _internal(exc: Exception) -> Refusal:
    return Refusal(500, f"internal error in the gpu-placement webhook: {type(exc).__name__}: {exc}", "internal",
                   "InternalError")


_EDGE = Edge("webhook", log, _status, {
    BodyTooLarge: lambda exc: Refusal(413, f"{exc}: an AdmissionReview of one pod is far smaller", "too_large",
                                      "RequestEntityTooLarge"),
    ReviewError: lambda exc: Refusal(400, str(exc), exc.problem, "BadRequest"),
}, _wrong_path, _internal)


# -- what both verbs do -------------------------------------------------------------------------------------

async def _handle(request: Request, state: Webhook, verb: str,
                  decide: Callable[[AdmissionRequest], Decision]) -> ORJSONResponse:
    review = parse_review(await read_body(request, MAX_BODY))
    admission = state.admission
    reads: list[Awaitable[None]] = []
    namespace = admission.namespace_to_read(review)
    if namespace is not None and admission.reader is not None:  # the view has not seen it yet: one GET, off the loop
        reads.append(admission.reader.read(namespace))
    claims = admission.claims_to_read(review) if verb == "mutate" else []
    if claims and admission.claim_reader is not None:  # the claims or templates it names (claim_reader.py), too
        reads.append(admission.claim_reader.read(claims))
    if reads:
        await asyncio.gather(*reads)
    try:
        decision = decide(review)
        encoded = encode_review(decision.response)
    except Exception as exc:
        exc.add_note(f"for request {review['uid']}")  # in the line the edge logs
        raise
    state.decisions.count(decision.reason)
    if state.on_warned is not None and verb == "validate" and decision.response.get("warnings") and \
            decision.response["allowed"] and review.get("operation", "CREATE") == "CREATE" and \
            not review.get("dryRun") and not (review.get("resource") or {}).get("group"):
        peer = request.client.host if request.client is not None else ""
        state.on_warned(decision.namespace, decision.pod, decision.uid, list(decision.response["warnings"]), peer)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("webhook decision %s", orjson.dumps(decision.log_entry(verb)).decode())
    return ORJSONResponse(encoded)
