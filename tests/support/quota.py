"""The quota mirror's tests: fast watch and lease settings, the annotation, the ResourceQuota written, the end
of a turn."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import REGISTRY

from gpu_placement.controllers.quota_mirror import MirrorSettings, QuotaMirror
from gpu_placement.kube.api import WatchSettings
from tests.fakeapi import FakeApiServer

QUOTA = "gpu-placement.io/quota"
SUCCESS = "gpu_placement_quota_mirror_last_success_timestamp_seconds"
FAST_WATCH = WatchSettings(connect_timeout=1.0, read_timeout=2.0, server_timeout=30, client_timeout=35.0,
                           backoff_initial=0.05, backoff_max=0.3)
FAST = MirrorSettings(lease_name="quota-lock", lease_seconds=1, renew_seconds=0.05, resync_seconds=3600)


def mirrored(fake: FakeApiServer, ns: str) -> dict[str, str] | None:
    quota = fake.get("ResourceQuota", "gpu-placement", ns)
    return None if quota is None else quota["spec"]["hard"]


def a_turn_ends(mirror: QuotaMirror) -> Callable[[], bool]:
    """A condition for wait_for: true once `mirror`, leading, has ended a turn after this call (so the turn
    that was under way, or the first full pass, is done), read from the stamp the mirror keeps for that
    (gpu_placement_quota_mirror_last_success_timestamp_seconds, set at the end of a turn with nothing failing).
    What the test then finds unwritten was not written on that turn."""
    since = time.time()
    labels = {"lease": mirror.settings.lease_name}
    return lambda: mirror.leading and (REGISTRY.get_sample_value(SUCCESS, labels) or 0.0) > since
