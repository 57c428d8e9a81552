"""The survey's facts per GPU node, and the fleet grouped per pool and product.

How a node is managed is read from what runs on it and from its labels, the way the GPU Operator
itself decides (NVIDIA/gpu-operator controllers/state_manager.go): its operands are DaemonSets in
the operator's namespace that select `nvidia.com/gpu.deploy.<component>=true`, and
`nvidia.com/gpu.deploy.operands=false` keeps every one of them off a node. The driver is the
operator's when its driver DaemonSet runs there (`nvidia.com/gpu.deploy.driver=true`); its
k8s-driver-manager writes `nvidia.com/gpu.deploy.driver=pre-installed` when it finds a driver on the
host (NVIDIA/k8s-driver-manager cmd/driver-manager, `disableContainerizedDriver`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.base.cuda import format_version
from gpu_placement.decide.rules import node_readiness
from gpu_placement.facts.nodes import NodeFacts
from gpu_placement.report.nodes import natural
from gpu_placement.survey.labels import LabelWriters, label_writers
from gpu_placement.view.cluster import ClusterView

__all__ = ["CLOUD_POOL_LABELS", "MANAGED", "NFD_NVIDIA_PCI", "OPERANDS_LABEL", "PREINSTALLED", "UNMANAGED",
           "NodeSurvey", "PoolProduct", "gpu_signs", "inventory", "is_device_plugin", "is_operand", "survey_nodes"]

MANAGED = "gpu-operator"
PREINSTALLED = "gpu-operator, pre-installed driver"
UNMANAGED = "not managed"
OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"
DRIVER_DEPLOY_LABEL = "nvidia.com/gpu.deploy.driver"
# NFD's PCI labels for NVIDIA devices: what makes the GPU Operator set nvidia.com/gpu.present=true
# (gpuNodeLabels in NVIDIA/gpu-operator controllers/state_manager.go).
NFD_NVIDIA_PCI = ("feature.node.kubernetes.io/pci-10de.present", "feature.node.kubernetes.io/pci-0302_10de.present",
                  "feature.node.kubernetes.io/pci-0300_10de.present")
# Node pools as the clouds and Karpenter label them, for clusters whose configuration names no pools.
CLOUD_POOL_LABELS = ("cloud.google.com/gke-nodepool", "eks.amazonaws.com/nodegroup", "karpenter.sh/nodepool",
                     "kubernetes.azure.com/agentpool", "agentpool", "node.kubernetes.io/pool")
NO_POOL = "-"


@dataclass(slots=True, frozen=True)
class NodeSurvey:
    """One GPU node as the survey reports it."""

    name: str
    pool: str  # the configured pool, else a cloud node-pool label, else "-"
    product: str
    gpus: int
    driver: str | None
    max_cuda: str | None
    mig: str  # "off", "single 1g.10gb", "mixed 2x1g.10gb+1x3g.40gb"
    sharing: str  # "none", "time-slicing x8", "mps x4"
    allocation: str  # "device plugin", "DRA", "device plugin + DRA", "none"
    management: str  # MANAGED, PREINSTALLED or UNMANAGED
    state: str  # "ready", or the readiness reason code (NotValidated, NoGPU, DriverUpgrade, ...)
    why: str  # the readiness sentence when not ready
    hand_labels: dict[str, str] = field(default_factory=dict)  # label -> the writers that are not the stack's
    writers_known: bool = True  # the node carries managedFields
    operands: tuple[str, ...] = ()  # the GPU Operator's pods on the node
    foreign_plugins: tuple[str, ...] = ()  # device plugin pods not of the operator, on the node
    cordoned: bool = False
    rollout: str = "done"  # the node's rollout state (soak.py): done, pending, upgrading, soaking, failed

    @property
    def publishes(self) -> bool:
        return self.allocation != "none"

    def json(self) -> dict[str, Any]:
        return {"node": self.name, "pool": self.pool, "product": self.product, "gpus": self.gpus,
                "driver": self.driver, "maxCuda": self.max_cuda, "mig": self.mig, "sharing": self.sharing,
                "allocation": self.allocation, "management": self.management, "state": self.state,
                "why": self.why, "handLabels": sorted(self.hand_labels), "labelWritersKnown": self.writers_known,
                "cordoned": self.cordoned, "rollout": self.rollout}


@dataclass(slots=True)
class PoolProduct:
    """The inventory row of one pool and product."""

    pool: str
    product: str
    nodes: list[NodeSurvey]

    def json(self) -> dict[str, Any]:
        return {"pool": self.pool, "product": self.product, "nodes": len(self.nodes),
                "gpus": sum(node.gpus for node in self.nodes), "drivers": _counts(n.driver for n in self.nodes),
                "maxCuda": _counts(n.max_cuda for n in self.nodes), "mig": _counts(n.mig for n in self.nodes),
                "sharing": _counts(n.sharing for n in self.nodes),
                "allocation": _counts(n.allocation for n in self.nodes),
                "management": _counts(n.management for n in self.nodes),
                "states": _counts(n.state for n in self.nodes), "nodeDetails": [n.json() for n in self.nodes]}


def _counts(values: Iterable[str | None]) -> dict[str, int]:
    counted = Counter(value or "unknown" for value in values)
    return dict(sorted(counted.items(), key=lambda item: (-item[1], item[0])))


def is_operand(pod: Mapping[str, Any], config: Config) -> bool:
    """A GPU Operator operand: its DaemonSets' pods in the operator's namespace (app=nvidia-*,
    gpu-feature-discovery, the validator and driver selectors). NFD's worker runs there on every node,
    GPU or not, and the operator's own Deployment runs anywhere: neither counts."""
    meta = pod.get("metadata") or {}
    if (meta.get("namespace") or "default") != config.validator.namespace:
        return False
    labels = meta.get("labels") or {}
    app = str(labels.get("app") or "")
    return (app.startswith("nvidia-") or app == "gpu-feature-discovery" or config.validator.selector.matches(labels)
            or config.rollout.driver_selector.matches(labels))


