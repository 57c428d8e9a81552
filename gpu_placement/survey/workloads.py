"""The cluster's GPU workloads, one per controller: its pods, else its pod template.

A pod is named after the workload that made it (`NS/KIND/NAME`), the way a person names it: a pod of
a ReplicaSet whose name ends in the pod's `pod-template-hash` belongs to the Deployment of that name
(the Deployment controller names its ReplicaSets `<deployment>-<hash>`, pkg/controller/deployment
sync.go), a Job's pods to the CronJob that made the Job when the Job is in view. A workload with
running pods is judged by a pod as the API server stored it (the webhook's changes included); one
without (a CronJob between runs, a Deployment scaled to zero) by its template, passed through
`admit` when the caller has the webhook at hand, since the webhook adds its pool selection on the way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_placement.base.config import Config
from gpu_placement.facts.workloads import WorkloadError, pods_of

__all__ = ["Admit", "Workload", "gpu_workloads", "workload_of"]

Admit = Callable[[dict[str, Any], str], dict[str, Any]]  # (pod, namespace) -> the pod as the webhook makes it
_NOT_WORKLOADS = frozenset({"Node", "Pod", "Namespace", "ConfigMap", "Secret", "ResourceQuota", "PodDisruptionBudget",
                            "ClusterPolicy", "NVIDIADriver", "MutatingWebhookConfiguration",
                            "ValidatingWebhookConfiguration", "Lease", "EndpointSlice", "Service", "ResourceSlice",
                            "DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "DeviceTaintRule", "Event",
                            "NodeFeature", "NodeFeatureRule", "List"})
_TERMINAL = ("Succeeded", "Failed")


@dataclass(slots=True)
class Workload:
    ref: str  # NS/KIND/NAME
    namespace: str
    kind: str
    pods: list[dict[str, Any]] = field(default_factory=list)  # its active pods
    template: dict[str, Any] | None = None  # the pod its controller would make

    @property
    def pod(self) -> dict[str, Any] | None:
        """What the checks read: a running pod as stored, else the template."""
        return self.pods[0] if self.pods else self.template


def workload_of(pod: Mapping[str, Any], job_owners: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(kind, name) of what made the pod: Deployment, StatefulSet, DaemonSet, Job, CronJob, ..., or Pod."""
    meta = pod.get("metadata") or {}
    owners = meta.get("ownerReferences")
    owner = next((o for o in owners if isinstance(o, dict) and o.get("controller") and o.get("kind") and o.get("name")),
                 None) if isinstance(owners, list) else None
    if owner is None:
        return "Pod", str(meta.get("name") or "")
    kind, name = str(owner.get("kind") or "?"), str(owner.get("name") or "")
    if kind == "ReplicaSet":
        hash_ = (meta.get("labels") or {}).get("pod-template-hash")
        if hash_ and name.endswith(f"-{hash_}"):
            return "Deployment", name[:-len(hash_) - 1]
    if kind == "Job" and job_owners:
        namespace = meta.get("namespace") or "default"
        cron = job_owners.get(f"{namespace}/{name}")
        if cron:
            return "CronJob", cron
    return kind, name


def gpu_workloads(objects: Iterable[Mapping[str, Any]], config: Config, wants_gpu: Callable[[dict[str, Any]], bool],
                  admit: Admit | None = None) -> list[Workload]:
    """Every workload that asks for a GPU, outside the GPU Operator's own namespace (its validator
    takes a GPU to prove one works)."""
    objects = list(objects)
    job_owners = {f"{(o.get('metadata') or {}).get('namespace') or 'default'}/{o['metadata'].get('name')}": owner
                  for o in objects if o.get("kind") == "Job" and isinstance(o.get("metadata"), dict)
                  for owner in [_controller(o, "CronJob")] if owner}
    found: dict[str, Workload] = {}
    for obj in objects:
        kind = str(obj.get("kind") or "")
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        if namespace == config.validator.namespace:
            continue
        if kind == "Pod":
            if (obj.get("status") or {}).get("phase") in _TERMINAL or meta.get("deletionTimestamp"):
                continue
            owner_kind, name = workload_of(obj, job_owners)
            ref = f"{namespace}/{owner_kind}/{name}"
            found.setdefault(ref, Workload(ref, namespace, owner_kind)).pods.append(dict(obj))
        elif kind not in _NOT_WORKLOADS and isinstance(obj.get("spec"), dict) and not _finished(obj):
            if kind == "Job" and _controller(obj, "CronJob"):
                continue  # the CronJob's template stands for it
            try:
                templates = pods_of(obj)
            except WorkloadError:
                continue
            ref = f"{namespace}/{kind}/{meta.get('name')}"
            workload = found.setdefault(ref, Workload(ref, namespace, kind))
            template = next((t.pod for t in templates if wants_gpu(t.pod)), templates[0].pod if templates else None)
            if template is not None and admit is not None:
                template = admit(template, namespace)
            workload.template = template
    return [w for ref, w in sorted(found.items()) if w.pod is not None and wants_gpu(w.pod)]


def _controller(obj: Mapping[str, Any], kind: str) -> str | None:
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(owner, dict) and owner.get("controller") and owner.get("kind") == kind:
            return str(owner.get("name") or "")
    return None


def _finished(obj: Mapping[str, Any]) -> bool:
    """A Job that completed or failed for good makes no more pods."""
    if obj.get("kind") != "Job":
        return False
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
               if isinstance(c, dict))
