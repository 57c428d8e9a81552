"""The replayed cluster as Kubernetes objects: what the view ingests (Nodes with the GPU Operator's
labels, its validator pods, a namespace per sharing level, and in `dra` mode a DeviceClass, one
ResourceSlice per node and a ResourceClaimTemplate per kind of ask), and each task as the Pod (and
ResourceClaim) a user and the scheduler would make of it.

Two ways the trace's asks become Kubernetes asks (docs/replay.md says where each departs from a live
cluster):

- `dra`: every GPU is a DRA device of driver gpu.nvidia.com with `allowMultipleAllocations: true`
  and one consumable capacity, `share`, of 1000 (the trace's unit, thousandths of the GPU; KEP-5075).
  A task asking N whole GPUs gets a claim for N devices that names no capacity, so each consumes all
  of its device (`fillEmptyRequest`); a task asking part of one GPU gets a claim for one device with
  `capacity.requests.share: <gpu_milli>`. Whole and partial claims share one node, even one GPU.
- `device-plugin`: what NVIDIA's device plugin can express. A node's GPUs are either exclusive
  (`nvidia.com/gpu`) or time-sliced into `replicas` equal replicas (`nvidia.com/gpu.shared`,
  renameByDefault). A task asking at most 1000/replicas of one GPU takes one replica (namespace
  `openb-shared`, sharing level shared); any other task takes whole GPUs, a larger share being
  rounded up to a whole GPU (namespace `openb`). Which nodes are time-sliced is fixed beforehand, per
  GPU model in proportion to the GPU capacity the replica-sized tasks hold, as a platform team sizes a
  time-sliced pool.

Nodes come from the trace's node CSV (GPU Feature Discovery labels made up from the model, the rest
of a published label set) or from a `kubectl get nodes -o json` snapshot (its own labels, conditions
and allocatable CPU and memory; its GPUs re-published for the mode). Nodes carry no GPU taint: the
trace's CPU-only tasks ran on the same nodes.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.quantity import QuantityError, parse_quantity
from gpu_placement.facts.dra import Device, slice_from_json
from gpu_placement.replay.trace import MILLI, NodeRow, Task, TraceError
from gpu_placement.samples.cluster import base_labels, namespace, validator_pod

__all__ = ["CAPACITY", "DEVICE_PLUGIN", "DRA", "Cluster", "ReplayNode", "TaskPod", "build_cluster", "claim_object",
           "nodes_from_objects", "read_node_source", "task_pod"]

DRA = "dra"
DEVICE_PLUGIN = "device-plugin"
DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
CAPACITY = "share"  # the consumable capacity every replayed DRA device publishes: 1000 per GPU
NAMESPACE = "openb"
SHARED_NAMESPACE = "openb-shared"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
POD_LIMIT = "110"  # kubelet's default --max-pods
_IMAGE = "registry.example/openb/task:latest"  # no CUDA version in the tag: the trace states none

# The trace's GPU models as GPU Feature Discovery would label them: product label, productName of the
# DRA driver, memory (MiB), compute capability, family. G2 and G3 are Alibaba's undisclosed codes: the
# label is the code, and the memory a placeholder (nothing in the replay depends on it).
MODELS: dict[str, tuple[str, str, int, tuple[int, int], str]] = {
    "P100": ("Tesla-P100-PCIE-16GB", "Tesla P100-PCIE-16GB", 16280, (6, 0), "pascal"),
    "T4": ("Tesla-T4", "Tesla T4", 15360, (7, 5), "turing"),
    "V100M16": ("Tesla-V100-SXM2-16GB", "Tesla V100-SXM2-16GB", 16160, (7, 0), "volta"),
    "V100M32": ("Tesla-V100-SXM2-32GB", "Tesla V100-SXM2-32GB", 32510, (7, 0), "volta"),
    "A10": ("NVIDIA-A10", "NVIDIA A10", 23028, (8, 6), "ampere"),
}
_UNKNOWN_MODEL = (16384, (7, 0), "unknown")


@dataclass(slots=True)
class ReplayNode:
    name: str
    cpu_milli: int
    memory_mib: int
    pods: int
    gpus: int
    product: str  # the GPU product label ("" without GPUs)
    replicas: int = 1  # device-plugin: > 1 when its GPUs are time-sliced
    obj: dict[str, Any] = field(default_factory=dict)  # the Node as ingested
    devices: tuple[Device, ...] = ()  # dra: its devices in the allocator's order
    extended: dict[str, int] = field(default_factory=dict)  # device-plugin: allocatable GPU resources


@dataclass(slots=True)
class Cluster:
    mode: str
    nodes: list[ReplayNode]
    objects: list[dict[str, Any]]  # everything the view ingests before the first task
    replicas: int = 1  # device-plugin: replicas of a time-sliced GPU

    @property
    def gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)


@dataclass(slots=True, frozen=True)
class TaskPod:
    """A task as Kubernetes sees it: its Pod, and the shape the scheduler model filters and scores by."""

    pod: dict[str, Any]
    key: str
    cpu_milli: int
    memory_mib: int
    extended: tuple[tuple[str, int], ...]  # device-plugin resources asked
    asks: tuple[tuple[str, int, tuple[tuple[str, int], ...]], ...]  # dra: the claim's requests
    template: str = ""  # dra: the ResourceClaimTemplate the pod names
    gpu: bool = True  # False: a CPU-only task, which the default scheduler places (gpu-placement never sees it)

    @property
    def shape(self) -> tuple[object, ...]:
        return (self.cpu_milli, self.memory_mib, self.extended, self.asks, self.gpu)


def _product_of(model: str) -> str:
    known = MODELS.get(model)
    return known[0] if known else model


# -- nodes ---------------------------------------------------------------------------------------
def _gpu_labels(product: str, count: int, model: str) -> dict[str, str]:
    known = MODELS.get(model)
    memory, compute, family = (known[2], known[3], known[4]) if known else _UNKNOWN_MODEL
    labels = {key: value for key, value in base_labels("h100x8").items() if not key.startswith("nvidia.com/mig")}
    labels.update({n.GPU_PRODUCT: product, n.GPU_COUNT: str(count), n.GPU_MEMORY: str(memory),
                   n.COMPUTE_MAJOR: str(compute[0]), n.COMPUTE_MINOR: str(compute[1]), n.GPU_FAMILY: family,
                   n.GPU_REPLICAS: "1", n.GPU_SHARING_STRATEGY: "none", "nvidia.com/mig.capable": "false"})
    return labels


def _node_object(name: str, labels: dict[str, str], cpu_milli: int, memory_mib: int, pods: str,
                 extended: Mapping[str, int], status: Mapping[str, Any] | None = None,
                 spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    allocatable = {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi", "pods": pods,
                   **{res: str(count) for res, count in extended.items()}}
    conditions = list((status or {}).get("conditions") or [{"type": "Ready", "status": "True",
                                                            "reason": "KubeletReady"}])
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-node-{name}",
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels}},
            "spec": {k: v for k, v in (spec or {}).items() if k != "taints"} | (
                {"taints": [t for t in (spec or {}).get("taints") or () if t.get("key") != n.GPU_RESOURCE]}
                if (spec or {}).get("taints") else {}),
            "status": {"capacity": dict(allocatable), "allocatable": allocatable, "conditions": conditions}}


def _shared_counts(rows: Sequence[ReplayNode], tasks: Iterable[Task], replicas: int) -> dict[str, int]:
    """device-plugin: how many nodes of each model are time-sliced, in proportion to the GPU milli the
    replica-sized tasks would hold against all the GPU milli the tasks hold."""
    if replicas <= 1:
        return {}
    size = MILLI // replicas
    held = Counter[str]()
    for task in tasks:
        if task.gpus:
            held["replica" if task.share and task.milli <= size else "whole"] += size if (
                task.share and task.milli <= size) else task.gpus * MILLI
    total = held["replica"] + held["whole"]
    if not total or not held["replica"]:
        return {}
    by_model = Counter(node.product for node in rows if node.gpus)
    return {model: max(1, round(count * held["replica"] / total)) for model, count in by_model.items()}


def _nodes_from_rows(rows: Sequence[NodeRow]) -> list[ReplayNode]:
    return [ReplayNode(r.name, r.cpu_milli, r.memory_mib, int(POD_LIMIT), r.gpus,
                       _product_of(r.model) if r.gpus else "",
                       obj={"labels": _gpu_labels(_product_of(r.model), r.gpus, r.model) if r.gpus else {}})
            for r in rows]


def nodes_from_objects(objects: Sequence[Mapping[str, Any]], source: str) -> list[ReplayNode]:
    """Nodes of a `kubectl get nodes -o json` snapshot: GPUs from GPU Feature Discovery's labels (else
    the device plugin's allocatable), CPU, memory and pods from allocatable."""
    nodes = []
    for obj in objects:
        if obj.get("kind") != "Node":
            continue
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        name = str(meta.get("name") or "")
        labels = dict(meta.get("labels") or {})
        allocatable = status.get("allocatable") or {}
        try:
            cpu = _amount(allocatable.get("cpu", "0")) * 1000
            memory = _amount(allocatable.get("memory", "0")) / 2**20
            pods = int(_amount(allocatable.get("pods", POD_LIMIT)))
            replicas = max(1, int(labels.get(n.GPU_REPLICAS) or 1))
            count = int(labels.get(n.GPU_COUNT) or 0) or (
                int(_amount(allocatable.get(n.GPU_RESOURCE, 0))) + int(_amount(allocatable.get(SHARED_RESOURCE, 0)))
            ) // replicas
        except (QuantityError, ValueError) as exc:
            raise TraceError(f"{source}: node {name}: {exc}") from None
        product = (labels.get(n.GPU_PRODUCT) or "").removesuffix("-SHARED")
        labels.update({n.GPU_REPLICAS: "1", n.GPU_SHARING_STRATEGY: "none"} if count else {})
        if product:
            labels[n.GPU_PRODUCT] = product
        node = ReplayNode(name, int(cpu), int(memory), pods, count, product if count else "",
                          obj={"labels": labels, "status": status, "spec": obj.get("spec") or {}})
        nodes.append(node)
    if not nodes:
        raise TraceError(f"{source}: no Node objects (expected `kubectl get nodes -o json` output)")
    return nodes


