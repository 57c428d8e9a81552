"""Pods as the rules see them: GPU requests by Kubernetes' effective-request rule, and slim records.

`PodRecord` is what the cluster view keeps for every pod (30 pods a node at 15,000 nodes is
450,000 of them): a handful of fields, no raw dicts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.quantity import QuantityError, cpu_to_milli, quantity_to_int
from gpu_placement.facts.launch import Launch, launch_of, unhealthy
from gpu_placement.facts.sharing import is_standin
from gpu_placement.facts.soak import OperatorPod, operator_pod_from_json

__all__ = ["MAX_GPU_COUNT", "GpuRequests", "PodRecord", "container_gpu_requests", "cpu_request",
           "effective_gpu_requests", "pod_from_json", "pod_key", "pod_priority", "resource_version",
           "soft_placement"]

# ((resource, count), ...) sorted by resource: hashable, so it can key caches.
GpuRequests = tuple[tuple[str, int], ...]
# The most of one GPU resource a pod may ask for. The largest nodes have 8 or 16 GPUs; MIG gives at
# most 7 slices of each and time-slicing or MPS a few dozen replicas, so no node offers anywhere near
# 1024 units of one resource, and a count past it (2**64 in a manifest) is a mistake, refused as bad
# input before it reaches arithmetic, JSON encoders (64-bit integers) or messages.
MAX_GPU_COUNT = 1024
_TERMINAL = frozenset({"Succeeded", "Failed"})


@dataclass(slots=True, frozen=True)
class PodRecord:
    namespace: str
    name: str
    uid: str
    node: str | None
    active: bool  # not Succeeded/Failed: still holds what it was given
    gpus: GpuRequests
    memory_annotation: str | None  # raw gpu-placement.io/gpu-memory; parsed where it is charged
    validator_ready: bool | None  # None: not a GPU Operator validator pod
    priority: int = 0  # spec.priority (set by the API server from the PriorityClass): who may preempt whom
    waits_for: str | None = None  # a validator pod not bound yet: the node its DaemonSet made it for
    claims: bool = False  # a validator pod that takes a device through a ResourceClaim (GPU Operator's DRA validator)
    # GPU pods only (the rest are never weighed against a PodDisruptionBudget or held for): their labels,
    # for the budgets that select them, and status.nominatedNodeName while unbound (preemption made room).
    labels: tuple[tuple[str, str], ...] = ()
    nominated: str | None = None
    # metadata.resourceVersion: the same version is the same object, so a relist reuses the record it
    # has instead of building it again (Ingest.relist). Not part of equality: a change the rules do
    # not read still compares equal, and the view skips it.
    version: int = field(default=0, compare=False)
    failed: bool = False  # phase Failed: counted per driver version (rollout metrics)
    # A pod not done whose claims from ResourceClaimTemplates are not all made yet: those templates' names
    # (gpu_placement/controllers/templates.py keeps an old template of ours while a pod waits on it).
    claim_templates: tuple[str, ...] = ()
    operator: OperatorPod | None = None  # a GPU Operator driver or validator pod: what the rollout reads
    # A claim pod's stand-in resources (gpu-placement.io/*, one per device of a level:
    # gpu_placement/decide/dra_quota.py),
    # by the effective-request rule: what the API server's pod quota charges it.
    standins: GpuRequests = ()
    launch: Launch | None = None  # GPU pods only: how its launch went, for the outcome metrics (launch.py)
    # Allocated resources its kubelet reports Unhealthy (KEP-4680): (name, resourceID, message); and then, to
    # find the devices, its claims' names: (its entry in spec.resourceClaims, the ResourceClaim's name).
    unhealthy: tuple[tuple[str, str, str], ...] = ()
    claim_names: tuple[tuple[str, str], ...] = ()
    cpu_milli: int = 0  # CPU requested (milli), read only for the fragmentation score (Ingest says when)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def pod_from_json(obj: Mapping[str, Any], is_gpu_resource: Callable[[str], bool],
                  is_validator: Callable[[str, Mapping[str, str]], bool],
                  is_driver: Callable[[str, Mapping[str, str]], bool] | None = None,
                  scheduler: str | None = None,
                  with_cpu: bool = False,
                  is_plugin: Callable[[str, Mapping[str, str]], bool] | None = None) -> PodRecord:
    """`scheduler`: gpu-placement's schedulerName, to tell the GPU pods it placed (Launch.placed)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    namespace = sys.intern(str(meta.get("namespace") or "default"))  # one string per namespace, not per pod
    labels = meta.get("labels") or {}
    validator = is_validator(namespace, labels)
    validator_ready = _is_ready(status) if validator else None
    plugin = not validator and is_plugin is not None and is_plugin(namespace, labels)
    operator = validator or plugin or (is_driver is not None and is_driver(namespace, labels))
    try:
        gpus = effective_gpu_requests(spec, is_gpu_resource)
        standins = effective_gpu_requests(spec, is_standin) if spec.get("resourceClaims") else ()
    except QuantityError:
        gpus = standins = ()  # the API server validates quantities; a broken one cannot have been scheduled
    waits_for = _daemon_node(spec) if validator_ready is not None and not spec.get("nodeName") else None
    node = sys.intern(spec["nodeName"]) if spec.get("nodeName") else None
    nominated = status.get("nominatedNodeName") if gpus and not node else None
    sick = unhealthy(status) if node and status.get("containerStatuses") else ()
    annotations = meta.get("annotations") or {}
    # A claim pod gpu-placement's webhook routed for its GPU claims has a launch to count too.
    routed = bool(spec.get("resourceClaims")) and '"claims"' in str(annotations.get(n.ANN_ADMITTED) or "")
    return PodRecord(
        namespace=namespace,
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        node=node,
        active=status.get("phase") not in _TERMINAL,
        gpus=gpus,
        memory_annotation=(meta.get("annotations") or {}).get(n.ANN_GPU_MEMORY),
        validator_ready=validator_ready,
        priority=pod_priority(spec),
        waits_for=waits_for,
        claims=validator_ready is not None and bool(spec.get("resourceClaims")),
        labels=_labels(labels) if gpus and labels else (),
        nominated=sys.intern(nominated) if isinstance(nominated, str) and nominated else None,
        version=resource_version(meta),
        failed=status.get("phase") == "Failed",
        operator=operator_pod_from_json(obj, plugin) if operator and spec.get("nodeName") else None,
        claim_templates=_awaited_templates(spec, status) if status.get("phase") not in _TERMINAL else (),
        standins=standins,
        launch=launch_of(obj, is_gpu_resource, scheduler) if gpus or routed else None,
        unhealthy=sick,
        claim_names=_claim_names(status) if sick else (),
        cpu_milli=cpu_request(spec) if with_cpu else 0,
    )


