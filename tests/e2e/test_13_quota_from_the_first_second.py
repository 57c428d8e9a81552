"""Issue 25, on the real API server: the quota mirror's RBAC reaches only its own ResourceQuota and
still works; the quota holds from the first second after the annotation is set or raised, with two
webhook replicas and 50 concurrent creates; a GPU pod that /mutate could not shape is refused.

What the RBAC test leans on, from kube-apiserver v1.37.2's source: a list or watch whose
fieldSelector is `metadata.name=<n>` is authorized as a request for the name <n>
(staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go), so `resourceNames` can limit it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.e2e.cluster import wait_for
from tests.e2e.conftest import E2E
from tests.e2e.deploy import NAMESPACE

QUOTA, RAISED, BURST = 8, 12, 50
WEBHOOK_SA = "gpu-placement-webhook"


def test_the_quota_mirror_reaches_only_its_own_resourcequota(e2e: E2E) -> None:
    ns = e2e.namespace("rbac-quota")
    assert e2e.api.create(f"/api/v1/namespaces/{ns}/resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "tenant-cpu"},
        "spec": {"hard": {"requests.cpu": "4"}}}).status_code == 201
    token = e2e.api.token_for(NAMESPACE, WEBHOOK_SA, seconds=600)
    with httpx.Client(base_url=e2e.api.server, verify=str(e2e.api.ca), timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as webhook:
        mine = {"fieldSelector": "metadata.name=gpu-placement"}
        assert webhook.get("/api/v1/resourcequotas", params=mine).status_code == 200  # the mirror's list
        watch = webhook.get("/api/v1/resourcequotas", params={**mine, "watch": "1", "timeoutSeconds": "1"})
        assert watch.status_code == 200  # and the webhook's watch of it
        assert webhook.get("/api/v1/resourcequotas").status_code == 403  # not every quota in the cluster
        assert webhook.get(f"/api/v1/namespaces/{ns}/resourcequotas/tenant-cpu").status_code == 403
        assert webhook.delete(f"/api/v1/namespaces/{ns}/resourcequotas/tenant-cpu").status_code == 403
        assert webhook.get(f"/api/v1/namespaces/{ns}/resourcequotas",
                           params={"fieldSelector": "metadata.name=tenant-cpu"}).status_code == 403
    # And the mirror, running as that account, does its job: the ResourceQuota written and counted.
    e2e.api.merge_patch(f"/api/v1/namespaces/{ns}", {"metadata": {"annotations": {
        "gpu-placement.io/quota": "nvidia.com/gpu=3"}}})
    wait_for(f"ResourceQuota {ns}/gpu-placement in force", lambda: e2e.quota_in_force(ns, {"nvidia.com/gpu": 3}))


def _burst(e2e: E2E, ns: str, prefix: str) -> Counter[int]:
    barrier = threading.Barrier(BURST)

    def create(i: int) -> int:
        barrier.wait()
        return e2e.gpu_pod(ns, f"{prefix}-{i:02d}", "s13-nowhere", retry=False).status_code  # the 503s counted

    with ThreadPoolExecutor(BURST) as pool:
        return Counter(pool.map(create, range(BURST)))


def _stored(e2e: E2E, ns: str) -> int:
    return len(e2e.api.get(f"/api/v1/namespaces/{ns}/pods")["items"])


def _fill(e2e: E2E, ns: str, prefix: str, quota: int, admitted: int, seconds: float = 60.0) -> int:
    """Bursts, one a second, until the namespace holds `quota` pods: never one more, after any burst.
    The first bursts meet the quota not in force yet (503) or, with the old figure, the API server."""
    history: list[dict[int, int]] = []
    deadline = time.monotonic() + seconds
    while admitted < quota and time.monotonic() < deadline:
        codes = _burst(e2e, ns, f"{prefix}-{len(history)}")
        history.append(dict(codes))
        admitted += codes[201]
        assert set(codes) <= {201, 403, 503}, history
        assert admitted <= quota and _stored(e2e, ns) <= quota, history
        time.sleep(1.0)
    assert admitted == quota and _stored(e2e, ns) == quota, history
    return admitted


def test_two_replicas_and_fifty_creates_at_once_never_exceed_a_quota_just_set_or_raised(e2e: E2E) -> None:
    """The namespace is created with its annotation and the burst starts at once, without waiting for
    the mirror: until the API server enforces the quota, /validate refuses (503 QuotaPending); then
    the API server's atomic check decides. Then the quota is raised and a second burst starts at once."""
    e2e.start_webhook(1)  # a second replica behind the Service; the proxy spreads connections
    try:
        ns = f"at-once-{time.monotonic_ns() % 10**6}"
        e2e.api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": ns, "labels": {"gpu-placement.io/enabled": "true"},  # opted in (the chart's default: optIn)
            "annotations": {"gpu-placement.io/quota": f"nvidia.com/gpu={QUOTA}"}}})
        wait_for(f"serviceaccount {ns}/default",
                 lambda: e2e.api.http.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default").status_code == 200)
        admitted = _fill(e2e, ns, "first", QUOTA, 0)
        # Raised, and a burst at once: the old figure holds until the new one is counted, never more.
        e2e.api.merge_patch(f"/api/v1/namespaces/{ns}", {"metadata": {"annotations": {
            "gpu-placement.io/quota": f"nvidia.com/gpu={RAISED}"}}})
        _fill(e2e, ns, "raised", RAISED, admitted)
    finally:
        e2e.stop_webhook(1)


def test_a_gpu_pod_mutate_could_not_shape_is_refused_with_the_reason(e2e: E2E) -> None:
    """/mutate unreachable (its path broken in the MutatingWebhookConfiguration, failurePolicy Ignore):
    the API server creates GPU pods unshaped; /validate refuses them in a namespace with a GPU policy."""
    ns = e2e.namespace("unshaped", {"gpu-placement.io/quota": "nvidia.com/gpu=100"})
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpu-placement"
    hooks = e2e.api.get(path)["webhooks"]
    broken = [{**hook, "clientConfig": {**hook["clientConfig"], "service": {
        **hook["clientConfig"]["service"], "path": "/not-there"}}} for hook in hooks]
    e2e.api.merge_patch(path, {"webhooks": broken})
    try:
        def refused() -> str | None:
            r = e2e.gpu_pod(ns, f"raw-{time.monotonic_ns() % 10**6}", "s13-nowhere")
            return str(r.json().get("message")) if r.status_code == 403 else None

        message = str(wait_for("an unshaped GPU pod refused", refused, timeout=30, interval=0.5))
        assert "was not shaped by gpu-placement's mutating webhook" in message, message
        assert "create the pod again" in message and "failurePolicy is Ignore" in message
        assert e2e.gpu_pod(ns, "cpu", "s13-nowhere", gpus=0).status_code == 201  # other pods: as usual
    finally:
        e2e.api.merge_patch(path, {"webhooks": hooks})
    assert wait_for("a GPU pod shaped again", lambda: e2e.gpu_pod(
        ns, f"shaped-{time.monotonic_ns() % 10**6}", "s13-nowhere").status_code == 201, timeout=30, interval=0.5)