def _amount(value: Any) -> float:
    return float(parse_quantity(value))


def _device(node: ReplayNode, index: int) -> dict[str, Any]:
    known = next((m for m in MODELS.values() if m[0] == node.product), None)
    product_name = known[1] if known else node.product.replace("-", " ")
    compute = known[3] if known else _UNKNOWN_MODEL[1]
    return {"name": f"gpu-{index}", "allowMultipleAllocations": True,
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-{node.name}-{index}"},
                           "productName": {"string": product_name}, "driverVersion": {"version": "535.129.3"},
                           "cudaDriverVersion": {"version": "12.2.0"},
                           "cudaComputeCapability": {"version": f"{compute[0]}.{compute[1]}.0"}},
            "capacity": {CAPACITY: {"value": str(MILLI)}}}


def _slice(node: ReplayNode) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node.name}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node.name,
                     "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [_device(node, i) for i in range(node.gpus)]}}


def _device_class() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": GPU_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}" && '
                                                          f'device.attributes["{DRIVER}"].type == "gpu"'}}]}}


def build_cluster(nodes: list[ReplayNode], tasks: Sequence[Task], mode: str, replicas: int = 2) -> Cluster:
    """The cluster's objects for `mode`; `tasks` (all that will arrive) size the time-sliced pool and
    name the ResourceClaimTemplates."""
    cluster = Cluster(mode, nodes, [namespace(NAMESPACE, {n.ANN_ALLOCATION: mode})], replicas)
    shared = _shared_counts(nodes, tasks, replicas) if mode == DEVICE_PLUGIN else {}
    if mode == DEVICE_PLUGIN and shared:
        cluster.objects.append(namespace(SHARED_NAMESPACE, {n.ANN_SHARING: "shared"}))
    for node in sorted(nodes, key=lambda x: x.name):
        labels = copy.deepcopy(node.obj.get("labels") or {})
        extended: dict[str, int] = {}
        if node.gpus and mode == DEVICE_PLUGIN:
            if shared.get(node.product, 0) > 0:
                shared[node.product] -= 1
                node.replicas = replicas
                labels.update({n.GPU_REPLICAS: str(replicas), n.GPU_SHARING_STRATEGY: "time-slicing"})
                extended[SHARED_RESOURCE] = node.gpus * replicas
            else:
                extended[n.GPU_RESOURCE] = node.gpus
        node.extended = extended
        node.obj = _node_object(node.name, labels, node.cpu_milli, node.memory_mib, str(node.pods), extended,
                                node.obj.get("status"), node.obj.get("spec"))
        cluster.objects.append(node.obj)
        if node.gpus:
            cluster.objects.append(_validator(node.name))
        if node.gpus and mode == DRA:
            piece = _slice(node)
            node.devices = slice_from_json(piece).devices
            cluster.objects.append(piece)
    if mode == DRA:
        cluster.objects.append(_device_class())
        asks = sorted({(t.gpus, t.milli) for t in tasks if t.gpus})
        cluster.objects.extend(_template(count, milli) for count, milli in asks)
    return cluster


