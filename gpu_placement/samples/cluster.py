"""Kubernetes objects built from real GPU Operator label sets: the demo cluster, tests and benchmarks.

The label sets are the ones NVIDIA and others published (`data/gpu-operator-node-labels.json`);
each node here starts from one of them and changes only what its story needs.
"""

from __future__ import annotations

import copy
import json
import time
from functools import cache
from importlib import resources
from typing import Any

from gpu_placement.base.timestamps import format_time

__all__ = ["BASES", "HAND_INSTALLED", "HAND_LABELLED", "NEW_DRIVER", "OLD_DRIVER", "base_labels", "cluster_policy",
           "demo_objects", "demo_pods", "device_plugin_daemonset", "driver_labels", "driver_pod", "make_node",
           "make_pod", "namespace", "survey_objects", "validator_pod", "wave_objects", "with_label_writers"]

Obj = dict[str, Any]

# Index of each published label set in the data file, by a short name.
BASES = {"h100": 0, "h100-mig-mixed": 1, "t4-timeslicing": 2, "a100-vgpu": 3, "h100x8": 4, "a10g-unregistered": 5}
_HOST_LABELS = {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"}


@cache
def _label_sets() -> list[dict[str, str]]:
    raw = json.loads(resources.files("gpu_placement").joinpath("data/gpu-operator-node-labels.json").read_text())
    return [node["labels"] for node in raw["nodes"]]


def base_labels(base: str) -> dict[str, str]:
    return dict(_label_sets()[BASES[base]])


def _allocatable(labels: dict[str, str], shared_resource: str | None) -> dict[str, str]:
    """What the device plugin would register for these labels (the fixtures carry labels only)."""
    resources_: dict[str, str] = {}
    count = int(labels.get("nvidia.com/gpu.count", "0") or 0)
    replicas = int(labels.get("nvidia.com/gpu.replicas", "1") or 1)
    if replicas and count:
        resources_[shared_resource or "nvidia.com/gpu"] = str(count * replicas)
    for key, value in labels.items():
        if key.startswith("nvidia.com/mig-") and key.endswith(".count"):
            resources_[key.removesuffix(".count")] = value
    return resources_


def make_node(name: str, base: str | None, *, labels: dict[str, str] | None = None, drop: tuple[str, ...] = (),
              allocatable: dict[str, str] | None = None, capacity: dict[str, str] | None = None,
              ready: bool = True, unschedulable: bool = False, shared_resource: str | None = None,
              created: float | None = None) -> Obj:
    node_labels = base_labels(base) if base else {}
    node_labels.update(_HOST_LABELS)
    node_labels["kubernetes.io/hostname"] = name
    node_labels.update(labels or {})
    for key in drop:
        node_labels.pop(key, None)
    gpus = _allocatable(node_labels, shared_resource) if allocatable is None else allocatable
    standard = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    condition = {"type": "Ready", "status": "True" if ready else "False",
                 "reason": "KubeletReady" if ready else "KubeletNotReady",
                 "message": "kubelet is posting ready status" if ready else "container runtime is down"}
    node: Obj = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": node_labels, "uid": f"uid-node-{name}"},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]} if gpus else {},
        "status": {"capacity": {**standard, **(capacity if capacity is not None else gpus)},
                   "allocatable": {**standard, **gpus}, "conditions": [condition]},
    }
    if unschedulable:
        node["spec"]["unschedulable"] = True
    if created is not None:
        node["metadata"]["creationTimestamp"] = format_time(created)
    return node


def namespace(name: str, annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **(labels or {})},
                         "annotations": annotations or {}}}


def make_pod(namespace_: str, name: str, *, gpus: dict[str, int] | None = None, node: str | None = None,
             image: str = "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04", annotations: dict[str, str] | None = None,
             phase: str | None = None, labels: dict[str, str] | None = None, uid: str | None = None,
             priority: int | None = None) -> Obj:
    limits = {res: str(count) for res, count in (gpus or {}).items()}
    container: Obj = {"name": "main", "image": image,
                      "resources": {"limits": {"cpu": "4", "memory": "16Gi", **limits},
                                    "requests": {"cpu": "4", "memory": "16Gi", **limits}}}
    pod: Obj = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace_, "uid": uid or f"uid-{namespace_}-{name}",
                     "labels": labels or {"app": name}, "annotations": annotations or {}},
        "spec": {"containers": [container], "schedulerName": "default-scheduler", "restartPolicy": "Never"},
        "status": {"phase": phase or ("Running" if node else "Pending")},
    }
    if node:
        pod["spec"]["nodeName"] = node
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    if priority is not None:  # what the API server's Priority admission sets from priorityClassName
        pod["spec"]["priority"] = priority
    return pod


