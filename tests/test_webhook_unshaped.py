"""A GPU pod that reaches /validate without /mutate's shaping (/mutate failed or timed out, and its
failurePolicy is Ignore). In a namespace with a GPU policy it is refused (webhook/shaping.py,
NotShaped); in one without, it may go in unshaped, and its user is told so in a warning kubectl prints.
In audit mode /mutate shapes nothing, so no pod is held to it (tests/test_webhook_validate.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_placement.observe import metrics
from gpu_placement.web.certs import CertBundle
from tests.support.webhook import TEST_CONFIG, Webhook, serving, user_pod

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def allowing(bundle: CertBundle) -> Iterator[Webhook]:
    with serving(bundle, {**TEST_CONFIG, "defaultNamespacePolicy": "allow"}) as hook:
        yield hook


def test_outside_any_gpu_policy_an_unshaped_pod_is_let_in_and_told(allowing: Webhook) -> None:
    allowing.reset()
    counter = metrics.DECISIONS.labels("webhook", "NotShapedAllowed")
    before = counter._value.get()  # type: ignore[attr-defined]
    pod = user_pod("web", "raw", gpus={"nvidia.com/gpu": 1})
    verdict = allowing.validate(pod, "web")  # straight to /validate: /mutate never answered
    assert verdict["allowed"] is True
    [warning] = verdict["warnings"]
    assert warning == (
        "pod web/raw was not shaped by gpu-placement's mutating webhook: it lacks spec.tolerations, "
        "spec.nodeSelector, spec.schedulerName, the gpu-placement.io/admitted annotation, so it keeps its scheduler "
        "and runs without gpu-placement's GPU node checks. Most likely the webhook could not be reached when the pod "
        "was created (its failurePolicy is Ignore, so the API server went on without it): create the pod again to "
        "have it placed by gpu-placement")
    assert counter._value.get() == before + 1  # type: ignore[attr-defined]
    _, shaped = allowing.admit(pod, "web")
    assert "warnings" not in shaped

