"""`gpu-placement serve` as a process: a free port, the script that runs it, waiting for it to answer, stopping
it; and the objects certificate rotation reads."""

from __future__ import annotations

import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.fakeapi import FakeApiServer

SCRIPT = str(Path(sys.executable).with_name("gpu-placement"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, verify: ssl.SSLContext | bool = False, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, verify=verify, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} not ready within {timeout} s")


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM, as the kubelet sends it; SIGKILL only if it does not stop."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


NS, SECRET, SERVICE, CONFIG = "gpu-placement", "gpu-placement-webhook-tls", "gpu-placement-webhook", "gpu-placement"


def webhook_configurations(api: FakeApiServer) -> None:
    api.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    hook = {"admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"service": {"name": SERVICE, "namespace": NS, "path": "/mutate"}}}
    api.add({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
             "metadata": {"name": CONFIG}, "webhooks": [{**hook, "name": "mutate.gpu-placement.io"}]})
    api.add({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
             "metadata": {"name": CONFIG}, "webhooks": [{**hook, "name": "validate.gpu-placement.io"},
                                                        {**hook, "name": "validate2.gpu-placement.io"}]})
