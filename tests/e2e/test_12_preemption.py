"""A real kube-scheduler, configured by the chart, preempting for a high-priority shared-GPU pod.

etcd, kube-apiserver and kube-scheduler are the real binaries (built from Go modules by
tests/e2e/build_control_plane.sh into ~/.cache/gpu-placement/k8s-<version>, or $KUBEBUILDER_ASSETS);
kube-scheduler runs the KubeSchedulerConfiguration the chart renders (extender verbs, preemptVerb,
nodeCacheCapable, managedResources) with only its kubeconfig and urlPrefix pointed here, and the
extender is `gpu-placement serve --kubeconfig` with the chart's service config. No kubelet: nodes are
API objects, running pods are created bound, and victims go at once (terminationGracePeriodSeconds 0).

Two time-sliced T4s (8 shares of 15360 MiB), every share taken. On t4-a the lowest-priority pod holds
2 GiB: kube-scheduler's unit-counting dry run proposes it alone, which frees a share but not the 4 GiB
the pending pod asks. On t4-b the one lower-priority pod holds 1 GiB and the rest is held by pods of
higher priority than the pending one. The extender must add batch-big on t4-a and drop t4-b.
Without `preemptVerb` (tried by hand, v1.35.4) kube-scheduler evicts batch-low on t4-a, then b-low on
t4-b, both for nothing, and the pod stays Pending with InsufficientGPUMemory.

Run by path (`pytest tests/e2e/test_12_preemption.py`); pyproject keeps tests/e2e out of `make test`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python
import httpx
import pytest
import trustme
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpu_placement.demo_cluster import make_node, make_pod, validator_pod

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = os.environ.get("K8S_VERSION", "1.35.4")
SHARED = "nvidia.com/gpu.shared"
TOKEN = "e2e-preemption-admin-token"
Obj = dict[str, Any]
PRIORITIES = {"batch-low": 5, "batch": 10, "batch-high": 20, "inference-critical": 1000, "platform-gpu": 2000}


def _binaries() -> Path:
    folder = Path(os.environ.get("KUBEBUILDER_ASSETS") or Path.home() / ".cache" / "gpu-placement"
                  / f"k8s-{K8S_VERSION}")
    missing = [b for b in ("etcd", "kube-apiserver", "kube-scheduler") if not (folder / b).is_file()]
    assert not missing, (f"{', '.join(missing)} not in {folder}: build them with "
                         "`bash tests/e2e/build_control_plane.sh` (make e2e) or set KUBEBUILDER_ASSETS")
    return folder


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(what: str, check: Callable[[], Any], timeout: float, procs: list[subprocess.Popen[bytes]],
          logs: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args[0]} exited with {proc.returncode} while waiting for {what}:\n"
                                     + _tails(logs))
        try:
            value = check()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}:\n" + _tails(logs))


def _tails(logs: Path) -> str:
    return "\n".join(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                     for log in sorted(logs.glob("*.log")))


class Cluster:
    """etcd + kube-apiserver (+ whatever the test starts), stopped in reverse order."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.bin = _binaries()
        self.procs: list[subprocess.Popen[bytes]] = []
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(work / "ca.crt"))
        ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(work / "api.pem"))
        key = ec.generate_private_key(ec.SECP256R1())
        (work / "sa.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                        serialization.PrivateFormat.TraditionalOpenSSL,
                                                        serialization.NoEncryption()))
        (work / "sa.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                    serialization.PublicFormat.SubjectPublicKeyInfo))
        (work / "tokens.csv").write_text(f'{TOKEN},e2e-admin,e2e-admin,"system:masters"\n')
        etcd, peer, api = _port(), _port(), _port()
        self.server = f"https://127.0.0.1:{api}"
        self.start("etcd", [str(self.bin / "etcd"), "--name=e2e", f"--data-dir={work / 'etcd'}",
                            f"--listen-client-urls=http://127.0.0.1:{etcd}",
                            f"--advertise-client-urls=http://127.0.0.1:{etcd}",
                            f"--listen-peer-urls=http://127.0.0.1:{peer}",
                            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                            f"--initial-cluster=e2e=http://127.0.0.1:{peer}", "--unsafe-no-fsync",
                            "--log-level=warn"])
        self.start("kube-apiserver", [
            str(self.bin / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api}",
            f"--tls-cert-file={work / 'api.pem'}", f"--tls-private-key-file={work / 'api.pem'}",
            f"--client-ca-file={work / 'ca.crt'}", f"--token-auth-file={work / 'tokens.csv'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={work / 'sa.pub'}", f"--service-account-signing-key-file={work / 'sa.key'}",
            "--authorization-mode=RBAC", "--service-cluster-ip-range=10.0.0.0/24",
            # No controller-manager creates the namespaces' default ServiceAccounts; Priority
            # admission (which sets spec.priority from priorityClassName) stays on.
            "--disable-admission-plugins=ServiceAccount", "--profiling=false", "--v=1"])
        self.http = httpx.Client(base_url=self.server, verify=str(work / "ca.crt"), timeout=10,
                                 headers={"Authorization": f"Bearer {TOKEN}"})
        self.wait("kube-apiserver /readyz", lambda: self.http.get("/readyz").status_code == 200, 90)
        self.kubeconfig = work / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
            "clusters": [{"name": "e2e", "cluster": {"server": self.server,
                                                     "certificate-authority": str(work / "ca.crt")}}],
            "users": [{"name": "admin", "user": {"token": TOKEN}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}]}))

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.work / f"{name}.log").open("wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.work)
        log.close()
        self.procs.append(proc)
        return proc

    def wait(self, what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
        return _wait(what, check, timeout, self.procs, self.work)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.http.close()

    # -- API
    def create(self, path: str, body: Obj) -> Obj:
        response = self.http.post(path, json=body)
        assert response.status_code == 201, f"POST {path}: {response.status_code} {response.text}"
        return dict(response.json())

    def pod(self, namespace: str, name: str) -> Obj | None:
        response = self.http.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return dict(response.json()) if response.status_code == 200 else None

    def pods_on(self, node: str) -> set[str]:
        items = self.http.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"}).json()["items"]
        return {item["metadata"]["name"] for item in items}


def _chart_configs() -> tuple[Obj, str]:
    """(KubeSchedulerConfiguration, service config text) as the chart renders them by default."""
    with helm_python.Chart.load(ROOT / "charts" / "gpu-placement") as chart:
        files = chart.render({}, name="gpu-placement", namespace="gpu-placement")
    docs = [doc for path, text in files.items() if path.endswith(".yaml") for doc in yaml.safe_load_all(text) if doc]
    maps = {doc["metadata"]["name"]: doc["data"] for doc in docs if doc["kind"] == "ConfigMap"}
    return dict(yaml.safe_load(maps["gpu-placement-scheduler"]["scheduler-config.yaml"])), \
        str(maps["gpu-placement-config"]["config.yaml"])


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with tempfile.TemporaryDirectory(prefix="gpu-placement-e2e-12-") as work:
        plane = Cluster(Path(work))
        try:
            yield plane
        finally:
            plane.stop()


def _t4(name: str) -> Obj:
    return make_node(name, "t4-timeslicing", labels={"nvidia.com/gpu.sharing-strategy": "time-slicing"},
                     shared_resource=SHARED)


def _bound(name: str, node: str, mib: int, priority_class: str) -> Obj:
    """A pod already running on `node` (created bound: no scheduler, no kubelet)."""
    pod = make_pod("inference", name, gpus={SHARED: 1}, node=node,
                   annotations={"gpu-placement.io/gpu-memory": f"{mib}Mi"})
    del pod["metadata"]["uid"], pod["status"]
    pod["spec"].update({"priorityClassName": priority_class, "terminationGracePeriodSeconds": 0,
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]})
    return pod


def test_kube_scheduler_preempts_the_pods_that_free_the_memory(cluster: Cluster) -> None:
    sched_config, service_config = _chart_configs()
    assert sched_config["extenders"][0]["preemptVerb"] == "preempt"

    for name in ("gpu-placement", "inference", "gpu-operator"):
        cluster.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    for name, value in PRIORITIES.items():
        cluster.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value})
    for node in ("t4-a", "t4-b"):
        created = cluster.create("/api/v1/nodes", _t4(node))
        assert created["status"]["allocatable"][SHARED] == "8"
        # Admission (TaintNodesByCondition) added node.kubernetes.io/not-ready; the node lifecycle
        # controller lifts it once the node is Ready. There is no controller-manager here: lift it.
        taints = [t for t in created["spec"]["taints"] if t["key"] != "node.kubernetes.io/not-ready"]
        response = cluster.http.patch(f"/api/v1/nodes/{node}", json={"spec": {"taints": taints}},
                                      headers={"Content-Type": "application/merge-patch+json"})
        assert response.status_code == 200, response.text
        validator = validator_pod(node)
        del validator["metadata"]["uid"], validator["status"]
        cluster.create("/api/v1/namespaces/gpu-operator/pods", validator)
        response = cluster.http.patch(
            f"/api/v1/namespaces/gpu-operator/pods/{validator['metadata']['name']}/status",
            json={"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
            headers={"Content-Type": "application/merge-patch+json"})
        assert response.status_code == 200, response.text
    t4a = [_bound("batch-low", "t4-a", 2048, "batch-low"), _bound("batch-big", "t4-a", 6144, "batch"),
           *[_bound(f"batch-small-{i}", "t4-a", 1024, "batch-high") for i in range(6)]]
    t4b = [_bound("b-low", "t4-b", 1024, "batch-low"),
           *[_bound(f"platform-{i}", "t4-b", 2048, "platform-gpu") for i in range(7)]]
    for pod in t4a + t4b:
        cluster.create("/api/v1/namespaces/inference/pods", pod)
    before_b = cluster.pods_on("t4-b")

    work = cluster.work
    extender_port = _port()
    (work / "gpu-placement.yaml").write_text(service_config)
    cluster.start("gpu-placement", [sys.executable, "-m", "gpu_placement.cli", "serve", "--kubeconfig",
                                    str(cluster.kubeconfig), "--components", "extender", "--config",
                                    str(work / "gpu-placement.yaml"), "--extender-listen",
                                    f"127.0.0.1:{extender_port}", "--log-level", "debug"])
    extender = f"http://127.0.0.1:{extender_port}"
    cluster.wait("the extender's /readyz", lambda: httpx.get(f"{extender}/readyz").status_code == 200, 60)

    sched_config["clientConnection"] = {"kubeconfig": str(cluster.kubeconfig)}
    sched_config["extenders"][0]["urlPrefix"] = extender  # the chart's sidecar address, on this test's port
    (work / "scheduler.yaml").write_text(yaml.safe_dump(sched_config))
    cluster.start("kube-scheduler", [str(cluster.bin / "kube-scheduler"), f"--config={work / 'scheduler.yaml'}",
                                     f"--authentication-kubeconfig={cluster.kubeconfig}",
                                     f"--authorization-kubeconfig={cluster.kubeconfig}",
                                     "--bind-address=127.0.0.1", f"--secure-port={_port()}", "--v=2"])

    # No CUDA version in the image tag: the T4s' driver (CUDA 11.7) will do.
    pending = make_pod("inference", "chat-hi", gpus={SHARED: 1}, image="registry.example.com/inference/chat:1.4",
                       annotations={"gpu-placement.io/gpu-memory": "4Gi"})
    del pending["metadata"]["uid"], pending["status"]
    pending["spec"].update({"schedulerName": sched_config["profiles"][0]["schedulerName"],
                            "priorityClassName": "inference-critical",
                            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]})
    cluster.create("/api/v1/namespaces/inference/pods", pending)

    def placed() -> str | None:
        pod = cluster.pod("inference", "chat-hi")
        return (pod or {}).get("spec", {}).get("nodeName")

    node = cluster.wait("chat-hi bound after preemption", placed, 90)
    assert node == "t4-a"
    on_a = cluster.pods_on("t4-a")
    assert {"batch-low", "batch-big"}.isdisjoint(on_a)  # the in-tree victim and the one the extender added
    assert {f"batch-small-{i}" for i in range(6)} <= on_a  # higher priority than needed: left alone
    assert cluster.pods_on("t4-b") == before_b  # evicting b-low would not free 4 GiB: untouched
    outcomes = {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in httpx.get(f"{extender}/metrics").text
                .splitlines() if line.startswith("gpu_placement_preemption_nodes_total{")}
    assert outcomes.get("victims_added", 0) >= 1 and outcomes.get("dropped", 0) >= 1, outcomes

    def preempted() -> set[str]:
        events = cluster.http.get("/apis/events.k8s.io/v1/namespaces/inference/events").json()["items"]
        return {event["regarding"]["name"] for event in events if event.get("reason") == "Preempted"}

    assert cluster.wait("Preempted events", lambda: preempted() >= {"batch-low", "batch-big"}, 30)
    assert preempted() == {"batch-low", "batch-big"}  # and nothing else, on either node
