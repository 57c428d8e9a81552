"""RFC 6902 JSON Patches that shape a pod, computed from the pod as it is, so they are idempotent.

Every operation compares the pod with what it should be and emits only the difference: a pod that
already went through (the API server may call a mutating webhook again after other webhooks ran)
gets an empty patch. Missing parents are created whole (`add /spec/tolerations [...]`), never
appended into (`add /spec/tolerations/-` on a pod without tolerations is an error).

Node affinity: Kubernetes ORs `nodeSelectorTerms` and ANDs the expressions inside one term. Adding a
constraint C to a pod whose terms are T1..Tn therefore means (T1 or .. or Tn) and C: C goes into every
term, and a C that is itself a choice (several pools: P1 or .. or Pm) multiplies the terms out to
Ti and Pj. Terms that already imply C are kept as they are, which is also what makes the patch empty
the second time. An empty term matches no node in Kubernetes; it is kept empty, so it still matches none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from gpu_placement.base import names as n
from gpu_placement.base.config import Config, Pool
from gpu_placement.base.quantity import to_count
from gpu_placement.facts.pods import GpuRequests, effective_gpu_requests
from gpu_placement.facts.policy import Sharing

__all__ = ["Patch", "admitted_value", "asks_for_gpu_nodes", "claim_patch", "escape", "gpu_patch", "protect_patch",
           "shaped_requests", "tolerates_gpu_taint"]

Patch = list[dict[str, Any]]
Expression = dict[str, Any]
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_DEFAULT_SCHEDULER = "default-scheduler"
GPU_PRESENT_TRUE = {n.GPU_PRESENT: "true"}
_KEEP_OFF_GPU: Expression = {"key": n.GPU_PRESENT, "operator": "NotIn", "values": ["true"]}
# Off the nodes gpu-placement refuses every GPU pod for (controllers/refused_nodes.py): kube-scheduler's
# NodeAffinity drops them before its sample of nodes is counted (config refusedNodeLabel).
_NOT_REFUSED: Expression = {"key": n.LABEL_REFUSED, "operator": "DoesNotExist"}


def escape(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901): `~` first, then `/`."""
    return token.replace("~", "~0").replace("/", "~1")


def gpu_patch(pod: Mapping[str, Any], gpus: GpuRequests, sharing: Sharing, pools: Sequence[Pool],
              memory_default: str | None, config: Config, keep_scheduler: bool = False,
              served_by_dra: Callable[[str], bool] = lambda _resource: False) -> Patch:
    """Shape a GPU pod (whose effective GPU request is `gpus`): resource rewrite, tolerations, node
    selection, scheduler (not with `keep_scheduler`: DaemonSet pods, which the DaemonSet controller
    pins to one node each), our annotations. `served_by_dra`: whether a DRA DeviceClass serves the
    resource where a node lacks it (DRAExtendedResource): a pod asking only such resources gets no
    nvidia.com/gpu.present selector, which a node whose GPUs only the DRA driver gives may lack (no GPU
    Feature Discovery); kube-scheduler keeps it off nodes without devices (DynamicResources)."""
    spec: Mapping[str, Any] = pod.get("spec") or {}
    ops: Patch = []
    gpus = _rewritten(spec, gpus, sharing.resource(config), config, ops)
    dra_only = bool(gpus) and all(served_by_dra(resource) for resource, _ in gpus)
    scheduler = _route(spec, pools, config, keep_scheduler, {} if dra_only else GPU_PRESENT_TRUE, ops)
    meta: Mapping[str, Any] = pod.get("metadata") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    wanted_annotations = {n.ANN_ADMITTED: admitted_value(sharing, gpus, pools, scheduler)}
    if memory_default is not None and n.ANN_GPU_MEMORY not in annotations:
        # The extender charges memory by this annotation; writing the namespace default on the pod
        # makes the charge independent of later namespace changes and visible to the user.
        wanted_annotations[n.ANN_GPU_MEMORY] = memory_default
    _set_annotations(pod, wanted_annotations, ops)
    return ops


