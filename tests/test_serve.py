"""`gpu-placement serve` as a process: real listeners, the snapshot reloaded, TLS for the webhook,
and a clean stop on SIGTERM."""

from __future__ import annotations

import base64
import json
import signal
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpu_placement.app.assembly import TRIM_THRESHOLD
from gpu_placement.app.demo import write_snapshot
from gpu_placement.samples.cluster import make_pod
from tests.support.serve import SCRIPT, free_port, stop, wait_ready
from tests.support.waiting import wait_for


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict[str, object]]:
    snapshot = tmp_path / "cluster.json"
    write_snapshot(str(snapshot))
    ports = {"extender": free_port(), "webhook": free_port()}
    process = subprocess.Popen(
        [SCRIPT, "serve", "--snapshot", str(snapshot), "--extender-listen", f"127.0.0.1:{ports['extender']}",
         "--webhook-listen", f"127.0.0.1:{ports['webhook']}", "--self-signed", str(tmp_path / "certs")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield {"process": process, "ports": ports, "snapshot": snapshot, "certs": tmp_path / "certs"}
    finally:
        stop(process)


def test_serve_answers_both_components_and_stops_on_sigterm(served: dict[str, object]) -> None:
    ports: dict[str, int] = served["ports"]  # type: ignore[assignment]
    extender = f"http://127.0.0.1:{ports['extender']}"
    wait_ready(f"{extender}/readyz")
    pod = make_pod("research", "p", gpus={"nvidia.com/gpu": 1}, image="nvcr.io/nvidia/cuda:13.0.0-base-ubuntu24.04")
    answer = httpx.post(f"{extender}/filter", json={"Pod": pod, "NodeNames": ["a100-vgpu", "h100-single"]}).json()
    assert answer["NodeNames"] == ["a100-vgpu"]
    assert answer["FailedAndUnresolvableNodes"]["h100-single"].startswith("DriverTooOld: ")

    trust = ssl.create_default_context(cafile=str(Path(served["certs"]) / "ca.crt"))  # type: ignore[arg-type]
    webhook = f"https://localhost:{ports['webhook']}"
    wait_ready(f"{webhook}/readyz", verify=trust)
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                          "resource": {"group": "", "version": "v1", "resource": "pods"},
                          "namespace": "research", "operation": "CREATE", "object": pod}}
    response = httpx.post(f"{webhook}/mutate?timeout=10s", json=review, verify=trust).json()["response"]
    assert response["uid"] == "u-1" and response["allowed"] is True and response["patch"]
    metrics = httpx.get(f"{extender}/metrics").text
    assert 'gpu_placement_request_seconds_count{component="extender",verb="filter"}' in metrics

    process: subprocess.Popen[str] = served["process"]  # type: ignore[assignment]
    process.send_signal(signal.SIGTERM)
    assert process.wait(15) == 0
    logs = [json.loads(line) for line in process.stderr.read().splitlines() if line.startswith("{")]  # type: ignore[union-attr]
    assert any("extender listening on http://127.0.0.1" in entry["message"] for entry in logs)


def test_serve_reloads_the_snapshot_when_it_changes(served: dict[str, object]) -> None:
    ports: dict[str, int] = served["ports"]  # type: ignore[assignment]
    extender = f"http://127.0.0.1:{ports['extender']}"
    wait_ready(f"{extender}/readyz")
    pod = make_pod("research", "p", gpus={"nvidia.com/gpu": 1}, image="nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04")
    args = {"Pod": pod, "NodeNames": ["h100-single"]}
    assert httpx.post(f"{extender}/filter", json=args).json()["NodeNames"] == ["h100-single"]
    snapshot = Path(served["snapshot"])  # type: ignore[arg-type]
    cluster = json.loads(snapshot.read_text())
    for item in cluster["items"]:
        if item["kind"] == "Node" and item["metadata"]["name"] == "h100-single":
            item["metadata"]["labels"]["nvidia.com/gpu-driver-upgrade-state"] = "pod-restart-required"
    snapshot.write_text(json.dumps(cluster))
    failed = wait_for(lambda: httpx.post(f"{extender}/filter", json=args).json()["FailedAndUnresolvableNodes"], 30,
                      "the snapshot's change reloaded", interval=0.2)
    assert failed["h100-single"].startswith("DriverUpgrade: the node is in a driver upgrade")


