"""Scenario 1: a GPU pod goes through the real API server (mutated by /mutate, checked by /validate)
and the chart's kube-scheduler (through /filter, which answers its best tier; bound by kube-scheduler itself, or
through /bind when it asks for a GPU share) to a verified node; one that fits nowhere stays Pending
with the reasons in its condition and Event: gpu-placement's codes for what the pod asks; for the nodes'
own state, the node label gpu-placement.io/refused (config.refusedNodeLabel) and `explain`.

Also the harness's own promises: cold start, the chart accepted, RBAC as the chart grants it.
"""

from __future__ import annotations

import httpx

from gpu_placement.decide.kubefilters import AFFINITY
from tests.e2e.conftest import E2E, admitted
from tests.e2e.deploy import NAMESPACE


def extender_calls(e2e: E2E) -> dict[str, float]:
    calls: dict[str, float] = {}
    for line in httpx.get(f"{e2e.extender_url()}/metrics", timeout=5).text.splitlines():
        if line.startswith("gpu_placement_request_seconds_count{") and 'component="extender"' in line:
            verb = line.split('verb="', 1)[1].split('"', 1)[0]
            calls[verb] = float(line.rsplit(" ", 1)[1])
    return calls


def test_cold_start_to_ready_api_within_30_seconds(e2e: E2E) -> None:
    print(f"\ncontrol plane: ready API {e2e.plane.startup_seconds:.1f} s after start")
    assert e2e.plane.startup_seconds <= 30


def test_chart_objects_are_live_and_rbac_is_what_the_chart_grants(e2e: E2E) -> None:
    for doc in e2e.docs:
        meta = doc["metadata"]
        path = e2e.api.path(doc["kind"], meta["name"], meta.get("namespace"), doc["apiVersion"])
        assert e2e.api.http.get(path).status_code == 200, (doc["kind"], meta["name"])

    def can(pod_token_kubeconfig_sa: str, verb: str, resource: str, namespace: str = "", name: str = "",
            group: str = "") -> bool:
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": f"system:serviceaccount:{NAMESPACE}:{pod_token_kubeconfig_sa}",
                           "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
                           "resourceAttributes": {"verb": verb, "resource": resource, "namespace": namespace,
                                                  "name": name, "group": group}}}
        r = e2e.api.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        return bool(r.json()["status"].get("allowed"))

    # The extender binds; the webhook cannot, and neither can touch other Secrets than its own.
    assert can("gpu-placement-scheduler", "create", "pods/binding", "default")
    assert not can("gpu-placement-webhook", "create", "pods/binding", "default")
    assert can("gpu-placement-webhook", "update", "secrets", NAMESPACE, "gpu-placement-webhook-tls")
    assert not can("gpu-placement-webhook", "get", "secrets", NAMESPACE, "someone-elses")
    assert not can("gpu-placement-webhook", "patch", "mutatingwebhookconfigurations", "", "another-webhook",
                   "admissionregistration.k8s.io")
    assert not can("gpu-placement-scheduler", "create", "secrets", "default")


