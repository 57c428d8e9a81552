"""The simulated fleet on a real control plane: KWOK plays the kubelets of fake GPU nodes, the harness
plays the GPU Operator (validator pods, driver upgrades) and the faults, and creates the Jobs.

KWOK manages only the nodes annotated kwok.x-k8s.io/node=fake (the fleet's), so the chart's own pods,
which the harness runs as local processes (tests/e2e/deploy.py), are never touched by it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpu_placement.base.names import DRIVER_UPGRADE_STATE
from gpu_placement.samples.cluster import make_node, validator_pod
from tests.e2e.churn.schedule import DOWN, OK, Action, JobSpec, Plan, timeline
from tests.e2e.churn.stages import (
    ANNOTATION_RUNTIME,
    ANNOTATION_VALIDATION,
    KUBELET_ANNOTATION,
    LABEL_WORKLOAD,
    NUDGE_ANNOTATION,
    gpu_pod_stages,
    static_stages,
)
from tests.e2e.churn.truth import Ledger
from tests.e2e.cluster import ADMIN_TOKEN, Api, ControlPlane, Proc, follow_pods, namespace, wait_for

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "tests" / "e2e" / "churn" / "build_kwok.sh"
Obj = dict[str, Any]
WORKLOAD_NS = "churn"
IMAGE = "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04"
VALIDATOR_IMAGE = "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.3.0"
SELECTOR = f"{LABEL_WORKLOAD}=gpu"


def kwok_binary() -> Path:
    run = subprocess.run(["bash", str(BUILD), "--print-path"], stdout=subprocess.PIPE, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"{BUILD} failed (exit {run.returncode}); see its messages above")
    return Path(run.stdout.strip().splitlines()[-1])


def _apply(api: Api, path: str, obj: Obj) -> Obj:
    r = api.http.patch(path, content=json.dumps(obj), params={"fieldManager": "churn", "force": "true"},
                       headers={"Content-Type": "application/apply-patch+yaml"})
    if r.status_code >= 400:
        raise RuntimeError(f"apply {path}: {r.status_code} {r.text[:500]}")
    return dict(r.json())


def _patch(api: Api, path: str, body: Obj, kind: str = "merge") -> httpx.Response:
    return api.http.patch(path, content=json.dumps(body), headers={"Content-Type": f"application/{kind}-patch+json"})


class Kwok:
    """KWOK's controller (v0.8.0) as a process: Stages from the API server (--enable-crds=Stage),
    the fleet's nodes only (--manage-nodes-with-annotation-selector), their Leases renewed."""

    def __init__(self, plane: ControlPlane) -> None:
        assert plane.api is not None
        self.plane, self.api = plane, plane.api
        self.binary = kwok_binary()
        self.applied: dict[str, Obj] = {}
        self.proc: Proc | None = None

    def install(self) -> None:
        crd = yaml.safe_load((self.binary.parent / "kwok.x-k8s.io_stages.yaml").read_text())
        _apply(self.api, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}", crd)
        wait_for("the Stage CRD served", lambda: self.api.http.get("/apis/kwok.x-k8s.io/v1alpha1/stages").status_code
                 == 200, timeout=30, interval=0.2)
        self.stages([*static_stages(), *gpu_pod_stages({})])

    def start(self) -> None:
        work = self.plane.work
        kubeconfig = self.api.kubeconfig(work / "kwok.kubeconfig", ADMIN_TOKEN, "kwok")
        config = work / "kwok.yaml"
        # Leases of 160 s renewed every 40 s: 25 writes a second for 1,000 nodes, well inside
        # kube-controller-manager's 120 s grace period (tests/e2e/cluster.py).
        config.write_text(yaml.safe_dump({
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
            "options": {"manageNodesWithAnnotationSelector": "kwok.x-k8s.io/node=fake", "enableCRDs": ["Stage"],
                        "nodeLeaseDurationSeconds": 160, "nodeLeaseParallelism": 4, "podPlayStageParallelism": 8,
                        "nodePlayStageParallelism": 4}}))
        # --v=WARN: at INFO it logs every patch and lease, a line for each of tens of writes a second.
        self.proc = Proc("kwok", [str(self.binary), f"--config={config}", f"--kubeconfig={kubeconfig}", "--v=WARN"],
                         work / "kwok.log").start()
        self.plane.procs["kwok"] = self.proc  # its liveness is checked with the control plane's

    def stages(self, stages: Iterable[Obj]) -> None:
        """Apply the Stages that changed since they were last applied."""
        for stage in stages:
            name = stage["metadata"]["name"]
            if self.applied.get(name) != stage:
                _apply(self.api, f"/apis/kwok.x-k8s.io/v1alpha1/stages/{name}", stage)
                self.applied[name] = stage

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def node_manifest(name: str) -> tuple[Obj, Obj]:
    """An 8-GPU H100 node of the GPU Operator's published labels, for KWOK: (object, status to post)."""
    node = make_node(name, "h100x8", labels={"type": "kwok"})
    status = node.pop("status")
    node["metadata"].pop("uid", None)
    node["metadata"]["annotations"] = {"kwok.x-k8s.io/node": "fake", KUBELET_ANNOTATION: "up"}
    status.pop("conditions")  # KWOK's node Stage posts them, as a kubelet does once it registered
    status["nodeInfo"] = {"kubeletVersion": "v1.37.2", "architecture": "amd64", "operatingSystem": "linux",
                          "containerRuntimeVersion": "containerd://2.0.5", "kernelVersion": "6.8.0-60-generic",
                          "osImage": "Ubuntu 24.04.2 LTS", "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
                          "bootID": ""}
    status["addresses"] = [{"type": "Hostname", "address": name}]
    return node, status