def _validator(node: str) -> dict[str, Any]:
    """The GPU Operator's validator pod on the node, Ready (the replay assumes a verified GPU stack); it
    requests nothing, as the scheduler model charges it nothing."""
    pod = validator_pod(node)
    for container in pod["spec"]["containers"]:
        container["resources"] = {}
    return pod


# -- tasks ---------------------------------------------------------------------------------------
def _template_name(count: int, milli: int) -> str:
    return f"gpu-{count}x{milli}"


def _claim_spec(count: int, milli: int) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": count}
    if milli < MILLI:
        exactly["capacity"] = {"requests": {CAPACITY: str(milli)}}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def _template(count: int, milli: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": _template_name(count, milli), "namespace": NAMESPACE},
            "spec": {"spec": _claim_spec(count, milli)}}


def task_pod(task: Task, cluster: Cluster, index: int) -> TaskPod:
    """The Pod a task becomes in this cluster's mode (`index`: its position, for a unique UID)."""
    container: dict[str, Any]
    if not task.gpus:
        container = {"name": "main", "image": _IMAGE, "resources": {"requests": {
            "cpu": f"{task.cpu_milli}m", "memory": f"{task.memory_mib}Mi"}}}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": task.name, "namespace": NAMESPACE, "uid": f"uid-{index}-{task.name}"},
               "spec": {"schedulerName": "default-scheduler", "containers": [container]},
               "status": {"phase": "Pending"}}
        return TaskPod(pod, f"{NAMESPACE}/{task.name}", task.cpu_milli, task.memory_mib, (), (), gpu=False)
    limits: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if task.models:
        annotations[n.ANN_PRODUCTS] = ",".join(_product_of(m) for m in task.models)
    spec: dict[str, Any] = {"schedulerName": "gpu-placement", "restartPolicy": "Never"}
    extended: tuple[tuple[str, int], ...] = ()
    asks: tuple[tuple[str, int, tuple[tuple[str, int], ...]], ...] = ()
    template = ""
    ns = NAMESPACE
    if cluster.mode == DRA:
        template = _template_name(task.gpus, task.milli)
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
        asks = ((GPU_CLASS, task.gpus, ((CAPACITY, task.milli * 1000),) if task.milli < MILLI else ()),)
    elif task.share and cluster.replicas > 1 and task.milli <= MILLI // cluster.replicas:
        ns, extended = SHARED_NAMESPACE, ((SHARED_RESOURCE, 1),)
    else:
        extended = ((n.GPU_RESOURCE, task.gpus),)
    limits.update({res: str(count) for res, count in extended})
    requests = {"cpu": f"{task.cpu_milli}m", "memory": f"{task.memory_mib}Mi", **limits}
    container = {"name": "main", "image": _IMAGE, "resources": {"requests": requests, "limits": dict(limits)}}
    if cluster.mode == DRA:
        container["resources"]["claims"] = [{"name": "gpu"}]
    spec["containers"] = [container]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": task.name, "namespace": ns, "uid": f"uid-{index}-{task.name}",
                        "labels": {"app": "openb"}, "annotations": annotations},
           "spec": spec, "status": {"phase": "Pending"}}
    return TaskPod(pod, f"{ns}/{task.name}", task.cpu_milli, task.memory_mib, extended, asks, template)


