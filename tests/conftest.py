"""Shared pytest fixtures. Each fixture group sits in its own marked block; append new blocks below."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_placement.web.certs import CertBundle
from tests.fakeapi import FakeApiServer
from tests.support.dra_taints import replicas  # noqa: F401  (the fixture of test_dra_taints*.py)
from tests.support.webhook import TEST_CONFIG, Webhook, certificates, serving

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


# ---- the webhook over real HTTPS (tests/support/webhook.py) ----------------------------------


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> CertBundle:
    """A CA and serving pair for localhost, made once per test module."""
    return certificates(Path(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="module")
def served(bundle: CertBundle) -> Iterator[Webhook]:
    """The webhook app over HTTPS on loopback, one server per test module."""
    with serving(bundle) as hook:
        yield hook


@pytest.fixture
def hook(served: Webhook) -> Webhook:
    """The module's webhook with its view and reservations reset for this test."""
    served.reset()
    return served


@pytest.fixture(scope="module")
def served_audit(bundle: CertBundle) -> Iterator[Webhook]:
    """The same in audit mode (`mode: audit`)."""
    with serving(bundle, {**TEST_CONFIG, "mode": "audit"}) as hook:
        yield hook


@pytest.fixture
def audit(served_audit: Webhook) -> Webhook:
    """The module's audit-mode webhook, reset for this test."""
    served_audit.reset()
    return served_audit

# ---- end of the webhook over real HTTPS ------------------------------------------------------------
