"""What both HTTP edges share: orjson responses, a bounded body reader, and the ops routes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gpu_placement.observe import metrics

__all__ = ["BodyTooLarge", "ORJSONResponse", "ops_routes", "read_body"]


class ORJSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return content if isinstance(content, bytes) else orjson.dumps(content)


class BodyTooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"request body of {'at least ' if size < 0 else ''}{abs(size)} bytes exceeds the "
                         f"limit of {limit} bytes")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refusing early (by Content-Length) or as soon as the stream passes `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(-size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def ops_routes(ready: Callable[[], tuple[bool, str]]) -> list[Route]:
    """`/healthz` (the process answers), `/readyz` (the view is listed and the source healthy), `/metrics`."""

    async def healthz(_: Request) -> Response:
        return Response("ok", media_type="text/plain")

    async def readyz(_: Request) -> Response:
        ok, why = ready()
        return Response("ok" if ok else f"not ready: {why}", status_code=200 if ok else 503, media_type="text/plain")

    async def metrics_endpoint(_: Request) -> Response:
        return Response(metrics.exposition(), media_type=metrics.CONTENT_TYPE_LATEST)

    return [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics_endpoint)]