def validator_manifest(node: str) -> Obj:
    """The GPU Operator's nvidia-operator-validator pod of a node (a DaemonSet's pod, bound), its status
    left to KWOK's validator Stages."""
    pod = validator_pod(node)
    pod.pop("status")
    meta = pod["metadata"]
    meta.pop("uid", None)
    # no such DaemonSet here: the garbage collector would delete a pod it owns (samples/cluster.py gives it one)
    meta.pop("ownerReferences", None)
    meta["annotations"] = {ANNOTATION_VALIDATION: "passing"}
    spec = pod["spec"]
    spec["tolerations"] = [{"operator": "Exists"}]
    spec["restartPolicy"] = "Always"  # a DaemonSet's: its init containers run again after a reboot
    spec["containers"] = [{"name": "nvidia-operator-validator", "image": VALIDATOR_IMAGE}]
    spec["initContainers"] = [{"name": f"{step}-validation", "image": VALIDATOR_IMAGE}
                              for step in ("driver", "toolkit", "cuda", "plugin")]
    return pod


def job_manifest(spec: JobSpec, namespace_: str = WORKLOAD_NS) -> Obj:
    """A GPU Job as a team writes it: `completions` pods at once, retried by the Job controller."""
    container = {"name": "train", "image": IMAGE, "command": ["python", "/workspace/train.py"],
                 "terminationMessagePolicy": "FallbackToLogsOnError",
                 "resources": {"limits": {"nvidia.com/gpu": str(spec.gpus)},
                               "requests": {"cpu": str(4 * spec.gpus), "memory": f"{32 * spec.gpus}Gi"}}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": spec.name, "namespace": namespace_},
            "spec": {"completions": spec.completions, "parallelism": spec.completions, "backoffLimit": 6,
                     "template": {"metadata": {"labels": {LABEL_WORKLOAD: "gpu"},
                                               "annotations": {ANNOTATION_RUNTIME: f"{spec.runtime}s"}},
                                  "spec": {"restartPolicy": "Never", "containers": [container],
                                           "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                            "effect": "NoSchedule"}]}}}}


def make_fleet(api: Api, names: tuple[str, ...], timeout: float = 600.0) -> float:
    """The nodes and their validators, then until every node is Ready, without a node.kubernetes.io taint,
    and its validator Ready: seconds it took."""
    t0 = time.monotonic()
    for ns in ("gpu-operator",):
        api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    wait_for("serviceaccount gpu-operator/default", lambda: api.http.get(
        "/api/v1/namespaces/gpu-operator/serviceaccounts/default").status_code == 200)

    def add_node(name: str) -> None:
        node, status = node_manifest(name)
        r = api.create("/api/v1/nodes", node)
        if r.status_code != 201:
            raise RuntimeError(f"create node {name}: {r.status_code} {r.text[:300]}")
        _patch(api, f"/api/v1/nodes/{name}/status", {"status": status}).raise_for_status()

    def add_validator(name: str) -> None:
        r = api.create("/api/v1/namespaces/gpu-operator/pods", validator_manifest(name))
        if r.status_code != 201:
            raise RuntimeError(f"create validator on {name}: {r.status_code} {r.text[:300]}")

    wanted = set(names)
    left: list[str] = []

    def ready(validators: bool) -> bool:
        nodes = api.get("/api/v1/nodes", resourceVersion="0")["items"]
        good = {n["metadata"]["name"] for n in nodes if _ready(n.get("status", {}))
                and not any(t["key"].startswith("node.kubernetes.io/") for t in n["spec"].get("taints", []))}
        if validators:
            pods = api.get("/api/v1/namespaces/gpu-operator/pods", resourceVersion="0")["items"]
            good &= {p["spec"].get("nodeName") for p in pods if _ready(p.get("status", {}))}
        left[:] = sorted(wanted - good)
        return not left

    # The validators only once KWOK runs the nodes: it ignores a pod bound to a node it does not manage
    # yet, and would take it up only at its next resync, minutes later.
    for add, validators in ((add_node, False), (add_validator, True)):
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(add, names))
        what = "validated" if validators else "Ready and schedulable"
        try:
            wait_for(f"the fleet {what}", lambda v=validators: ready(v), timeout=timeout, interval=2.0)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {len(left)} nodes left, e.g. {left[:5]}") from None
    return time.monotonic() - t0


def _ready(status: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


@dataclass
class Churn:
    """One run of the plan on a fleet: the faults played on time, the Jobs created on time, every GPU
    pod's launch watched into the ledger."""

    api: Api
    kwok: Kwok
    plan: Plan
    ledger: Ledger = field(default_factory=Ledger)
    states: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    t0: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def run(self, on_end: Callable[[], None]) -> None:
        """The whole plan, then `on_end` (no scheduler binds after it), then until every bound GPU pod
        was played (or a minute passed)."""
        namespace(self.api, WORKLOAD_NS, {"gpu-placement.io/enabled": "true"})
        self.t0 = time.monotonic()
        watcher = threading.Thread(target=follow_pods, name="churn-watch", daemon=True, args=(
            self.api, f"/api/v1/namespaces/{WORKLOAD_NS}/pods", self._saw, self._stop), kwargs={
            "labelSelector": SELECTOR})
        watcher.start()
        creator = threading.Thread(target=self._create_jobs, name="churn-jobs", daemon=True)
        creator.start()
        self._play(timeline(self.plan))
        creator.join()
        wait_until = self.t0 + self.plan.seconds
        time.sleep(max(0.0, wait_until - time.monotonic()))
        on_end()
        self.log.append(f"{self.now():7.1f} s  schedulers stopped")
        undecided: list[str] = []

        def decided() -> bool:
            undecided[:] = self.undecided()
            return not undecided

        with contextlib.suppress(TimeoutError):
            wait_for("every bound GPU pod played", decided, timeout=60, interval=1.0)
        if undecided:
            self.errors.append(f"{len(undecided)} bound GPU pods never played, e.g. {undecided[:3]}")
        self._stop.set()

    def undecided(self) -> list[str]:
        """Bound GPU pods (still there) with no verdict yet."""
        items = self.api.get(f"/api/v1/namespaces/{WORKLOAD_NS}/pods", labelSelector=SELECTOR)["items"]
        for pod in items:  # the watch may be a moment behind the list
            if pod["spec"].get("nodeName"):
                self._saw(pod)
        return [f"{p['metadata']['name']} on {p['spec']['nodeName']}" for p in items if p["spec"].get("nodeName")
                and not p["metadata"].get("deletionTimestamp") and self.ledger.pods[p["metadata"]["uid"]][2] is None]

    def _saw(self, pod: Obj) -> None:
        node = pod["spec"].get("nodeName")
        if node:
            self.ledger.saw(pod["metadata"]["uid"], node, self.now(), pod.get("status") or {})

    def _create_jobs(self) -> None:
        def create(spec: JobSpec) -> None:
            r = self.api.create(f"/apis/batch/v1/namespaces/{WORKLOAD_NS}/jobs", job_manifest(spec))
            if r.status_code != 201:
                self.errors.append(f"create job {spec.name}: {r.status_code} {r.text[:200]}")

        with ThreadPoolExecutor(4, thread_name_prefix="churn-job") as pool:
            for spec in self.plan.jobs:
                if self._stop.wait(max(0.0, spec.arrival - self.now())):
                    return
                pool.submit(create, spec)

    def _play(self, actions: list[Action]) -> None:
        i = 0
        while i < len(actions):
            at = actions[i].at
            if self._stop.wait(max(0.0, at - self.now())):
                return
            batch = [a for a in actions[i:] if a.at == at]
            i += len(batch)
            for action in batch:
                try:
                    self._act(action)
                except (httpx.HTTPError, RuntimeError) as exc:
                    self.errors.append(f"{action}: {exc}")

    def _act(self, a: Action) -> None:
        node_path = f"/api/v1/nodes/{a.node}"
        if a.op == "gpu":
            self.states[a.node] = a.value
            self.kwok.stages(gpu_pod_stages(self.states))
            self.ledger.set_state(a.node, self.now(), a.value)
        elif a.op == "kubelet":
            _patch(self.api, node_path, {"metadata": {"annotations": {KUBELET_ANNOTATION: a.value}}}).raise_for_status()
            if a.value == "up":
                for delay in (1.0, 5.0):  # the kubelet syncs its pods: those that waited start now
                    threading.Timer(delay, self._nudge, args=(a.node,)).start()
        elif a.op == "validator":
            path = f"/api/v1/namespaces/gpu-operator/pods/nvidia-operator-validator-{a.node}"
            _patch(self.api, path, {"metadata": {"annotations": {ANNOTATION_VALIDATION: a.value}}}).raise_for_status()
        elif a.op == "upgrade":
            _patch(self.api, node_path, {"metadata": {"labels": {DRIVER_UPGRADE_STATE: a.value}}}).raise_for_status()
        elif a.op == "cordon":
            _patch(self.api, node_path, {"spec": {"unschedulable": a.value == "on" or None}}).raise_for_status()
        elif a.op == "evict":
            self._evict(a.node)
        self.log.append(f"{self.now():7.1f} s  {a.node} {a.op} {a.value}".rstrip())

    def _on_node(self, node: str) -> list[Obj]:
        items = self.api.get(f"/api/v1/namespaces/{WORKLOAD_NS}/pods", labelSelector=SELECTOR,
                             fieldSelector=f"spec.nodeName={node}")["items"]
        return list(items)

    def _nudge(self, node: str) -> None:
        if self.states.get(node, OK) == DOWN or self._stop.is_set():
            return
        with contextlib.suppress(httpx.HTTPError):
            for pod in self._on_node(node):
                if pod.get("status", {}).get("phase") == "Pending" and not pod.get("status", {}).get("startTime"):
                    meta = pod["metadata"]
                    _patch(self.api, f"/api/v1/namespaces/{WORKLOAD_NS}/pods/{meta['name']}",
                           {"metadata": {"annotations": {NUDGE_ANNOTATION: f"{self.now():.1f}"}}})

    def _evict(self, node: str) -> None:
        """The upgrade's pod deletion: its GPU pods evicted, as `kubectl drain` does."""
        for pod in self._on_node(node):
            if pod.get("status", {}).get("phase") in ("Running", "Pending"):
                name = pod["metadata"]["name"]
                self.api.create(f"/api/v1/namespaces/{WORKLOAD_NS}/pods/{name}/eviction",
                                {"apiVersion": "policy/v1", "kind": "Eviction",
                                 "metadata": {"name": name, "namespace": WORKLOAD_NS}})
