"""The quota mirror's tests: fast watch and lease settings, the annotation, the ResourceQuota written."""

from __future__ import annotations

from gpu_placement.controllers.quota_mirror import MirrorSettings
from gpu_placement.kube.api import WatchSettings
from tests.fakeapi import FakeApiServer

QUOTA = "gpu-placement.io/quota"
FAST_WATCH = WatchSettings(connect_timeout=1.0, read_timeout=2.0, server_timeout=30, client_timeout=35.0,
                           backoff_initial=0.05, backoff_max=0.3)
FAST = MirrorSettings(lease_name="quota-lock", lease_seconds=1, renew_seconds=0.05, resync_seconds=3600)


def mirrored(fake: FakeApiServer, ns: str) -> dict[str, str] | None:
    quota = fake.get("ResourceQuota", "gpu-placement", ns)
    return None if quota is None else quota["spec"]["hard"]
