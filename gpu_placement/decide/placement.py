"""Filter and score nodes for a pod, fast: verdicts are precomputed per kind of pod and kept current.

Pods that need the same thing (same `Requirements`) share one `_Verdicts`: every node's static
verdict, the set of nodes that pass right now, and every node's score. The view tells us which node
changed and we redo that node only, so a request costs set operations over the names it asks about.
"""

from __future__ import annotations

import random
import sys
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from itertools import compress, repeat
from operator import add, itemgetter
from typing import Any

import orjson

from gpu_placement.base.config import Config
from gpu_placement.decide.dra_fit import DRA, DraFit, both_ways_on, extended_requests, fit_on, served_on, why_not_on
from gpu_placement.decide.fences import Fences
from gpu_placement.decide.fragmentation import Fragmentation, round_cpu
from gpu_placement.decide.requirements import Requirements, requirements_for
from gpu_placement.decide.rollout import Rollout
from gpu_placement.decide.rules import (
    DRA_DEVICES,
    UNKNOWN_NODE,
    Need,
    Rejection,
    broken_ask,
    check_node,
    insufficient_devices,
    insufficient_memory,
    insufficient_units,
    unknown_node,
)
from gpu_placement.facts.nodes import NodeFacts
from gpu_placement.facts.pods import cpu_request
from gpu_placement.facts.soak import FAILED, SOAKING
from gpu_placement.view.cluster import ClusterView

__all__ = ["FilterResult", "Freed", "NodeVerdict", "Placement"]

MAX_SCORE = 10
# A node's rank is its 0..10 score times RANK_STEPS plus a finer step within that score, the order
# /filter's best tier follows (`Placement.tier`). The fragmentation score keeps the 0..1000 it computed
# (a tier tied at a rounded 0..10 left kube-scheduler's LeastAllocated to choose among nodes the score
# told apart, docs/replay.md); binpack and spread rank by their 0..10 score alone, as before.
RANK_STEPS = 100
_MIDDLE = RANK_STEPS // 2
# Kinds of pod remembered, bounded by memory rather than by count: a kind costs about 330 bytes a node
# (tracemalloc, 5,000 nodes: 1.4-1.7 MB a kind; before the ranks, which add about 90), so 128 MiB holds
# about 60-75 kinds at 5,000 nodes and 400 at 1,000. What the pod wrote is kept only as the kind's key
# (bounded by the annotation limit, counted below): a pod whose ask is broken gets no kind, and an answer
# naming nodes the view lacks is not kept (both quote or echo request text; a stream of them filled
# memory, issue 36).
_CACHE_BYTES = 128 * 2**20
_PER_NODE_BYTES = 410  # table slots, score piece, rank (a dict slot and an int: ~90), Need, last answer: a kind's
# cost per node besides its fragments
# Its tables and record whatever the cluster's size: tracemalloc, 16 nodes: 14 KB a kind in all, of which the
# per-node part and fragments are 6.4 KB. Without it, on a small cluster 128 MiB by estimate was 300 MiB.
_PER_KIND_BYTES = 8 * 1024
# A failing node's place in its kind's fragments (`_Verdicts.places`): 62 bytes a failing node at 5,000 nodes
# (sys.getsizeof of the dict and its ints; 176 KB of the 2.36 MB tracemalloc gives a kind there).
_PER_PLACE_BYTES = 64
_EMPTY = b"{}"
_SCORE_ENDS = tuple(b"%d}" % score for score in range(MAX_SCORE + 1))  # a score piece's end, by score
_NO_NODES: Mapping[str, Any] = {}  # the default of per-resource lookups: not a new dict per call
Freed = Mapping[str, tuple[int, int]]  # resource -> (units, MiB) that evicting some pods would give back
_NOTHING_FREED: Freed = {}
_NO_NAMES: frozenset[str] = frozenset()


@dataclass(slots=True)
class FilterResult:
    """The answer to one filter. The two failure maps are kept as the JSON objects they are sent as
    (built from per-node pieces encoded when the node changed); decode them with `failed` and
    `unresolvable` when a person or a test needs them."""

    passed: list[str]
    failed_json: bytes = _EMPTY  # node -> reason preemption may fix (FailedNodes)
    unresolvable_json: bytes = _EMPTY  # node -> reason it cannot (FailedAndUnresolvableNodes)
    reasons: Counter[str] = field(default_factory=Counter)  # code -> nodes, for metrics
    encoded: bytes | None = None  # the NodeNames-form response, kept by the extender when it encodes it
    # The failure maps were not built (`filter(maps=False)` with some node passing): both are empty here,
    # and only `passed` and `reasons` may be read.
    partial: bool = False

    @property
    def failed(self) -> dict[str, str]:
        assert not self.partial, "a partial FilterResult has no failure maps"
        failed: dict[str, str] = orjson.loads(self.failed_json)
        return failed

    @property
    def unresolvable(self) -> dict[str, str]:
        assert not self.partial, "a partial FilterResult has no failure maps"
        unresolvable: dict[str, str] = orjson.loads(self.unresolvable_json)
        return unresolvable


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
    ranks: dict[str, int] = field(default_factory=dict)  # the score in finer steps: the tier's order (`_score`)
    score_json: dict[str, bytes] = field(default_factory=dict)  # b'{"Host":"n1","Score":7}'
    messages: dict[str, str] = field(default_factory=dict)  # failing nodes: the reason
    fragments: dict[str, bytes] = field(default_factory=dict)  # failing nodes: b'"n1":"Code: sentence"'
    # failing nodes: each one's place in `fragments`' order (numbered as it was put in; see `_known`)
    places: dict[str, int] = field(default_factory=dict)
    placed: int = 0  # the next place
    codes: dict[str, str] = field(default_factory=dict)  # failing nodes: the reason code
    resolvable: set[str] = field(default_factory=set)  # failing nodes preemption could help
    by_class: dict[int, Rejection | Need] = field(default_factory=dict)  # static verdict per node class
    size: int = 0  # estimated bytes, for the cache's memory bound
    version: int = 0  # bumped when a node's pass/fail, reason or resolvability changes: the filter answer
    changed: set[str] = field(default_factory=set)  # nodes whose bump the last answer has not taken in yet
    answer: _Answer | None = None  # the last filter's answer, replayed while `version` stays, else put right
    seen: int = 0  # position in Placement's log of changed nodes up to which this kind is current
    scored: int = 0  # the fragmentation score's learned shares (their version) the scores were made with


