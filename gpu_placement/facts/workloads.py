"""The pods a workload makes: `explain` takes a Deployment, a Job or a PyTorchJob as readily as a Pod.

A controller creates each pod from a pod template (`{metadata, spec}`) with the workload's namespace, a
generated name and an owner reference, and some controllers add to it: the DaemonSet controller adds
tolerations for the node-condition taints (pkg/controller/daemon/util, `AddOrUpdateDaemonPodTolerations`)
and pins each pod to its node. Kinds not known here are searched for templates: any `template` whose
value holds a `spec` with `containers` (PyTorchJob's `spec.pytorchReplicaSpecs.Worker.template`,
Kubeflow's other jobs, Argo, RayCluster groups), each one a kind of pod to explain.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PodTemplate", "WorkloadError", "pods_of"]

# kind -> (where its template is, the kind that owns the pods it makes)
_KNOWN: dict[str, tuple[tuple[str, ...], str]] = {
    "Deployment": (("spec", "template"), "ReplicaSet"),
    "ReplicaSet": (("spec", "template"), "ReplicaSet"),
    "ReplicationController": (("spec", "template"), "ReplicationController"),
    "StatefulSet": (("spec", "template"), "StatefulSet"),
    "DaemonSet": (("spec", "template"), "DaemonSet"),
    "Job": (("spec", "template"), "Job"),
    "CronJob": (("spec", "jobTemplate", "spec", "template"), "Job"),
    "PodTemplate": (("template",), "PodTemplate"),
}
_DAEMONSET_TOLERATIONS = (  # added to every DaemonSet pod; NetworkUnavailable too with hostNetwork
    ("node.kubernetes.io/not-ready", "NoExecute"), ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"), ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"), ("node.kubernetes.io/unschedulable", "NoSchedule"))
_MAX_DEPTH = 12  # how deep an unknown kind is searched for templates


class WorkloadError(ValueError):
    """An object with no pod in it; the message names the kind and where templates were looked for."""


@dataclass(slots=True, frozen=True)
class PodTemplate:
    where: str  # "Deployment team-a/train (spec.template)", for the output
    pod: dict[str, Any]  # the pod the controller would create, before admission
    replicas: int | None = None
    note: str = ""  # what the controller does that explain's verdicts leave out


def pods_of(obj: Mapping[str, Any]) -> list[PodTemplate]:
    """The kinds of pod an object makes: itself for a Pod, one per template otherwise."""
    kind = str(obj.get("kind") or "Pod")
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or meta.get("generateName") or "")
    namespace = meta.get("namespace")
    called = f"{kind} {name}" if name else f"a {kind} without a name"
    if kind == "Pod":
        if not isinstance(obj.get("spec"), dict):
            raise WorkloadError("a Pod without a spec")
        return [PodTemplate(f"Pod {name}", copy.deepcopy(dict(obj)))]
    known = _KNOWN.get(kind)
    if known is not None:
        path, owner = known
        template = _at(obj, path)
        if not _is_template(template):
            raise WorkloadError(f"{called} has no pod template at {'.'.join(path)}")
        found = [(".".join(path), template, _replicas(obj, path))]
    else:
        owner = kind
        found = list(_templates(obj.get("spec"), "spec", 0))
        if not found:
            raise WorkloadError(f"{called}: no pod template found (looked for a `template` holding a spec with "
                                "containers anywhere under spec); explain a Pod or a workload with a pod template")
    templates = []
    for at, template, replicas in found:  # `at`: the template's path as text (`path` is the known one)
        pod = _pod(template, name, namespace, kind, owner, obj)
        note = ""
        if kind == "DaemonSet":
            _daemonset_tolerations(pod["spec"])
            note = ("the DaemonSet controller makes one such pod per node, each pinned to its node; the verdicts "
                    "say which nodes can run one")
        templates.append(PodTemplate(f"{kind} {f'{namespace}/' if namespace else ''}{name} ({at})", pod,
                                     replicas, note))
    return templates


def _pod(template: Mapping[str, Any], name: str, namespace: str | None, kind: str, owner: str,
         obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = copy.deepcopy(dict(template.get("metadata") or {}))
    if namespace:
        meta["namespace"] = namespace
    if kind == "StatefulSet":
        meta["name"] = f"{name}-0"
    else:
        meta.pop("name", None)
        meta["generateName"] = f"{name}-"
    meta["ownerReferences"] = [{"apiVersion": str(obj.get("apiVersion") or "v1"), "kind": owner, "name": name,
                                "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(dict(template["spec"]))}


def _daemonset_tolerations(spec: dict[str, Any]) -> None:
    tolerations = spec.setdefault("tolerations", [])
    wanted = list(_DAEMONSET_TOLERATIONS)
    if spec.get("hostNetwork"):
        wanted.append(("node.kubernetes.io/network-unavailable", "NoSchedule"))
    for key, effect in wanted:
        if not any(t.get("key") == key and t.get("effect") == effect for t in tolerations if isinstance(t, dict)):
            tolerations.append({"key": key, "operator": "Exists", "effect": effect})


def _is_template(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("spec"), dict) and \
        isinstance(value["spec"].get("containers"), list)


def _at(obj: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = obj
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _replicas(obj: Mapping[str, Any], path: tuple[str, ...]) -> int | None:
    holder = _at(obj, path[:-1])
    value = holder.get("replicas", holder.get("parallelism")) if isinstance(holder, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _templates(value: Any, path: str, depth: int) -> Iterator[tuple[str, dict[str, Any], int | None]]:
    """Every `template` holding a pod spec under `value`, in document order, with its sibling
    `replicas` when there is one (PyTorchJob's replica specs carry it)."""
    if depth > _MAX_DEPTH or not isinstance(value, dict):
        return
    for key, child in value.items():
        where = f"{path}.{key}"
        if key == "template" and _is_template(child):
            replicas = value.get("replicas")
            yield where, child, replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None
        elif isinstance(child, dict):
            yield from _templates(child, where, depth + 1)
        elif isinstance(child, list):
            for i, item in enumerate(child):
                yield from _templates(item, f"{where}[{i}]", depth + 1)