def _daemon_pod(pod: Obj, daemonset: str) -> Obj:
    """The pod as its DaemonSet's controller makes it: the GPU Operator's operands are DaemonSets' pods."""
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": daemonset,
                                           "uid": f"uid-daemonset-{daemonset}", "controller": True,
                                           "blockOwnerDeletion": True}]
    return pod


def validator_pod(node: str, ready: bool = True) -> Obj:
    pod = _daemon_pod(make_pod("gpu-operator", f"nvidia-operator-validator-{node}", node=node,
                               image="nvcr.io/nvidia/gpu-operator", labels={"app": "nvidia-operator-validator"}),
                      "nvidia-operator-validator")
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    if not ready:
        pod["status"]["phase"] = "Pending"
        pod["status"]["initContainerStatuses"] = [{"name": "driver-validation", "ready": False}]
    return pod


def driver_labels(version: str, cuda: str) -> dict[str, str]:
    """What GPU Feature Discovery publishes for a driver: its version and the highest CUDA it supports."""
    major, minor, revision = version.split(".")
    cuda_major, cuda_minor = cuda.split(".")
    return {"nvidia.com/cuda.driver-version.full": version, "nvidia.com/cuda.driver-version.major": major,
            "nvidia.com/cuda.driver-version.minor": minor, "nvidia.com/cuda.driver-version.revision": revision,
            "nvidia.com/cuda.driver.major": major, "nvidia.com/cuda.driver.minor": minor,
            "nvidia.com/cuda.driver.rev": revision, "nvidia.com/cuda.runtime-version.full": cuda,
            "nvidia.com/cuda.runtime-version.major": cuda_major, "nvidia.com/cuda.runtime-version.minor": cuda_minor,
            "nvidia.com/cuda.runtime.major": cuda_major, "nvidia.com/cuda.runtime.minor": cuda_minor}


def driver_pod(node: str, version: str, ready_at: float | None, *, created: float | None = None, restarts: int = 0,
               restarted_at: float | None = None) -> Obj:
    """The GPU Operator's driver pod on `node` (DaemonSet nvidia-driver-daemonset, container
    nvidia-driver-ctr, image driver:<version>-<os>): Ready since `ready_at` (None: still installing)."""
    created = created if created is not None else (ready_at or time.time()) - 240  # installing takes minutes
    pod = _daemon_pod(make_pod("gpu-operator", f"nvidia-driver-daemonset-{node}", node=node,
                               image=f"nvcr.io/nvidia/driver:{version}-ubuntu22.04",
                               labels={"app": "nvidia-driver-daemonset",
                                       "app.kubernetes.io/component": "nvidia-driver"}),
                      "nvidia-driver-daemonset")
    container = pod["spec"]["containers"][0]
    container["name"], container["resources"] = "nvidia-driver-ctr", {}
    pod["metadata"]["creationTimestamp"] = format_time(created)
    status: Obj = {"phase": "Running", "startTime": format_time(created + 5),
                   "conditions": [{"type": "Ready", "status": "True" if ready_at is not None else "False",
                                   "lastTransitionTime": format_time(ready_at if ready_at is not None else created)}],
                   "containerStatuses": [{"name": "nvidia-driver-ctr", "ready": ready_at is not None,
                                          "restartCount": restarts, "image": container["image"]}]}
    if restarted_at is not None:
        status["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 1,
                                                                      "finishedAt": format_time(restarted_at)}}
    pod["status"] = status
    return pod


