"""How the cluster commands reach the API server, and what they say when they cannot (the wave 5 trial's
table of mistakes): an API server that is down is `cannot reach https://HOST:PORT (context x): connection
refused`; a kubeconfig that is not there says what to pass, and mentions a service account only in a pod, where
(as kubectl does) the command uses the pod's service account when no kubeconfig is given."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from kubernetes.config import incluster_config

from gpu_placement.app.cli import main
from gpu_placement.app.demo import demo_config_map
from gpu_placement.samples.cluster import demo_objects
from gpu_placement.view import fetch
from tests.fakeapi import FakeApiServer

pytestmark = pytest.mark.timeout(120)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens there once the socket is closed


@pytest.mark.parametrize("command", [["explain", "pod/train"], ["nodes"], ["namespaces"], ["survey"],
                                     ["migrate", "h100-1"]])
def test_an_api_server_that_is_down(command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = closed_port()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    assert main([*command, "--kubeconfig", str(kubeconfig)]) == 2
    assert capsys.readouterr().err == (f"gpu-placement {command[0]}: cannot reach https://127.0.0.1:{port} (context "
                                       "x): connection refused\n")


def test_a_missing_kubeconfig_on_a_laptop_says_what_to_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    assert main(["nodes"]) == 2
    assert capsys.readouterr().err == (
        "gpu-placement nodes: kubeconfig /nonexistent (from $KUBECONFIG) does not exist or is not a file: set "
        "KUBECONFIG, or pass --kubeconfig PATH, to a readable kubeconfig\n")
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["nodes"]) == 2
    assert capsys.readouterr().err == (
        f"gpu-placement nodes: no kubeconfig: {tmp_path}/.kube/config does not exist and KUBECONFIG is not set: pass "
        "--kubeconfig PATH or set KUBECONFIG (kubectl reads the same)\n")
    assert main(["nodes", "--kubeconfig", str(tmp_path / "nope")]) == 2
    assert "service account" not in capsys.readouterr().err


def test_in_a_pod_without_a_kubeconfig_the_service_account(fake_api: FakeApiServer, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """kubectl in a pod without a kubeconfig uses the pod's service account and namespace; so does explain."""
    fake_api.load([*demo_objects(), demo_config_map()])
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(fake_api.token)
    (account / "ca.crt").write_bytes(fake_api.ca_pem)
    (account / "namespace").write_text("research")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(account / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(account / "ca.crt"))
    monkeypatch.setattr(fetch, "SERVICE_ACCOUNT_NAMESPACE", str(account / "namespace"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", fake_api.host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(fake_api.port))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    pod = tmp_path / "dev.yaml"
    pod.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dev-1"}, "spec": {
        "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                        "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}))
    assert main(["explain", str(pod)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["pod research/dev-1", "namespace: research, context in-cluster's (the file names none and -n "
                         "is not given, so kubectl create -f would create it there)"]
    # Only in a pod is the service account offered as the way out.
    assert main(["nodes", "--kubeconfig", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == (
        f"gpu-placement nodes: kubeconfig {tmp_path / 'nope'} (--kubeconfig) does not exist or is not a file: pass "
        "--kubeconfig PATH to a readable kubeconfig, or leave it out to use the pod's service account\n")