def _claim_names(status: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The pod's claims by its own name for them (status.resourceClaimStatuses), and the claim
    kube-scheduler made for its extended resources (status.extendedResourceClaimStatus), by its own name:
    what `claim:<name>` in allocatedResourcesStatus refers to."""
    names: list[tuple[str, str]] = []
    for entry in status.get("resourceClaimStatuses") or ():
        if isinstance(entry, Mapping) and entry.get("name") and entry.get("resourceClaimName"):
            names.append((str(entry["name"]), str(entry["resourceClaimName"])))
    extended = status.get("extendedResourceClaimStatus")
    if isinstance(extended, Mapping) and extended.get("resourceClaimName"):
        names.append((str(extended["resourceClaimName"]), str(extended["resourceClaimName"])))
    return tuple(names)


def _awaited_templates(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[str, ...]:
    """The templates named by the pod's `spec.resourceClaims` whose claim `status.resourceClaimStatuses`
    does not record yet. kube-controller-manager's resourceclaim controller creates each claim from its
    template and then records its name there, in the same sync (pkg/controller/resourceclaim/controller.go
    `syncPod`, v1.37.2); until then (a create refused by quota, say) it needs the template to exist."""
    entries = spec.get("resourceClaims")
    if not entries or not isinstance(entries, list):
        return ()
    recorded = status.get("resourceClaimStatuses")
    made = {s.get("name") for s in recorded if isinstance(s, Mapping) and s.get("resourceClaimName")} if (
        isinstance(recorded, list)) else set()
    return tuple(sorted({sys.intern(str(e["resourceClaimTemplateName"])) for e in entries
                         if isinstance(e, Mapping) and isinstance(e.get("resourceClaimTemplateName"), str)
                         and e.get("name") not in made}))


def cpu_request(spec: Mapping[str, Any]) -> int:
    """The pod's CPU request (milli) by Kubernetes' effective-request rule, as kube-scheduler charges it
    to the node: app containers together, or an init container's alone when that is more; a broken
    quantity counts as 0 (the API server would have refused it)."""
    def cpu(container: Any) -> int:
        requests = ((container or {}).get("resources") or {}).get("requests") or {} if isinstance(container,
                                                                                                   Mapping) else {}
        try:
            return cpu_to_milli(requests["cpu"]) if "cpu" in requests else 0
        except (QuantityError, TypeError):
            return 0

    app = sum(cpu(c) for c in spec.get("containers") or ())
    inits = [cpu(c) for c in spec.get("initContainers") or () if (c or {}).get("restartPolicy") != "Always"]
    sidecars = sum(cpu(c) for c in spec.get("initContainers") or () if (c or {}).get("restartPolicy") == "Always")
    return max(app + sidecars, max(inits, default=0) + sidecars)


def resource_version(meta: Mapping[str, Any]) -> int:
    """metadata.resourceVersion as a number (etcd's revision), 0 when there is none to go by."""
    version = meta.get("resourceVersion")
    return int(version) if isinstance(version, str) and version.isdigit() and len(version) < 20 else 0


def _labels(labels: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(labels, Mapping):
        return ()
    return tuple(sorted((sys.intern(str(key)), str(value)) for key, value in labels.items()))


def _daemon_node(spec: Mapping[str, Any]) -> str | None:
    """The node a DaemonSet pod is for: the controller pins each pod with a required node affinity term
    `matchFields metadata.name In [node]` (pkg/controller/daemon/util ReplaceDaemonSetPodNodeNameNodeAffinity)."""
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or ():
        for requirement in term.get("matchFields") or ():
            values: Sequence[Any] = requirement.get("values") or ()
            if requirement.get("key") == "metadata.name" and requirement.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return None


def pod_priority(spec: Mapping[str, Any]) -> int:
    """kube-scheduler's `corev1helpers.PodPriority`: `spec.priority`, 0 when unset."""
    priority = spec.get("priority")
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0


def soft_placement(spec: Mapping[str, Any]) -> bool:
    """Whether the pod asks kube-scheduler's own scoring for something: a topology spread constraint with
    `whenUnsatisfiable: ScheduleAnyway`, or a preferred node affinity, pod affinity or anti-affinity term
    (PodTopologySpread, NodeAffinity and InterPodAffinity score these; they act only among several nodes)."""
    for constraint in spec.get("topologySpreadConstraints") or ():
        if isinstance(constraint, Mapping) and constraint.get("whenUnsatisfiable") == "ScheduleAnyway":
            return True
    affinity = spec.get("affinity")
    if not isinstance(affinity, Mapping):
        return False
    return any(isinstance(kind, Mapping) and kind.get("preferredDuringSchedulingIgnoredDuringExecution")
               for kind in (affinity.get("nodeAffinity"), affinity.get("podAffinity"),
                            affinity.get("podAntiAffinity")))


def _is_ready(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def container_gpu_requests(container: Mapping[str, Any], is_gpu_resource: Callable[[str], bool]
                           ) -> dict[str, int]:
    """GPU resources of one container. Extended resources may be given as limits only: then the
    request equals the limit (and when both are given they must be equal)."""
    resources = container.get("resources") or {}
    asked: dict[str, int] = {}
    for section in ("limits", "requests"):
        for name, value in (resources.get(section) or {}).items():
            if is_gpu_resource(name):
                asked[name] = quantity_to_int(value)
    return asked


def effective_gpu_requests(spec: Mapping[str, Any], is_gpu_resource: Callable[[str], bool]) -> GpuRequests:
    """Kubernetes' effective request per resource: the larger of what app containers (plus sidecars)
    hold together and what each init container needs while it runs (plus sidecars started before it)."""
    containers: Sequence[Any] = spec.get("containers") or ()
    inits = spec.get("initContainers")
    if not inits:  # most pods: what the app containers ask (one list of 150,000 is this path)
        if len(containers) == 1:
            app = container_gpu_requests(containers[0], is_gpu_resource)
        else:
            app = _sum(container_gpu_requests(c, is_gpu_resource) for c in containers)
        return tuple(sorted((name, count) for name, count in app.items() if count > 0)) if app else ()
    app = _sum(container_gpu_requests(c, is_gpu_resource) for c in containers)
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for init in inits:
        asked = container_gpu_requests(init, is_gpu_resource)
        if init.get("restartPolicy") == "Always":  # a sidecar: keeps running beside the app
            sidecars = _sum((sidecars, asked))
        else:
            peak = _max(peak, _sum((sidecars, asked)))
    total = _max(_sum((app, sidecars)), peak)
    return tuple(sorted((name, count) for name, count in total.items() if count > 0))


def _sum(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for name, count in part.items():
            total[name] = total.get(name, 0) + count
    return total


def _max(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {name: max(a.get(name, 0), b.get(name, 0)) for name in a.keys() | b.keys()}
