"""Scenario 4: failurePolicy as docs/deploy.md documents it, with every webhook replica stopped:
GPU pods are refused (/validate is Fail), other pods are created as usual, and a non-GPU pod that
tolerates the GPU taint is created unmutated (/mutate is Ignore)."""

from __future__ import annotations

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
