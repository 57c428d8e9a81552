"""Shared pytest fixtures. Each fixture group sits in its own marked block; append new blocks below."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakeapi import FakeApiServer

# ---- fake Kubernetes API server (tests/fakeapi.py) -------------------------------------------------


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    """A started FakeApiServer (TLS, bearer token, the four system namespaces, 1 s bookmarks);
    stopped afterwards, its thread and every connection ended."""
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.stop()

# ---- end of fake Kubernetes API server -------------------------------------------------------------
