"""Filter and score nodes for a pod, fast: verdicts are precomputed per kind of pod and kept current.

Pods that need the same thing (same `Requirements`) share one `_Verdicts`: every node's static
verdict, the set of nodes that pass right now, and every node's score. The view tells us which node
changed and we redo that node only, so a request costs set operations over the names it asks about.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import filterfalse
from typing import Any

from gpu_placement.config import Config
from gpu_placement.nodes import NodeFacts
from gpu_placement.requirements import Requirements, requirements_for
from gpu_placement.rules import (
    UNKNOWN_NODE,
    Need,
    Rejection,
    check_node,
    insufficient_memory,
    insufficient_units,
    unknown_node,
)
from gpu_placement.view import ClusterView

__all__ = ["FilterResult", "NodeVerdict", "Placement"]

MAX_SCORE = 10
_CACHE_SIZE = 256  # kinds of pod remembered; each costs a dict and a set over the nodes


@dataclass(slots=True)
class FilterResult:
    passed: list[str]
    failed: dict[str, str]  # preemption may help
    unresolvable: dict[str, str]
    reasons: Counter[str] = field(default_factory=Counter)  # code -> nodes, for metrics


@dataclass(slots=True, frozen=True)
class NodeVerdict:
    """One node's outcome for `explain`: pass or the reason, the score and the figures behind it."""

    node: str
    passed: bool
    reason: str
    score: int
    detail: str


@dataclass(slots=True)
class _Verdicts:
    req: Requirements
    entries: dict[str, Rejection | Need]  # static verdict per node
    passing: set[str]  # static pass and fits what is free now
    scores: dict[str, int]
    rejected: dict[str, str] = field(default_factory=dict)  # static rejections: node -> message
    codes: dict[str, str] = field(default_factory=dict)  # static rejections: node -> reason code


