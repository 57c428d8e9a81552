"""Metrics of the cluster as gpu-placement sees it: GPU nodes by verdict, capacity per pool, quota use,
pods waiting on a GPU reason, telemetry and reservation freshness.

Kept current one object change at a time (the view's node, free-capacity and pod listeners, and the
extender's filter answers), never recomputed per scrape and never on the request path beyond a dict
lookup: a scrape copies small aggregates under the view's lock. Cardinality is bounded by the
cluster's shape (reason codes × GPU products, resources × pools, namespaces with a quota); the one
per-node series lists unusable nodes only, because "which node" is its point.

Every replica (extender and webhook alike) builds the same view, so aggregate these with `max`, not
`sum`, across pods. What each metric answers is in docs/operations.md ("Metrics reference").
"""

from __future__ import annotations

import time
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from prometheus_client.metrics_core import GaugeMetricFamily, InfoMetricFamily, Metric

from gpu_placement.base.config import Config
from gpu_placement.decide.enforcement import quota_enforced
from gpu_placement.decide.rules import CODES, UNKNOWN_NODE, node_readiness
from gpu_placement.facts.namespaces import NamespaceRecord
from gpu_placement.facts.nodes import NodeFacts
from gpu_placement.facts.pods import PodRecord
from gpu_placement.observe.metrics import LatestFamilies
from gpu_placement.view.cluster import ClusterView

__all__ = ["NO_POOL", "OK", "ClusterMetrics", "QuotaOf", "track_cluster", "tracker_for"]

OK = "OK"  # the verdict label of a node that takes GPU pods
NO_POOL = "none"  # the pool label of a node no configured pool's nodeSelector matches
_MIB = 2**20
_MAX_WAITING = 10_000  # pods remembered as waiting; beyond it the longest-remembered are forgotten

QuotaOf = Callable[[NamespaceRecord], Mapping[str, int] | None]
ProblemsOf = Callable[[NamespaceRecord], Mapping[str, list[str]]]  # kind -> sentences (namespaces_view)


# Capacity figures per (resource, pool): index into _NodeShare.rows values.
_FIGURES = (
    ("gpu_placement_gpu_allocatable", "GPU units (devices, shares or MIG slices) the nodes' device plugins offer."),
    ("gpu_placement_gpu_used", "GPU units held by bound, non-terminal pods."),
    ("gpu_placement_gpu_reserved", "GPU units held by reservations between /bind and the pod seen bound."),
    ("gpu_placement_gpu_memory_allocatable_bytes", "GPU memory the offered units stand for."),
    ("gpu_placement_gpu_memory_used_bytes", "GPU memory charged to bound, non-terminal pods."),
    ("gpu_placement_gpu_memory_reserved_bytes", "GPU memory held by reservations."),
    ("gpu_placement_gpu_memory_free_bytes", "GPU memory free for new pods on nodes whose verdict is OK "
                                            "(shared resources narrowed by DCGM telemetry when configured)."),
)
Figures = tuple[int, int, int, int, int, int, int]


class _NodeShare(NamedTuple):
    """What one GPU node adds to the aggregates, kept so that its next change can take it out again."""

    verdict: str
    product: str
    pool: str
    resources: tuple[str, ...]
    rows: tuple[tuple[str, Figures], ...]  # per resource: its figures


@dataclass(slots=True)
class _Waiting:
    reason: str
    since: float  # Unix time the extender first rejected the pod on every node it was asked about


