"""A GPU pod that reaches /validate without /mutate's shaping (/mutate failed or timed out, and its
failurePolicy is Ignore): the user is told what happened and what to do, in a warning kubectl prints."""

from __future__ import annotations

import pytest

from gpu_placement import metrics
from tests.test_webhook_helpers import Webhook, user_pod
from tests.test_webhook_validate import audit, served_audit  # noqa: F401 (fixtures)
from webhook.unshaped import unshaped

pytestmark = pytest.mark.timeout(30)


def test_an_unshaped_gpu_pod_is_told_what_happened(hook: Webhook) -> None:
    counter = metrics.DECISIONS.labels("webhook", "Unshaped")
    before = counter._value.get()  # type: ignore[attr-defined]
    pod = user_pod("team-a", "raw", gpus={"nvidia.com/gpu": 1})
    verdict = hook.validate(pod, "team-a")  # straight to /validate: /mutate never answered
    assert verdict["allowed"] is True
    assert verdict["warnings"] == [unshaped("team-a", "raw")]
    assert "/mutate failed or timed out" in verdict["warnings"][0] and "delete it and create it again" in \
        verdict["warnings"][0]
    assert counter._value.get() == before + 1  # type: ignore[attr-defined]
    _, shaped = hook.admit(pod, "team-a")
    assert "warnings" not in shaped


def test_audit_mode_does_not_call_its_own_pods_unshaped(audit: Webhook) -> None:  # noqa: F811
    _, verdict = audit.admit(user_pod("team-a", "raw", gpus={"nvidia.com/gpu": 1}), "team-a")
    assert verdict == {"uid": verdict["uid"], "allowed": True}
