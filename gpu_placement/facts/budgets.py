"""PodDisruptionBudgets as preemption weighs them: which victims would break one.

kube-scheduler's DefaultPreemption evicts victims by deleting them, not through the eviction API, so
a budget is never enforced there; it is a preference. Of two nodes it prefers the one whose victims
break fewer budgets (`NumPDBViolations`), and on a node it spares budget-breaking victims first. A
victim breaks a budget when the budget selects it (same namespace, a non-empty selector matching its
labels), it is not already in the budget's `status.disruptedPods`, and the budget's
`status.disruptionsAllowed` is used up by the victims counted before it
(`pkg/scheduler/framework/preemption/util.go` `FilterVictimsWithPDBViolation`, v1.37).

The view keeps each budget as a `Budget` (raw JSON in, only what that rule reads).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Budget", "Requirement", "budget_from_json", "budget_key", "violations"]

# One requirement of a label selector: (key, operator, values); matchLabels become `In` of one value.
Requirement = tuple[str, str, frozenset[str]]
_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


@dataclass(slots=True, frozen=True)
class Budget:
    namespace: str
    name: str
    selector: tuple[Requirement, ...] | None  # None: matches no pod (nil, empty or invalid selector)
    allowed: int  # status.disruptionsAllowed
    disrupted: frozenset[str]  # status.disruptedPods: names the API server is already evicting

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        if self.selector is None or namespace != self.namespace or not labels:
            return False
        return all(_holds(requirement, labels) for requirement in self.selector)


def budget_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def budget_from_json(obj: Mapping[str, Any]) -> Budget:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    allowed = status.get("disruptionsAllowed")
    disrupted = status.get("disruptedPods")
    return Budget(str(meta.get("namespace") or "default"), str(meta.get("name") or ""),
                  _selector(spec.get("selector")),
                  allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
                  frozenset(disrupted) if isinstance(disrupted, dict) else frozenset())


def violations(victims: Sequence[tuple[str, str, Mapping[str, str]]], budgets: Iterable[Budget]) -> list[bool]:
    """For each victim (namespace, name, labels), in order, whether evicting it breaks a budget once the
    victims before it have drawn on the budgets they match."""
    left: dict[str, int] = {}
    chosen = list(budgets)
    result = []
    for namespace, name, labels in victims:
        breaks = False
        for budget in chosen:
            if not budget.selects(namespace, labels) or name in budget.disrupted:
                continue
            left[budget.key] = left.get(budget.key, budget.allowed) - 1
            if left[budget.key] < 0:
                breaks = True
                break  # as kube-scheduler: the first budget broken settles it
        result.append(breaks)
    return result


def _selector(selector: Any) -> tuple[Requirement, ...] | None:
    """metav1.LabelSelector as kube-scheduler reads it: nil, empty or invalid matches nothing."""
    if not isinstance(selector, dict):
        return None
    requirements: list[Requirement] = []
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, dict):
        return None
    for key, value in match_labels.items():
        if not isinstance(value, str):
            return None
        requirements.append((str(key), "In", frozenset((value,))))
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        return None
    for expression in expressions:
        if not isinstance(expression, dict):
            return None
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        if not isinstance(key, str) or operator not in _OPERATORS or not isinstance(values, list):
            return None
        if (operator in ("In", "NotIn")) != bool(values):  # In/NotIn need values, Exists/DoesNotExist none
            return None
        requirements.append((key, str(operator), frozenset(str(value) for value in values)))
    return tuple(requirements) or None


def _holds(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    key, operator, values = requirement
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    return key not in labels