@dataclass(slots=True)
class _Answer:
    """One kind's last filter answer, in parts, so that a few nodes changed or a few names more or
    fewer asked put it right without walking every name. The names asked are kept as a set:
    kube-scheduler's feasible list is filled by parallel workers, so the same nodes arrive in
    another order each cycle (and the passing names may go back in any order: it looks each up)."""

    version: int
    asked: frozenset[str]
    passed: dict[str, None]  # an ordered set
    failed: dict[str, bytes]  # name -> its piece of FailedNodes
    unresolvable: dict[str, bytes]  # name -> its piece of FailedAndUnresolvableNodes
    codes: dict[str, str]  # failing name -> its reason code
    counts: Counter[str]  # `codes` counted, kept in step
    result: FilterResult
    failed_changed: bool = False  # since `result`: its FailedNodes bytes are joined again, else kept
    unresolvable_changed: bool = False
    strangers: bool = False  # names asked that the view lacks: an answer that echoes them is not kept
    # An answer built without its failure maps (`filter(maps=False)`): (the failing names the view knows,
    # those of them preemption could help, the names the view lacks), the very sets `_answer` walks, so
    # `_materialize` builds `failed`, `unresolvable` and `codes` later in the order `_answer` would have.
    pending: tuple[AbstractSet[str], AbstractSet[str], AbstractSet[str]] | None = None