def shaped_requests(pod: Mapping[str, Any], gpus: GpuRequests, sharing: Sharing, config: Config) -> GpuRequests:
    """The pod's effective GPU request as `gpu_patch` would leave it (audit mode checks what enforce
    mode would admit, without changing the pod)."""
    return _rewritten(pod.get("spec") or {}, gpus, sharing.resource(config), config, [])


def claim_patch(pod: Mapping[str, Any], classes: Sequence[str], pools: Sequence[Pool], config: Config,
                keep_scheduler: bool = False) -> Patch:
    """Route a pod whose ResourceClaims ask for a GPU device class (DRA) to the gpu-placement scheduler:
    tolerations, pool selection, scheduler, our record. No resource to rewrite and no GPU node label
    (a node may publish devices without GPU Feature Discovery): the DRA allocator knows where they are."""
    ops: Patch = []
    scheduler = _route(pod.get("spec") or {}, pools, config, keep_scheduler, {}, ops)
    value = orjson.dumps({"claims": list(classes), "pools": [pool.name for pool in pools], "scheduler": scheduler},
                         option=orjson.OPT_SORT_KEYS).decode()
    _set_annotations(pod, {n.ANN_ADMITTED: value}, ops)
    return ops


def _route(spec: Mapping[str, Any], pools: Sequence[Pool], config: Config, keep_scheduler: bool,
           selector: Mapping[str, str], ops: Patch) -> str:
    """Tolerations, node selection (`selector` plus the pools', and with `refusedNodeLabel`, for a pod gpu-placement
    schedules, not a refused node) and scheduler; returns the scheduler."""
    wanted = [*config.gpu_tolerations, *[t for pool in pools for t in pool.tolerations]] if pools else \
        config.gpu_tolerations
    _add_tolerations(spec, wanted, ops)
    selector = dict(selector)
    if len(pools) == 1:
        selector.update(pools[0].node_selector)
    if selector:
        _set_node_selector(spec, selector, ops)
    scheduler = spec.get("schedulerName") or ""
    if keep_scheduler:
        scheduler = scheduler or _DEFAULT_SCHEDULER
    elif scheduler in ("", _DEFAULT_SCHEDULER):
        ops.append({"op": "replace" if "schedulerName" in spec else "add", "path": "/spec/schedulerName",
                    "value": config.scheduler_name})
        scheduler = config.scheduler_name
    # Only a pod the extender judges: another scheduler never refused those nodes (a DaemonSet's pods included).
    refused = [_NOT_REFUSED] if config.refused_node_label and scheduler == config.scheduler_name else []
    if len(pools) > 1 and all(pool.node_selector for pool in pools):
        # A pool without a nodeSelector admits every node, so then the choice constrains nothing.
        choices = [[*({"key": key, "operator": "In", "values": [value]}
                      for key, value in sorted(pool.node_selector.items())), *refused] for pool in pools]
        _require(spec, choices, ops)
    elif refused:
        _require(spec, [refused], ops)  # into every term the pod has: (T1 or .. or Tn) and not refused
    return scheduler


def admitted_value(sharing: Sharing, gpus: GpuRequests, pools: Sequence[Pool], scheduler: str) -> str:
    """What /mutate decided, as compact JSON with sorted keys (the same decision gives the same text)."""
    return orjson.dumps({"sharing": sharing.text, "resources": dict(gpus), "pools": [pool.name for pool in pools],
                         "scheduler": scheduler}, option=orjson.OPT_SORT_KEYS).decode()


def tolerates_gpu_taint(spec: Mapping[str, Any], config: Config) -> bool:
    """A toleration for the GPU nodes' taint key (nvidia.com/gpu, or a key of gpuTolerations), or a
    bare `operator: Exists`, which tolerates every taint."""
    tolerations = spec.get("tolerations")
    if not tolerations:  # most pods
        return False
    keys = {n.GPU_RESOURCE, *(t.get("key") for t in config.gpu_tolerations if t.get("key"))}
    for toleration in tolerations:
        key = toleration.get("key") or ""
        if key in keys or (not key and toleration.get("operator") == "Exists"):
            return True
    return False


