"""The webhook's HTTP edge: read the AdmissionReview, ask `Admission`, encode the answer.

Answers, by what came in:
- an AdmissionReview (any pod, good or bad): HTTP 200 with an AdmissionReview response;
- a body that is not one: HTTP 400; over 3 MiB: HTTP 413; an unknown path: 404/405; a bug: 500.
  Every non-200 answer has a JSON `v1.Status` body (`kind: Status`, `status: Failure`, `message`,
  `reason`, `code`), the shape the API server uses for its own errors, and is logged and counted.
Query strings (`?timeout=10s`, which the API server appends) are ignored by the routing. One endpoint
per verb (`mutate`, `validate`), each a function of the request; what they share is `app.state.webhook`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from gpu_placement.base.config import Config
from gpu_placement.observe import metrics
from gpu_placement.view.cluster import ClusterView
from gpu_placement.web.http import BodyTooLarge, ORJSONResponse, ops_routes, read_body
from webhook.admission import Admission, Decision
from webhook.holds import HoldChecker
from webhook.review import AdmissionRequest, ReviewError, encode_review, parse_review, status_body

__all__ = ["MAX_BODY", "Webhook", "crashed", "create_app", "mutate", "not_found", "validate"]

log = logging.getLogger("gpu_placement.webhook")
MAX_BODY = 3 * 2**20  # the API server caps objects at about 1.5 MiB; a review holds one, plus its metadata
_VERBS = ("mutate", "validate")
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
    routes = [Route("/mutate", mutate, methods=["POST"]), Route("/validate", validate, methods=["POST"]),
              *ops_routes(ready)]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if state.holds is not None:
            state.holds.start()
        try:
            yield
        finally:
            if state.holds is not None:
                state.holds.stop()

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found, Exception: crashed},
                    lifespan=lifespan)
    app.state.webhook = state
    app.state.admission = admission  # for tests and the demo: the policy cache and reservations
    app.state.holds = state.holds
    return app


@dataclass(slots=True, eq=False)
class Webhook:
    """What the routes share, on `app.state.webhook`: the decisions, the thread settling quota holds, the
    hook for admission warnings, and the metric children looked up once so the hot path skips labels()."""

    admission: Admission
    holds: HoldChecker | None = None
    on_warned: Warned | None = None
    timers: dict[str, Any] = field(default_factory=lambda: {
        verb: metrics.REQUEST_SECONDS.labels("webhook", verb) for verb in _VERBS})
    answered: dict[str, Any] = field(default_factory=lambda: {
        verb: metrics.REQUESTS.labels("webhook", verb, "200") for verb in _VERBS})
    decided: dict[str, Any] = field(default_factory=dict)  # reason -> its gpu_placement_decisions child


# -- the two verbs -------------------------------------------------------------------------------------------

async def mutate(request: Request) -> ORJSONResponse:
    state: Webhook = request.app.state.webhook
    return await _handle(request, state, "mutate", state.admission.mutate)


async def validate(request: Request) -> ORJSONResponse:
    state: Webhook = request.app.state.webhook
    return await _handle(request, state, "validate", state.admission.validate)


async def not_found(request: Request, exc: Exception) -> ORJSONResponse:
    status = getattr(exc, "status_code", 404)
    reason = "NotFound" if status == 404 else "MethodNotAllowed"
    return _refuse(request.url.path.strip("/") or "root", status, reason, "bad_path",
                   f"{request.method} {request.url.path} is not a webhook endpoint: the API server calls "
                   "POST /mutate and POST /validate")


async def crashed(request: Request, exc: Exception) -> ORJSONResponse:
    log.exception("webhook %s failed", request.url.path)
    return _refuse(request.url.path.strip("/"), 500, "InternalError", "internal", _internal(exc))


# -- what both verbs do -------------------------------------------------------------------------------------

async def _handle(request: Request, state: Webhook, verb: str,
                  decide: Callable[[AdmissionRequest], Decision]) -> ORJSONResponse:
    start = time.perf_counter()
    try:
        body = await read_body(request, MAX_BODY)
    except BodyTooLarge as exc:
        return _refuse(verb, 413, "RequestEntityTooLarge", "too_large",
                       f"{exc}: an AdmissionReview of one pod is far smaller")
    try:
        review = parse_review(body)
    except ReviewError as exc:
        return _refuse(verb, 400, "BadRequest", exc.problem, str(exc))
    admission = state.admission
    reads: list[Awaitable[None]] = []
    namespace = admission.namespace_to_read(review)
    if namespace is not None:  # the view has not seen it yet: one GET, off the event loop
        reads.append(admission.reader.read(namespace))  # type: ignore[union-attr]
    claims = admission.claims_to_read(review) if verb == "mutate" else []
    if claims:  # the claims or templates it names, likewise (webhook/claim_reader.py), at the same time
        reads.append(admission.claim_reader.read(claims))  # type: ignore[union-attr]
    if reads:
        await asyncio.gather(*reads)
    try:
        decision = decide(review)
        encoded = encode_review(decision.response)
    except Exception as exc:
        # Answered here rather than by Starlette's error middleware: that one re-raises to the
        # server after answering, and uvicorn then drops the connection, with the answer
        # sometimes still unsent on a TLS connection.
        log.exception("webhook %s failed for request %s", verb, review["uid"])
        return _refuse(verb, 500, "InternalError", "internal", _internal(exc))
    counter = state.decided.get(decision.reason)
    if counter is None:
        counter = state.decided[decision.reason] = metrics.DECISIONS.labels("webhook", decision.reason)
    counter.inc()
    state.answered[verb].inc()
    if state.on_warned is not None and verb == "validate" and decision.response.get("warnings") and \
            decision.response["allowed"] and review.get("operation", "CREATE") == "CREATE" and \
            not review.get("dryRun") and not (review.get("resource") or {}).get("group"):
        peer = request.client.host if request.client is not None else ""
        state.on_warned(decision.namespace, decision.pod, decision.uid, list(decision.response["warnings"]), peer)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("webhook decision %s", orjson.dumps(decision.log_entry(verb)).decode())
    state.timers[verb].observe(time.perf_counter() - start)
    return ORJSONResponse(encoded)


def _refuse(verb: str, status: int, reason: str, problem: str, message: str) -> ORJSONResponse:
    log.warning("webhook %s refused (%d %s): %s", verb, status, reason, message)
    metrics.BAD_REQUESTS.labels("webhook", problem).inc()
    metrics.REQUESTS.labels("webhook", verb, str(status)).inc()
    return ORJSONResponse(orjson.dumps(status_body(status, reason, message)), status_code=status)


def _internal(exc: Exception) -> str:
    return f"internal error in the gpu-placement webhook: {type(exc).__name__}: {exc}"
