"""One survey of a cluster: its objects (a snapshot, or a live read) and the core built on them."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_placement.base.names import REGISTERED_ANNOTATION
from gpu_placement.decide.bypass import Webhook
from gpu_placement.decide.kubefilters import KubeNodes
from gpu_placement.report.nodes import node_state
from gpu_placement.survey.findings import UNTOLERATED_TAINT, Context, Finding, find_all
from gpu_placement.survey.inventory import PoolProduct, inventory, survey_nodes
from gpu_placement.survey.workloads import Admit, gpu_workloads

__all__ = ["Survey", "run_survey", "webhook_from_objects"]


@dataclass(slots=True)
class Survey:
    nodes: list[Any]  # NodeSurvey, GPU nodes only
    inventory: list[PoolProduct]
    findings: list[Finding]
    cpu_nodes: int
    configuration: str = ""
    notes: list[str] = field(default_factory=list)

    def ready(self) -> list[str]:
        """The GPU nodes a GPU pod can be placed on now: state `ready` (as `gpu-placement nodes` shows it:
        not a soaking driver, not an upgrade due, its driver labels there), not cordoned, and no taint that
        neither the configuration nor any GPU workload tolerates (UntoleratedTaint: a maintenance taint)."""
        untolerated = {name for finding in self.findings if finding.code == UNTOLERATED_TAINT for name in finding.nodes}
        return [node.name for node in self.nodes if node.state == "ready" and not node.cordoned
                and node.name not in untolerated]

    def json(self) -> dict[str, Any]:
        return {"inventory": [group.json() for group in self.inventory],
                "findings": [finding.json() for finding in self.findings],
                "gpuNodes": len(self.nodes), "gpus": sum(node.gpus for node in self.nodes), "cpuNodes": self.cpu_nodes,
                "readyNodes": len(self.ready()), "configuration": self.configuration, "notes": self.notes}


def webhook_from_objects(objects: Iterable[Mapping[str, Any]]) -> Webhook | None:
    """gpu-placement's MutatingWebhookConfiguration among the objects (what `explain` reads live)."""
    for obj in objects:
        meta = obj.get("metadata") or {}
        if obj.get("kind") == "MutatingWebhookConfiguration" and \
                (meta.get("labels") or {}).get("app.kubernetes.io/part-of") == "gpu-placement":
            hooks = obj.get("webhooks") or []
            registered = str((meta.get("annotations") or {}).get(REGISTERED_ANNOTATION) or "").split(" ")[0] or None
            return Webhook(meta.get("name"), meta.get("creationTimestamp"), (hooks or [{}])[0].get("failurePolicy"),
                           len(hooks), registered)
    return None


def run_survey(core: Any, objects: list[dict[str, Any]], *, deployed: bool, admit: Admit | None = None,
               webhook: Webhook | None = None, notes: Iterable[str] = (), now: float | None = None) -> Survey:
    """The survey of `objects`, judged by `core` (a Core built from the same objects, with the
    configuration of the deployed service). `deployed`: gpu-placement runs there, so GPU pods that went
    around it are findings."""
    config, view = core.config, core.view
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(str(obj.get("kind") or ""), []).append(obj)
    node_objects = {str((o.get("metadata") or {}).get("name")): o for o in by_kind.get("Node", [])}
    pods = by_kind.get("Pod", [])
    rollout = core.placement.rollout
    rollout.expire()
    states = {name: rollout.soak(name).state for name in node_objects}
    with view.lock:
        shown = {name: node_state(core, name) for name in view.nodes}  # as `gpu-placement nodes` shows them
    nodes = survey_nodes(view, config, node_objects, pods, states, shown)

    def wants_gpu(pod: dict[str, Any]) -> bool:
        return bool(core.placement.requirements(pod).wants_gpu)

    workloads = gpu_workloads(objects, config, wants_gpu, admit)
    webhook = webhook or webhook_from_objects(objects)
    with view.lock:
        facts = dict(view.nodes)
    context = Context(config=config, nodes={node.name: node for node in nodes}, facts=facts,
                      kube_nodes=KubeNodes.from_objects(by_kind.get("Node", [])).nodes, workloads=workloads,
                      requirements=core.placement.requirements, pods=pods,
                      namespaces={str((o.get("metadata") or {}).get("name")): o for o in by_kind.get("Namespace", [])},
                      quotas=by_kind.get("ResourceQuota", []), deployed=deployed, webhook=webhook,
                      now=time.time() if now is None else now)
    notes = list(notes)
    unknown = [node.name for node in nodes if not node.writers_known]
    if unknown:
        notes.append(f"{len(unknown)} GPU {'node carries' if len(unknown) == 1 else 'nodes carry'} no managedFields, "
                     "so who wrote their labels is unknown and "
                     "HandSetLabels was not checked for them (a snapshot needs kubectl get nodes -o json "
                     "--show-managed-fields)")
    if not deployed:
        notes.append("gpu-placement is not deployed (no ConfigMap of its chart and no pod it admitted): "
                     "BypassedGpuPlacement was not checked")
    return Survey(nodes, inventory(nodes), find_all(context), len(node_objects) - len(nodes),
                  getattr(core, "config_source", ""), notes)