def asks_for_gpu_nodes(spec: Mapping[str, Any]) -> bool:
    """The pod's own node selection asks for GPU nodes: `nodeSelector` nvidia.com/gpu.present "true",
    or a required node affinity term with nvidia.com/gpu.present In [..."true"...]. Keeping such a pod
    off GPU nodes would make it (or that term) unschedulable by construction."""
    if (spec.get("nodeSelector") or {}).get(n.GPU_PRESENT) == "true":
        return True
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(_REQUIRED) or {}
    return any(expression.get("key") == n.GPU_PRESENT and expression.get("operator") == "In"
               and "true" in (expression.get("values") or ())
               for term in required.get("nodeSelectorTerms") or () for expression in term.get("matchExpressions") or ())


def protect_patch(pod: Mapping[str, Any]) -> Patch:
    """Keep a pod that asks for no GPU off GPU nodes: `nvidia.com/gpu.present NotIn [true]`, required."""
    ops: Patch = []
    _require(pod.get("spec") or {}, [[_KEEP_OFF_GPU]], ops)
    return ops


# -- pieces --------------------------------------------------------------------------------------------

def _rewritten(spec: Mapping[str, Any], gpus: GpuRequests, target: str, config: Config, ops: Patch) -> GpuRequests:
    """nvidia.com/gpu → target (ops appended); the effective GPU request afterwards."""
    if target == n.GPU_RESOURCE:
        return gpus
    rewritten = _rewrite_resources(spec, target, ops)
    asked = dict(gpus)
    if target in asked:  # both names asked for somewhere: the effective rule must be run again
        return effective_gpu_requests(rewritten, config.is_gpu_resource)
    if n.GPU_RESOURCE in asked:  # a pure rename: the effective request is the same figure
        asked[target] = asked.pop(n.GPU_RESOURCE)
        return tuple(sorted(asked.items()))
    return gpus


def _rewrite_resources(spec: Mapping[str, Any], target: str, ops: Patch) -> dict[str, Any]:
    """nvidia.com/gpu → target in requests and limits of every container; returns the spec's containers
    as they will be, for the admitted record."""
    after: dict[str, Any] = {}
    for field in ("initContainers", "containers"):
        containers = spec.get(field)
        if not containers:
            continue
        after[field] = []
        for index, container in enumerate(containers):
            resources: Mapping[str, Any] = container.get("resources") or {}
            new_resources: dict[str, Any] = {}
            for section in ("requests", "limits"):
                values: Mapping[str, Any] | None = resources.get(section)
                if not values or n.GPU_RESOURCE not in values:
                    if values:
                        new_resources[section] = values
                    continue
                base = f"/spec/{field}/{index}/resources/{section}/"
                new_values = {k: v for k, v in values.items() if k != n.GPU_RESOURCE}
                ops.append({"op": "remove", "path": base + escape(n.GPU_RESOURCE)})
                if target in values:  # both given: the pod asks for the sum of them
                    total = str(to_count(values[n.GPU_RESOURCE]) + to_count(values[target]))
                    ops.append({"op": "replace", "path": base + escape(target), "value": total})
                    new_values[target] = total
                else:
                    ops.append({"op": "add", "path": base + escape(target), "value": values[n.GPU_RESOURCE]})
                    new_values[target] = values[n.GPU_RESOURCE]
                new_resources[section] = new_values
            after[field].append({"resources": new_resources, "restartPolicy": container.get("restartPolicy")})
    return after