# -- the demo cluster ----------------------------------------------------------------------------
# Each node tells one story; `demo` shows how every kind of pod fares on each.
_DEMO_NODES: list[tuple[Obj, bool | None]] = [  # (node, validator Ready; None: no validator pod)
    (make_node("h100-train-1", "h100x8", labels={"pool": "training"}), True),
    (make_node("h100-train-2", "h100x8", labels={"pool": "training",
                                                  "nvidia.com/gpu-driver-upgrade-state": "upgrade-required"}), True),
    (make_node("h100-single", "h100"), True),
    (make_node("h100-mig", "h100-mig-mixed"), True),
    (make_node("t4-shared", "t4-timeslicing", labels={"nvidia.com/gpu.sharing-strategy": "time-slicing"},
               shared_resource="nvidia.com/gpu.shared"), True),
    # Time-slicing without renameByDefault: 8 replicas offered as nvidia.com/gpu, product ...-SHARED.
    (make_node("t4-replicas", "t4-timeslicing", labels={"nvidia.com/gpu.sharing-strategy": "time-slicing"}), True),
    (make_node("a100-vgpu", "a100-vgpu"), True),
    (make_node("a10g-unregistered", "a10g-unregistered", allocatable={"nvidia.com/gpu": "0"}), True),
    (make_node("h100-not-validated", "h100"), False),
    (make_node("h100-upgrading", "h100", labels={"nvidia.com/gpu-driver-upgrade-state": "drain-required",
                                                  "nvidia.com/gpu.deploy.driver": "paused-for-driver-upgrade"}), True),
    (make_node("h100-mig-pending", "h100", labels={"nvidia.com/mig.config": "all-1g.10gb",
                                                    "nvidia.com/mig.config.state": "pending"}), True),
    (make_node("h100-down", "h100", ready=False), True),
    (make_node("v100-legacy", "h100", labels={
        "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB", "nvidia.com/gpu.memory": "16384",
        "nvidia.com/gpu.compute.major": "7", "nvidia.com/gpu.compute.minor": "0", "nvidia.com/gpu.family": "volta",
        "nvidia.com/cuda.driver-version.full": "470.256.02", "nvidia.com/cuda.driver-version.major": "470",
        "nvidia.com/cuda.driver-version.minor": "256", "nvidia.com/cuda.driver-version.revision": "02",
        "nvidia.com/cuda.driver.major": "470", "nvidia.com/cuda.driver.minor": "256",
        "nvidia.com/cuda.driver.rev": "02",
        "nvidia.com/cuda.runtime-version.full": "11.4", "nvidia.com/cuda.runtime-version.major": "11",
        "nvidia.com/cuda.runtime-version.minor": "4", "nvidia.com/cuda.runtime.major": "11",
        "nvidia.com/cuda.runtime.minor": "4"}), True),
    (make_node("l4-no-driver-labels", "h100", labels={"nvidia.com/gpu.product": "NVIDIA-L4",
                                                       "nvidia.com/gpu.memory": "23034"},
               drop=tuple(k for k in base_labels("h100") if k.startswith("nvidia.com/cuda."))), True),
    (make_node("h100-bad-label", "h100", labels={"nvidia.com/gpu.memory": "abc"}), True),
    (make_node("cpu-1", None), None),
]

# A driver rollout in the batch pool: 550.54.15 -> 580.126.09. Two nodes run the new driver and soak,
# one runs the old one, one waits for the next wave (upgrade-required). Every node had 550.54.15
# settled (gpu-placement.io/settled-driver, as the rollout leader records it); h100-batch-1's driver pod
# was recreated 15 minutes ago with that same driver (an operator upgrade rolled the DaemonSet): a
# reinstall, no soak.
OLD_DRIVER, NEW_DRIVER = ("550.54.15", "12.4"), ("580.126.09", "13.0")
_WAVE = [("h100-batch-1", OLD_DRIVER, 15 * 60.0, "upgrade-done"),
         ("h100-batch-2", NEW_DRIVER, 20 * 60.0, "upgrade-done"),
         ("h100-batch-3", NEW_DRIVER, 35 * 60.0, "upgrade-done"),
         ("h100-batch-4", OLD_DRIVER, 40 * 86400.0, "upgrade-required")]


