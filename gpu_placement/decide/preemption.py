"""Preemption that counts GPU memory: which pods to evict on a node so a higher-priority pod fits.

kube-scheduler's DefaultPreemption picks victims by re-running its in-tree filters, which count GPU
*units* only. For each node it proposes, this module checks the proposal with the same fit check
`/filter` uses (free units and memory, reservations and telemetry included) as if the victims were
gone; where units come free but memory does not, it adds lower-priority GPU pods bound there, lowest
priority first and as few as will do; and it drops the node when no set of lower-priority pods would
do, or when the node fails for a reason eviction cannot fix. Pure: view and placement in, plans out.

PodDisruptionBudgets weigh as kube-scheduler weighs them (gpu_placement/facts/budgets.py): of the pods it
could add, those whose eviction would break a budget come last and are spared first, and the ones it
still adds are counted into the node's `NumPDBViolations`, by which kube-scheduler picks the node.
Budgets are drawn on by kube-scheduler's own victims first (as far as the view knows their labels:
GPU pods only; the others it counted itself).

DRA devices: kube-scheduler 1.37 does not preempt for them. Its DynamicResources plugin has no
PreFilterExtensions (the dry run cannot take a victim's claims away) and refuses a node without the
devices as UnschedulableAndUnresolvable, which keeps it out of preemption (v1.37.2
pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go `PreFilterExtensions`,
`statusUnschedulable`); DRA-aware preemption is KEP-5690, not merged. So for a pod that takes devices
through DRA (its claims, or an extended resource a DeviceClass serves on the node) gpu-placement never
adds a victim for its devices, and drops a node whose devices its claims do not find free, with that
sentence (`NO_DRA_PREEMPTION`); kube-scheduler's own victims, for what else the pod needs, stand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_placement.decide.placement import Placement
from gpu_placement.decide.requirements import Requirements
from gpu_placement.decide.rules import INSUFFICIENT_GPU, NO_NEED, Need, NeedItem, Rejection, unknown_node
from gpu_placement.facts.budgets import Budget, violations
from gpu_placement.facts.pods import PodRecord, pod_priority

__all__ = ["NO_DRA_PREEMPTION", "NodePlan", "Proposal", "Victim", "explain_preemption", "plan_node", "preempt"]

NO_DRA_PREEMPTION = ("kube-scheduler does not preempt for DRA devices (Kubernetes 1.37: its DynamicResources plugin "
                     "cannot take a victim's claims away in its dry run; DRA-aware preemption, KEP-5690, is not "
                     "merged), so evicting pods here frees no device for this pod's claims")


@dataclass(slots=True, frozen=True)
class Proposal:
    """One node's victims as kube-scheduler sent them (highest priority first, as it orders them)."""

    uids: tuple[str, ...]
    pdb_violations: int = 0
    priorities: tuple[int | None, ...] = ()  # known from the v1.Pod form; empty in the UID-only form


@dataclass(slots=True, frozen=True)
class Victim:
    uid: str
    pod: str  # namespace/name, "" when the view does not hold the pod
    priority: int | None  # None: neither the request nor the view says
    added: bool  # added by gpu-placement (kube-scheduler's in-tree set did not free the GPU memory)


@dataclass(slots=True, frozen=True)
class NodePlan:
    """A node and what to evict there, or why eviction cannot make room (`reason`, no victims)."""

    node: str
    victims: tuple[Victim, ...]  # highest priority first: kube-scheduler reads Pods[0] as the highest
    pdb_violations: int
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason


def preempt(placement: Placement, req: Requirements, priority: int,
            proposals: Mapping[str, Proposal]) -> dict[str, NodePlan]:
    """Every proposed node's plan (kept ones have `ok`); work proportional to the nodes and their pods."""
    view = placement.view
    view.expire_reservations()
    with view.lock:
        return {node: plan_node(placement, req, priority, node, proposal) for node, proposal in proposals.items()}