def _toleration_key(toleration: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (toleration.get("key") or "", toleration.get("operator") or "Equal", toleration.get("value") or "",
            toleration.get("effect") or "")


def _add_tolerations(spec: Mapping[str, Any], wanted: Sequence[Mapping[str, Any]], ops: Patch) -> None:
    existing = spec.get("tolerations")
    if existing and all(t in existing for t in wanted):  # each one there as written (a shaped pod): none missing
        return
    have = {_toleration_key(t) for t in existing or ()}
    missing = []
    for toleration in wanted:
        key = _toleration_key(toleration)
        if key not in have:
            have.add(key)
            missing.append(dict(toleration))
    if not missing:
        return
    if existing is None:
        ops.append({"op": "add", "path": "/spec/tolerations", "value": missing})
    else:
        ops.extend({"op": "add", "path": "/spec/tolerations/-", "value": t} for t in missing)


def _set_node_selector(spec: Mapping[str, Any], wanted: Mapping[str, str], ops: Patch) -> None:
    # The pool is the platform team's choice: it wins over a pod's own value for the same label.
    _set_entries(spec.get("nodeSelector"), "/spec/nodeSelector", wanted, ops)


def _set_entries(existing: Mapping[str, Any] | None, path: str, wanted: Mapping[str, str], ops: Patch) -> None:
    """Make the map at `path` hold `wanted`: one `add` of the whole map when it is missing (never an
    add into a parent that is not there), else an add or replace per key that differs."""
    if existing is None:
        ops.append({"op": "add", "path": path, "value": dict(wanted)})
        return
    for key, value in wanted.items():
        if existing.get(key) != value:
            ops.append({"op": "replace" if key in existing else "add", "path": f"{path}/{escape(key)}",
                        "value": value})


def _require(spec: Mapping[str, Any], choices: list[list[Expression]], ops: Patch) -> None:
    """AND (choice 1 OR choice 2 ...) into the pod's required node affinity."""
    affinity = spec.get("affinity")
    node = (affinity or {}).get("nodeAffinity")
    required = (node or {}).get(_REQUIRED)
    terms = (required or {}).get("nodeSelectorTerms")
    merged = _and_terms(terms or [], choices)
    if merged is None:
        return
    if affinity is None:
        ops.append({"op": "add", "path": "/spec/affinity",
                    "value": {"nodeAffinity": {_REQUIRED: {"nodeSelectorTerms": merged}}}})
    elif node is None:
        ops.append({"op": "add", "path": "/spec/affinity/nodeAffinity",
                    "value": {_REQUIRED: {"nodeSelectorTerms": merged}}})
    elif required is None:
        ops.append({"op": "add", "path": f"/spec/affinity/nodeAffinity/{_REQUIRED}",
                    "value": {"nodeSelectorTerms": merged}})
    else:
        ops.append({"op": "replace" if "nodeSelectorTerms" in required else "add",
                    "path": f"/spec/affinity/nodeAffinity/{_REQUIRED}/nodeSelectorTerms", "value": merged})


def _and_terms(terms: list[dict[str, Any]], choices: list[list[Expression]]) -> list[dict[str, Any]] | None:
    """(T1 or .. or Tn) and (C1 or .. or Cm) as terms; None when the terms already imply it."""
    if not terms:
        return [{"matchExpressions": [dict(e) for e in choice]} for choice in choices]
    merged: list[dict[str, Any]] = []
    changed = False
    for term in terms:
        expressions = term.get("matchExpressions") or []
        if not expressions and not term.get("matchFields"):
            merged.append(term)  # matches no node; ANDing into it would make it match some
            continue
        if any(all(e in expressions for e in choice) for choice in choices):
            merged.append(term)
            continue
        changed = True
        for choice in choices:
            added = [dict(e) for e in choice if e not in expressions]
            merged.append({**term, "matchExpressions": [*expressions, *added]})
    return merged if changed else None


def _set_annotations(pod: Mapping[str, Any], wanted: Mapping[str, str], ops: Patch) -> None:
    meta = pod.get("metadata")
    if meta is None:
        ops.append({"op": "add", "path": "/metadata", "value": {"annotations": dict(wanted)}})
        return
    _set_entries(meta.get("annotations"), "/metadata/annotations", wanted, ops)