def is_device_plugin(pod: Mapping[str, Any], config: Config) -> bool:
    """A device plugin pod installed outside the GPU Operator (NVIDIA's static manifest or its Helm chart)."""
    meta = pod.get("metadata") or {}
    if (meta.get("namespace") or "default") == config.validator.namespace:
        return False
    names = [str(meta.get("name") or ""), *(str(v) for v in (meta.get("labels") or {}).values())]
    return any("nvidia-device-plugin" in name for name in names)


def survey_nodes(view: ClusterView, config: Config, node_objects: Mapping[str, Mapping[str, Any]],
                 pods: Iterable[Mapping[str, Any]], rollout_state: Mapping[str, str] | None = None,
                 shown: Mapping[str, tuple[str, str]] | None = None) -> list[NodeSurvey]:
    """Every GPU node: GPUs present by its labels or NFD's, published by a device plugin or DRA. `shown`:
    each node's state and why, as `gpu-placement nodes` decides it (report.nodes.node_state); without
    it, its readiness alone."""
    operands: dict[str, list[str]] = {}
    plugins: dict[str, list[str]] = {}
    drivers: set[str] = set()  # nodes where the operator's driver DaemonSet runs a pod
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        if is_operand(pod, config):
            operands.setdefault(node, []).append(key)
            labels = meta.get("labels") or {}
            if config.rollout.driver_selector.matches(labels) or labels.get("app") == "nvidia-driver-daemonset":
                drivers.add(node)
        elif is_device_plugin(pod, config):
            plugins.setdefault(node, []).append(key)
    found = []
    with view.lock:
        for name in sorted(view.nodes, key=natural):  # x13 before x103, as a person reads them
            facts = view.nodes[name]
            obj = node_objects.get(name) or {}
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if not (facts.dra_devices > 0 or any(facts.allocatable.values()) or gpu_signs(obj, config)):
                continue
            if shown is not None and name in shown:
                state, why = shown[name]
            else:
                verdict = node_readiness(facts, view.validator_state(name), config)
                state, why = ("ready", "") if verdict is None else (verdict.code, verdict.message.split(": ", 1)[1])
                if verdict is None and facts.problems:
                    state, why = "BadLabel", "; ".join(sorted(facts.problems.values()))
            writers = label_writers(obj)
            found.append(NodeSurvey(
                name=name, pool=_pool_of(facts, labels), product=facts.product or "unknown", gpus=_gpus(facts),
                driver=format_version(facts.driver) if facts.driver else None,
                max_cuda=format_version(facts.max_cuda) if facts.max_cuda else None,
                mig=_mig(facts), sharing=_sharing(facts), allocation=_allocation(facts),
                management=_management(labels, bool(operands.get(name)), name in drivers, writers),
                state=state, why=why, hand_labels=writers.by_hand(labels), writers_known=writers.known,
                operands=tuple(sorted(operands.get(name, []))), foreign_plugins=tuple(sorted(plugins.get(name, []))),
                cordoned=facts.unschedulable, rollout=(rollout_state or {}).get(name, "done")))
    return found