def wave_objects(now: float | None = None) -> list[Obj]:
    """The driver rollout of the demo, timed from `now`: the batch pool's namespaces (one a canary),
    its nodes with their driver and validator pods, and the ClusterPolicy."""
    now = time.time() if now is None else now
    objects: list[Obj] = [
        namespace("batch", {"gpu-placement.io/quota": "nvidia.com/gpu=4", "gpu-placement.io/pools": "batch"}),
        namespace("batch-canary", {"gpu-placement.io/quota": "nvidia.com/gpu=2", "gpu-placement.io/pools": "batch",
                                   "gpu-placement.io/canary": "true"}),
        cluster_policy()]
    for name, (version, cuda), ready_ago, state in _WAVE:
        node = make_node(name, "h100", created=now - 100 * 86400, labels={
            "pool": "batch", "nvidia.com/gpu-driver-upgrade-state": state, **driver_labels(version, cuda)})
        node["metadata"]["annotations"] = {"gpu-placement.io/settled-driver": OLD_DRIVER[0]}
        objects.append(node)
        objects.append(driver_pod(name, version, now - ready_ago))
        objects.append(validator_pod(name))
    return objects


def cluster_policy(version: str = NEW_DRIVER[0]) -> Obj:
    """The GPU Operator's ClusterPolicy as far as rollouts read it: the driver version the
    DaemonSet runs, and the upgrade controller's policy for the waves."""
    return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
            "spec": {"driver": {"enabled": True, "repository": "nvcr.io/nvidia", "image": "driver",
                                "version": version,
                                "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 1,
                                                  "maxUnavailable": "25%",
                                                  "drain": {"enable": False}}}}}

_DEMO_NAMESPACES = [
    namespace("team-a", {"gpu-placement.io/quota": "nvidia.com/gpu=16", "gpu-placement.io/pools": "training"}),
    namespace("inference", {"gpu-placement.io/sharing": "shared", "gpu-placement.io/gpu-memory": "1Gi",
                            "gpu-placement.io/quota": "nvidia.com/gpu.shared=16"}),
    namespace("mig-lab", {"gpu-placement.io/sharing": "mig-1g.10gb",
                          "gpu-placement.io/quota": "nvidia.com/mig-1g.10gb=2"}),
    namespace("research", {"gpu-placement.io/quota": "nvidia.com/gpu=2", "gpu-placement.io/cuda": "12.4"}),
    namespace("vision", {"gpu-placement.io/quota": "nvidia.com/gpu=4",
                         "gpu-placement.io/gpu-products": "NVIDIA-H100-80GB-HBM3"}),
    namespace("media", {"gpu-placement.io/quota": "nvidia.com/gpu=2"}),
    namespace("web"),
    namespace("gpu-operator"),
    namespace("kube-system"),
]


def demo_objects() -> list[Obj]:
    """Namespaces, nodes, validator pods and the load already running."""
    objects: list[Obj] = [copy.deepcopy(ns) for ns in _DEMO_NAMESPACES]
    for node, validator_ready in _DEMO_NODES:
        objects.append(copy.deepcopy(node))
        if validator_ready is not None:
            objects.append(validator_pod(node["metadata"]["name"], validator_ready))
    objects.append(make_pod("team-a", "pretrain-0", gpus={"nvidia.com/gpu": 6}, node="h100-train-1"))
    objects.append(make_pod("team-a", "eval-0", gpus={"nvidia.com/gpu": 2}, node="h100-train-2"))
    objects.append(make_pod("inference", "embed-0", gpus={"nvidia.com/gpu.shared": 2}, node="t4-shared",
                            annotations={"gpu-placement.io/gpu-memory": "6Gi"}))
    objects.append(make_pod("research", "old-job", gpus={"nvidia.com/gpu": 1}, node="h100-single", phase="Succeeded"))
    return objects