@dataclass(slots=True)
class ClusterMetrics:
    view: ClusterView
    config: Config
    quota_of: QuotaOf | None = None
    problems_of: ProblemsOf | None = None
    nodes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (verdict, product) -> nodes
    capacity: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (resource, pool) -> figures
    unusable_since: dict[str, tuple[str, float]] = field(default_factory=dict)  # node -> (reason, Unix time)
    quotas: dict[str, Mapping[str, int]] = field(default_factory=dict)  # namespace -> resource -> limit
    enforced: dict[str, bool] = field(default_factory=dict)  # namespace with a quota -> the webhook enforces it
    problems: dict[str, dict[str, int]] = field(default_factory=dict)  # namespace -> problem kind -> count
    waiting: dict[str, _Waiting] = field(default_factory=dict)  # pod key -> why and since when
    waiting_by: dict[str, dict[str, float]] = field(default_factory=dict)  # reason -> pod key -> since
    _shares: dict[str, _NodeShare] = field(default_factory=dict)

    def start(self) -> None:
        with self.view.lock:
            self.view.subscribe(self._node_changed, self._free_changed)
            self.view.subscribe_records(self._pod_changed, self._namespace_changed)
            self._node_changed(None)
            for name, record in self.view.namespaces.items():
                self._namespace_changed(name, record)

    # -- nodes ---------------------------------------------------------------------------------
    def _node_changed(self, name: str | None) -> None:
        """Facts or validator of a node changed (None: all of them): its verdict and figures are redone."""
        if name is None:
            for node in {*self._shares, *self.view.nodes}:
                self._update(node, None)
            return
        self._update(name, None)

    def _free_changed(self, name: str) -> None:
        """What is held on the node changed (a pod, a reservation, telemetry): figures only."""
        old = self._shares.get(name)
        self._update(name, old.verdict if old is not None else None)

    def _update(self, name: str, verdict: str | None) -> None:
        """Called under the view's lock."""
        old = self._shares.pop(name, None)
        facts = self.view.nodes.get(name)
        share = self._share(facts, verdict) if facts is not None else None
        if old is not None and share is not None and old[:4] == share[:4]:
            self._shift(old, share)  # the common case, a pod came or went: only the figures moved
        else:
            if old is not None:
                self._add(old, -1)
            if share is not None:
                self._add(share, 1)
        if share is None:
            self.unusable_since.pop(name, None)
            return
        self._shares[name] = share
        if share.verdict == OK:
            self.unusable_since.pop(name, None)
        elif self.unusable_since.get(name, ("",))[0] != share.verdict:
            self.unusable_since[name] = (share.verdict, time.time())

    def _share(self, facts: NodeFacts, verdict: str | None) -> _NodeShare | None:
        if not facts.gpu_present and not any(facts.capacity.values()):
            return None  # not a GPU node
        view = self.view
        if verdict is None:
            rejection = node_readiness(facts, view.validator_state(facts.name), self.config)
            verdict = rejection.code if rejection is not None else OK
        units, mib = view.used(facts.name)
        reserved = view.reserved(facts.name)
        rows = []
        for resource, allocatable in sorted(facts.allocatable.items()):
            held_units, held_mib = reserved.get(resource, (0, 0))
            capacity = view.capacity_mib.get(resource, {}).get(facts.name) or 0
            free = view.free_mib.get(resource, {}).get(facts.name) if verdict == OK else None
            rows.append((resource, (allocatable, units.get(resource, 0) - held_units, held_units,
                                    capacity * _MIB, (mib.get(resource, 0) - held_mib) * _MIB, held_mib * _MIB,
                                    max(free or 0, 0) * _MIB)))
        return _NodeShare(verdict, facts.product or "unknown", facts.pool or NO_POOL,
                          tuple(resource for resource, _ in rows), tuple(rows))

    def _add(self, share: _NodeShare, sign: int) -> None:
        key = (share.verdict, share.product)
        self.nodes[key] += sign
        if not self.nodes[key]:
            del self.nodes[key]
        for resource, figures in share.rows:
            totals = self.capacity.setdefault((resource, share.pool), [0] * len(_FIGURES))
            totals[:] = [total + sign * value for total, value in zip(totals, figures, strict=True)]

    def _shift(self, old: _NodeShare, new: _NodeShare) -> None:
        """Same verdict, product, pool and resources: add the difference of the figures."""
        for (resource, before), (_, after) in zip(old.rows, new.rows, strict=True):
            if before != after:
                totals = self.capacity[(resource, new.pool)]
                totals[:] = [t - b + a for t, b, a in zip(totals, before, after, strict=True)]

    # -- namespaces ----------------------------------------------------------------------------
    def _namespace_changed(self, name: str, record: NamespaceRecord | None) -> None:
        quota = self.quota_of(record) if record is not None and self.quota_of is not None else None
        if quota and record is not None:
            self.quotas[name] = dict(quota)
            self.enforced[name] = quota_enforced(record, self.config)[0]
        else:
            self.quotas.pop(name, None)
            self.enforced.pop(name, None)
        found = self.problems_of(record) if record is not None and self.problems_of is not None else None
        if found:
            self.problems[name] = {kind: len(sentences) for kind, sentences in found.items()}
        else:
            self.problems.pop(name, None)

    # -- pods waiting --------------------------------------------------------------------------
    def filtered(self, key: str, passed: bool, reasons: Mapping[str, int]) -> None:
        """The extender's answer for a GPU pod. Rejected on every node it was asked about, for GPU
        reasons: it waits, for the reason of the node that came closest to taking it (see `_rank`).
        Called on the request path: a dict lookup unless the pod starts or stops waiting."""
        current = self.waiting.get(key)
        if passed or not reasons:
            if current is not None:
                with self.view.lock:
                    self._unwait(key)
            return
        reason = max(reasons, key=_rank)
        if current is not None and current.reason == reason:
            return
        with self.view.lock:
            since = current.since if current is not None else time.time()
            self._unwait(key)
            self.waiting[key] = _Waiting(reason, since)
            self.waiting_by.setdefault(reason, {})[key] = since
            if len(self.waiting) > _MAX_WAITING:
                self._unwait(next(iter(self.waiting)))

    def _pod_changed(self, key: str, pod: PodRecord | None) -> None:
        if key in self.waiting and (pod is None or pod.node or not pod.active):
            self._unwait(key)

    def _unwait(self, key: str) -> None:
        gone = self.waiting.pop(key, None)
        if gone is not None:
            by_reason = self.waiting_by[gone.reason]
            del by_reason[key]
            if not by_reason:
                del self.waiting_by[gone.reason]

    # -- exposition ----------------------------------------------------------------------------
    def families(self) -> list[Metric]:
        view = self.view
        with view.lock:
            nodes = dict(self.nodes)
            capacity = {key: tuple(values) for key, values in self.capacity.items()}
            unusable = dict(self.unusable_since)
            quotas = {ns: (dict(limit), dict(view.namespace_usage.get(ns, {})), self.enforced.get(ns, False))
                      for ns, limit in self.quotas.items()}
            problems = {ns: dict(kinds) for ns, kinds in self.problems.items()}
            waiting = {reason: (len(pods), min(pods.values())) for reason, pods in self.waiting_by.items()}
            oldest = next(iter(view.reservations.values()), None)
            reservation_age = (max(0.0, view.clock() - (oldest.expires - self.config.reservation_ttl_seconds))
                               if oldest is not None else 0.0)
            telemetry_nodes = len(view.telemetry)
            dra_devices = {ns: dict(counts) for ns, counts in view.dra.namespace_devices.items()}
        out: list[Metric] = []
        family = GaugeMetricFamily("gpu_placement_gpu_nodes", "GPU nodes by verdict (OK or the reason code that "
                                   "keeps GPU pods off them) and nvidia.com/gpu.product.",
                                   labels=["verdict", "product"])
        for (verdict, product), count in sorted(nodes.items()):
            family.add_metric([verdict, product], count)
        out.append(family)
        family = GaugeMetricFamily("gpu_placement_gpu_node_unusable_since_timestamp_seconds",
                                   "Unix time since which this GPU node has been unusable for this reason "
                                   "(as seen by this process); only unusable nodes have a series.",
                                   labels=["node", "reason"])
        for node, (reason, since) in sorted(unusable.items()):
            family.add_metric([node, reason], since)
        out.append(family)
        for index, (name, help_) in enumerate(_FIGURES):
            family = GaugeMetricFamily(name, help_ + " Per GPU resource and node pool.", labels=["resource", "pool"])
            for (resource, pool), values in sorted(capacity.items()):
                family.add_metric([resource, pool], values[index])
            out.append(family)
        limits = GaugeMetricFamily("gpu_placement_namespace_quota_limit", "The namespace's gpu-placement.io/quota "
                                   "for this resource; enforced=\"false\" where the webhook never sees the "
                                   "namespace's pods (not opted in, exempt) or only warns (audit mode).",
                                   labels=["namespace", "resource", "enforced"])
        used = GaugeMetricFamily("gpu_placement_namespace_quota_used", "GPU units the namespace's non-terminal pods "
                                 "request, for each resource in its quota (enforced as on the limit).",
                                 labels=["namespace", "resource", "enforced"])
        for namespace, (limit, usage, enforced) in sorted(quotas.items()):
            flag = "true" if enforced else "false"
            for resource, value in sorted(limit.items()):
                limits.add_metric([namespace, resource, flag], value)
                used.add_metric([namespace, resource, flag], usage.get(resource, 0))
        out += [limits, used]
        family = GaugeMetricFamily("gpu_placement_namespace_policy_problems", "gpu-placement settings on the namespace "
                                   "that do nothing or do not parse, by kind: unread_annotation (a misspelt "
                                   "gpu-placement.io/* key), bad_value, not_opted_in (a GPU policy the webhook never "
                                   "sees), label_value (gpu-placement.io/enabled other than true or false); "
                                   "gpu-placement namespaces says which.", labels=["namespace", "problem"])
        for namespace, kinds in sorted(problems.items()):
            for kind, count in sorted(kinds.items()):
                family.add_metric([namespace, kind], count)
        out.append(family)
        claimed = GaugeMetricFamily("gpu_placement_namespace_dra_devices", "Devices the namespace's ResourceClaims "
                                    "ask for, per device class, as ResourceQuota charges them "
                                    "(<class>.deviceclass.resource.k8s.io/devices).",
                                    labels=["namespace", "device_class"])
        for namespace, counts in sorted(dra_devices.items()):
            for device_class, value in sorted(counts.items()):
                claimed.add_metric([namespace, device_class], value)
        out.append(claimed)
        pods_waiting = GaugeMetricFamily("gpu_placement_pods_waiting", "Pending GPU pods the extender last rejected "
                                         "on every node it was asked about, by the reason of the node that came "
                                         "closest to taking it.",
                                         labels=["reason"])
        waiting_since = GaugeMetricFamily("gpu_placement_pods_waiting_since_timestamp_seconds", "Unix time since "
                                          "which the longest-waiting of those pods has waited, by reason.",
                                          labels=["reason"])
        for reason, (pods, first) in sorted(waiting.items()):
            pods_waiting.add_metric([reason], pods)
            waiting_since.add_metric([reason], first)
        out += [pods_waiting, waiting_since]
        out.append(GaugeMetricFamily("gpu_placement_reservation_oldest_age_seconds", "Age of the oldest GPU "
                                     "reservation still waiting for its pod to be seen bound (0: none).",
                                     value=reservation_age))
        out.append(GaugeMetricFamily("gpu_placement_telemetry_nodes", "Nodes with a fresh DCGM telemetry reading.",
                                     value=telemetry_nodes))
        info = InfoMetricFamily("gpu_placement_config", "The configuration this process runs with.")
        info.add_metric([], {"scheduler_name": self.config.scheduler_name, "mode": self.config.mode,
                             "strategy": self.config.scoring.strategy,
                             "validator_required": str(self.config.validator.required).lower(),
                             "pools": ",".join(sorted(self.config.pools))})
        out.append(info)
        return out


def _rank(code: str) -> int:
    """How far a node got through the checks before this code rejected it. rules.CODES lists the codes
    in the order the checks run (readiness, compatibility, device fit, free capacity), so a later code
    is a node that came closer: a pod rejected as InsufficientGPU on one node and NoGPU on twenty waits
    for capacity, not for GPUs to exist. UnknownNode says nothing about the pod: lowest."""
    if code == UNKNOWN_NODE or code not in CODES:
        return -1
    return CODES.index(code)


_exported = LatestFamilies()
_by_view: weakref.WeakKeyDictionary[ClusterView, ClusterMetrics] = weakref.WeakKeyDictionary()


def track_cluster(view: ClusterView, config: Config, quota_of: QuotaOf | None = None,
                  problems_of: ProblemsOf | None = None) -> ClusterMetrics:
    tracker = ClusterMetrics(view, config, quota_of, problems_of)
    tracker.start()
    _by_view[view] = tracker
    _exported.current = tracker
    return tracker


def tracker_for(view: ClusterView) -> ClusterMetrics | None:
    return _by_view.get(view)
