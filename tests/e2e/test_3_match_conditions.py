"""Scenario 3: the chart's CEL matchConditions compile in the real API server (a misspelt field is
accepted when the configuration is created and fails only when a pod is admitted) and keep ordinary
pods away from the webhook: the API server's own counters of the calls it made to each named webhook
(apiserver_admission_webhook_request_total) say what reached it."""

from __future__ import annotations

from typing import Any

from tests.e2e.cluster import wait_for
from tests.e2e.conftest import E2E

Obj = dict[str, Any]


def pod(name: str, *, limits: dict[str, str] | None = None, init_limits: dict[str, str] | None = None,
        tolerations: list[Obj] | None = None, owner: Obj | None = None) -> Obj:
    spec: Obj = {"restartPolicy": "Never", "nodeSelector": {"e2e-group": "s3-nowhere"},
                 "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits or {}}}]}
    if init_limits:
        spec["initContainers"] = [{"name": "init", "image": "busybox", "resources": {"limits": init_limits}}]
    if tolerations:
        spec["tolerations"] = tolerations
    meta: Obj = {"name": name}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def test_only_pods_that_matter_reach_the_webhook(e2e: E2E) -> None:
    ns = e2e.namespace("web")
    cases = [
        # (pod, expected /mutate calls, expected /validate calls)
        (pod("plain"), 0, 0),
        (pod("cpu-heavy", limits={"cpu": "2", "memory": "1Gi"}), 0, 0),
        (pod("tolerates-other-taint", tolerations=[{"key": "dedicated", "operator": "Exists"}]), 0, 0),
        (pod("gpu", limits={"nvidia.com/gpu": "1"}), 1, 1),
        (pod("gpu-in-init", init_limits={"nvidia.com/gpu": "1"}), 1, 1),
        (pod("mig", limits={"nvidia.com/mig-1g.10gb": "1"}), 1, 1),
        (pod("shared", limits={"nvidia.com/gpu.shared": "1"}), 1, 1),
        # protectGpuNodes: a non-GPU pod that tolerates every taint goes to /mutate only.
        (pod("tolerates-all", tolerations=[{"operator": "Exists"}]), 1, 0),
        (pod("tolerates-gpu-taint", tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]), 1, 0),
        # ... unless a DaemonSet owns it (the DaemonSet does not exist; the garbage collector will
        # remove the pod later, after admission).
        (pod("daemon", tolerations=[{"operator": "Exists"}],
             owner={"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "controller": True,
                    "uid": "00000000-0000-0000-0000-000000000001"}), 0, 0),
    ]
    for body, mutate, validate in cases:
        got = admission_calls(e2e, ns, body)
        assert got == (mutate, validate), f"{body['metadata']['name']}: webhook saw (mutate, validate) = {got}"

    # An exempt namespace never reaches the webhook, GPU or not.
    assert admission_calls(e2e, "gpu-operator", pod("gpu-in-exempt", limits={"nvidia.com/gpu": "1"})) == (0, 0)


WEBHOOKS = {"mutate.gpu-placement.io": 0, "validate.gpu-placement.io": 1}  # the pod webhooks, not the
# claim or annotation ones


def pod_webhook_calls(e2e: E2E) -> list[float]:
    """Pod CREATEs the API server has sent to /mutate and to /validate, by the webhooks' names."""
    calls = [0.0, 0.0]
    for line in e2e.api.http.get("/metrics").text.splitlines():
        if line.startswith("apiserver_admission_webhook_request_total{") and 'operation="CREATE"' in line:
            name = line.split('name="', 1)[1].split('"', 1)[0]
            if name in WEBHOOKS:
                calls[WEBHOOKS[name]] += float(line.rsplit(" ", 1)[1])
    return calls


def admission_calls(e2e: E2E, ns: str, body: Obj, tries: int = 3) -> tuple[float, float]:
    """(/mutate, /validate) calls the API server made while this pod was created, counted by the
    webhooks' names: the same /validate path also serves the claim webhook, which the quota mirror's
    template writes reach at any moment (after test_2 rolls the replicas, its new leader writes the
    templates of earlier tests' `dra` namespaces: CI counted one such call for "plain" once, and a
    run with a CPU hog two in a row). Another test's controller creating a GPU pod at that instant
    would still add, and only ever add: so the pod is created twice under new names, a third time
    when the two counts differ, and the fewest calls seen per webhook are what this pod costs."""
    seen: list[list[float]] = []
    for attempt in range(tries):
        copy = {**body, "metadata": {**body["metadata"], "name": f"{body['metadata']['name']}-{attempt}"}}
        before = pod_webhook_calls(e2e)
        r = e2e.api.create(f"/api/v1/namespaces/{ns}/pods", copy)
        assert r.status_code == 201, (copy["metadata"]["name"], r.text)
        seen.append([after - was for after, was in zip(pod_webhook_calls(e2e), before, strict=True)])
        if len(seen) > 1 and seen[-1] == seen[-2]:
            break
    return min(m for m, _ in seen), min(v for _, v in seen)


def test_gpu_taint_tolerating_pod_is_kept_off_gpu_nodes(e2e: E2E) -> None:
    ns = e2e.namespace("web")
    r = e2e.api.create(f"/api/v1/namespaces/{ns}/pods", pod("sneaky", tolerations=[{"operator": "Exists"}]))
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all({"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]} in t["matchExpressions"]
               for t in terms), terms


def test_a_broken_match_condition_is_accepted_at_create_and_fails_only_at_admission(e2e: E2E) -> None:
    """Why only admitting pods proves the expressions: the API server compiles matchConditions when
    the configuration is created, but a field that does not exist on this pod (CEL's dynamic
    object.spec) only errors when evaluated."""
    ns = e2e.namespace("cel")
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "e2e-misspelt"},
        "webhooks": [{
            "name": "misspelt.e2e.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "timeoutSeconds": 2,
            "clientConfig": {"url": "https://127.0.0.1:1/never"},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "matchConditions": [{"name": "misspelt", "expression": "object.spec.containerz.size() > 0"}],
        }]}
    e2e.api.apply(config)
    try:
        def refused() -> str | None:
            r = e2e.api.create(f"/api/v1/namespaces/{ns}/pods", pod("probe"), dryRun="All")
            return r.text if r.status_code >= 400 else None
        message = wait_for("the misspelt condition to be evaluated", refused, timeout=10, interval=0.2)
        assert "containerz" in message or "no such key" in message, message
    finally:
        e2e.api.delete("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/e2e-misspelt")