def demo_pods() -> list[tuple[str, Obj]]:
    """Pods a user creates, before the webhook: (what it shows, pod)."""
    def job(ns: str, name: str, gpus: dict[str, int] | None,
            image: str = "nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04",
            annotations: dict[str, str] | None = None) -> Obj:
        pod = make_pod(ns, name, gpus=gpus, image=image, annotations=annotations)
        del pod["status"]
        return pod

    def turing(pod: Obj) -> Obj:  # the user's own selector: kube-scheduler asks about the T4 nodes only
        pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.family": "turing"}
        return pod

    return [
        ("2 whole GPUs in the training pool; binpack fills the node in use",
         job("team-a", "llama-finetune", {"nvidia.com/gpu": 2}, image="nvcr.io/nvidia/pytorch:24.01-py3",
             annotations={"gpu-placement.io/cuda": "12.2"})),
        ("a time-sliced GPU share with 2Gi", job("inference", "chat-api", {"nvidia.com/gpu": 1},
                                                 image="nvcr.io/nvidia/cuda:11.4.3-runtime-ubuntu20.04",
                                                 annotations={"gpu-placement.io/gpu-memory": "2Gi"})),
        ("a second share, 4Gi: no longer fits", job("inference", "chat-big", {"nvidia.com/gpu": 1},
                                                     image="nvcr.io/nvidia/cuda:11.4.3-runtime-ubuntu20.04",
                                                     annotations={"gpu-placement.io/gpu-memory": "4Gi"})),
        ("one MIG 1g.10gb slice", job("mig-lab", "notebook", {"nvidia.com/gpu": 1})),
        ("2 H100s (namespace's product list)", job("vision", "detector", {"nvidia.com/gpu": 2},
                                                  image="nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04")),
        ("a whole T4 (node selector), but every T4 is time-sliced", turing(job("media", "transcode",
                                                                              {"nvidia.com/gpu": 1}))),
        ("CUDA 13 image", job("research", "cuda13-sim", {"nvidia.com/gpu": 1},
                              image="nvcr.io/nvidia/cuda:13.0.0-devel-ubuntu24.04")),
        ("asks more memory than any GPU has", job("research", "huge-model", {"nvidia.com/gpu": 1},
                                                  annotations={"gpu-placement.io/gpu-memory": "120Gi"})),
        ("namespace over its quota", job("research", "sweep", {"nvidia.com/gpu": 4})),
        ("namespace without GPU access", job("web", "frontend-gpu", {"nvidia.com/gpu": 1})),
        ("broken annotation", job("research", "typo", {"nvidia.com/gpu": 1},
                                  annotations={"gpu-placement.io/cuda": "twelve"})),
        ("no GPU at all", job("web", "frontend", None, image="nginx:1.27")),
        ("driver rollout: a canary namespace takes the soaking new driver first",
         job("batch-canary", "smoke-test", {"nvidia.com/gpu": 1})),
        ("driver rollout: an ordinary job is kept on the old driver (h100-batch-1's, reinstalled 15m ago: no soak)",
         job("batch", "train", {"nvidia.com/gpu": 1})),
    ]


# -- the survey's stories ------------------------------------------------------------------------
# Who writes which label, as the API server records it in managedFields (gpu_placement/survey/labels.py
# names the writers and where that was checked): the kubelet its own, nfd-master what NFD and GPU
# Feature Discovery publish, the GPU Operator gpu.present and the deploy labels, people the rest.
HAND_INSTALLED, HAND_LABELLED = "h100-train-hand", "l40s-relabelled"
_OPERATOR_LABELS = ("nvidia.com/gpu.present", "nvidia.com/gpu-driver-upgrade-state")
_PEOPLE_LABELS = ("nvidia.com/mig.config", "nvidia.com/device-plugin.config", "nvidia.com/gpu.deploy.operands")


def _writer(key: str, value: str) -> str:
    if key.startswith(("kubernetes.io/", "beta.kubernetes.io/", "node.kubernetes.io/", "node-role.")):
        return "kubelet"
    if key in _PEOPLE_LABELS or not key.startswith(("nvidia.com/", "feature.node.kubernetes.io/")):
        return "kubectl-label"
    if key == "nvidia.com/mig.config.state":
        return "nvidia-mig-manager"
    if (key == "nvidia.com/gpu.deploy.driver" and value == "pre-installed") or value.startswith("paused-"):
        return "driver-manager"
    if key in _OPERATOR_LABELS or key.startswith("nvidia.com/gpu.deploy."):
        return "gpu-operator"
    return "nfd-master"


def with_label_writers(node: Obj, by_hand: tuple[str, ...] = (), at: str = "2026-01-05T09:00:00Z") -> Obj:
    """The node with the managedFields its labels' writers leave: `by_hand` keys last written by kubectl label."""
    node = copy.deepcopy(node)
    owners: dict[str, list[str]] = {}
    for key, value in (node["metadata"].get("labels") or {}).items():
        owners.setdefault("kubectl-label" if key in by_hand else _writer(key, str(value)), []).append(key)
    node["metadata"]["managedFields"] = [
        {"manager": manager, "operation": "Update", "apiVersion": "v1", "time": at, "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:labels": {f"f:{key}": {} for key in sorted(keys)}}}}
        for manager, keys in sorted(owners.items())]
    return node


