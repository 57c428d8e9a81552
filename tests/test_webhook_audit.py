"""Audit mode as a true dry run, over HTTPS: /mutate sends no patch (nothing a pod runs with changes)
and says in a warning what enforce mode would have done; /validate judges the pod as /mutate would
have shaped it, so its warnings are enforce mode's denials; both are counted."""

from __future__ import annotations

import copy

import pytest

from gpu_placement.observe import metrics
from gpu_placement.samples.dra import device_classes
from tests.support.webhook import Webhook, user_pod
from webhook.admission import AUDIT, AUDIT_OVER_QUOTA
from webhook.audit import KEEP_OFF, would_do

pytestmark = pytest.mark.timeout(30)


def decided(reason: str) -> float:
    return metrics.DECISIONS.labels("webhook", reason)._value.get()  # type: ignore[attr-defined]


@pytest.mark.parametrize("ns, gpus, says", [
    ("team-a", {"nvidia.com/gpu": 2}, "set schedulerName gpu-placement; add nodeSelector nvidia.com/gpu.present=true,"
                                      "pool=training; add tolerations nvidia.com/gpu:NoSchedule, dedicated:NoSchedule"),
    ("inference", {"nvidia.com/gpu": 1}, "rewrite nvidia.com/gpu to nvidia.com/gpu.shared; set schedulerName"),
    ("mig-lab", {"nvidia.com/gpu": 1}, "rewrite nvidia.com/gpu to nvidia.com/mig-1g.10gb"),
    ("multi", {"nvidia.com/gpu": 1}, "require the nodes of pools training, inference"),
])
def test_mutate_changes_nothing_and_says_what_enforce_would_do(hook: Webhook, audit: Webhook, ns: str,
                                                               gpus: dict[str, int], says: str) -> None:
    pod = user_pod(ns, "job", gpus=gpus)
    before = decided("AuditMutated")
    mutated, ops, response = audit.mutate(pod, ns)
    assert ops == [] and mutated == pod, "audit mode: nothing a pod runs with changes"
    [warning] = response["warnings"]
    assert warning.startswith("audit mode, nothing changed: enforce mode would ") and says in warning, warning
    assert decided("AuditMutated") == before + 2  # Webhook.mutate asks twice: the second, its idempotency check
    # What the warning says is what the enforce replica's patch does.
    _, enforce_ops, _ = hook.mutate(pod, ns)
    assert warning == would_do(enforce_ops, [p for p in ("training", "inference") if p in says])


def test_mutate_does_not_keep_a_tolerating_pod_off_gpu_nodes(audit: Webhook) -> None:
    pod = user_pod("web", "sneaky")
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]
    before = decided("AuditKeptOffGpuNodes")
    mutated, ops, response = audit.mutate(pod, "web")
    assert ops == [] and "affinity" not in mutated["spec"]
    assert response["warnings"] == [f"audit mode, nothing changed: enforce mode would {KEEP_OFF}"]
    assert decided("AuditKeptOffGpuNodes") == before + 2


def test_a_pod_enforce_would_not_change_gets_no_warning(hook: Webhook, audit: Webhook) -> None:
    shaped, _, _ = hook.mutate(user_pod("team-a", "job", gpus={"nvidia.com/gpu": 1}), "team-a")
    _, ops, response = audit.mutate(shaped, "team-a")
    assert ops == [] and "warnings" not in response


@pytest.mark.parametrize("ns, gpus, count", [
    ("inference", {"nvidia.com/gpu": 5}, 1),  # quota nvidia.com/gpu.shared=4: counted as the rewrite's resource
    ("mig-lab", {"nvidia.com/gpu": 3}, 1),
])
def test_validate_judges_the_pod_as_mutate_would_have_shaped_it(hook: Webhook, audit: Webhook, ns: str,
                                                                gpus: dict[str, int], count: int) -> None:
    """Unshaped, the pod still asks for nvidia.com/gpu; audit /validate must not then say that the
    mutating webhook did not run, nor that the quota does not list nvidia.com/gpu."""
    pod = user_pod(ns, "big", gpus=gpus)
    _, enforced = hook.admit(pod, ns, dry_run=True)
    assert enforced["allowed"] is False
    unshaped, _, _ = audit.mutate(pod, ns)
    verdict = audit.validate(unshaped, ns, dry_run=True)
    assert verdict["allowed"] is True
    assert verdict["warnings"] == [enforced["status"]["message"]]
    assert len(verdict["warnings"]) == count


def test_a_dra_pod_is_not_routed_either(hook: Webhook, audit: Webhook) -> None:
    """A pod whose ResourceClaims ask for a GPU class: audit mode tells the routing enforce mode does."""
    from tests.support.dra import TEMPLATES, bare, claim_pod

    pod = bare(claim_pod("team-a", "train", "one-gpu"))
    for served in (hook, audit):
        with served.view.lock:
            served.ingest.replace(served.view, "deviceclasses", copy.deepcopy(device_classes()))
            served.ingest.replace(served.view, "resourceclaimtemplates", copy.deepcopy(TEMPLATES))
    try:
        mutated, ops, response = audit.mutate(pod, "team-a")
        _, enforce_ops, _ = hook.mutate(pod, "team-a")
    finally:
        for served in (hook, audit):
            with served.view.lock:
                for kind in ("deviceclasses", "resourceclaimtemplates"):
                    served.ingest.replace(served.view, kind, [])
                served.view.dra.active = False
                served.view.listed -= {"deviceclasses", "resourceclaimtemplates"}
    assert ops == [] and mutated == pod, "audit mode: nothing a pod runs with changes"
    assert response["warnings"] == [would_do(enforce_ops, ["training"])]
    assert "set schedulerName gpu-placement" in response["warnings"][0]


def test_validate_counts_what_enforce_would_refuse_under_its_audit_code(audit: Webhook) -> None:
    """Every refusal code has its audit code written out (webhook/admission.py AUDIT), so a grep for
    AuditOverQuota finds the rule that counts it."""
    unshaped, _, _ = audit.mutate(user_pod("inference", "big", gpus={"nvidia.com/gpu": 5}), "inference")
    before = decided(AUDIT_OVER_QUOTA)
    audit.validate(unshaped, "inference", dry_run=True)
    assert decided("AuditOverQuota") == before + 1
    assert all(code == f"Audit{refusal}" for refusal, code in AUDIT.items())
