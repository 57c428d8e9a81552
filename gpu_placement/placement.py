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

import orjson

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

__all__ = ["FilterResult", "Freed", "NodeVerdict", "Placement"]

MAX_SCORE = 10
_CACHE_SIZE = 64  # kinds of pod remembered; each costs a few entries per node (about 1.5 KiB a node)
_EMPTY = b"{}"
Freed = Mapping[str, tuple[int, int]]  # resource -> (units, MiB) that evicting some pods would give back
_NOTHING_FREED: Freed = {}


@dataclass(slots=True)
class FilterResult:
    """The answer to one filter. The two failure maps are kept as the JSON objects they are sent as
    (built from per-node pieces encoded when the node changed); decode them with `failed` and
    `unresolvable` when a person or a test needs them."""

    passed: list[str]
    failed_json: bytes = _EMPTY  # node -> reason preemption may fix (FailedNodes)
    unresolvable_json: bytes = _EMPTY  # node -> reason it cannot (FailedAndUnresolvableNodes)
    reasons: Counter[str] = field(default_factory=Counter)  # code -> nodes, for metrics

    @property
    def failed(self) -> dict[str, str]:
        return orjson.loads(self.failed_json)

    @property
    def unresolvable(self) -> dict[str, str]:
        return orjson.loads(self.unresolvable_json)


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
    """Everything one kind of pod needs to know about every node, kept current node by node."""

    req: Requirements
    entries: dict[str, Rejection | Need] = field(default_factory=dict)  # static verdict per node
    passing: set[str] = field(default_factory=set)  # static pass and fits what is free now
    scores: dict[str, int] = field(default_factory=dict)
    score_json: dict[str, bytes] = field(default_factory=dict)  # b'{"Host":"n1","Score":7}'
    messages: dict[str, str] = field(default_factory=dict)  # failing nodes: the reason
    fragments: dict[str, bytes] = field(default_factory=dict)  # failing nodes: b'"n1":"Code: sentence"'
    codes: dict[str, str] = field(default_factory=dict)  # failing nodes: the reason code
    resolvable: set[str] = field(default_factory=set)  # failing nodes preemption could help


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
        """Set membership in C over the names asked, and the failure maps joined from pieces encoded
        when each node last changed; Python work only for names not in the view."""
        if not req.wants_gpu:
            return FilterResult(list(names))
        view = self.view
        view.expire_reservations()
        with view.lock:
            verdicts = self._verdicts(req)
            passing = verdicts.passing
            passed = list(filter(passing.__contains__, names))
            if len(passed) == len(names):
                return FilterResult(passed)
            failing = list(filterfalse(passing.__contains__, names))
            known = list(filter(verdicts.fragments.__contains__, failing))
            reasons: Counter[str] = Counter(map(verdicts.codes.__getitem__, known))
            resolvable = verdicts.resolvable
            failed = list(map(verdicts.fragments.__getitem__, filter(resolvable.__contains__, known)))
            unresolvable = list(map(verdicts.fragments.__getitem__, filterfalse(resolvable.__contains__, known)))
            if len(known) != len(failing):
                unknown = [name for name in failing if name not in verdicts.fragments]
                unresolvable += [_fragment(name, unknown_node(name)) for name in unknown]
                reasons[UNKNOWN_NODE] += len(unknown)
        return FilterResult(passed, _object(failed), _object(unresolvable), reasons)

    def scores(self, req: Requirements, names: Sequence[str]) -> list[tuple[str, int]]:
        if not req.wants_gpu:
            return [(name, 0) for name in names]
        self.view.expire_reservations()
        with self.view.lock:
            scores = self._verdicts(req).scores
            return [(name, scores.get(name, 0)) for name in names]

    def scores_json(self, req: Requirements, names: Sequence[str]) -> bytes:
        """`[{"Host": name, "Score": n}, ...]` for /prioritize, joined from per-node pieces."""
        if req.wants_gpu:
            self.view.expire_reservations()
            with self.view.lock:
                pieces = self._verdicts(req).score_json
                try:
                    return b"[" + b",".join(map(pieces.__getitem__, names)) + b"]"
                except KeyError:  # a name not in the view scores 0
                    return b"[" + b",".join([pieces.get(name) or _score_piece(name, 0) for name in names]) + b"]"
        return orjson.dumps([{"Host": name, "Score": 0} for name in names])

    def explain(self, req: Requirements, names: Sequence[str] | None = None) -> list[NodeVerdict]:
        """Every node's verdict and score with the figures behind them; slow path, for humans."""
        with self.view.lock:
            names = sorted(self.view.nodes) if names is None else names
            result = self.filter(req, names)
            failures = {**result.failed, **result.unresolvable}
            scores = dict(self.scores(req, names))
            verdicts = self._verdicts(req) if req.wants_gpu else None
            rows = []
            for name in names:
                reason = failures.get(name, "")
                entry = verdicts.entries.get(name) if verdicts else None
                rows.append(NodeVerdict(name, not reason, reason, scores.get(name, 0) if not reason else 0,
                                        self._detail(name, entry)))
            return rows

    # -- preemption ------------------------------------------------------------------------------
    def entry(self, req: Requirements, name: str) -> Rejection | Need | None:
        """The node's static verdict for this kind of pod: what it would take, or why it never can;
        None when the node is not in the view. Call under `view.lock`."""
        return self._verdicts(req).entries.get(name)

    def shortfall(self, name: str, need: Need, freed: Freed = _NOTHING_FREED) -> str | None:
        """The `/filter` fit check of a node (reservations and telemetry included) as if pods holding
        `freed` were gone: None when the pod fits, else the resolvable reason. Call under `view.lock`."""
        return self._shortfall(name, need, freed)

    # -- cache maintenance ---------------------------------------------------------------------
    def _verdicts(self, req: Requirements) -> _Verdicts:
        verdicts = self._cache.get(req)
        if verdicts is not None:
            self._cache.move_to_end(req)
            return verdicts
        verdicts = _Verdicts(req)
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
        if facts is None:
            for table in (verdicts.entries, verdicts.scores, verdicts.score_json):
                table.pop(name, None)
            verdicts.passing.discard(name)
            _clear_failure(verdicts, name)
            return
        entry = check_node(facts, self.view.validator_state(name), verdicts.req, self.config)
        verdicts.entries[name] = entry
        if entry.__class__ is Rejection:
            _set_score(verdicts, name, 0)
            _set_failure(verdicts, name, entry.code, entry.message, entry.resolvable)  # type: ignore[union-attr]
        else:
            self._place(verdicts, name, entry)  # type: ignore[arg-type]

    def _place(self, verdicts: _Verdicts, name: str, need: Need) -> None:
        shortfall = self._shortfall(name, need)
        if shortfall is None:
            _set_score(verdicts, name, self._score(name, need))
            _clear_failure(verdicts, name)
            verdicts.passing.add(name)
        else:
            _set_score(verdicts, name, 0)
            _set_failure(verdicts, name, shortfall.split(":", 1)[0], shortfall, True)

    # -- figures -------------------------------------------------------------------------------
    def _shortfall(self, name: str, need: Need, freed: Freed = _NOTHING_FREED) -> str | None:
        """Why `need` does not fit what is free on the node (plus what `freed` would give back), or None."""
        view = self.view
        for resource, units, mib in need:
            freed_units, freed_mib = freed.get(resource, (0, 0))
            free_units = view.free_units.get(resource, {}).get(name, 0) + freed_units
            if units > free_units:
                return insufficient_units(name, resource, free_units, units)
            free_mib = view.free_mib.get(resource, {}).get(name)
            if mib is not None and free_mib is not None and mib > free_mib + freed_mib:
                return insufficient_memory(name, resource, free_mib + freed_mib, mib)
            reading = view.telemetry.get(name)
            if mib is not None and units and not freed_mib and reading is not None and reading.device_free_mib \
                    and view.nodes[name].is_shared(resource) and mib // units > reading.device_free_mib[0]:
                # A share lives on one device: the ask must fit the device with the most framebuffer free.
                # (Not when victims would be evicted: which device they free, the reading cannot say.)
                return insufficient_memory(name, resource, reading.device_free_mib[0], mib // units)
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


def _fragment(name: str, message: str) -> bytes:
    return orjson.dumps(name) + b":" + orjson.dumps(message)


def _object(fragments: list[bytes]) -> bytes:
    return b"{" + b",".join(fragments) + b"}" if fragments else _EMPTY


def _score_piece(name: str, score: int) -> bytes:
    return b'{"Host":%b,"Score":%d}' % (orjson.dumps(name), score)


def _set_score(verdicts: _Verdicts, name: str, score: int) -> None:
    if verdicts.scores.get(name) != score or name not in verdicts.score_json:
        verdicts.scores[name] = score
        verdicts.score_json[name] = _score_piece(name, score)


def _set_failure(verdicts: _Verdicts, name: str, code: str, message: str, resolvable: bool) -> None:
    verdicts.passing.discard(name)
    if verdicts.messages.get(name) != message:
        verdicts.messages[name] = message
        verdicts.fragments[name] = _fragment(name, message)
        verdicts.codes[name] = code
    if resolvable:
        verdicts.resolvable.add(name)
    else:
        verdicts.resolvable.discard(name)


def _clear_failure(verdicts: _Verdicts, name: str) -> None:
    for table in (verdicts.messages, verdicts.fragments, verdicts.codes):
        table.pop(name, None)
    verdicts.resolvable.discard(name)