class Placement:
    def __init__(self, view: ClusterView, config: Config, rollout: Rollout | None = None,
                 fences: Fences | None = None, seed: int | None = None) -> None:
        self.view = view
        self.config = config
        self.random = random.Random(seed)  # draws the best tier's sample (`tier`): equal nodes share the pods
        self.rollout = rollout if rollout is not None else Rollout(view, config)
        self.fences = fences if fences is not None else Fences(view, config)
        self._cache: OrderedDict[Requirements, _Verdicts] = OrderedDict()  # keyed on decision inputs only
        self._cache_bytes = 0
        self._keys: dict[Requirements, Requirements] = {}  # a pod's Requirements -> its cache key
        self._classes: dict[str, int] = {}  # node -> the id of its class (see _node_class)
        self._class_ids: dict[Hashable, int] = {}  # everything a static verdict depends on -> a small id
        # Nodes changed since the kinds last looked, in order: (node, its facts or validator changed, not
        # only what is free). A view event appends one entry; each kind takes in the entries it has not
        # seen when it is next used (`_catch_up`), so an event costs the same with 1 kind cached or 300.
        self._log: list[tuple[str, bool]] = []
        self._log_start = 0  # the position of _log[0] since the cache was last cleared
        view.subscribe(self._node_changed, self._free_changed)
        self.rollout.subscribe(self._node_changed)  # a soak began, ended or failed: that node's verdicts
        self.fences.subscribe(self._node_changed)  # a launch fence began, lifted, or its probe opened
        # scoring.strategy fragmentation: learns what arrives, follows the CPU pods request on each node
        self.fragmentation = Fragmentation(view, self._free_changed) if config.scoring.strategy == "fragmentation" \
            else None

    # -- requests ------------------------------------------------------------------------------
    def requirements(self, pod: Mapping[str, Any]) -> Requirements:
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        dra = self.view.dra
        req = requirements_for(pod, self.view.namespaces.get(namespace), self.config.is_gpu_resource,
                               dra if dra.active else None, self.config.ngc)
        if self.fragmentation is not None and req.wants_gpu and req.error is None:
            # The CPU it asks decides whether a node's free GPUs are left usable: part of its kind here only.
            req = replace(req, cpu_milli=round_cpu(cpu_request(pod.get("spec") or {})))
            with self.view.lock:
                self.fragmentation.observe(str(meta.get("uid") or ""), req)
        return req

    def filter(self, req: Requirements, names: Sequence[str], maps: bool = True) -> FilterResult:
        """This kind's answer for these names: its last one while no verdict it depends on changed,
        else built by `_answer`. The passing names come in no particular order: kube-scheduler looks
        each one up in the nodes it asked about. With `maps` False, a caller that reads only `passed`
        and `reasons` when some node passes (the extender's best tier) may get a `partial` result: the
        failing nodes counted by reason, their maps not built (the same passing names, in the same
        order; an answer that passes nothing is always whole)."""
        if not req.wants_gpu:
            return FilterResult(list(names))
        if req.error is not None:
            return self._refused(req.error, names)
        view = self.view
        view.expire_reservations()
        self.rollout.expire()
        self.fences.expire()
        asked = frozenset(names)  # touches only this request's names, each hashed once
        hash(asked)  # order-free, from the names' hashes; kept in the set
        with view.lock:
            verdicts = self._verdicts(req)
            last, changed = verdicts.answer, verdicts.changed
            if last is not None:
                if _same_names(last.asked, asked):
                    if last.version == verdicts.version:
                        # Nothing this kind's answer depends on changed (a pod bound on a node that
                        # still passes, a heartbeat): the same answer.
                        if maps and last.pending is not None:
                            _materialize(verdicts, last)
                            last.result = _result(last)
                        return last.result
                    if len(changed) <= _PATCH_AT_MOST:
                        return _patch(verdicts, last, last.asked)
                elif abs(len(last.asked) - len(asked)) + len(changed) <= _PATCH_AT_MOST:
                    # Most often a node or two fewer or more: kube-scheduler's own filters dropped a
                    # node that filled up, or took back one that was freed. One pass: `^` copies the
                    # last set's table and looks each name asked up in the copy.
                    differ = set(last.asked ^ asked)  # copied small: the result has the big table
                    if len(differ) + len(changed) <= _PATCH_AT_MOST:
                        removed = differ - asked
                        return _patch(verdicts, last, asked, differ - removed, removed)
            answer = _answer(verdicts, asked, maps)
            if not answer.strangers:  # else the last answer stays, and the changes it has not taken in
                verdicts.answer = answer
                changed.clear()
            return answer.result

    def _refused(self, error: str, names: Sequence[str]) -> FilterResult:
        """A pod whose own ask is broken: refused by every node with the same sentence (which quotes
        what it wrote), answered without a kind in the cache."""
        rejection = broken_ask(error)
        mine, stranger = b":" + orjson.dumps(rejection.message), b":" + orjson.dumps(unknown_node())
        asked = dict.fromkeys(names)  # each name once, as the kinds answer
        with self.view.lock:
            known = asked.keys() & self.view.nodes.keys()
        pieces = [orjson.dumps(name) + (mine if name in known else stranger) for name in asked]
        reasons = Counter({rejection.code: len(known)} if known else {})
        if len(asked) > len(known):
            reasons[UNKNOWN_NODE] = len(asked) - len(known)
        return FilterResult([], _EMPTY, _object(pieces), reasons)

    def recheck(self, req: Requirements, name: str) -> str | None:
        """None when the pod fits on the node now, reservations included; else the reason. For `/bind`,
        which calls it under the view's lock in one step with making the reservation. A launch fence's
        probe goes to one pod: taken by another's reservation, it refuses."""
        with self.view.lock:
            return self._recheck(req, name) or self.fences.probe_taken(name, req.gpus)

    def _recheck(self, req: Requirements, name: str) -> str | None:
        view = self.view
        self.rollout.expire()
        self.fences.expire()
        with view.lock:
            facts = view.nodes.get(name)
            if facts is None:
                return unknown_node()
            key = _decision_key(req)
            verdicts = self._cache.get(key)
            if verdicts is not None:  # brought current with every change of the node and of what is free on it
                self._catch_up(verdicts)
                if name in verdicts.passing:
                    return None
                entry = verdicts.entries.get(name)
                if type(entry) is Need and entry.dra:
                    # kube-scheduler allocated the pod's devices before it asked to bind (PreBind): by now the
                    # view may count them as taken by the pod itself. Only the device-plugin part is rechecked.
                    return self._shortfall(name, entry)
                return verdicts.messages.get(name, unknown_node())
            entry = check_node(facts, view.validator_state(name), key, self.config, self.rollout.soak(name),
                               self.fences.closed(name))
            return entry.message if type(entry) is Rejection else self._shortfall(name, entry)

    def scores(self, req: Requirements, names: Sequence[str]) -> list[tuple[str, int]]:
        if not req.wants_gpu or req.error is not None:  # a broken ask passes no node: 0 everywhere
            return [(name, 0) for name in names]
        self.view.expire_reservations()
        self.rollout.expire()
        self.fences.expire()
        with self.view.lock:
            scores = self._verdicts(req).scores
            return [(name, scores.get(name, 0)) for name in names]

    def passing_outside(self, req: Requirements, asked: AbstractSet[str]) -> list[str]:
        """The nodes this kind passes now that are not in `asked`: for a /filter that passed none of the
        names kube-scheduler sent (extender/sample.py). A walk over the kind's passing set, so only on
        that rare path."""
        if not req.wants_gpu or req.error is not None:
            return []
        with self.view.lock:
            return [name for name in self._verdicts(req).passing if name not in asked]

    def tier(self, req: Requirements, passed: Sequence[str], size: int | None = None, coarse: bool = False
             ) -> list[str]:
        """The best tier of `passed` (names `filter` passed): the nodes tied at this kind's highest rank (the
        0..10 score; fragmentation's in hundredths, `RANK_STEPS`, unless `coarse`: a pod whose own soft
        preferences kube-scheduler's plugins are to weigh among nodes of one score), at most `size` (default
        `scoring.tierSize`) drawn at random, so that a burst on equal nodes spreads over them. `size` 0, a
        pod with no GPU, or one node: `passed` as it is. The order of `passed` is kept before the draw, so a
        caller that sorts it gets a draw its seed repeats."""
        size = self.config.scoring.tier_size if size is None else size
        if size <= 0 or len(passed) <= 1 or not req.wants_gpu or req.error is not None:
            return list(passed)
        with self.view.lock:
            verdicts = self._verdicts(req)
            ranks = verdicts.scores if coarse else verdicts.ranks
            try:  # in C: one lookup per name, then the names at the best rank
                values = itemgetter(*passed)(ranks)
            except KeyError:  # passed by a caller that asked about a node the view lacks: it ranks 0
                values = tuple(ranks.get(name, 0) for name in passed)
        best = max(values)
        tied = list(compress(passed, map(best.__eq__, values)))
        return tied if len(tied) <= size else self.random.sample(tied, size)

    def scores_json(self, req: Requirements, names: Sequence[str]) -> bytes:
        """`[{"Host": name, "Score": n}, ...]` for /prioritize, joined from per-node pieces: each node's
        score less the lowest among the names asked, and the nodes at that lowest left out.
        kube-scheduler adds an extender's score (times its weight) to the plugins' and a node left out
        gets 0 from it, so every node asked moves by the same amount and the ranking stays what the
        scores say; the answer shrinks to the nodes that differ (a burst on like nodes: a few). What
        changes is kube-scheduler's tie-break among equal totals (docs/performance.md, "Shorter
        /prioritize")."""
        if not names or not req.wants_gpu or req.error is not None:  # no GPU, a broken ask: 0 everywhere
            return b"[]"
        self.view.expire_reservations()
        self.rollout.expire()
        self.fences.expire()
        with self.view.lock:
            verdicts = self._verdicts(req)
            scores, pieces = verdicts.scores, verdicts.score_json
            try:  # in C: one lookup per name, the lowest, the names above it
                values = itemgetter(*names)(scores) if len(names) > 1 else (scores[names[0]],)
            except KeyError:  # a name not in the view scores 0
                values = tuple(scores.get(name, 0) for name in names)
            low = min(values)
            above = list(map(low.__lt__, values))  # in C too
            kept = compress(names, above)
            if not low:  # the pieces as kept: no new bytes
                return b"[" + b",".join(map(pieces.__getitem__, kept)) + b"]"
            # Each kept node's piece made again with its score less the lowest: in C too (a name's head is cached)
            ends = map(_SCORE_ENDS.__getitem__, map(low.__rsub__, compress(values, above)))
            return b"[" + b",".join(map(add, map(_score_head, kept), ends)) + b"]"

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
                                        self._detail(name, entry, req.canary, req)))
            return rows

    def detail(self, req: Requirements, name: str) -> str:
        """One node's own figures for this pod (free units and MiB): for `explain` and the debug log,
        never for a reason, which is the same string on every node with the same cause."""
        with self.view.lock:
            verdicts = self._cache.get(_decision_key(req))
            if verdicts is not None:
                self._catch_up(verdicts)
            return self._detail(name, verdicts.entries.get(name) if verdicts else None, req.canary, req)

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
        key = self._keys.get(req)
        if key is None:
            if len(self._keys) > 4096:  # pods come and go; the keys they map to stay in the cache
                self._keys.clear()
            key = self._keys[req] = _decision_key(req)
        verdicts = self._cache.get(key)
        if verdicts is not None:
            self._cache.move_to_end(key)
            self._catch_up(verdicts)
            if self.fragmentation is not None and verdicts.scored != self.fragmentation.version:
                self._rescore(verdicts)
            return verdicts
        verdicts = _Verdicts(key, seen=self._log_start + len(self._log),
                             scored=self.fragmentation.version if self.fragmentation is not None else 0)
        self._build(verdicts)
        if key.error is not None:  # preemption or explain asking about a broken ask: not kept (see filter)
            return verdicts
        verdicts.size = (_PER_KIND_BYTES + len(repr(key)) + _PER_NODE_BYTES * len(verdicts.entries)
                         + sum(map(len, verdicts.fragments.values())) + _PER_PLACE_BYTES * len(verdicts.places))
        self._cache[key] = verdicts
        self._cache_bytes += verdicts.size
        while self._cache_bytes > _CACHE_BYTES and len(self._cache) > 1:  # least recently used first
            _, evicted = self._cache.popitem(last=False)
            self._cache_bytes -= evicted.size
        return verdicts

    def _build(self, verdicts: _Verdicts) -> None:
        """Every node's verdict for a new kind of pod: `_redo` for all nodes, unrolled. A static
        rejection is one class lookup and a few stores; only nodes that pass statically are placed
        against what is free. This is the cold /filter, so it avoids a call per node where it can."""
        view, config, req, soak, fenced = self.view, self.config, verdicts.req, self.rollout.soak, self.fences.closed
        by_class, entries, classes = verdicts.by_class, verdicts.entries, self._classes
        scores, score_json, messages = verdicts.scores, verdicts.score_json, verdicts.messages
        fragments, codes, resolvable = verdicts.fragments, verdicts.codes, verdicts.resolvable
        passing = verdicts.passing
        messages_json: dict[str, bytes] = {}
        dumps = orjson.dumps
        for name, facts in view.nodes.items():
            node_class = classes.get(name) or self._node_class(name, facts)
            entry = by_class.get(node_class)
            if entry is None:
                entry = by_class[node_class] = check_node(facts, view.validator_state(name), req, config, soak(name),
                                                          fenced(name))
            entries[name] = entry
            if type(entry) is not Rejection:  # a fresh kind has nothing to clear: _place without it
                shortfall, freeable, dra = self._fit(name, entry, req)  # not `resolvable`: the set below
                if shortfall is None:
                    verdicts.ranks[name] = rank = self._score(name, entry, req, dra)
                    scores[name] = score = rank // RANK_STEPS
                    score_json[name] = b'{"Host":%b,"Score":%d}' % (dumps(name), score)
                    passing.add(name)
                else:
                    _set_score(verdicts, name, 0)
                    _set_failure(verdicts, name, shortfall.split(":", 1)[0], shortfall, freeable)
                continue
            message = entry.message
            encoded = messages_json.get(message)
            if encoded is None:
                encoded = messages_json[message] = b":" + dumps(message)
            name_json = dumps(name)
            scores[name] = 0
            score_json[name] = b'{"Host":%b,"Score":0}' % name_json
            messages[name] = message
            verdicts.places[name] = verdicts.placed  # a fresh kind: every name new to `fragments`
            verdicts.placed += 1
            fragments[name] = name_json + encoded
            codes[name] = entry.code
            if entry.resolvable:
                resolvable.add(name)

    def _rescore(self, verdicts: _Verdicts) -> None:
        """The fragmentation score's learned shares were re-read: this kind's passing nodes scored again,
        once (their verdicts stand; only the scores move)."""
        assert self.fragmentation is not None
        verdicts.scored = self.fragmentation.version
        for name in verdicts.passing:
            entry = verdicts.entries.get(name)
            if type(entry) is Need:
                _set_score(verdicts, name, self._score(name, entry, verdicts.req))

    def _node_changed(self, name: str | None) -> None:
        if name is None:
            self._cache.clear()
            self._cache_bytes = 0
            self._classes.clear()
            self._class_ids.clear()
            self._log_start += len(self._log)
            self._log.clear()
            return
        self._classes.pop(name, None)
        self._logged(name, True)

    def _free_changed(self, name: str) -> None:
        self._logged(name, False)

    def _logged(self, name: str, static: bool) -> None:
        """A view listener (under the view's lock): note the change; the kinds take it in when used."""
        if not self._cache:
            return
        self._log.append((name, static))
        if len(self._log) > _LOG_LIMIT:  # kinds that have not looked since the older half are rebuilt instead
            cut = len(self._log) // 2
            del self._log[:cut]
            self._log_start += cut
            for key in [key for key, verdicts in self._cache.items() if verdicts.seen < self._log_start]:
                self._cache_bytes -= self._cache.pop(key).size

    def _catch_up(self, verdicts: _Verdicts) -> None:
        """Redo the nodes changed since this kind last looked: each once, whatever changed it how often.
        Under the view's lock."""
        end = self._log_start + len(self._log)
        if verdicts.seen >= end:
            return
        static: set[str] = set()
        free: set[str] = set()
        for name, whole in self._log[verdicts.seen - self._log_start:]:
            (static if whole else free).add(name)
        verdicts.seen = end
        for name in static:
            self._redo(verdicts, name)
        for name in free - static:
            entry = verdicts.entries.get(name)
            if type(entry) is Need:
                self._place(verdicts, name, entry)

    def _node_class(self, name: str, facts: NodeFacts) -> int:
        """What the static verdict of a node depends on besides the pod: its facts but its name, and
        whether its validator is there and Ready, and whether its driver is soaking or failed its soak.
        Nodes of one class get one `check_node` per kind of pod, so a new kind costs a call per class
        (tens), not per node (thousands)."""
        class_id = self._classes.get(name)
        if class_id is None:  # the key is hashed here once, not at every lookup (tuples do not cache it)
            validator = self.view.validator_state(name)
            soak = self.rollout.soak(name)
            key = (_facts_key(facts), validator.pod is None, validator.ready, soak.state if soak.avoided else "",
                   self.fences.closed(name))
            class_id = self._classes[name] = self._class_ids.setdefault(key, len(self._class_ids))
        return class_id

    def _redo(self, verdicts: _Verdicts, name: str) -> None:
        facts = self.view.nodes.get(name)
        if facts is None:
            for table in (verdicts.entries, verdicts.scores, verdicts.ranks, verdicts.score_json):
                table.pop(name, None)
            verdicts.passing.discard(name)
            _clear_failure(verdicts, name)
            _bump(verdicts, name)
            return
        node_class = self._node_class(name, facts)
        entry = verdicts.by_class.get(node_class)
        if entry is None:
            entry = verdicts.by_class[node_class] = check_node(facts, self.view.validator_state(name), verdicts.req,
                                                               self.config, self.rollout.soak(name),
                                                               self.fences.closed(name))
        verdicts.entries[name] = entry
        if type(entry) is Rejection:
            _set_score(verdicts, name, 0)
            _set_failure(verdicts, name, entry.code, entry.message, entry.resolvable)
        else:
            self._place(verdicts, name, entry)

    def _place(self, verdicts: _Verdicts, name: str, need: Need) -> None:
        shortfall, resolvable, dra = self._fit(name, need, verdicts.req)
        if shortfall is None:
            _set_score(verdicts, name, self._score(name, need, verdicts.req, dra))
            _clear_failure(verdicts, name)
            if name not in verdicts.passing:
                verdicts.passing.add(name)
                _bump(verdicts, name)
        else:
            _set_score(verdicts, name, 0)
            _set_failure(verdicts, name, shortfall.split(":", 1)[0], shortfall, resolvable)

    def _fit(self, name: str, need: Need, req: Requirements) -> tuple[str | None, bool, DraFit | None]:
        """(why the pod does not fit what is free now, whether preemption could help, its DRA fit)."""
        shortfall = self._shortfall(name, need)
        if shortfall is not None or not need.dra:
            return shortfall, True, None
        dra = self.dra_fit(name, req)
        if dra is None:
            return insufficient_devices(", ".join(self._dra_classes(name, req)) or "the classes asked"), False, None
        return None, False, dra

    def dra_fit(self, name: str, req: Requirements) -> DraFit | None:
        """How the pod's DRA asks (its claims' requests, and its extended resources served through DRA on
        this node) fit the node's devices now (gpu_placement/decide/dra_fit.py). Call under `view.lock`."""
        return fit_on(self.view, name, self._dra_requests(name, req))

    def _dra_requests(self, name: str, req: Requirements) -> tuple[Any, ...]:
        facts = self.view.nodes.get(name)
        served = extended_requests(req.gpus, req.dra_resources, facts.allocatable if facts else {},
                                   self.view.dra.extended) if req.dra_resources else ()
        return (*req.dra_requests, *served)

    def _dra_classes(self, name: str, req: Requirements) -> list[str]:
        return sorted({a.device_class for r in self._dra_requests(name, req) for a in r})

    # -- figures -------------------------------------------------------------------------------
    def _shortfall(self, name: str, need: Need, freed: Freed = _NOTHING_FREED) -> str | None:
        """Why `need` does not fit what is free on the node (plus what `freed` would give back), or None."""
        view = self.view
        for resource, units, mib in need.asks:
            if resource == DRA_DEVICES:  # the allocator's: `_fit` counts it against the node's devices
                continue
            freed_units, freed_mib = freed.get(resource, (0, 0))
            free_units = view.free_units.get(resource, _NO_NODES).get(name, 0) + freed_units
            if units > free_units:
                return insufficient_units(resource, units)
            free_mib = view.free_mib.get(resource, _NO_NODES).get(name)
            if mib is not None and free_mib is not None and mib > free_mib + freed_mib:
                return insufficient_memory(resource, mib)
            reading = view.telemetry.get(name)
            if mib is not None and units and not freed_mib and reading is not None and reading.device_free_mib \
                    and view.nodes[name].is_shared(resource) and mib // units > reading.device_free_mib[0]:
                # A share lives on one device: the ask must fit the device with the most framebuffer free.
                # (Not when victims would be evicted: which device they free, the reading cannot say.)
                return insufficient_memory(resource, mib // units)
        return None

    def _score(self, name: str, need: Need, req: Requirements, dra: DraFit | None = None) -> int:
        """The node's rank: its 0..10 score times RANK_STEPS plus a step within it (`rank // RANK_STEPS` is
        the score). Binpack: how full the node is once the pod is on it (fill used nodes first, keep whole
        nodes free for big jobs); spread: how empty; fragmentation: how little the pod there adds to the
        fragments of the node's free GPUs for the pods that typically arrive (gpu_placement.decide.fragmentation),
        its step the score's own fraction. Minus penalties for nodes to avoid when there is a choice. A
        soaking driver overrides them all: the bottom for most pods, the top for canaries; a driver that
        failed its soak, the bottom for all."""
        canary = req.canary
        soak = self.rollout.soak(name).state
        if soak == FAILED or (soak == SOAKING and not canary):
            return 0
        if soak == SOAKING:
            return MAX_SCORE * RANK_STEPS + _MIDDLE
        top = MAX_SCORE - 1 if canary else MAX_SCORE  # a canary's top is a soaking node's alone
        view = self.view
        if self.fragmentation is not None:
            exact = MAX_SCORE * self.fragmentation.raw(name, req) - self._penalty(view.nodes[name])
            return _rank(exact, top)
        fills = []
        tier = (0, 1)  # (the alternative the allocator would take, how many a request lists)
        for resource, units, mib in need.asks:
            if resource == DRA_DEVICES:  # the node's devices of the classes asked, in use once the pod is there
                if dra is not None:
                    fills.append(dra.fill)
                    tier = (dra.rank, dra.choices)
                    continue
                total = view.nodes[name].dra_devices
                fills.append(min(1.0, (len(view.dra.used_on(name)) + 1) / total) if total else 0.0)
                continue
            capacity = view.capacity_mib.get(resource, _NO_NODES).get(name)
            free = view.free_mib.get(resource, _NO_NODES).get(name)
            if mib is None or not capacity or free is None:  # memory unknown: count devices instead
                facts = view.nodes[name]
                capacity, free, mib = facts.allocatable.get(resource, 0), view.free_units[resource][name], units
            fills.append(min(1.0, (capacity - free + mib) / capacity) if capacity else 0.0)
        fill = sum(fills) / len(fills)
        raw = fill if self.config.scoring.strategy == "binpack" else 1.0 - fill
        rank, choices = tier
        if choices > 1:  # a node where a request gets only its n-th alternative scores below every node
            raw = (choices - 1 - rank + raw) / choices  # where it gets an earlier one (firstAvailable's order)
        score = round(MAX_SCORE * raw) - self._penalty(view.nodes[name])
        return max(0, min(top, score)) * RANK_STEPS + _MIDDLE

    def _penalty(self, facts: NodeFacts) -> int:
        weights = self.config.scoring
        penalty = weights.upgrade_required if facts.upgrade_state == "upgrade-required" else 0
        if facts.capacity and facts.unhealthy_devices:
            penalty += weights.unhealthy_devices
        reading = self.view.telemetry.get(facts.name) if self.view.telemetry else None
        if reading is not None and reading.xid_errors:
            penalty += weights.xid_errors
        return penalty

    def _dra_detail(self, name: str, req: Requirements) -> str:
        found = self.dra_fit(name, req)
        if found is None:
            requests = self._dra_requests(name, req)
            reasons = [f"{alternative.device_class}{' (' + alternative.name + ')' if alternative.name else ''}: "
                       + ("; ".join(f"{d} {w}" for d, w in why_not_on(self.view, name, alternative).items())
                          or "fewer devices than asked")
                       for request in requests for alternative in request]
            return "no free device serves its claims: " + " | ".join(reasons)
        taken = ", ".join(found.devices) or "nothing (admin access)"
        if found.choices > 1:
            order = ", ".join(f"alternative {index + 1}" for index in found.chosen)
            return f"would take {taken} ({order} of its firstAvailable list); fill {found.fill:.0%} after"
        return f"would take {taken}; fill {found.fill:.0%} after"

    def _detail(self, name: str, entry: Rejection | Need | None, canary: bool = False,
                req: Requirements | None = None) -> str:
        if type(entry) is not Need:
            return ""
        soak = self.rollout.soak(name)
        parts = []
        if req is not None and req.dra_resources:  # which way the node serves what it asks (KEP-5004)
            asked = sorted(r for r, _ in req.gpus)
            both = both_ways_on(self.view, name, asked)
            for resource, way in served_on(self.view, name, asked).items():
                if way == DRA:
                    parts.append(f"{resource} through DRA (DeviceClass {self.view.dra.extended[resource]})")
                elif resource in both:
                    device_class, count = both[resource]
                    parts.append(f"{resource} from the device plugin, not from its {count} DRA devices of "
                                 f"{device_class} (kube-scheduler uses DRA for it only on nodes whose "
                                 "allocatable lacks it)")
                else:
                    parts.append(f"{resource} from the device plugin")
        for resource, units, mib in entry.asks:
            if resource == DRA_DEVICES:
                parts.append(f"{len(self.view.dra.used_on(name))} of {self.view.nodes[name].dra_devices} "
                             f"{self.config.dra.driver} devices held by claims (DRA allocates)")
                if req is not None:
                    parts.append(self._dra_detail(name, req))
                continue
            free_units = self.view.free_units.get(resource, _NO_NODES).get(name, 0)
            free_mib = self.view.free_mib.get(resource, _NO_NODES).get(name)
            memory = f", needs {mib} MiB of {free_mib} MiB free" if mib is not None and free_mib is not None else ""
            parts.append(f"{units}x {resource} of {free_units} free{memory}")
        if self.fragmentation is not None and req is not None:
            parts.append(self.fragmentation.explain(name, req))
        penalty = self._penalty(self.view.nodes[name])
        if soak.avoided:
            top = soak.state == SOAKING and canary
            parts.append(f"driver {soak.version or '?'} {soak.state}: score {MAX_SCORE if top else 0} "
                         f"({'canary namespace' if canary else 'not a canary namespace'}; gpu-placement rollout)")
        elif penalty:
            parts.append(f"score -{penalty} (upgrade/unhealthy/XID)")
        for fence in self.fences.state(name).fences:  # passes by its probe: the one pod let through
            if req is not None and any(resource == fence.resource for resource, _ in req.gpus):
                parts.append(f"launch fence on {fence.resource} ({fence.count} failed in a row, {fence.cause}): "
                             "its probe is open, one pod goes through and its start lifts the fence")
        return "; ".join(parts)


# Per node, or read by scores only: no part of a node's class (its static verdicts).
# settled_driver counts through the node's soak state, boot_id and launch_fence through its launch fence:
# each part of the class on its own; `refused` is the label the verdicts themselves are written to, never
# read by them.
_FACT_FIELDS = tuple(f.name for f in fields(NodeFacts)
                     if f.name not in ("name", "created", "cpu_milli", "settled_driver", "boot_id", "launch_fence",
                                       "refused"))


def _facts_key(facts: NodeFacts) -> Hashable:
    return tuple(_hashable(getattr(facts, name)) for name in _FACT_FIELDS)


def _hashable(value: object) -> Hashable:
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    if isinstance(value, (list, set, frozenset)):
        return tuple(sorted(value))
    return value


def _decision_key(req: Requirements) -> Requirements:
    """The pod's requirements without what does not decide anything: which container an inferred
    CUDA version came from. Two pods differing only in container names share one cache entry, and
    the reasons built from it say "(image tag)", never a container's name."""
    cuda_source = req.cuda_source.split(" of container ", 1)[0]
    memory_source = req.memory_source.split(" of container ", 1)[0]
    image_cuda = req.image_cuda
    if image_cuda is not None and " of container " in image_cuda.source:
        image_cuda = replace(image_cuda, source=image_cuda.source.split(" of container ", 1)[0])
    if cuda_source == req.cuda_source and memory_source == req.memory_source and image_cuda is req.image_cuda:
        return req
    return replace(req, cuda_source=cuda_source, memory_source=memory_source, image_cuda=image_cuda)


_PATCH_AT_MOST = 64  # nodes an answer is put right for, one by one; past this, building it again is as cheap
_LOG_LIMIT = 65_536  # changed-node entries kept for kinds to take in (about 4 MB); see Placement._logged


def _same_names(last: frozenset[str], asked: frozenset[str]) -> bool:
    """Whether the same nodes were asked, by size and set hash. Comparing the names themselves would
    read every name of the last request again, cold in memory by now: at 5,000 names that alone
    costs more than parsing the request. The hash of a frozenset is order-free and made from the
    names' own seeded 64-bit hashes, so two different sets of one size match by chance about once
    in 2**64; and a wrong match places nothing wrongly: kube-scheduler refuses an answer naming a
    node it did not ask about, or a node left out waits for the next cycle, and /bind checks again."""
    return len(last) == len(asked) and hash(last) == hash(asked)


def _answer(verdicts: _Verdicts, asked: frozenset[str], maps: bool = True) -> _Answer:
    """The answer built for every name asked: set operations and lookups in C, pieces encoded when
    each node last changed; Python work only for names not in the view. Without `maps`, when some
    node passes: the failing names only counted by reason, the rest left to `_materialize`."""
    passed = asked & verdicts.passing
    failing = asked - passed
    fragments, codes = verdicts.fragments, verdicts.codes
    known = _known(verdicts, failing)
    resolvable = known & verdicts.resolvable
    if not maps and passed:
        strangers = failing - known
        codes_of = _subset(codes, known)  # kept: a patch takes a node out by the code it had here
        counts = Counter(codes_of.values())  # in C, in the order below
        if strangers:
            counts[UNKNOWN_NODE] += len(strangers)
        return _Answer(verdicts.version, asked, dict.fromkeys(passed), {}, {}, codes_of, counts,
                       FilterResult(list(passed), reasons=+counts, partial=True), strangers=bool(strangers),
                       pending=(known, resolvable, strangers))
    unresolvable = known - resolvable
    answer = _Answer(verdicts.version, asked, dict.fromkeys(passed), _subset(fragments, resolvable),
                     _subset(fragments, unresolvable), _subset(codes, known), Counter(), FilterResult([]))
    for name in failing - known:  # asked about, not in the view
        answer.unresolvable[name] = _fragment(name, unknown_node())
        answer.codes[name] = UNKNOWN_NODE
        answer.strangers = True
    answer.counts.update(answer.codes.values())
    answer.failed_changed = answer.unresolvable_changed = True
    answer.result = _result(answer)
    return answer


def _materialize(verdicts: _Verdicts, answer: _Answer) -> None:
    """A partial answer's failure maps, built as `_answer` would have built them: from the same sets,
    so in the same order (its codes and counts were kept whole). A node whose verdict changed since
    has its piece as it is now, or an empty one when it passes now or left the view: it is in
    `verdicts.changed`, so the only callers, `_patch` (which takes it out and puts it back as it stands)
    and a replay (of an answer nothing changed since), never send that piece."""
    assert answer.pending is not None
    known, resolvable, strangers = answer.pending
    answer.pending = None
    fragments = verdicts.fragments
    unresolvable = known - resolvable
    answer.failed = dict(zip(resolvable, map(fragments.get, resolvable, repeat(b"")), strict=False))  # in C
    answer.unresolvable = dict(zip(unresolvable, map(fragments.get, unresolvable, repeat(b"")), strict=False))
    for name in strangers:
        answer.unresolvable[name] = _fragment(name, unknown_node())
        answer.codes[name] = UNKNOWN_NODE
    answer.failed_changed = answer.unresolvable_changed = True


def _known(verdicts: _Verdicts, failing: frozenset[str]) -> frozenset[str]:
    """`failing.intersection(verdicts.fragments)`, the same set made the same way, so that it iterates
    in the same order (and the answers built from it are the same bytes): its names added one by one
    in the order of `fragments`. That intersection walks every failing node of the kind (thousands at
    5,000 nodes); this looks up the names asked (`keys() & failing` walks `failing`) and sorts the few
    found by their place in `fragments`."""
    found = verdicts.fragments.keys() & failing
    return frozenset(sorted(found, key=verdicts.places.__getitem__))


def _subset(table: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    return dict(zip(names, map(table.__getitem__, names), strict=True))  # in C: no Python step per name


def _patch(verdicts: _Verdicts, answer: _Answer, asked: frozenset[str], added: AbstractSet[str] = _NO_NAMES,
           removed: AbstractSet[str] = _NO_NAMES) -> FilterResult:
    """The last answer put right for the names `asked`: names no longer asked taken out, and each
    name newly asked or whose verdict changed taken out and put back as it stands now; the others
    are as they were."""
    if answer.pending is not None:
        _materialize(verdicts, answer)
    answer.asked = asked
    for name in removed:
        _take_out(answer, name)
    redo = verdicts.changed | added if added else verdicts.changed
    passing, fragments, codes, resolvable = verdicts.passing, verdicts.fragments, verdicts.codes, verdicts.resolvable
    for name in redo:
        if name not in asked:
            continue
        _take_out(answer, name)
        if name in passing:
            answer.passed[name] = None
            continue
        if name in resolvable:
            answer.failed[name] = fragments[name]
            answer.failed_changed = True
        else:
            fragment = fragments.get(name)
            if fragment is None:  # asked about, not in the view
                fragment, answer.strangers = _fragment(name, unknown_node()), True
            answer.unresolvable[name] = fragment
            answer.unresolvable_changed = True
        code = answer.codes[name] = codes.get(name, UNKNOWN_NODE)
        answer.counts[code] += 1
    verdicts.changed.clear()
    answer.version = verdicts.version
    answer.result = _result(answer)
    if answer.strangers:  # it now names nodes the view lacks: not kept (see _answer)
        verdicts.answer = None
    return answer.result


def _take_out(answer: _Answer, name: str) -> None:
    answer.passed.pop(name, None)
    code = answer.codes.pop(name, None)
    if code is not None:
        answer.counts[code] -= 1
        if answer.failed.pop(name, None) is not None:
            answer.failed_changed = True
        elif answer.unresolvable.pop(name, None) is not None:
            answer.unresolvable_changed = True


def _result(answer: _Answer) -> FilterResult:
    """The answer's FilterResult; a failure map's bytes (hundreds of KiB at 5,000 nodes) are joined
    again only when that map changed."""
    last = answer.result
    failed = _object(answer.failed.values()) if answer.failed_changed else last.failed_json
    unresolvable = _object(answer.unresolvable.values()) if answer.unresolvable_changed else last.unresolvable_json
    answer.failed_changed = answer.unresolvable_changed = False
    return FilterResult(list(answer.passed), failed, unresolvable,
                        +answer.counts)  # unary plus: a copy without the codes counted down to zero


def _fragment(name: str, message: str) -> bytes:
    return orjson.dumps(name) + b":" + orjson.dumps(message)


def _object(fragments: Iterable[bytes]) -> bytes:
    return b"{%b}" % b",".join(fragments)


def _score_piece(name: str, score: int) -> bytes:
    return b'{"Host":%b,"Score":%d}' % (orjson.dumps(name), score)


@lru_cache(maxsize=65536)  # about 100 bytes a node: 6.5 MB at most, whatever names are asked
def _score_head(name: str) -> bytes:
    """A score piece up to its score, for /prioritize's shifted answers (`_SCORE_ENDS` ends it)."""
    return b'{"Host":%b,"Score":' % orjson.dumps(name)


def _rank(exact: float, top: int) -> int:
    """A score computed as a real number (0..10, less penalties) as a rank: the rounded score, clamped to
    0..top, times RANK_STEPS, plus where the real number lies within that score's half-point either side
    (clamped when the score was)."""
    score = max(0, min(top, round(exact)))
    step = int((exact - score + 0.5) * RANK_STEPS)
    return score * RANK_STEPS + max(0, min(RANK_STEPS - 1, step))


def _set_score(verdicts: _Verdicts, name: str, rank: int) -> None:
    """Store a node's rank (`Placement._score`) and the 0..10 score it gives."""
    verdicts.ranks[name] = rank
    score = rank // RANK_STEPS
    if verdicts.scores.get(name) != score or name not in verdicts.score_json:
        verdicts.scores[name] = score
        verdicts.score_json[name] = _score_piece(name, score)


def _set_failure(verdicts: _Verdicts, name: str, code: str, message: str, resolvable: bool) -> None:
    changed = name in verdicts.passing or (name in verdicts.resolvable) != resolvable
    verdicts.passing.discard(name)
    if verdicts.messages.get(name) != message:
        message = sys.intern(message)  # one string per cause, not one per node
        verdicts.messages[name] = message
        if name not in verdicts.fragments:  # put in last (a name already there keeps its place)
            verdicts.places[name] = verdicts.placed
            verdicts.placed += 1
        verdicts.fragments[name] = _fragment(name, message)
        verdicts.codes[name] = code
        changed = True
    if resolvable:
        verdicts.resolvable.add(name)
    else:
        verdicts.resolvable.discard(name)
    if changed:
        _bump(verdicts, name)


def _clear_failure(verdicts: _Verdicts, name: str) -> None:
    if name in verdicts.messages:
        _bump(verdicts, name)
    for table in (verdicts.messages, verdicts.fragments, verdicts.codes, verdicts.places):
        table.pop(name, None)
    verdicts.resolvable.discard(name)


def _bump(verdicts: _Verdicts, name: str) -> None:
    """The node's verdict changed: the kind's answer is no longer the one kept."""
    verdicts.version += 1
    verdicts.changed.add(name)
