"""Events: the ones the fake API holds."""

from __future__ import annotations

from typing import Any

from tests.fakeapi import FakeApiServer


def events(fake: FakeApiServer, namespace: str | None = None) -> list[dict[str, Any]]:
    return [e for e in fake.list("Event") if namespace is None or e["metadata"]["namespace"] == namespace]