def claim_object(pod: TaskPod, node: str, results: Sequence[tuple[str, tuple[tuple[str, int], ...]]],
                 count: int, milli: int) -> dict[str, Any]:
    """The ResourceClaim kube-controller-manager made from the pod's template, with the allocation
    kube-scheduler's DRA plugin wrote (status.allocation: one result per device, consumedCapacity for
    shareable ones), reserved for the pod."""
    meta = pod.pod["metadata"]
    allocated = []
    for device, consumed in results:
        result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}
        if consumed:
            result["consumedCapacity"] = {name: _quantity(amount) for name, amount in consumed}
        allocated.append(result)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"{meta.get('name')}-gpu", "namespace": meta.get("namespace"),
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"),
                                              "uid": meta.get("uid"), "controller": True}]},
            "spec": _claim_spec(count, milli),
            "status": {"allocation": {"devices": {"results": allocated},
                                      "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                                          {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
                       "reservedFor": [{"resource": "pods", "name": meta.get("name"), "uid": meta.get("uid")}]}}


def _quantity(milli_units: int) -> str:
    return str(milli_units // 1000) if milli_units % 1000 == 0 else f"{milli_units}m"


def read_node_source(path: str | Path) -> list[ReplayNode]:
    """`--nodes`: the trace's node CSV, or a snapshot file or folder of Kubernetes JSON/YAML."""
    from gpu_placement.replay.trace import read_nodes_csv
    from gpu_placement.view.snapshot import SnapshotError, read_objects

    source = Path(path)
    if source.is_file() and source.suffix.lower() == ".csv":
        return _nodes_from_rows(read_nodes_csv(source))
    try:
        return nodes_from_objects(read_objects(source), str(source))
    except SnapshotError as exc:
        raise TraceError(str(exc)) from None
