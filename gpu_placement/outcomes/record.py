"""Launch outcomes and node lifecycle times, counted once per cluster from the objects' own timestamps.

Every replica with a view keeps an `Outcomes`: it notes, one object change at a time, the events to
count and the time each belongs to (its *anchor*, read from the objects wherever they carry one):

- a GPU pod's launch (`gpu_placement_gpu_pod_starts_total`), anchored at `status.startTime` (the
  kubelet took the pod; it never moves, whatever the pod does later), else when it was bound;
- its wait from creation to bound (`gpu_placement_gpu_pod_wait_seconds`), anchored at the Binding;
- a node's first verified verdict (`gpu_placement_node_ready_seconds`), its return to verified after
  an outage (`..._recovery_seconds`), and the time from the evidence of a fault to the verdict changing
  (`..._exclusion_seconds`), each anchored at the change.

Only the replica holding the outcomes Lease emits them (gpu_placement/outcomes/counter.py): it advances a
*watermark* W kept in the Lease itself, and emits every event whose anchor lies in (W, W'] as it moves
W to W' with a compare-and-swap on the Lease (a PUT with its resourceVersion), which also carries the
cluster's totals so far. Whoever leads next, or this process after a restart, reads W back and emits
only what lies beyond it: an event is counted by the one write that carried W past its anchor, so
neither a restart nor a second replica counts it again; and every replica exports the totals it read,
so each series is the cluster's.

W' stays `settle` seconds behind what the view has heard, so an object change reaches the view before
W passes its timestamp. A launch is classified once, from the status the pod has then. One still
undecided when W passes its anchor (the pod bound, its containers still being created) is *deferred*:
the write that carries W past it also puts its pod UID (with the anchor) in the Lease's deferred set,
and the later write that takes it out of the set counts it, once it started or failed, or `horizon`
seconds after its anchor as `not_started`; a deferred pod deleted undecided leaves the set uncounted.
A pod deferred before its kubelet took it (anchored at its binding) whose kubelet then writes
status.startTime after W leaves the set too: its anchor moved past W, where every replica sees it, and
the write that passes the new anchor counts it.
So one write counts each launch, as before, and no figure waits on an undecided pod. The set holds
at most MAX_DEFERRED pods: beyond, W waits below the next undecided anchor (as it did for every one).

What a restart can lose: events whose objects were deleted while no replica ran (a pod that failed
and was deleted in that gap). What it never does is count an event twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from gpu_placement.base.config import Config
from gpu_placement.decide.rules import CODES, NOT_VALIDATED, node_readiness
from gpu_placement.facts.launch import CAUSES, FAILED, NONE, NOT_STARTED, PENDING, STARTED, Launch
from gpu_placement.facts.nodes import NodeFacts
from gpu_placement.facts.pods import PodRecord
from gpu_placement.facts.soak import NEW_NODE_SECONDS, OperatorPod
from gpu_placement.observe.metrics import LatestFamilies
from gpu_placement.report.cluster_metrics import NO_POOL, OK
from gpu_placement.view.cluster import ClusterView

__all__ = ["BUCKETS", "LABELS", "MAX_DEFERRED", "SETTLE_SECONDS", "START_HORIZON_SECONDS", "Emission", "Outcomes",
           "Turn", "track_outcomes", "wait_reason"]

SETTLE_SECONDS = 120.0  # how far the watermark stays behind what the view has heard
START_HORIZON_SECONDS = 3600.0  # a bound pod undecided this long after its anchor is counted not_started
MAX_DEFERRED = 1000  # launches passed undecided, kept in the Lease until decided; beyond, the watermark waits
PREPARE_WINDOW_SECONDS = 86400.0  # at start, an unverified node younger than this is taken to be in preparation
_EPSILON = 1e-3
_SLICE = 8192  # pods looked at per hold of the view's lock while priming (nodes: a sixteenth of it)
STARTS = "gpu_placement_gpu_pod_starts"
WAIT = "gpu_placement_gpu_pod_wait_seconds"
READY = "gpu_placement_node_ready_seconds"
RECOVERY = "gpu_placement_node_recovery_seconds"
EXCLUSION = "gpu_placement_node_exclusion_seconds"
_HOURS = (3600.0, 7200.0, 10800.0, 14400.0, 21600.0, 43200.0, 86400.0, 172800.0)
BUCKETS: dict[str, tuple[float, ...]] = {
    # 600 is a bound on purpose: `report` counts the pods that waited more than 10 minutes.
    WAIT: (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, *_HOURS),
    READY: (60.0, 120.0, 180.0, 300.0, 420.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, *_HOURS),
    RECOVERY: (60.0, 300.0, 600.0, 900.0, 1800.0, 2700.0, *_HOURS),
    EXCLUSION: (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0),
}
LABELS = {STARTS: ("outcome", "cause", "pool", "placed"), WAIT: ("reason", "pool"), READY: ("pool", "product"),
          RECOVERY: ("pool", "product", "reason"), EXCLUSION: ("pool", "product", "reason")}
_HELP = {
    STARTS: "Bound GPU pods by launch outcome (started: every app container Running, or Succeeded; failed: the "
            "cause read from the pod's status), pool of their node, and whether gpu-placement placed them. Counted "
            "once per pod for the cluster by the holder of the outcomes Lease, which keeps the totals in it: every "
            "replica exports the cluster's totals (max across replicas, never sum).",
    WAIT: "GPU pods' wait from creation to bound, by the reason they waited (the dominant reason code of their "
          "PodScheduled=False message; none: bound without one; unknown: the replica that counted it never saw it "
          "pending, after a restart).",
    READY: "Time from a GPU node's creation (or its GPU first appearing) to its first verified verdict.",
    RECOVERY: "Time a verified GPU node was unusable before it was verified again, by the reason code it went out for.",
    EXCLUSION: "Time from the evidence of a fault (the Ready condition's or the validator pod's lastTransitionTime) "
               "to this service's verdict turning the node away: how long a bad GPU could still be given out.",
}
# The wait reasons besides the extender's codes: what kube-scheduler itself writes.
GATED, AFFINITY, INSUFFICIENT, NO_WAIT, UNKNOWN = "SchedulingGated", "NodeAffinity", "Insufficient", "none", "unknown"


def wait_reason(codes: tuple[str, ...]) -> str:
    """The reason a pending GPU pod waits: of its PodScheduled message's codes, the extender's code of
    the node that came closest (rules.CODES order, as cluster_metrics ranks them), else what
    kube-scheduler said itself; `none` without a message."""
    ours = [code for code in codes if code in CODES]
    if ours:
        return max(ours, key=CODES.index)
    if GATED in codes:
        return GATED
    if any(code.startswith("Insufficient ") for code in codes):
        return INSUFFICIENT
    return AFFINITY if AFFINITY in codes else NO_WAIT


@dataclass(slots=True)
class _Launch:
    record: PodRecord  # the last one seen (kept after the pod is deleted, until it is counted)
    pool: str
    gone: bool = False

    @property
    def launch(self) -> Launch:
        assert self.record.launch is not None
        return self.record.launch


@dataclass(slots=True, frozen=True)
class Emission:
    """One observation to count: a launch (metric STARTS, value 1) or a histogram's."""

    metric: str
    labels: tuple[str, ...]
    value: float
    at: float  # its anchor
    key: str  # what it is about (pod UID, node), for tests and logs


