"""A workload explained as a workload: its pods added up against the namespace's quota left and against
the room on the nodes that would take them.

`explain` judges one pod of each template; a controller makes `replicas` of them (a Job `parallelism`,
a PyTorchJob one group per replica spec), and the webhook checks each pod's quota as it is created,
so of 4 pods × 2 GPUs with 4 GPUs of quota left, two are admitted and two refused (the controller
retries them, with FailedCreate events on the workload). Without gang scheduling (Kueue, Volcano, KAI)
the admitted pods of a distributed job start and wait for the rest, holding their GPUs: the summary
says so when the whole job cannot run at once, and "never" when it asks for more than the quota itself.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_placement.decide.enforcement import quota_enforced

if TYPE_CHECKING:
    from gpu_placement.app.assembly import Core
    from gpu_placement.app.explain import Explanation
    from gpu_placement.facts.workloads import PodTemplate

__all__ = ["Summary", "summarize"]

# Kinds whose pods work as one job: all of them must run at once for any to make progress.
_SINGLE_POD_KINDS = frozenset({"Pod", "Deployment", "ReplicaSet", "ReplicationController", "StatefulSet",
                               "DaemonSet", "PodTemplate"})


@dataclass(slots=True)
class Summary:
    lines: list[str]
    denied_pods: int = 0  # pods the quota refuses as the controller creates them
    waiting_pods: int = 0  # admitted pods no node has room for now


def summarize(core: Core, templates: list[PodTemplate], found: list[Explanation]) -> Summary | None:
    """None for a single pod, a workload of one pod asking no GPU, or a DaemonSet (one pod per node)."""
    kind = templates[0].where.split(" ", 1)[0]
    if kind in ("Pod", "DaemonSet"):
        return None
    groups = [(_replicas(t), dict(f.req.gpus), f, _role(t)) for t, f in zip(templates, found, strict=True)]
    groups = [(count, asks, f, role) for count, asks, f, role in groups if asks]
    if not groups:
        return None
    name = templates[0].where.rsplit(" (", 1)[0]
    total: Counter[str] = Counter()
    for count, asks, _, _ in groups:
        for resource, per_pod in asks.items():
            total[resource] += count * per_pod
    pods = sum(count for count, _, _, _ in groups)
    parts = " + ".join(f"{count} {_pods(count)} × {_asks(asks)}" + (f" ({role})" if role else "")
                       for count, asks, _, role in groups)
    lines = [f"workload {name}: {parts} = {_asks(total)}"]
    summary = Summary(lines)
    gang = kind not in _SINGLE_POD_KINDS and pods > 1
    found_ = groups[0][2]
    namespace = found_.pod.split("/", 1)[0]
    admitted = _quota(core, namespace, groups, total, gang, kind, summary) if found_.admission.called else None
    _room(core, groups, admitted, gang, kind, summary)
    return summary


def _quota(core: Core, namespace: str, groups: list[tuple[int, dict[str, int], Any, str]], total: Counter[str],
           gang: bool, kind: str, summary: Summary) -> list[int] | None:
    """Pods of each group the quota admits, in creation order; None when no quota applies."""
    from gpu_placement.facts.policy import parse_policy

    with core.view.lock:
        record = core.view.namespaces.get(namespace)
        used = dict(core.view.namespace_usage.get(namespace) or {})
    quota = parse_policy(record, namespace, core.config).quota if record is not None else None
    if not quota:
        return None
    enforced, why = quota_enforced(record, core.config) if record is not None else (True, "")
    limited = {r: v for r, v in quota.items() if r in total}
    if not limited:
        return None
    left = {r: max(0, limit - used.get(r, 0)) for r, limit in limited.items()}
    figures = ", ".join(f"{limit} {r} (uses {used.get(r, 0)}, {left[r]} left)" for r, limit in limited.items())
    if not enforced:
        summary.lines.append(f"  quota of namespace {namespace}: {figures}, but not enforced ({why}): nothing limits "
                             "these pods")
        return None
    remaining = dict(left)
    admitted = []
    for count, asks, _, _ in groups:
        fits = 0
        for _ in range(count):
            if all(remaining.get(r, per_pod) >= per_pod for r, per_pod in asks.items() if r in limited):
                for r, per_pod in asks.items():
                    if r in remaining:
                        remaining[r] -= per_pod
                fits += 1
        admitted.append(fits)
    pods = sum(count for count, _, _, _ in groups)
    denied = pods - sum(admitted)
    summary.denied_pods = denied
    if not denied:
        summary.lines.append(f"  quota of namespace {namespace}: {figures}: every pod is admitted")
        return admitted
    over = [r for r in limited if total[r] > limited[r]]
    summary.lines.append(f"  quota of namespace {namespace}: {figures}: {sum(admitted)} of {pods} pods are admitted, "
                         f"{denied} denied (the {_controller(kind)} retries them, with FailedCreate events on the "
                         f"{kind}, as quota frees)")
    if gang:
        need = ", ".join(f"{total[r]} {r}" for r in limited)
        if over:
            summary.lines.append(f"  this {kind} can never run all its replicas at once: it needs {need}, more than "
                                 f"the quota itself ({', '.join(f'{limited[r]} {r}' for r in over)}); lower the "
                                 "replicas or the GPUs per pod, or ask for a larger quota")
        else:
            summary.lines.append(f"  this {kind} cannot run all its replicas at once now: it needs {need} and the "
                                 "quota leaves less; the admitted pods start and hold their GPUs while the rest wait "
                                 "(no gang scheduling: use Kueue or wait for the quota to free)")
    return admitted


def _room(core: Core, groups: list[tuple[int, dict[str, int], Any, str]], admitted: list[int] | None, gang: bool,
          kind: str, summary: Summary) -> None:
    """How many pods the nodes that pass could take now, by free GPU units (pods placed one by one)."""
    if groups[0][2].hypothetical and not (groups[0][2].route and groups[0][2].route.node_name):
        return
    free: dict[str, dict[str, int]] = {}
    with core.view.lock:
        for _, _, found, _ in groups:
            for verdict in found.verdicts:
                if verdict.passed and verdict.node not in free:
                    facts = core.view.nodes.get(verdict.node)
                    units, _ = core.view.used(verdict.node)
                    free[verdict.node] = {r: facts.allocatable.get(r, 0) - units.get(r, 0) for r in facts.allocatable} \
                        if facts else {}
    placed = 0
    wanted = 0
    for index, (count, asks, found, _) in enumerate(groups):
        count = admitted[index] if admitted is not None else count
        wanted += count
        passing = sorted((v for v in found.verdicts if v.passed), key=lambda v: (-v.score, v.node))
        for _ in range(count):
            node = next((v.node for v in passing if all(free[v.node].get(r, 0) >= c for r, c in asks.items())), None)
            if node is None:
                break
            for r, c in asks.items():
                free[node][r] -= c
            placed += 1
    waiting = wanted - placed
    summary.waiting_pods = waiting
    which = "admitted pods" if admitted is not None else "pods"
    if not waiting:
        summary.lines.append(f"  room: the nodes that pass have room for all {wanted} {which} now (by free GPUs)")
        return
    summary.lines.append(f"  room: the nodes that pass have room for {placed} of the {wanted} {which} now (by free "
                         f"GPUs); {waiting} wait for GPUs to free")
    if gang and placed:
        summary.lines.append(f"  without gang scheduling the {placed} placed pods of this {kind} start and hold their "
                             "GPUs while the others wait")


def _replicas(template: PodTemplate) -> int:
    """Pods made from the template at once: replicas or parallelism, 1 when unset (Kubernetes' default)."""
    return template.replicas if template.replicas is not None and template.replicas >= 0 else 1


def _role(template: PodTemplate) -> str:
    """`Worker` for spec.pytorchReplicaSpecs.Worker.template; empty for a single template."""
    path = template.where.rpartition("(")[2].rstrip(")")
    parts = path.split(".")
    return parts[-2] if len(parts) >= 3 and parts[-1] == "template" and parts[-2] not in ("spec", "jobTemplate") else ""


def _pods(count: int) -> str:
    return "pod" if count == 1 else "pods"


def _asks(asks: dict[str, int] | Counter[str]) -> str:
    return " + ".join(f"{count} {resource}" for resource, count in sorted(asks.items()))


def _controller(kind: str) -> str:
    known = {"Job": "Job controller", "CronJob": "Job controller", "Deployment": "ReplicaSet controller",
             "ReplicaSet": "ReplicaSet controller", "StatefulSet": "StatefulSet controller"}
    return known.get(kind, f"{kind} operator")