def gpu_signs(node: Mapping[str, Any], config: Config) -> list[str]:
    """What says a Node has NVIDIA GPUs, one phrase each; none: it has no GPU as far as the cluster can tell.
    - NFD's NVIDIA PCI label: the hardware, as nfd-worker read it, and what the GPU Operator itself looks
      for before it deploys anything there (gpuNodeLabels, NVIDIA/gpu-operator controllers/state_manager.go);
    - an NVIDIA GPU label: nvidia.com/gpu.present=true, nvidia.com/gpu.count above 0, nvidia.com/gpu.product
      (GPU Feature Discovery's, a cloud's node pool, or a person's);
    - a GPU resource in its capacity: a device plugin registered GPUs there.
    (The survey also counts DRA devices, which it reads from ResourceSlices.)"""
    labels = (node.get("metadata") or {}).get("labels") or {}
    capacity = (node.get("status") or {}).get("capacity") or {}
    signs = [f"{key}=true" for key in NFD_NVIDIA_PCI if labels.get(key) == "true"][:1]
    if labels.get(n.GPU_PRESENT) == "true":
        signs.append(f"{n.GPU_PRESENT}=true")
    if _positive(labels.get(n.GPU_COUNT)):
        signs.append(f"{n.GPU_COUNT}={labels[n.GPU_COUNT]}")
    if labels.get(n.GPU_PRODUCT):
        signs.append(f"{n.GPU_PRODUCT}={labels[n.GPU_PRODUCT]}")
    for resource, quantity in sorted(capacity.items()) if isinstance(capacity, dict) else ():
        if (config.is_gpu_resource(str(resource)) or str(resource).startswith("nvidia.com/")) and _positive(quantity):
            signs.append(f"{resource} {quantity} in its capacity")
    return signs


def _positive(value: Any) -> bool:
    """A whole count above 0 (GPU counts and device plugin quantities are whole numbers)."""
    try:
        return int(str(value).strip()) > 0
    except ValueError:
        return False


def _pool_of(facts: NodeFacts, labels: Mapping[str, str]) -> str:
    if facts.pool:
        return facts.pool
    return next((str(labels[key]) for key in CLOUD_POOL_LABELS if labels.get(key)), NO_POOL)


def _gpus(facts: NodeFacts) -> int:
    if facts.count is not None:
        return facts.count
    whole = facts.capacity.get(n.GPU_RESOURCE, 0)
    return whole // facts.replicas if whole and facts.replicas > 1 else whole or facts.dra_devices


def _mig(facts: NodeFacts) -> str:
    profile = facts.mig_single_profile
    if profile:
        return f"single {profile}"
    if facts.mig:
        return "mixed " + "+".join(f"{p.count}x{name}" for name, p in sorted(facts.mig.items()))
    if facts.mig_config_state not in (None, "success"):
        return f"changing ({facts.mig_config_state})"
    return "off"


def _sharing(facts: NodeFacts) -> str:
    if facts.replicas > 1:
        return f"{facts.sharing if facts.sharing != 'none' else 'time-slicing'} x{facts.replicas}"
    return "none"


def _allocation(facts: NodeFacts) -> str:
    ways = (["device plugin"] if any(count > 0 for count in facts.allocatable.values()) else []) + (
        ["DRA"] if facts.dra_devices else [])
    return " + ".join(ways) or "none"


def _management(labels: Mapping[str, str], operands: bool, driver_pod: bool, writers: LabelWriters) -> str:
    if labels.get(OPERANDS_LABEL) == "false":
        return UNMANAGED
    deploy = {k: v for k, v in labels.items() if k.startswith(n.DEPLOY_PREFIX) and k != OPERANDS_LABEL}
    # Without its pods in the view (a snapshot of nodes only), the operator's deploy labels still say it
    # takes the node: written by the operator, or by anyone when the writers are unknown.
    labelled = any(value in ("true", "pre-installed") and (not writers.known or writers.written_by(key, "gpu-operator")
                                                            or writers.written_by(key, "driver-manager"))
                   for key, value in deploy.items())
    if not operands and not labelled:
        return UNMANAGED
    driver = str(labels.get(DRIVER_DEPLOY_LABEL) or "")
    # k8s-driver-manager pauses the operator's driver as paused-for-driver-upgrade: still the operator's.
    if driver_pod or driver == "true" or driver.startswith("paused-"):
        return MANAGED
    return PREINSTALLED


def inventory(nodes: Iterable[NodeSurvey]) -> list[PoolProduct]:
    groups: dict[tuple[str, str], list[NodeSurvey]] = {}
    for node in nodes:
        groups.setdefault((node.pool, node.product), []).append(node)
    return [PoolProduct(pool, product, members) for (pool, product), members
            in sorted(groups.items(), key=lambda item: (item[0][0] == NO_POOL, item[0]))]
