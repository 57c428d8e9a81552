"""`gpu-placement serve` as a process, for adoption: the webhook writes its webhooks into the empty
configurations only once ready (--webhooks-file), and the extender answers kubelet's HTTP probes on
a listener of its own (--health-listen) that serves nothing else."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from gpu_placement.app.demo import write_snapshot
from tests.fakeapi import FakeApiServer
from tests.support.serve import SCRIPT, free_port, stop, wait_ready
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)

HOOKS = {"mutating": [{"name": "mutate.gpu-placement.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                       "clientConfig": {"service": {"name": "gpu-placement-webhook", "namespace": "gpu-placement",
                                                    "path": "/mutate", "port": 443}}}],
         "validating": [{"name": "validate.gpu-placement.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                         "clientConfig": {"service": {"name": "gpu-placement-webhook", "namespace": "gpu-placement",
                                                      "path": "/validate", "port": 443}}}]}


def test_the_health_listener_serves_the_probes_and_nothing_else(tmp_path: Path) -> None:
    snapshot = tmp_path / "cluster.json"
    write_snapshot(str(snapshot))
    extender, health = free_port(), free_port()
    process = subprocess.Popen([SCRIPT, "serve", "--snapshot", str(snapshot), "--components", "extender",
                                "--extender-listen", f"127.0.0.1:{extender}", "--health-listen", f"127.0.0.1:{health}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(f"http://127.0.0.1:{health}/readyz")
        assert httpx.get(f"http://127.0.0.1:{health}/healthz").text == "ok"
        assert httpx.get(f"http://127.0.0.1:{health}/metrics").status_code == 404
        assert httpx.post(f"http://127.0.0.1:{health}/bind", json={}).status_code == 404
        assert httpx.post(f"http://127.0.0.1:{extender}/bind", json={}).status_code == 400  # there, it is served
    finally:
        stop(process)


@pytest.mark.parametrize("extra, message", [
    (["--components", "extender"], "--webhooks-file registers the webhook with an API server"),
    (["--self-signed", "CERTS"], "--webhooks-file registers the webhook with an API server"),  # with --snapshot
])
def test_webhooks_file_usage_errors(tmp_path: Path, extra: list[str], message: str) -> None:
    snapshot = tmp_path / "cluster.json"
    write_snapshot(str(snapshot))
    hooks = tmp_path / "webhooks.yaml"
    hooks.write_text(yaml.safe_dump(HOOKS))
    args = [a.replace("CERTS", str(tmp_path / "certs")) for a in extra]
    result = subprocess.run([SCRIPT, "serve", "--snapshot", str(snapshot), "--webhooks-file", str(hooks), *args],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_a_bad_webhooks_file_stops_serve_before_it_connects(tmp_path: Path) -> None:
    hooks = tmp_path / "webhooks.yaml"
    hooks.write_text("mutating: {name: x}\n")
    kubeconfig = tmp_path / "kubeconfig"  # an API server nobody listens for: never reached
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    result = subprocess.run([SCRIPT, "serve", "--kubeconfig", str(kubeconfig), "--components", "webhook",
                             "--manage-certs", "--webhooks-file", str(hooks)],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2 and "mutating must be a list of webhooks" in result.stderr, result.stderr


def test_serve_writes_the_webhooks_once_ready_with_the_ca_it_serves_with(fake_api: FakeApiServer,
                                                                         tmp_path: Path) -> None:
    fake_api.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        fake_api.add({"kind": kind, "metadata": {"name": "gpu-placement"}})
    hooks = tmp_path / "webhooks.yaml"
    hooks.write_text(yaml.safe_dump(HOOKS))
    port = free_port()
    process = subprocess.Popen(
        [SCRIPT, "serve", "--kubeconfig", str(fake_api.write_kubeconfig(tmp_path / "kubeconfig")), "--components",
         "webhook", "--webhook-listen", f"127.0.0.1:{port}", "--manage-certs", "--namespace", "gpu-placement",
         "--cert-dir", str(tmp_path / "certs"), "--webhooks-file", str(hooks), "--no-quota-mirror"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(f"https://127.0.0.1:{port}/readyz")
        # Each turn of the registration asks for the Service's endpoints first: two asks after ready, and
        # the turn of the first is over.
        slices = "/apis/discovery.k8s.io/v1/namespaces/gpu-placement/endpointslices"
        asked = fake_api.count("list", slices)
        wait_for(lambda: fake_api.count("list", slices) >= asked + 2, what="a turn of the registration after ready")
        assert "webhooks" not in (fake_api.get("ValidatingWebhookConfiguration", "gpu-placement") or {}), \
            "ready, but the Service has no ready endpoint: nothing written"
        fake_api.add({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "addressType": "IPv4",
                      "metadata": {"name": "gpu-placement-webhook-x", "namespace": "gpu-placement",
                                   "labels": {"kubernetes.io/service-name": "gpu-placement-webhook"}},
                      "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": True}}]})
        wait_for(lambda: (fake_api.get("ValidatingWebhookConfiguration", "gpu-placement") or {}).get("webhooks"), 30,
                 "the webhooks written", interval=0.2)
        secret = fake_api.get("Secret", "gpu-placement-webhook-tls", "gpu-placement")
        assert secret is not None
        trusted = base64.b64decode(secret["data"]["ca-bundle.crt"])
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            [hook] = (fake_api.get(kind, "gpu-placement") or {}).get("webhooks") or [{}]
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == trusted, kind
    finally:
        stop(process)
