"""Call an ASGI app in-process with one request: `explain` asks the webhook without a network hop."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["call"]


def call(app: Any, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    async def run() -> tuple[int, bytes]:
        status = 500
        chunks: list[bytes] = []
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
        await app(scope, receive, send)
        return status, b"".join(chunks)

    return asyncio.run(run())