def plan_node(placement: Placement, req: Requirements, priority: int, node: str,
              proposal: Proposal = Proposal(())) -> NodePlan:
    """What to evict on `node` so the pod fits; an empty proposal plans from scratch (`explain`).
    Call under `view.lock`."""
    view = placement.view
    need = placement.entry(req, node) if req.wants_gpu else NO_NEED
    if need is None:
        return NodePlan(node, (), proposal.pdb_violations, unknown_node())
    if type(need) is Rejection:
        return NodePlan(node, (), proposal.pdb_violations, need.message)
    if need.dra and placement.dra_fit(node, req) is None:
        return NodePlan(node, (), proposal.pdb_violations, f"no free DRA device its claims ask: {NO_DRA_PREEMPTION}")
    on_node = {pod.uid: pod for pod in view.pods_on(node) if pod.uid}
    chosen: list[Victim] = []
    for index, uid in enumerate(proposal.uids):
        pod = on_node.get(uid)
        sent = proposal.priorities[index] if index < len(proposal.priorities) else None
        known = pod.priority if pod is not None else sent
        if known is not None and known >= priority:
            return NodePlan(node, (), proposal.pdb_violations,
                            f"proposed victim {pod.key if pod else uid} has priority {known}, not below the pod's "
                            f"{priority}")
        chosen.append(Victim(uid, pod.key if pod else "", known, False))
    freed = _freed(view.charge_of, (victim.pod for victim in chosen if victim.pod))
    shortfall = placement.shortfall(node, need, freed) if need else None
    violations = proposal.pdb_violations
    if shortfall is not None:
        taken = {victim.uid for victim in chosen}
        budgets = _Budgets(view.poddisruptionbudgets.values(), [on_node[v.uid] for v in chosen if v.uid in on_node])
        extra = _more_victims(placement, node, need, priority, freed, [
            pod for pod in on_node.values() if pod.uid not in taken and pod.active and pod.priority < priority],
            budgets)
        if extra is None:
            return NodePlan(node, (), proposal.pdb_violations,
                            f"{shortfall} even with every lower-priority GPU pod there evicted")
        violations += budgets.broken(extra)
        chosen = _merge(chosen, [Victim(pod.uid, pod.key, pod.priority, True) for pod in extra])
    if not chosen:
        return NodePlan(node, (), proposal.pdb_violations, "the pod fits without evicting anything")
    return NodePlan(node, tuple(chosen), violations)


class _Budgets:
    """The namespace's PodDisruptionBudgets, drawn on first by kube-scheduler's own victims."""

    def __init__(self, budgets: Iterable[Budget], first: Sequence[PodRecord]) -> None:
        self.first = [_as_victim(pod) for pod in first]
        self.budgets = list(budgets)

    def breaks(self, pod: PodRecord) -> bool:
        """Whether evicting `pod`, after kube-scheduler's victims, breaks a budget."""
        return bool(self.budgets) and violations([*self.first, _as_victim(pod)], self.budgets)[-1]

    def broken(self, added: Sequence[PodRecord]) -> int:
        """How many of `added` (in this order, after kube-scheduler's victims) break a budget."""
        if not self.budgets:
            return 0
        return sum(violations([*self.first, *map(_as_victim, added)], self.budgets)[len(self.first):])


def _as_victim(pod: PodRecord) -> tuple[str, str, dict[str, str]]:
    return pod.namespace, pod.name, dict(pod.labels)


def _freed(charge_of: Callable[[str], tuple[NeedItem, ...]], keys: Iterable[str]) -> dict[str, tuple[int, int]]:
    """(units, MiB) per resource that the pods `keys` hold on their node, as the view charged them."""
    freed: dict[str, tuple[int, int]] = {}
    for key in keys:
        _add(freed, charge_of(key), 1)
    return freed


def _more_victims(placement: Placement, node: str, need: Need, priority: int, freed: dict[str, tuple[int, int]],
                  candidates: Sequence[PodRecord], budgets: _Budgets) -> list[PodRecord] | None:
    """The fewest lower-priority pods, lowest priority first, whose eviction (on top of `freed`) makes
    the pod fit; None when even all of them would not. Greedy by (breaks a PodDisruptionBudget,
    priority, most memory given back), then a reprieve pass as kube-scheduler's own victim selection
    makes it: budget-breaking pods first, then the others, each from the highest priority down."""
    charge_of = placement.view.charge_of
    resources = {resource for resource, _, _ in need.asks}
    ranked = []
    for pod in candidates:
        key = pod.key
        items = charge_of(key)
        if any(resource in resources for resource, _, _ in items):
            mib = sum(mib or 0 for resource, _, mib in items if resource in resources)
            ranked.append((budgets.breaks(pod), pod.priority, -mib, key, pod, items))
    ranked.sort(key=lambda entry: entry[:4])
    total = dict(freed)
    taken = []
    for entry in ranked:
        taken.append(entry)
        _add(total, entry[5], 1)
        if placement.shortfall(node, need, total) is None:
            break
    else:
        return None
    for entry in sorted(taken, key=lambda e: (not e[0], -e[1], e[3])):  # reprieve: budget breakers, important first
        _add(total, entry[5], -1)
        if placement.shortfall(node, need, total) is None:
            taken.remove(entry)
        else:
            _add(total, entry[5], 1)
    return [entry[4] for entry in sorted(taken, key=lambda e: (-e[1], e[3]))]