@dataclass(slots=True, frozen=True)
class Turn:
    """One write of the watermark: W moves to `until`, `batch` is what the write counts, `deferred` the
    launches passed undecided (pod UID -> anchor) that later writes count once decided."""

    until: float
    batch: list[Emission]
    deferred: dict[str, float]


@dataclass(slots=True)
class _Node:
    verdict: str
    gpu: bool
    out: tuple[str, float] | None = None  # the outage under way: (reason it went out for, since)
    preparing: float | None = None  # never verified yet: since when it is prepared
    pool: str = NO_POOL
    product: str = "unknown"
    facts: NodeFacts | None = None  # the facts last read: the same object means only its pods changed


@dataclass(slots=True)
class _Histogram:
    buckets: list[int]
    total: float = 0.0
    count: int = 0


@dataclass
class Outcomes:
    view: ClusterView
    config: Config
    clock: Callable[[], float] = time.time
    heard: Callable[[], float] = field(default=lambda: float("inf"))  # when the view last heard from its source
    settle: float = SETTLE_SECONDS
    horizon: float = START_HORIZON_SECONDS
    watermark: float | None = None  # W as last read from the Lease (None: not read yet)
    deferred: dict[str, float] = field(default_factory=dict)  # launches W passed undecided: pod UID -> anchor
    counts: dict[tuple[str, ...], float] = field(default_factory=dict)  # (outcome, cause, pool, placed) -> n
    histograms: dict[str, dict[tuple[str, ...], _Histogram]] = field(default_factory=dict)
    _launches: dict[str, _Launch] = field(default_factory=dict)  # pod UID -> launch not counted yet
    _uids: dict[str, str] = field(default_factory=dict)  # pod key -> UID of the GPU pod under that name
    _waiting: dict[str, tuple[str, ...]] = field(default_factory=dict)  # unbound GPU pod UID -> its codes
    pending: dict[str, PodRecord] = field(default_factory=dict)  # pod key -> unbound, active GPU pod (idle.py)
    _events: dict[str, Emission] = field(default_factory=dict)  # histogram observations not counted yet
    _nodes: dict[str, _Node] = field(default_factory=dict)
    _primed: bool = False
    _priming: bool = False
    counting: bool = False  # a counter counts from this view: keep the events to count (`count`)
    # Whether the counts are the cluster's (read from the Lease, or counted here): until then they are not
    # exported, so a fresh replica's zeros never pull a cluster total down (Prometheus would see a reset).
    loaded: bool = False
    _dirty: set[str] = field(default_factory=set)  # nodes whose validator changed, read after the pod's update

    def start(self) -> Outcomes:
        pools = [*sorted(self.config.pools), NO_POOL]
        for pool in pools:  # every series from the start: increase() needs the zero it grows from
            for placed in ("true", "false"):
                self.counts[(STARTED, NONE, pool, placed)] = 0.0
                for cause in CAUSES:
                    self.counts[(FAILED, cause, pool, placed)] = 0.0
        for metric in BUCKETS:
            self.histograms[metric] = {}
        with self.view.lock:
            self.view.subscribe(self._node_changed, lambda _name: None)
            self.view.subscribe_records(self._pod_changed, lambda _name, _record: None)
        self.prime()
        return self

    def count(self) -> None:
        """A counter counts from this view (gpu_placement/outcomes/counter.py): keep the events it will
        count. Without one (the extender's process, snapshot mode) none is kept, only what the gauges
        need; so the view is taken in again, for the launches already in it."""
        with self.view.lock:
            if self.counting:
                return
            self.counting = True
            walked = self._primed
        if walked:  # the listeners stay live; the walk takes in what they saw before counting began
            self._walk()
        else:
            self.prime()

    def prime(self) -> bool:
        """Take in the whole view once nodes and pods are listed in full (before, a node listed ahead
        of its validator pod would look unverified, then verified: a change that never happened).
        Called by every turn and scrape until it is done; the listeners do nothing before."""
        if self._primed:
            return True
        with self.view.lock:
            if not {"nodes", "pods"} <= self.view.listed or self._priming:
                return False
            self._priming = True  # from here the listeners take every change, so no slice can miss one
        self._walk()
        with self.view.lock:
            self._primed = True
        return True

    def _walk(self) -> None:
        """Every node and GPU pod of the view, in slices, each under the lock, as the view applies a
        relist: a reader waits for one slice (milliseconds), never for all 150,000 pods."""
        with self.view.lock:
            nodes, keys = list(self.view.nodes), list(self.view.pods)
        for start in range(0, len(nodes), _SLICE // 16):
            with self.view.lock:
                for name in nodes[start:start + _SLICE // 16]:
                    if name not in self._nodes:
                        self._evaluate(name)
            time.sleep(0)
        for start in range(0, len(keys), _SLICE):
            with self.view.lock:
                for key in keys[start:start + _SLICE]:
                    pod = self.view.pods.get(key)
                    if pod is not None and pod.launch is not None:
                        self._pod_changed(key, pod, priming=True)
            time.sleep(0)

    # -- what the leader does (under the view's lock) ------------------------------------------
    def turn(self, now: float, watermark: float, deferred: Mapping[str, float],
             written: Callable[[float], float] = lambda at: at) -> Turn | None:
        """The next write after (`watermark`, `deferred`) as last written: W moves to `settle` behind what
        the view has heard (`written`: as it reads back from where it is kept); the events it passes are
        counted, and so is each deferred launch decided since, or past the horizon (`not_started`). A
        launch passed undecided joins the deferred set, while there is room; W stops below the first
        that finds none. None: nothing to write."""
        if not self.prime():
            return None
        with self.view.lock:
            reach = min(now, self.heard()) - self.settle
            batch: list[Emission] = []
            kept: dict[str, float] = {}
            owned: set[str] = set()  # the deferred launches this write counts, keeps or lets go
            for uid, anchor in deferred.items():
                entry = self._launches.get(uid)
                if entry is not None and (entry.launch.anchor or anchor) > watermark:
                    # Deferred at its binding, and the kubelet took it since (status.startTime, after W):
                    # it leaves the set, to be counted when W passes that anchor, as any launch (every
                    # replica sees it beyond W; counted here too, it would be counted twice).
                    continue
                owned.add(uid)
                if entry is not None and (entry.launch.state != PENDING or anchor + self.horizon <= now):
                    batch.append(self._launch_emission(uid, entry, anchor))
                elif entry is not None or anchor > reach:  # undecided; or the view may not have it yet
                    kept[uid] = anchor
                # else the pod is gone undecided (or was decided and deleted while no replica ran): not counted
            passing = sorted((at, uid) for uid, entry in self._launches.items()
                             if (at := entry.launch.anchor) is not None and watermark < at <= reach
                             and uid not in owned and self._undecided(entry, at, now))
            room = MAX_DEFERRED - len(kept)
            until = reach if len(passing) <= room else passing[room][0] - _EPSILON
            until = written(until) if until > watermark else watermark
            batch += [event for event in self._events.values() if watermark < event.at <= until]
            for uid, entry in self._launches.items():
                at = entry.launch.anchor
                if at is not None and watermark < at <= until and uid not in owned:
                    if self._undecided(entry, at, now):
                        kept[uid] = at
                    else:
                        batch.append(self._launch_emission(uid, entry, at))
            if until == watermark and not batch and kept.keys() == deferred.keys():
                return None
            return Turn(until, sorted(batch, key=lambda e: (e.at, e.key)), kept)

    def _undecided(self, entry: _Launch, anchor: float, now: float) -> bool:
        return entry.launch.state == PENDING and anchor + self.horizon > now

    def emit(self, batch: Iterable[Emission]) -> None:
        """Count them (the leader, once its watermark write went through)."""
        with self.view.lock:
            self.loaded = True
            for event in batch:
                if event.metric == STARTS:
                    self.counts[event.labels] = self.counts.get(event.labels, 0.0) + event.value
                else:
                    self._observe(event.metric, event.labels, event.value)

    def totals(self, batch: Iterable[Emission] = ()) -> dict[str, Any]:
        """The cluster's totals as kept in the Lease with the watermark (JSON), with `batch` counted in:
        what the leader writes. Every replica exports the totals it last read, so each series is the
        cluster's own, the same on every replica (aggregate with max) and never reset by a restart."""
        with self.view.lock:
            counts = dict(self.counts)
            histograms = {metric: {labels: (list(h.buckets), h.total, h.count) for labels, h in table.items()}
                          for metric, table in self.histograms.items()}
        for event in batch:
            if event.metric == STARTS:
                counts[event.labels] = counts.get(event.labels, 0.0) + event.value
                continue
            bounds = BUCKETS[event.metric]
            buckets, total, count = histograms[event.metric].get(event.labels, ([0] * len(bounds), 0.0, 0))
            buckets = [n + (event.value <= bound) for n, bound in zip(buckets, bounds, strict=True)]
            histograms[event.metric][event.labels] = (buckets, total + event.value, count + 1)
        return {"version": 1,
                "starts": [[*labels, value] for labels, value in sorted(counts.items()) if value],
                "histograms": {metric: {"le": list(BUCKETS[metric]),
                                        "series": [[*labels, buckets, total, count]
                                                   for labels, (buckets, total, count) in sorted(table.items())
                                                   if count]}
                               for metric, table in histograms.items()}}

    def load(self, totals: Mapping[str, Any] | None) -> None:
        """Take the cluster's totals as read from the Lease (a standby's, or the leader's at each turn);
        None: there are none yet (counting starts). A histogram stored with other bucket bounds (an older
        version) is not taken: its series restart."""
        with self.view.lock:
            self.loaded = True
            if not isinstance(totals, Mapping) or totals.get("version") != 1:
                return
            for labels in self.counts:
                self.counts[labels] = 0.0
            for *labels, value in totals.get("starts") or ():
                self.counts[tuple(str(label) for label in labels)] = float(value)
            for metric, stored in (totals.get("histograms") or {}).items():
                if metric not in BUCKETS or [float(b) for b in stored.get("le") or ()] != list(BUCKETS[metric]):
                    continue
                table = self.histograms.setdefault(metric, {})
                for histogram in table.values():
                    histogram.buckets, histogram.total, histogram.count = [0] * len(BUCKETS[metric]), 0.0, 0
                for *labels, buckets, total, count in stored.get("series") or ():
                    table[tuple(str(label) for label in labels)] = _Histogram([int(n) for n in buckets],
                                                                              float(total), int(count))

    def settled(self, watermark: float, deferred: Mapping[str, float]) -> None:
        """The cluster's events up to `watermark` are counted (by whoever led) but the `deferred`
        launches (as read with it): forget the others."""
        self.prime()
        with self.view.lock:
            self.watermark = watermark if self.watermark is None else max(self.watermark, watermark)
            self.deferred = dict(deferred)
            for key in [key for key, event in self._events.items() if event.at <= self.watermark]:
                del self._events[key]
            for uid in [uid for uid, e in self._launches.items()
                        if (e.launch.anchor or 0) <= self.watermark and uid not in self.deferred]:
                del self._launches[uid]

    def _launch_emission(self, uid: str, entry: _Launch, anchor: float) -> Emission:
        launch = entry.launch
        outcome, cause = (launch.state, launch.cause) if launch.state != PENDING else (FAILED, NOT_STARTED)
        labels = (outcome, cause, entry.pool, "true" if launch.placed else "false")
        return Emission(STARTS, labels, 1.0, anchor, uid)

    # -- pods ----------------------------------------------------------------------------------
    def _pod_changed(self, key: str, pod: PodRecord | None, priming: bool = False) -> None:
        """A pod changed (None: deleted). Called under the view's lock: a dict lookup for most pods."""
        if not (self._priming or priming):
            return
        self._flush()
        if pod is not None and pod.launch is not None and not pod.node and pod.active:
            self.pending[key] = pod
        else:
            self.pending.pop(key, None)
        uid = self._uids.get(key)
        if pod is None or pod.launch is None or (uid is not None and pod.uid != uid):
            if uid is not None:
                self._gone(key, uid)
            if pod is None or pod.launch is None:
                return
        self._uids[key] = pod.uid
        launch = pod.launch
        if not self.counting:
            return
        if not pod.node:
            self._waiting[pod.uid] = launch.waiting or self._waiting.get(pod.uid, ())
            return
        codes = self._waiting.pop(pod.uid, None)
        entry = self._launches.get(pod.uid)
        anchor = launch.anchor
        if entry is None:
            if anchor is None or not (self._open(anchor) or pod.uid in self.deferred):
                return
            entry = self._launches[pod.uid] = _Launch(pod, self._pool(pod.node))
            if launch.bound is not None and self._open(launch.bound):
                reason = wait_reason(codes) if codes is not None else UNKNOWN
                waited = max(0.0, launch.bound - (launch.created or launch.bound))
                self._queue(Emission(WAIT, (reason, entry.pool), waited, launch.bound, f"wait/{pod.uid}"))
        entry.record = pod
        if pod.node in self.view.nodes:
            entry.pool = self._pool(pod.node)

    def _gone(self, key: str, uid: str) -> None:
        """The GPU pod under `key` (UID `uid`) was deleted: a decided launch is still counted."""
        del self._uids[key]
        self._waiting.pop(uid, None)
        entry = self._launches.get(uid)
        if entry is None:
            return
        if entry.launch.state == PENDING:  # deleted before it started or failed: no launch to count
            del self._launches[uid]
        else:
            entry.gone = True

    def _open(self, at: float) -> bool:
        """Whether an event at `at` is still to be counted (beyond the watermark, as far as known)."""
        return self.watermark is None or at > self.watermark

    def _pool(self, node: str) -> str:
        facts = self.view.nodes.get(node)
        return (facts.pool if facts is not None else None) or NO_POOL

    # -- nodes ---------------------------------------------------------------------------------
    def _node_changed(self, name: str | None) -> None:
        """The view's node listener. A node's own change is read at once; a change of its validator pod
        is read once the pod's update is complete (`_flush`, from the pod listener): in between, the view
        has taken the old pod out and not yet put the new one in, a node without validator for a moment."""
        if not self._priming:
            return
        if name is None:
            for node in {*self._nodes, *self.view.nodes}:
                self._evaluate(node)
            return
        state = self._nodes.get(name)
        if state is not None and state.facts is self.view.nodes.get(name):
            self._dirty.add(name)
        else:
            self._evaluate(name)

    def _flush(self) -> None:
        while self._dirty:
            self._evaluate(self._dirty.pop())

    def _evaluate(self, name: str) -> None:
        facts = self.view.nodes.get(name)
        if facts is None:
            self._nodes.pop(name, None)
            return
        gpu = facts.gpu_present or any(facts.capacity.values())
        rejection = node_readiness(facts, self.view.validator_state(name), self.config) if gpu else None
        verdict = rejection.code if rejection is not None else OK
        state = self._nodes.get(name)
        now = self.clock()
        if state is None:
            self._nodes[name] = self._first_sight(name, facts, gpu, verdict)
            self._nodes[name].facts = facts
            return
        state.facts = facts
        state.pool, state.product = facts.pool or NO_POOL, facts.product or "unknown"
        if gpu and not state.gpu:  # its GPU appeared: a new node prepares since its creation, an old one since now
            new = facts.created is not None and now - facts.created < NEW_NODE_SECONDS
            state.preparing = facts.created if new else min(
                [now, *(p.created for p in self._operator_pods(name) if p.created)])  # or the operator's first pod
        state.gpu = gpu
        if not gpu or verdict == state.verdict:
            state.verdict = verdict
            return
        if state.verdict == OK:
            self._went_out(name, state, facts, verdict, now)
        elif verdict == OK:
            self._came_back(name, state, facts, now)
        state.verdict = verdict

    def _first_sight(self, name: str, facts: NodeFacts, gpu: bool, verdict: str) -> _Node:
        """A node this process has not seen before: a node just added, or every node at start."""
        state = _Node(verdict, gpu, pool=facts.pool or NO_POOL, product=facts.product or "unknown")
        if not gpu:
            return state
        self._histogram(READY, (state.pool, state.product))
        validator = self._validator(name)
        created = facts.created
        if verdict == OK:
            at = self._verified_at(name, facts)
            if created is not None and at is not None and self._open(at) and self._first(validator, created, at):
                # Verified since this process last ran, by the node's first validator: its preparation.
                self._queue(Emission(READY, (state.pool, state.product), max(0.0, at - created), at, f"ready/{name}"))
        elif created is not None and self.clock() - created < PREPARE_WINDOW_SECONDS and (
                validator is None or (validator.ready_since is None and self._first(validator, created, None))):
            state.preparing = created
        else:
            since = self._evidence(name, facts, verdict)
            state.out = (verdict, since) if since is not None else None
        return state

    @staticmethod
    def _first(validator: OperatorPod | None, created: float, verified: float | None) -> bool:
        """Whether this is the node's first verification: its validator pod is the one made as the node
        joined (a DaemonSet pod, created with it); without one, the node turned Ready soon after it joined."""
        if validator is not None and validator.created is not None:
            return validator.created - created < NEW_NODE_SECONDS
        return verified is not None and verified - created < NEW_NODE_SECONDS

    def _went_out(self, name: str, state: _Node, facts: NodeFacts, verdict: str, now: float) -> None:
        evidence = self._evidence(name, facts, verdict)
        state.out = (verdict, evidence if evidence is not None else now)
        self._histogram(RECOVERY, (state.pool, state.product, verdict))
        if evidence is not None and self._open(now):
            self._queue(Emission(EXCLUSION, (state.pool, state.product, verdict), max(0.0, now - evidence), now,
                                 f"exclusion/{name}/{now:.3f}"))

    def _came_back(self, name: str, state: _Node, facts: NodeFacts, now: float) -> None:
        evidence = self._verified_at(name, facts)
        at = evidence if evidence is not None and now - evidence < self.settle else now
        if state.preparing is not None:
            if self._open(at):
                self._queue(Emission(READY, (state.pool, state.product), max(0.0, at - state.preparing), at,
                                     f"ready/{name}"))
            state.preparing = None
        elif state.out is not None and self._open(at):
            reason, since = state.out
            self._queue(Emission(RECOVERY, (state.pool, state.product, reason), max(0.0, at - since), at,
                                 f"recovery/{name}/{at:.3f}"))
        state.out = None

    def _validator(self, node: str) -> OperatorPod | None:
        pods = [self.view.pods.get(key) for key in self.view.validators.get(node, ())]
        found = [pod.operator for pod in pods if pod is not None and pod.operator is not None]
        return max(found, key=lambda p: p.created or 0.0, default=None)

    def _operator_pods(self, node: str) -> list[OperatorPod]:
        return [pod.operator for pod in self.view.pods_on(node) if pod.operator is not None]

    def _verified_at(self, name: str, facts: NodeFacts) -> float | None:
        """When the evidence of a verified node last changed: its Ready condition, its validator turning Ready."""
        validator = self._validator(name) if self.config.validator.required else None
        times = [t for t in (facts.ready_since, validator.ready_since if validator else None) if t is not None]
        return max(times) if times else None

    def _evidence(self, name: str, facts: NodeFacts, verdict: str) -> float | None:
        """The object timestamp of the change that made the node unusable, where the objects keep one:
        the node's Ready condition going False, the validator pod's going False. Labels and allocatable
        carry no time: None."""
        if not facts.ready and facts.ready_since is not None:
            return facts.ready_since
        if verdict == NOT_VALIDATED:
            validator = self._validator(name)
            if validator is not None and validator.ready_since is None:
                return validator.ready_changed
        return None

    # -- counting ------------------------------------------------------------------------------
    def _queue(self, event: Emission) -> None:
        self._histogram(event.metric, event.labels)  # the series, at zero until counted
        if self.counting:
            self._events[event.key] = event

    def _histogram(self, metric: str, labels: tuple[str, ...]) -> _Histogram:
        table = self.histograms.setdefault(metric, {})
        found = table.get(labels)
        if found is None:
            found = table[labels] = _Histogram([0] * len(BUCKETS[metric]))
        return found

    def _observe(self, metric: str, labels: tuple[str, ...], value: float) -> None:
        histogram = self._histogram(metric, labels)
        for index, bound in enumerate(BUCKETS[metric]):
            if value <= bound:
                histogram.buckets[index] += 1
        histogram.total += value
        histogram.count += 1

    # -- exposition ----------------------------------------------------------------------------
    def verified(self) -> list[str]:
        """GPU nodes whose verdict is OK (call under the view's lock, after `prime`)."""
        return [name for name, state in self._nodes.items() if state.gpu and state.verdict == OK]

    def preparing(self) -> dict[str, tuple[str, str, float]]:
        """Nodes never verified yet: node -> (pool, product, preparation start)."""
        with self.view.lock:
            return {name: (s.pool, s.product, s.preparing) for name, s in self._nodes.items()
                    if s.preparing is not None and s.gpu}

    def families(self) -> list[Metric]:
        self.prime()
        with self.view.lock:
            counts = dict(self.counts)
            histograms = {metric: {labels: (list(h.buckets), h.total, h.count) for labels, h in table.items()}
                          for metric, table in self.histograms.items()}
        loaded = self.loaded
        starts = CounterMetricFamily(STARTS, _HELP[STARTS], labels=list(LABELS[STARTS]))
        for labels, value in sorted(counts.items()) if loaded else ():
            starts.add_metric(list(labels), value)
        out: list[Metric] = [starts]
        for metric, table in histograms.items():
            family = HistogramMetricFamily(metric, _HELP[metric], labels=list(LABELS[metric]))
            for labels, (buckets, total, count) in sorted(table.items()) if loaded else ():
                cumulative = [(floatToGoString(b), float(n)) for b, n in zip(BUCKETS[metric], buckets, strict=True)]
                family.add_metric(list(labels), [*cumulative, ("+Inf", float(count))], total)
            out.append(family)
        preparing = GaugeMetricFamily("gpu_placement_node_preparing_since_timestamp_seconds",
                                      "Unix time since which this GPU node has been prepared without a first verified "
                                      "verdict (its creation, or its GPU first appearing); only such nodes have a "
                                      "series.", labels=["node", "pool", "product"])
        for node, (pool, product, since) in sorted(self.preparing().items()):
            preparing.add_metric([node, pool, product], since)
        out.append(preparing)
        return out


_exported = LatestFamilies()


def track_outcomes(outcomes: Outcomes) -> Outcomes:
    """Export this process's outcome figures on /metrics (one per process: the service's)."""
    _exported.current = outcomes
    return outcomes
