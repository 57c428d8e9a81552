"""Scenario 4: failurePolicy as docs/deploy.md documents it, with every webhook replica stopped:
GPU pods are refused (/validate is Fail), other pods are created as usual, and a non-GPU pod that
tolerates the GPU taint is created unmutated (/mutate is Ignore). And a GPU pod that /mutate did not
shape while /validate answers is admitted with a warning saying so."""

from __future__ import annotations

import json

from tests.e2e.cluster import wait_for
from tests.e2e.conftest import E2E


def test_with_the_webhook_down_gpu_pods_are_refused_and_the_rest_admitted(e2e: E2E) -> None:
    ns = e2e.namespace("outage")
    for pod in e2e.webhooks:
        pod.stop("webhook")
    try:
        r = e2e.gpu_pod(ns, "gpu", "s4-nowhere")
        assert r.status_code == 500, r.text
        message = r.json()["message"]
        assert 'failed calling webhook "validate.gpu-placement.io"' in message, message

        r = e2e.gpu_pod(ns, "cpu", "s4-nowhere", gpus=0)
        assert r.status_code == 201, r.text

        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tolerates-all"},
                "spec": {"containers": [{"name": "main", "image": "busybox"}], "tolerations": [{"operator": "Exists"}]}}
        r = e2e.api.create(f"/api/v1/namespaces/{ns}/pods", body)
        assert r.status_code == 201, r.text
        assert "affinity" not in r.json()["spec"]  # /mutate did not run: nothing keeps it off GPU nodes
    finally:
        e2e.restart_webhooks()
    r = e2e.gpu_pod(ns, "gpu", "s4-nowhere")
    assert r.status_code == 201, r.text


def test_a_gpu_pod_that_slipped_past_mutate_is_told_so(e2e: E2E) -> None:
    """/mutate fails (here: the API server is sent to a path the webhook does not serve, 404) and its
    failurePolicy Ignore lets the pod through unshaped; /validate answers and the user reads why."""
    ns = e2e.namespace("unshaped")
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpu-placement"
    move = [{"op": "replace", "path": "/webhooks/0/clientConfig/service/path", "value": "/not-served"}]
    back = [{"op": "replace", "path": "/webhooks/0/clientConfig/service/path", "value": "/mutate"}]
    patch = {"Content-Type": "application/json-patch+json"}

    def scheduler_of_a_new_pod(expected: str) -> None:
        """The API server takes a webhook configuration's change from its own informer, a moment later
        (longer on a loaded machine): dry-run creates until it calls the path as changed."""
        wait_for(f"a new pod's schedulerName {expected}", lambda: e2e.gpu_pod(
            ns, "probe", "s4-nowhere", dryRun="All").json()["spec"]["schedulerName"] == expected, timeout=30,
            interval=0.2)

    e2e.api.http.patch(path, content=json.dumps(move), headers=patch).raise_for_status()
    try:
        scheduler_of_a_new_pod("default-scheduler")
        r = e2e.gpu_pod(ns, "raw", "s4-nowhere")
        assert r.status_code == 201, r.text
        assert r.json()["spec"]["schedulerName"] == "default-scheduler"
        warnings = " ".join(r.headers.get_list("warning"))
        assert f"pod {ns}/raw was not shaped by gpu-placement's mutating webhook" in warnings, warnings
    finally:
        e2e.api.http.patch(path, content=json.dumps(back), headers=patch).raise_for_status()
    scheduler_of_a_new_pod("gpu-placement")
    assert e2e.gpu_pod(ns, "shaped", "s4-nowhere").json()["spec"]["schedulerName"] == "gpu-placement"