def _add(total: dict[str, tuple[int, int]], items: Iterable[NeedItem], sign: int) -> None:
    for resource, units, mib in items:
        had_units, had_mib = total.get(resource, (0, 0))
        total[resource] = (had_units + sign * units, had_mib + sign * (mib or 0))


def _merge(proposed: list[Victim], added: list[Victim]) -> list[Victim]:
    """kube-scheduler's victims keep their order; each added one goes before the first victim of known
    lower priority, so the list stays highest priority first."""
    merged = list(proposed)
    for victim in sorted(added, key=lambda v: -(v.priority or 0)):
        at = next((i for i, other in enumerate(merged)
                   if other.priority is not None and victim.priority is not None and other.priority < victim.priority),
                  len(merged))
        merged.insert(at, victim)
    return merged


def explain_preemption(placement: Placement, req: Requirements, pod: Mapping[str, Any],
                       names: Sequence[str] | None = None) -> list[list[str]]:
    """For `explain`: each node (of `names`, default all) that fails for want of room (FailedNodes),
    what preemption would evict there, or why it cannot help. Rows of (node, outcome, detail); empty
    when the pod fits somewhere, asks for no GPU, or may not preempt.

    kube-scheduler's side is simulated as its DefaultPreemption picks victims, counting GPU units
    only: every lower-priority pod removed, then reprieved from the highest priority down while the
    units still fit (start times, which break its ties, are not in the view: names do here)."""
    spec = pod.get("spec") or {}
    if not req.wants_gpu or spec.get("preemptionPolicy") == "Never":
        return []
    priority = pod_priority(spec)
    view = placement.view
    with view.lock:
        names = sorted(view.nodes) if names is None else [name for name in names if name in view.nodes]
        result = placement.filter(req, names)
        if result.passed:
            return []
        rows = [[node, "no", NO_DRA_PREEMPTION] for node, code in sorted(result.unresolvable.items())
                if code.startswith(f"{INSUFFICIENT_GPU}: no free DRA device")]
        for node in sorted(result.failed):
            need = placement.entry(req, node)
            if type(need) is not Need:  # FailedNodes: never a Rejection, nor a node the view lacks
                continue
            in_tree = _in_tree_victims(placement, node, need, priority)
            plan = plan_node(placement, req, priority, node, Proposal(tuple(p.uid for p in in_tree)))
            if not plan.ok:
                rows.append([node, "no", plan.reason])
            elif not in_tree:  # units free, memory short: kube-scheduler's dry run finds nothing to evict
                rows.append([node, "not asked", f"would evict {_names(plan.victims)}, but the GPU units are free "
                             "and only memory is short: kube-scheduler's own dry run finds no victims, so it "
                             "never asks"])
            else:
                rows.append([node, "evict", _names(plan.victims)])
        return rows


def _in_tree_victims(placement: Placement, node: str, need: Need, priority: int) -> list[PodRecord]:
    charge_of = placement.view.charge_of
    units_only = Need(tuple((resource, units, None) for resource, units, _ in need.asks), need.dra)
    lower = sorted((p for p in placement.view.pods_on(node) if p.active and p.priority < priority and p.uid),
                   key=lambda p: (-p.priority, p.key))
    victims = list(lower)
    if placement.shortfall(node, units_only, _freed(charge_of, [p.key for p in victims])) is not None:
        return []
    for pod in lower:  # reprieve the most important first
        rest = [p for p in victims if p is not pod]
        if placement.shortfall(node, units_only, _freed(charge_of, [p.key for p in rest])) is None:
            victims = rest
    return victims


def _names(victims: Iterable[Victim]) -> str:
    return ", ".join(f"{victim.pod or victim.uid} (priority {victim.priority})" for victim in victims)
