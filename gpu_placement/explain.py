"""`explain`: what the webhook would change and decide for a pod, then every node's verdict and score."""

from __future__ import annotations

import base64
import copy
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette

from gpu_placement import asgi
from gpu_placement.patching import apply_patch
from gpu_placement.preemption import explain_preemption
from gpu_placement.report import VERDICT_HEADER, table, verdict_rows
from gpu_placement.requirements import Requirements
from gpu_placement.rules import cuda_rule
from gpu_placement.service import Core

__all__ = ["Admission", "admission_review", "admit", "explain_pod"]


@dataclass(slots=True)
class Admission:
    patch: list[dict[str, Any]]
    pod: dict[str, Any]  # after the patch
    allowed: bool
    message: str
    warnings: list[str]


def admission_review(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "name": meta.get("name") or "", "operation": "CREATE", "object": pod, "dryRun": True,
        "userInfo": {"username": "gpu-placement-explain"}}}


def admit(webhook: Starlette, pod: dict[str, Any], namespace: str) -> Admission:
    """Mutate then validate, as the API server does; dry run, so no quota is reserved."""
    pod = copy.deepcopy(pod)
    pod.setdefault("metadata", {})["namespace"] = namespace
    status, body = asgi.call(webhook, "POST", "/mutate", orjson.dumps(admission_review(pod, namespace)))
    response = orjson.loads(body).get("response", {}) if status == 200 else {}
    patch = orjson.loads(_b64(response["patch"])) if response.get("patch") else []
    mutated = apply_patch(pod, patch)
    status, body = asgi.call(webhook, "POST", "/validate", orjson.dumps(admission_review(mutated, namespace)))
    verdict = orjson.loads(body).get("response", {}) if status == 200 else {}
    return Admission(patch, mutated, bool(verdict.get("allowed")),
                     (verdict.get("status") or {}).get("message", "") or ("" if status == 200 else body.decode()),
                     list(verdict.get("warnings") or []))


def _b64(text: str) -> bytes:
    return base64.b64decode(text)


def explain_pod(core: Core, pod: dict[str, Any], namespace: str | None) -> str:
    meta = pod.setdefault("metadata", {})
    namespace = namespace or meta.get("namespace") or "default"
    name = meta.get("name") or meta.get("generateName") or "?"
    lines = [f"pod {namespace}/{name}", "", "webhook:"]
    admission = admit(core.webhook_app(), pod, namespace)
    if admission.patch:
        for op in admission.patch:
            value = f" = {orjson.dumps(op['value']).decode()}" if "value" in op else ""
            lines.append(f"  {op['op']:<8} {op['path']}{value}")
    else:
        lines.append("  no change")
    lines.append(f"  {'allowed' if admission.allowed else 'DENIED'}" +
                 (f": {admission.message}" if admission.message else ""))
    lines += [f"  warning: {w}" for w in admission.warnings]
    req = core.placement.requirements(admission.pod)
    lines += ["", f"extender: needs {req.describe()}"]
    held = core.view.held(f"{namespace}/{meta.get('name') or ''}")
    if held is not None:  # already running: what it holds was fixed when it was first seen bound
        node, items, frozen = held
        what = ", ".join(f"{units}x {resource}" + (f" = {mib} MiB" if mib is not None else "")
                         for resource, units, mib in items)
        ask = f"{frozen.ask} from the {frozen.source}" if frozen.ask is not None else frozen.source
        lines.append(f"  holds {what} on {node}, fixed when first seen bound ({ask}); later annotation or "
                     "namespace-default edits do not change it")
    verdicts = core.placement.explain(req)
    best = max((v for v in verdicts if v.passed), key=lambda v: (v.score, v.node), default=None)
    lines.append(f"  would go to {best.node} (score {best.score})" if best else "  no node can take it")
    with core.view.lock:  # which CUDA rule lets each passing node run the images, where it is not plain
        rules = {v.node: cuda_rule(core.view.nodes[v.node], req) for v in verdicts if v.passed}
    lines += [f"  {node}: {rule}" for node, rule in sorted(rules.items()) if rule]
    lines += ["", table(VERDICT_HEADER, verdict_rows(verdicts))]
    lines += _preemption(core, req, admission.pod)
    return "\n".join(lines)


def _preemption(core: Core, req: Requirements, pod: dict[str, Any]) -> list[str]:
    rows = explain_preemption(core.placement, req, pod)
    if not rows:
        return []
    spec = pod.get("spec") or {}
    head = f"preemption (priority {spec.get('priority', 0)}" + (
        f", class {spec['priorityClassName']}" if spec.get("priorityClassName") else "") + "):"
    if "priority" not in spec and spec.get("priorityClassName"):
        head += " spec.priority is unset in this file; the API server sets it from the class, as 0 here"
    return ["", head, table(["NODE", "PREEMPTION", "WOULD EVICT / WHY NOT"], rows)]
