"""`discover_dra` asks a few times, waiting between tries as the watches do (WatchSettings.backoff)."""

from __future__ import annotations

import logging

import pytest

from gpu_placement.app.assembly import discover_dra
from gpu_placement.kube.api import WatchSettings
from tests.fakeapi import FakeApiServer

GROUP = "/apis/resource.k8s.io"
QUICK = WatchSettings(backoff_initial=0.01, backoff_max=0.05)


def test_discovery_answered_after_failures_turns_dra_on(caplog: pytest.LogCaptureFixture) -> None:
    with FakeApiServer(dra="v1") as fake:
        fake.fail_next(2, 503, path=GROUP)
        with caplog.at_level(logging.WARNING, "gpu_placement"):
            found = discover_dra(fake.api_client(), tries=3, settings=QUICK)
        assert found.served and found.version == "v1"
        assert fake.count(path=GROUP) == 3
    assert [r.getMessage().rsplit("; ", 1)[1] for r in caplog.records if "discovery of" in r.getMessage()] == [
        "attempt 1 of 3", "attempt 2 of 3"]


def test_discovery_never_answered_leaves_dra_off(caplog: pytest.LogCaptureFixture) -> None:
    with FakeApiServer(dra="v1") as fake:
        fake.fail_next(10, 503, path=GROUP)
        with caplog.at_level(logging.WARNING, "gpu_placement"):
            found = discover_dra(fake.api_client(), tries=2, settings=QUICK)
        assert not found.served
        assert fake.count(path=GROUP) == 2
    assert "resource.k8s.io could not be discovered: DRA objects are not read; restart to try again" in caplog.text