def test_serve_without_webhook_tls_is_a_usage_error(tmp_path: Path) -> None:
    snapshot = tmp_path / "cluster.json"
    write_snapshot(str(snapshot))
    result = subprocess.run([SCRIPT, "serve", "--snapshot", str(snapshot), "--components", "webhook"],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert "the webhook always serves TLS" in result.stderr


def test_serve_against_an_api_server_manages_its_webhook_certificate(fake_api: object, tmp_path: Path) -> None:
    """`serve --kubeconfig K --manage-certs`: lists the cluster, creates the Secret, patches both caBundles,
    and serves TLS that an API server holding that caBundle trusts."""
    from tests.fakeapi import FakeApiServer
    from tests.support.serve import CONFIG, NS, SECRET, SERVICE, webhook_configurations

    api: FakeApiServer = fake_api  # type: ignore[assignment]
    webhook_configurations(api)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    ports = {"extender": free_port(), "webhook": free_port()}
    process = subprocess.Popen(
        [SCRIPT, "serve", "--kubeconfig", str(kubeconfig), "--extender-listen", f"127.0.0.1:{ports['extender']}",
         "--webhook-listen", f"127.0.0.1:{ports['webhook']}", "--manage-certs", "--cert-secret", SECRET,
         "--service", SERVICE, "--namespace", NS, "--webhook-configuration", CONFIG,
         "--cert-dir", str(tmp_path / "certs")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(f"http://127.0.0.1:{ports['extender']}/readyz")
        mutating = api.get("MutatingWebhookConfiguration", CONFIG)
        assert mutating is not None
        ca_bundle = mutating["webhooks"][0]["clientConfig"]["caBundle"]
        trust = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
        trust.check_hostname = False  # the certificate names the Service, not 127.0.0.1
        wait_ready(f"https://127.0.0.1:{ports['webhook']}/readyz", verify=trust)
        assert api.get("Secret", SECRET, NS) is not None
        # The webhook replica counts launch outcomes: it holds the outcomes Lease and starts the watermark.
        from gpu_placement.outcomes.counter import STATE_ANNOTATION, WATERMARK_ANNOTATION

        annotations = wait_for(lambda: ((api.get("Lease", "gpu-placement-outcomes", NS) or {}).get("metadata") or {})
                               .get("annotations"), what="the outcomes Lease's watermark")
        assert WATERMARK_ANNOTATION in annotations and STATE_ANNOTATION in annotations
        scraped = httpx.get(f"https://127.0.0.1:{ports['webhook']}/metrics", verify=trust).text
        assert 'gpu_placement_outcomes_leading{lease="gpu-placement-outcomes"} 1.0' in scraped
    finally:
        stop(process)


def _heap_resident(pid: int) -> int:
    """KiB of glibc's main heap (the brk mapping) the process holds in memory."""
    lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    for index, line in enumerate(lines):
        if line.endswith("[heap]"):
            return next(int(entry.split()[1]) for entry in lines[index + 1:] if entry.startswith("Rss:"))
    return 0


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc")
def test_large_bodies_leave_nothing_in_the_heap(served: dict[str, object]) -> None:
    """Issue 36: glibc raised its mmap threshold to the size of each large block freed, so later request
    bodies were carved from the heap, whose pages stayed resident once freed (35 MiB under
    benchmarks/fuzz_rss.py; 24 MiB here). serve fixes it (2 MiB), and the heap's trim threshold (4 MiB):
    larger bodies come and go as maps."""
    ports: dict[str, int] = served["ports"]  # type: ignore[assignment]
    process: subprocess.Popen[str] = served["process"]  # type: ignore[assignment]
    wait_ready(f"http://127.0.0.1:{ports['extender']}/readyz")
    with httpx.Client(base_url=f"http://127.0.0.1:{ports['extender']}", timeout=30) as client:
        assert client.post("/filter", content=b"{").status_code == 400  # the connection's first request
        before = _heap_resident(process.pid)
        for mib in (3, 2.5, 5, 4, 8, 3):
            body = b'"' + b"x" * int(mib * 2**20) + b'"'  # JSON, but not ExtenderArgs: read, parsed, refused
            answer = client.post("/filter", content=body)
            assert answer.status_code == 400 and "body must be a JSON object" in answer.json()["Error"]
    grown = _heap_resident(process.pid) - before  # at most the free top it may keep, and a little
    assert grown < (TRIM_THRESHOLD + 2**20) // 1024, f"the heap holds {grown} KiB more after bodies of 2.5 to 8 MiB"
