"""How both HTTP edges answer, one way (Starlette's): a route answers 200, anything else is raised.

- `Edge.route`: `POST /<verb>`, its latency observed and its 200s counted.
- A request refused is an exception (`BodyTooLarge`, `WireError`, `ShapeError`, `ReviewError`,
  `Unavailable`, ...), raised wherever it is found and answered by the app's exception handlers
  (`Edge.handlers`, Starlette's `exception_handlers`): each edge maps its exceptions to a `Refusal`,
  and `Edge.refuse` logs it, counts it (`gpu_placement_requests_total`, and
  `gpu_placement_bad_requests_total` when the sender is at fault) and answers in the protocol's own
  error body. Every non-200 answer goes through `refuse`.
- A bug is answered by `Edge.route` with a 500 whose body says so, rather than by Starlette's error
  middleware: that one re-raises to the server after answering, and uvicorn then drops the
  connection, with the answer sometimes still unsent on a TLS connection.
- `Decisions`: the `gpu_placement_decisions_total` children of one component, each looked up once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from gpu_placement.observe import metrics
from gpu_placement.web.http import ORJSONResponse

__all__ = ["Decisions", "Edge", "Endpoint", "Refusal", "Unavailable"]

Endpoint = Callable[[Request], Awaitable[ORJSONResponse]]


@dataclass(slots=True, frozen=True)
class Refusal:
    """A non-200 answer: its HTTP status, the sentence the sender reads, the `problem` label of
    gpu_placement_bad_requests_total (None: not the sender's fault, not counted there, logged at debug
    by the edge: whoever raised it logged why), and the `v1.Status` reason where the protocol has one."""

    status: int
    message: str
    problem: str | None
    reason: str = ""


class Unavailable(Exception):
    """The service cannot answer yet (its view is not listed in full): HTTP 503, and the sender retries.
    `problem`: the bad-request label it is counted under, None for none."""

    def __init__(self, message: str, problem: str | None = "not_ready") -> None:
        super().__init__(message)
        self.problem = problem


class Decisions:
    """One component's `gpu_placement_decisions_total` children, each looked up once: the hot path
    skips `labels()` (a lock and a tuple of label values each call)."""

    __slots__ = ("_children", "_component")

    def __init__(self, component: str) -> None:
        self._component = component
        self._children: dict[str, Any] = {}

    def count(self, reason: str, number: int = 1) -> None:
        child = self._children.get(reason)
        if child is None:
            child = self._children[reason] = metrics.DECISIONS.labels(self._component, reason)
        child.inc(number)

    def count_all(self, reasons: Mapping[str, int]) -> None:
        for reason, number in reasons.items():
            self.count(reason, number)


Refuser = Callable[[Any], Refusal]  # a raised exception -> how it is answered
Handler = Callable[[Request, Exception], Awaitable[ORJSONResponse]]


class Edge:
    """One HTTP edge (`component`: extender or webhook): its routes, its exception handlers and how it
    refuses. `body(refusal)`: the protocol's error body; `refusals`: exception class -> its `Refusal`
    (looked up along the class's MRO, as Starlette does); `wrong_path(request, status)`: a 404 or 405;
    `internal(exc)`: the 500 of a bug."""

    def __init__(self, component: str, log: logging.Logger, body: Callable[[Refusal], Any],
                 refusals: Mapping[type[Exception], Refuser], wrong_path: Callable[[Request, int], Refusal],
                 internal: Callable[[Exception], Refusal]) -> None:
        self.component, self.log, self.body = component, log, body
        self.refusals, self.wrong_path, self.internal = dict(refusals), wrong_path, internal
        self._raised = tuple(refusals)

    def route(self, verb: str, endpoint: Endpoint) -> Route:
        """`POST /<verb>`: its latency observed (answered or refused), its 200s counted."""
        timer = metrics.REQUEST_SECONDS.labels(self.component, verb)
        answered = metrics.REQUESTS.labels(self.component, verb, "200")
        raised = self._raised

        async def timed(request: Request) -> ORJSONResponse:
            start = time.perf_counter()
            try:
                response = await endpoint(request)
            except raised:
                raise  # a refusal: the app's exception handler answers it
            except Exception as exc:
                return self.crashed(verb, exc)
            finally:
                timer.observe(time.perf_counter() - start)
            answered.inc()  # a route returns only 200s: anything else is raised
            return response

        return Route(f"/{verb}", timed, methods=["POST"])

    def handlers(self) -> dict[Any, Handler]:
        """Starlette's `exception_handlers` for the app."""
        handlers: dict[Any, Handler] = {kind: self._refused for kind in self.refusals}
        return handlers | {404: self._wrong_path, 405: self._wrong_path, Exception: self._crashed}

    def refuse(self, verb: str, refusal: Refusal) -> ORJSONResponse:
        """The one place a non-200 answer is logged, counted and encoded."""
        if refusal.problem is None:
            self.log.debug("%s %s answered %d: %s", self.component, verb, refusal.status, refusal.message)
        else:
            self.log.warning("%s %s refused (%d%s): %s", self.component, verb, refusal.status,
                             f" {refusal.reason}" if refusal.reason else "", refusal.message)
            metrics.BAD_REQUESTS.labels(self.component, refusal.problem).inc()
        metrics.REQUESTS.labels(self.component, verb, str(refusal.status)).inc()
        return ORJSONResponse(self.body(refusal), status_code=refusal.status)

    def crashed(self, verb: str, exc: Exception) -> ORJSONResponse:
        notes = "".join(f" {note}" for note in getattr(exc, "__notes__", ()))  # what the route added: a request's uid
        self.log.error("%s %s failed%s", self.component, verb, notes, exc_info=exc)
        return self.refuse(verb, self.internal(exc))

    async def _refused(self, request: Request, exc: Exception) -> ORJSONResponse:
        refuser = next(self.refusals[kind] for kind in type(exc).__mro__ if kind in self.refusals)
        return self.refuse(_verb(request), refuser(exc))

    async def _wrong_path(self, request: Request, exc: Exception) -> ORJSONResponse:
        return self.refuse(_verb(request) or "root", self.wrong_path(request, getattr(exc, "status_code", 404)))

    async def _crashed(self, request: Request, exc: Exception) -> ORJSONResponse:
        return self.crashed(_verb(request), exc)


def _verb(request: Request) -> str:
    return request.url.path.strip("/")