def device_plugin_daemonset() -> Obj:
    """NVIDIA's device plugin installed on its own (its Helm chart, NVIDIA/k8s-device-plugin
    deployments/helm/nvidia-device-plugin), with the chart's default affinity: nodes where NFD found an
    NVIDIA PCI device or NVIDIA CPU, or labelled nvidia.com/gpu.present=true."""
    def term(key: str, value: str) -> Obj:
        return {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}

    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system",
                         "uid": "uid-daemonset-nvidia-device-plugin-daemonset"},
            "spec": {"selector": {"matchLabels": {"name": "nvidia-device-plugin-ds"}},
                     "updateStrategy": {"type": "RollingUpdate"},
                     "template": {"metadata": {"labels": {"name": "nvidia-device-plugin-ds"}}, "spec": {
                         "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [term("feature.node.kubernetes.io/pci-10de.present", "true"),
                                                   term("feature.node.kubernetes.io/cpu-model.vendor_id", "NVIDIA"),
                                                   term("nvidia.com/gpu.present", "true")]}}},
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                         "priorityClassName": "system-node-critical",
                         "containers": [{"name": "nvidia-device-plugin-ctr",
                                         "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"}]}}},
            "status": {"desiredNumberScheduled": 1, "numberReady": 1}}


def survey_objects() -> list[Obj]:
    """What the survey finds in the demo: a node whose driver came from packages and whose labels were set
    by hand, an operator node with labels left over from before and a forgotten maintenance taint, and a
    CronJob whose selector names a GPU no node has."""
    driver = driver_labels("535.104.05", "12.2")  # from the distribution's packages, older than the pool's
    hand_keys = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                 "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559", **driver}
    hand = make_node(HAND_INSTALLED, None, labels={"pool": "training", "nvidia.com/gpu.deploy.operands": "false",
                                                   "feature.node.kubernetes.io/pci-10de.present": "true",
                                                   **hand_keys}, allocatable={"nvidia.com/gpu": "8"})
    hand["spec"] = {}  # installed by hand: nobody tainted it
    relabelled = make_node(HAND_LABELLED, "h100", labels={
        "nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.memory": "46068", "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.family": "ada-lovelace", "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "9"}, allocatable={"nvidia.com/gpu": "4"})
    relabelled["spec"]["taints"].append({"key": "maintenance", "value": "bios-update", "effect": "NoSchedule"})
    plugin = _daemon_pod(make_pod("kube-system", f"nvidia-device-plugin-daemonset-{HAND_INSTALLED}",
                                  node=HAND_INSTALLED, image="nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
                                  labels={"name": "nvidia-device-plugin-ds"}), "nvidia-device-plugin-daemonset")
    cache = make_pod("web", "cache-5d8f7b9c4-x2x7q", node=HAND_INSTALLED, image="redis:7.4",
                     labels={"app": "cache", "pod-template-hash": "5d8f7b9c4"})
    cache["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "controller": True,
                                             "name": "cache-5d8f7b9c4"}]
    eval_pod = make_pod("research", "nightly-eval", gpus={"nvidia.com/gpu": 1},
                        image="nvcr.io/nvidia/pytorch:24.05-py3")
    nightly = {"apiVersion": "batch/v1", "kind": "CronJob",
               "metadata": {"name": "nightly-eval", "namespace": "research"},
               "spec": {"schedule": "0 2 * * *", "jobTemplate": {"spec": {"template": {
                   "metadata": {"labels": {"app": "nightly-eval"}},
                   "spec": {**eval_pod["spec"], "restartPolicy": "OnFailure",
                            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}}}}}}}
    return [with_label_writers(hand, by_hand=tuple(hand_keys)),
            with_label_writers(relabelled, by_hand=("nvidia.com/gpu.present", "nvidia.com/gpu.product",
                                                    "nvidia.com/gpu.memory")),
            validator_pod(HAND_LABELLED), plugin, device_plugin_daemonset(), cache, nightly]
