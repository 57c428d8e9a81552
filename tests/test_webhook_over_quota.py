"""A namespace already over its quota when gpu-placement came (the wave 5 trial: team-a's pods from before the
webhook held 9 GPUs against a quota of 8, and a 2-GPU pod was refused with `9 are in use and this pod asks 2
more: lower the request`, which no request can satisfy and which does not say how 9 of 8 happened)."""

from __future__ import annotations

import pytest

from gpu_placement.samples.cluster import make_pod
from tests.support.webhook import Webhook, denial, user_pod

pytestmark = pytest.mark.timeout(30)


def test_a_namespace_already_over_its_quota_says_so_and_what_helps(hook: Webhook) -> None:
    # research: quota 2, two running pods with 1 GPU each; one more from before the webhook, never admitted by it.
    legacy = make_pod("research", "legacy", gpus={"nvidia.com/gpu": 1}, node="h100-train-1")
    legacy["status"] = {"phase": "Running"}
    hook.ingest.event(hook.view, "pods", "ADDED", legacy)
    _, verdict = hook.admit(user_pod("research", "sweep", gpus={"nvidia.com/gpu": 1}), "research")
    assert denial(verdict) == (
        "namespace research may use 2 nvidia.com/gpu (gpu-placement.io/quota); 3 are in use, already over its quota "
        "by pods admitted before gpu-placement held them to it (installed or switched to enforce since, or the quota "
        "lowered since), and this pod asks 1 more: no GPU pod of the namespace is admitted until it is under its "
        "quota again: end some of those pods, or raise the quota on the namespace")
