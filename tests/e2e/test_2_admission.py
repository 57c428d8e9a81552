"""Scenario 2: denials as the API server returns them (what kubectl prints), dryRun=All reserving
nothing, and audit mode's would-be denials arriving as API warnings (the `Warning` header)."""

from __future__ import annotations

from tests.e2e.conftest import E2E

PREFIX = 'admission webhook "validate.gpu-placement.io" denied the request: '


def test_over_quota_denial_is_a_403_with_the_webhooks_sentence(e2e: E2E) -> None:
    ns = e2e.namespace("research", {"gpu-placement.io/quota": "nvidia.com/gpu=2"})
    # Each webhook replica counts the namespace from its own view: the next create is judged by one that has seen this.
    assert e2e.created_and_seen(lambda: e2e.gpu_pod(ns, "a", "s2-nowhere", gpus=2)).status_code == 201
    r = e2e.gpu_pod(ns, "b", "s2-nowhere", gpus=4)
    assert r.status_code == 403, r.text
    status = r.json()
    assert (status["kind"], status["status"], status["reason"], status["code"]) == ("Status", "Failure", "Forbidden",
                                                                                   403)
    assert status["message"] == PREFIX + (
        f"namespace {ns} may use 2 nvidia.com/gpu (gpu-placement.io/quota); 2 are in use and this pod asks 4 more: "
        "lower the request or raise the quota on the namespace"), status["message"]


def test_bad_annotation_and_escalation_denials(e2e: E2E) -> None:
    ns = e2e.namespace("broken", {"gpu-placement.io/quota": "nvidia.com/gpu=lots"})
    r = e2e.gpu_pod(ns, "x", "s2-nowhere")
    assert r.status_code == 403
    assert r.json()["message"] == PREFIX + (
        f'gpu-placement.io/quota="nvidia.com/gpu=lots" on namespace {ns}: "lots" is not a quantity; '
        "write it as nvidia.com/gpu=4,nvidia.com/gpu.shared=16")

    shared = e2e.namespace("inference", {"gpu-placement.io/sharing": "shared"})
    r = e2e.gpu_pod(shared, "greedy", "s2-nowhere", resource="nvidia.com/mig-1g.10gb")
    assert r.status_code == 403
    assert r.json()["message"].startswith(PREFIX + f"pod {shared}/greedy asks for 1 nvidia.com/mig-1g.10gb, more "
                                          f"than namespace {shared} gives"), r.json()["message"]


def test_dry_run_reserves_nothing(e2e: E2E) -> None:
    ns = e2e.namespace("dry", {"gpu-placement.io/quota": "nvidia.com/gpu=1"})
    for _ in range(3):
        r = e2e.gpu_pod(ns, "probe", "s2-nowhere", dryRun="All")
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["schedulerName"] == "gpu-placement"  # mutated, not stored
    assert e2e.api.http.get(f"/api/v1/namespaces/{ns}/pods/probe").status_code == 404
    assert e2e.created_and_seen(lambda: e2e.gpu_pod(ns, "real", "s2-nowhere")).status_code == 201
    r = e2e.gpu_pod(ns, "second", "s2-nowhere", dryRun="All")
    assert r.status_code == 403, r.text
    assert r.json()["message"].startswith(PREFIX + f"namespace {ns} may use 1 nvidia.com/gpu"), r.text


def test_audit_mode_warnings_arrive_as_api_warnings(e2e: E2E) -> None:
    """`helm upgrade --set config.mode=audit,webhook.validating.failurePolicy=Ignore`, the webhook
    pods rolled (the config checksum changes), then back."""
    try:
        e2e.upgrade({"config": {"mode": "audit"}, "webhook": {"validating": {"failurePolicy": "Ignore"}}})
        ns = e2e.namespace("audited", {"gpu-placement.io/quota": "nvidia.com/gpu=1"})
        r = e2e.gpu_pod(ns, "over", "s2-nowhere", gpus=3)
        assert r.status_code == 201, r.text
        warnings = r.headers.get_list("warning")
        assert any(f"namespace {ns} may use 1 nvidia.com/gpu" in w for w in warnings), warnings
    finally:
        e2e.upgrade({})