def test_gpu_pod_is_mutated_scheduled_through_the_extender_and_bound_to_a_verified_node(e2e: E2E) -> None:
    group = "s1"
    verified = e2e.nodes(group, [("h100", "h100x8", {}), ("a100", "a100-vgpu", {})])
    e2e.nodes(group, [("unvalidated", "h100x8", {"validator_ready": False}),
                      ("upgrading", "h100x8", {"labels": {"nvidia.com/gpu-driver-upgrade-state": "drain-required"}}),
                      ("mig-pending", "h100x8", {"labels": {"nvidia.com/mig.config.state": "pending"}})])
    ns = e2e.namespace("team", {"gpu-placement.io/quota": "nvidia.com/gpu=8"})
    before = extender_calls(e2e)

    r = e2e.gpu_pod(ns, "train", group, gpus=1)  # both verified nodes fit, so the scheduler scores
    assert r.status_code == 201, r.text
    created = r.json()
    # What the real API server stored is the webhook's mutation.
    assert created["spec"]["schedulerName"] == "gpu-placement"
    assert created["spec"]["nodeSelector"] == {"e2e-group": group, "nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in created["spec"]["tolerations"]
    assert admitted(created)["sharing"] == "exclusive"

    node = e2e.wait_bound(ns, "train")
    assert node in verified
    after = extender_calls(e2e)
    assert after.get("filter", 0) > before.get("filter", 0), (before, after)
    # One call a pod: /filter answers the best tier and the chart's extender has no prioritizeVerb (issue 44).
    assert after.get("prioritize", 0) == before.get("prioritize", 0), (before, after)
    # Whole GPUs: kube-scheduler's own binder, whose cache counts them (the chart's bindAll: false).
    assert after.get("bind", 0) == before.get("bind", 0), (before, after)
    pod = e2e.pod(ns, "train")
    assert pod["status"]["phase"] == "Running"


def test_shared_namespace_pod_is_rewritten_to_the_shared_resource_and_lands_on_a_time_sliced_node(e2e: E2E) -> None:
    group = "s1-shared"
    [t4] = e2e.nodes(group, [("t4", "t4-timeslicing", {"shared_resource": "nvidia.com/gpu.shared",
                                                     "labels": {"nvidia.com/gpu.sharing-strategy": "time-slicing"}})])
    ns = e2e.namespace("inference", {"gpu-placement.io/sharing": "shared",
                                      "gpu-placement.io/quota": "nvidia.com/gpu.shared=4"})
    # The T4 fixture's driver is 510.73.08: an image for CUDA 11.6.2 (which needs 510.47.03) fits.
    before = extender_calls(e2e)
    r = e2e.gpu_pod(ns, "serve", group, gpus=1, image="nvcr.io/nvidia/cuda:11.6.2-runtime-ubuntu20.04")
    assert r.status_code == 201, r.text
    limits = r.json()["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu.shared": "1"}
    assert e2e.wait_bound(ns, "serve") == t4
    # A share: bound through /bind, which holds its GPU memory until the watch shows the pod there.
    assert extender_calls(e2e).get("bind", 0) > before.get("bind", 0)


def test_pod_that_fits_nowhere_is_pending_with_grouped_reason_codes(e2e: E2E) -> None:
    """Refused for the nodes' own state: with config.refusedNodeLabel (the chart's default) each node carries
    its code in gpu-placement.io/refused and the pod's affinity keeps it out, so kube-scheduler's message
    counts them as not matching the pod's node affinity (the extender is not asked), `explain` gives each
    node's reason, and its predicted message is kube-scheduler's. Refused for what the pod asks (a driver
    newer than any): the extender's codes, grouped, in the condition and the Event."""
    group = "s1-none"
    unvalidated, upgrading, mig, unvalidated_2 = e2e.nodes(group, [
        ("unvalidated", "h100", {"validator_ready": False}),
        ("upgrading", "h100", {"labels": {"nvidia.com/gpu-driver-upgrade-state": "drain-required"}}),
        ("mig-pending", "h100", {"labels": {"nvidia.com/mig.config.state": "pending"}}),
        ("unvalidated-2", "h100", {"validator_ready": False})])
    codes = {unvalidated: "NotValidated", upgrading: "DriverUpgrade", mig: "MIGReconfiguring",
             unvalidated_2: "NotValidated"}
    e2e.wait_refused(codes)
    ns = e2e.namespace("team")
    r = e2e.gpu_pod(ns, "stuck", group, gpus=1)
    assert r.status_code == 201, r.text
    message = e2e.unschedulable_message(ns, "stuck", AFFINITY)
    assert e2e.scheduled_condition(ns, "stuck")["reason"] == "Unschedulable"
    assert not any(code in message for code in codes.values()), message  # the extender was not asked
    explained = e2e.explain(ns, "stuck")
    assert explained["kube_scheduler"]["message"] == message.split(" preemption: ", 1)[0], explained
    rows = {row["node"]: row for row in explained["nodes"]}
    for node, code in codes.items():
        assert rows[node]["reason"] == f"NodeAffinity: {AFFINITY}", rows[node]
        assert rows[node]["figures"].startswith(f"gpu-placement.io/refused={code}, gpu-placement's reason: {code}: "), \
            rows[node]

    assert e2e.pod(ns, "stuck")["spec"].get("nodeName") is None

    # Two nodes verified and ready, the pod asking a driver none has: the extender's reason, grouped.
    group = "s1-too-new"
    verified = e2e.nodes(group, [("verified-1", "h100", {}), ("verified-2", "h100", {})])
    e2e.wait_refused(dict.fromkeys(verified))
    r = e2e.gpu_pod(ns, "too-new", group, gpus=1, annotations={"gpu-placement.io/min-driver": "999.0"})
    assert r.status_code == 201, r.text
    message = e2e.unschedulable_message(ns, "too-new", "2 DriverTooOld: ")
    assert AFFINITY in message and f"{group}-" not in message, message
    # That the scheduler can group them (no node named in a reason) is asserted in test_after_merge.py.

    def failed_event() -> str | None:
        for ev in e2e.events(ns, "too-new"):
            if ev["reason"] == "FailedScheduling" and "DriverTooOld" in ev["message"]:
                return str(ev["message"])
        return None

    from tests.e2e.cluster import wait_for
    event = wait_for("FailedScheduling event", failed_event, timeout=15)
    assert "2 DriverTooOld" in event and AFFINITY in event, event
    assert e2e.pod(ns, "too-new")["spec"].get("nodeName") is None