class Placement:
    def __init__(self, view: ClusterView, config: Config) -> None:
        self.view = view
        self.config = config
        self._cache: OrderedDict[Requirements, _Verdicts] = OrderedDict()
        view.subscribe(self._node_changed, self._free_changed)

    # -- requests ------------------------------------------------------------------------------
    def requirements(self, pod: Mapping[str, Any]) -> Requirements:
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        return requirements_for(pod, self.view.namespaces.get(namespace), self.config.is_gpu_resource)

    def filter(self, req: Requirements, names: Sequence[str]) -> FilterResult:
        """Set operations in C over the names asked; Python work only for nodes that fail for a reason
        computed now (a shortfall of free memory or devices) and for names not in the view."""
        if not req.wants_gpu:
            return FilterResult(list(names), {}, {})
        view = self.view
        view.expire_reservations()
        with view.lock:
            verdicts = self._verdicts(req)
            passing = verdicts.passing
            passed = list(filter(passing.__contains__, names))
            if len(passed) == len(names):
                return FilterResult(passed, {}, {})
            failing = list(filterfalse(passing.__contains__, names))
            rejected = verdicts.rejected
            static = list(filter(rejected.__contains__, failing))
            unresolvable = dict(zip(static, map(rejected.__getitem__, static), strict=True))
            reasons: Counter[str] = Counter(map(verdicts.codes.__getitem__, static))
            failed: dict[str, str] = {}
            entries = verdicts.entries
            for name in filterfalse(rejected.__contains__, failing):
                entry = entries.get(name)
                if entry is None:
                    unresolvable[name] = unknown_node(name)
                    reasons[UNKNOWN_NODE] += 1
                else:
                    message = self._shortfall(name, entry) or "internal: verdict out of date"  # type: ignore[arg-type]
                    failed[name] = message
                    reasons[message.split(":", 1)[0]] += 1
        return FilterResult(passed, failed, unresolvable, reasons)

    def scores(self, req: Requirements, names: Sequence[str]) -> list[tuple[str, int]]:
        if not req.wants_gpu:
            return [(name, 0) for name in names]
        self.view.expire_reservations()
        with self.view.lock:
            scores = self._verdicts(req).scores
            return [(name, scores.get(name, 0)) for name in names]

    def explain(self, req: Requirements, names: Sequence[str] | None = None) -> list[NodeVerdict]:
        """Every node's verdict and score with the figures behind them; slow path, for humans."""
        with self.view.lock:
            names = sorted(self.view.nodes) if names is None else names
            result = self.filter(req, names)
            scores = dict(self.scores(req, names))
            verdicts = self._verdicts(req) if req.wants_gpu else None
            rows = []
            for name in names:
                reason = result.failed.get(name) or result.unresolvable.get(name) or ""
                entry = verdicts.entries.get(name) if verdicts else None
                rows.append(NodeVerdict(name, not reason, reason, scores.get(name, 0) if not reason else 0,
                                        self._detail(name, entry)))
            return rows

    # -- cache maintenance ---------------------------------------------------------------------
    def _verdicts(self, req: Requirements) -> _Verdicts:
        verdicts = self._cache.get(req)
        if verdicts is not None:
            self._cache.move_to_end(req)
            return verdicts
        verdicts = _Verdicts(req, {}, set(), {})
        for name in self.view.nodes:
            self._redo(verdicts, name)
        self._cache[req] = verdicts
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return verdicts

    def _node_changed(self, name: str | None) -> None:
        if name is None:
            self._cache.clear()
            return
        for verdicts in self._cache.values():
            self._redo(verdicts, name)

    def _free_changed(self, name: str) -> None:
        for verdicts in self._cache.values():
            entry = verdicts.entries.get(name)
            if entry is not None and entry.__class__ is not Rejection:
                self._place(verdicts, name, entry)  # type: ignore[arg-type]

    def _redo(self, verdicts: _Verdicts, name: str) -> None:
        facts = self.view.nodes.get(name)
        verdicts.rejected.pop(name, None)
        verdicts.codes.pop(name, None)
        if facts is None:
            verdicts.entries.pop(name, None)
            verdicts.passing.discard(name)
            verdicts.scores.pop(name, None)
            return
        entry = check_node(facts, self.view.validator_state(name), verdicts.req, self.config)
        verdicts.entries[name] = entry
        if entry.__class__ is Rejection:
            verdicts.passing.discard(name)
            verdicts.scores[name] = 0
            verdicts.rejected[name] = entry.message  # type: ignore[union-attr]
            verdicts.codes[name] = entry.code  # type: ignore[union-attr]
        else:
            self._place(verdicts, name, entry)  # type: ignore[arg-type]

    def _place(self, verdicts: _Verdicts, name: str, need: Need) -> None:
        if self._shortfall(name, need) is None:
            verdicts.passing.add(name)
            verdicts.scores[name] = self._score(name, need)
        else:
            verdicts.passing.discard(name)
            verdicts.scores[name] = 0

    # -- figures -------------------------------------------------------------------------------
    def _shortfall(self, name: str, need: Need) -> str | None:
        view = self.view
        for resource, units, mib in need:
            free_units = view.free_units.get(resource, {}).get(name, 0)
            if units > free_units:
                return insufficient_units(name, resource, free_units, units)
            free_mib = view.free_mib.get(resource, {}).get(name)
            if mib is not None and free_mib is not None and mib > free_mib:
                return insufficient_memory(name, resource, free_mib, mib)
        return None

    def _score(self, name: str, need: Need) -> int:
        """Binpack: how full the node is once the pod is on it (fill used nodes first, keep whole nodes
        free for big jobs); spread: how empty. Minus penalties for nodes to avoid when there is a choice."""
        view = self.view
        fills = []
        for resource, units, mib in need:
            capacity = view.capacity_mib.get(resource, {}).get(name)
            free = view.free_mib.get(resource, {}).get(name)
            if mib is None or not capacity or free is None:  # memory unknown: count devices instead
                facts = view.nodes[name]
                capacity, free, mib = facts.allocatable.get(resource, 0), view.free_units[resource][name], units
            fills.append(min(1.0, (capacity - free + mib) / capacity) if capacity else 0.0)
        fill = sum(fills) / len(fills)
        raw = fill if self.config.scoring.strategy == "binpack" else 1.0 - fill
        score = round(MAX_SCORE * raw) - self._penalty(view.nodes[name])
        return max(0, min(MAX_SCORE, score))

    def _penalty(self, facts: NodeFacts) -> int:
        weights = self.config.scoring
        penalty = weights.upgrade_required if facts.upgrade_state == "upgrade-required" else 0
        if facts.unhealthy_devices:
            penalty += weights.unhealthy_devices
        reading = self.view.telemetry.get(facts.name)
        if reading is not None and reading.xid_errors:
            penalty += weights.xid_errors
        return penalty

    def _detail(self, name: str, entry: Rejection | Need | None) -> str:
        if entry is None or entry.__class__ is Rejection:
            return ""
        parts = []
        for resource, units, mib in entry:  # type: ignore[union-attr]
            free_units = self.view.free_units.get(resource, {}).get(name, 0)
            free_mib = self.view.free_mib.get(resource, {}).get(name)
            memory = f", needs {mib} MiB of {free_mib} MiB free" if mib is not None and free_mib is not None else ""
            parts.append(f"{units}x {resource} of {free_units} free{memory}")
        penalty = self._penalty(self.view.nodes[name])
        return "; ".join(parts) + (f"; score -{penalty} (upgrade/unhealthy/XID)" if penalty else "")
