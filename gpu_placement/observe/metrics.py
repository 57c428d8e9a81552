"""Prometheus metrics, one definition each, shared by every listener of the process."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol

import urllib3
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE_LATEST", "LatestFamilies", "api_outcome", "exposition", "heard_from_source", "last_heard",
           "seconds_since_heard"]


class _HasFamilies(Protocol):
    def families(self) -> Iterable[Metric]: ...


class LatestFamilies(Collector):
    """A registered collector exporting the families of whatever was set last as `current` (one per
    process: the service's), so that tests that build many sources do not register each."""

    def __init__(self) -> None:
        self.current: _HasFamilies | None = None
        REGISTRY.register(self)

    def collect(self) -> Iterable[Metric]:
        return self.current.families() if self.current is not None else ()

    def describe(self) -> Iterable[Metric]:
        return ()


_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

REQUEST_SECONDS = Histogram("gpu_placement_request_seconds", "Time to answer one request, by component and verb.",
                            ["component", "verb"], buckets=_BUCKETS)
REQUESTS = Counter("gpu_placement_requests", "Requests answered, by component, verb and HTTP status.",
                   ["component", "verb", "status"])
DECISIONS = Counter("gpu_placement_decisions", "Per-node extender verdicts and webhook decisions, by reason.",
                    ["component", "reason"])
BAD_REQUESTS = Counter("gpu_placement_bad_requests", "Requests refused as malformed, by component and problem.",
                       ["component", "problem"])
CACHE_OBJECTS = Gauge("gpu_placement_cache_objects", "Objects in the cluster view, by kind.", ["kind"])
CACHE_AGE = Gauge("gpu_placement_cache_age_seconds", "Seconds since the cluster view last heard from its source.")
CACHE_READY = Gauge("gpu_placement_cache_ready", "1 once every kind has been listed in full.")
RESERVATIONS = Gauge("gpu_placement_reservations", "GPU reservations held between bind and the pod seen bound.")
WATCH_EVENTS = Counter("gpu_placement_watch_events", "Watch events applied, by kind and type.", ["kind", "type"])
WATCH_RESTARTS = Counter("gpu_placement_watch_restarts", "Watch restarts, by kind and cause.", ["kind", "cause"])
SOURCE_UP = Gauge("gpu_placement_source_up", "1 while the cluster source (API server or snapshot) is healthy.")
SNAPSHOT_RELOADS = Counter("gpu_placement_snapshot_reloads", "Snapshot reloads, by result.", ["result"])
PREEMPTION_NODES = Counter("gpu_placement_preemption_nodes", "Nodes kube-scheduler proposed for preemption, by "
                           "outcome: kept, victims_added, dropped.", ["outcome"])
# The extender's wait for a view change on its way (extender/settle.py), by why it waited (`lagging`: the
# pod is newer than the view's pods; `retried`: kube-scheduler sent the same pod again for the same answer)
# and whether the view changed meanwhile (the pod was judged again) or not.
FILTER_SETTLE_SECONDS = Histogram("gpu_placement_filter_settle_seconds",
                                  "Time a /filter that passed no node waited for the view, by why and outcome.",
                                  ["why", "outcome"],
                                  buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25))
FILTER_SETTLE_DENIED = Counter("gpu_placement_filter_settle_denied",
                               "Waits for the view that /filter did not make: the settle budget was spent.", ["why"])
# Retries that could have waited and did not need to (extender/settle.py): `standing`, rejected on every node
# for what the node is; `covered`, a wait at the view's generation already found nothing in this round;
# `backlog`, a pod answered the same way many times, which waits only from a full budget.
FILTER_SETTLE_SKIPPED = Counter("gpu_placement_filter_settle_skipped",
                                "Waits for the view that /filter did not need to make, by why it would have "
                                "waited and why it did not (standing, covered, backlog).", ["why", "cause"])
BINDINGS = Counter("gpu_placement_bindings", "Bind calls, by result.", ["result"])
BIND_POST_SECONDS = Histogram("gpu_placement_bind_post_seconds",
                              "The Binding POST of a /bind as the extender sees it: from sending to the answer read.",
                              buckets=_BUCKETS)
UNMANAGED_GPU_NODES = Gauge("gpu_placement_unmanaged_gpu_resource_nodes",
                            "Nodes offering a GPU resource missing from kube-scheduler's managedResources.",
                            ["resource"])
CERT_EXPIRY = Gauge("gpu_placement_certificate_expiry_timestamp_seconds",
                    "Unix time at which the serving certificate expires.", ["listener"])
WEBHOOKS_REGISTERED = Gauge("gpu_placement_webhooks_registered",
                            "1 once this webhook replica has written the webhooks into their configurations "
                            "(webhook/registration.py), else 0.")
# The webhook's namespace quota: the ResourceQuota mirror (gpu_placement/controllers/quota_mirror.py), the holds on pods
# this replica admitted (webhook/quota.py, webhook/holds.py) and the GETs of namespaces the view lacked
# (webhook/namespace_reader.py). Series with labels appear once the component runs (live API only).
QUOTA_MIRROR_LEADING = Gauge("gpu_placement_quota_mirror_leading",
                             "1 on the replica that holds the quota mirror's Lease (and writes), else 0.", ["lease"])
QUOTA_MIRROR_SUCCESS = Gauge("gpu_placement_quota_mirror_last_success_timestamp_seconds",
                             "Unix time of the quota mirror's last turn without an API error (the leader: its "
                             "reads and writes; a standby: its Lease check).", ["lease"])
QUOTA_MIRROR_WRITES = Counter("gpu_placement_quota_mirror_writes",
                              "ResourceQuota creates, updates and deletes by the quota mirror, by outcome.",
                              ["action", "outcome"])
QUOTA_MIRROR_FAILING = Gauge("gpu_placement_quota_mirror_failing_objects",
                              "ResourceQuotas and ResourceClaimTemplates whose last write by the quota mirror failed "
                              "(each retried on the next turns; the log names them and why).", ["lease"])
QUOTA_HOLDS = Gauge("gpu_placement_quota_holds", "Pods this replica admitted that the view has not shown yet.")
QUOTA_HOLD_OLDEST = Gauge("gpu_placement_quota_hold_oldest_age_seconds", "Age of the oldest quota hold (0: none).")
QUOTA_HOLD_SETTLEMENTS = Counter("gpu_placement_quota_hold_settlements", "Quota holds ended, by how.", ["outcome"])
QUOTA_HOLD_LISTS = Counter("gpu_placement_quota_hold_lists",
                           "Lists of a namespace's pods made to settle overdue quota holds, by outcome.", ["outcome"])
NAMESPACE_READS = Counter("gpu_placement_namespace_reads",
                          "GETs of a namespace the view lacked when one of its pods was admitted, by outcome "
                          "(limited: not made, past the webhook's rate of such reads).",
                          ["outcome"])
CLAIM_READS = Counter("gpu_placement_claim_reads", "GETs of a ResourceClaim or ResourceClaimTemplate the view lacked "
                      "when a pod naming it was admitted (webhook/claim_reader.py), by outcome.", ["outcome"])

NGC_UNCHECKED = Counter("gpu_placement_ngc_unchecked_pods",
                        "GPU pods admitted (not dry runs) whose CUDA is unknown because gpu-placement's NGC table "
                        "lacks their NGC framework image's release, so no driver is checked against it: why=newer "
                        "(after the table's last release: the table is behind, add ngcReleases), why=gap (a "
                        "release the table skips).", ["why"])
for _why in ("newer", "gap"):  # both series from the start: rate() and alerts need a zero
    NGC_UNCHECKED.labels(_why)

# The DRA taint controller (gpu_placement/controllers/dra_taints.py): DeviceTaintRules for unverified nodes' devices.
DRA_TAINT_LEADING = Gauge("gpu_placement_dra_taint_leading",
                          "1 on the replica that holds the DRA taint controller's Lease (and writes), else 0.",
                          ["lease"])
DRA_TAINT_SERVED = Gauge("gpu_placement_dra_taint_rules_served",
                         "1 when the API server serves DeviceTaintRules; 0: only the extender keeps DRA pods off "
                         "unverified nodes.")
DRA_TAINT_RULES = Gauge("gpu_placement_dra_taint_rules", "DeviceTaintRules gpu-placement keeps now (the leader's).")
DRA_TAINTED_DEVICES = Gauge("gpu_placement_dra_tainted_devices",
                            "Devices under gpu-placement's DeviceTaintRules, by reason (the taint value) and effect.",
                            ["reason", "effect"])
DRA_TAINT_HOLDS = Gauge("gpu_placement_dra_taint_holds",
                        "Unverified nodes left untainted while their validator pod waits for a device.")
DRA_TAINT_WRITES = Counter("gpu_placement_dra_taint_writes",
                           "DeviceTaintRule creates, updates and deletes by gpu-placement, by outcome.",
                           ["action", "outcome"])
DRA_TAINT_FAILING = Gauge("gpu_placement_dra_taint_failing_objects",
                          "DeviceTaintRules whose last write failed (each retried on the next turns; the log names "
                          "them and why).", ["lease"])
DRA_TAINT_SUCCESS = Gauge("gpu_placement_dra_taint_last_success_timestamp_seconds",
                          "Unix time of the DRA taint controller's last turn without an API error.", ["lease"])
# The settled drivers (gpu_placement/controllers/settled_drivers.py): gpu-placement.io/settled-driver on each Node.
SETTLED_DRIVER_LEADING = Gauge("gpu_placement_settled_driver_leading",
                               "1 on the replica that holds the settled drivers' Lease (and writes "
                               "gpu-placement.io/settled-driver on Nodes), else 0.", ["lease"])
SETTLED_DRIVER_WRITES = Counter("gpu_placement_settled_driver_writes",
                                "Patches of a Node's gpu-placement.io/settled-driver annotation, by outcome.",
                                ["outcome"])
# Launch fences (gpu_placement/decide/fences.py, controllers/launch_fences.py; docs/rules.md LaunchFailures).
LAUNCH_FENCE_CHANGES = Counter("gpu_placement_launch_fence_changes",
                               "Launch fences (a node and a GPU resource) begun (fenced) or lifted (lifted), as "
                               "this replica saw them.", ["event"])
LAUNCH_FENCE_LEADING = Gauge("gpu_placement_launch_fence_leading",
                             "1 on the replica that holds the launch fences' Lease (and writes "
                             "gpu-placement.io/launch-fence on Nodes), else 0.", ["lease"])
LAUNCH_FENCE_WRITES = Counter("gpu_placement_launch_fence_writes",
                              "Patches of a Node's gpu-placement.io/launch-fence annotation, by outcome.", ["outcome"])
LAUNCH_FENCE_FAILING = Gauge("gpu_placement_launch_fence_failing_objects",
                             "Nodes whose last gpu-placement.io/launch-fence patch failed (each retried on the next "
                             "turns; the log names them and why).", ["lease"])
SETTLED_DRIVER_FAILING = Gauge("gpu_placement_settled_driver_failing_objects",
                               "Nodes whose last gpu-placement.io/settled-driver patch failed (each retried on the "
                               "next turns; the log names them and why).", ["lease"])
# The refused nodes (gpu_placement/controllers/refused_nodes.py): gpu-placement.io/refused on each Node.
REFUSED_LEADING = Gauge("gpu_placement_refused_nodes_leading",
                        "1 on the replica that holds the refused nodes' Lease (and writes gpu-placement.io/refused "
                        "on Nodes), else 0.", ["lease"])
REFUSED_WRITES = Counter("gpu_placement_refused_nodes_writes",
                         "Patches of a Node's gpu-placement.io/refused label, by outcome.", ["outcome"])
REFUSED_FAILING = Gauge("gpu_placement_refused_nodes_failing_objects",
                        "Nodes whose last gpu-placement.io/refused patch failed (each retried on the next turns; "
                        "the log names them and why).", ["lease"])
# The node writers' passes (gpu_placement/controllers/node_writer.py): refused nodes, settled drivers, launch fences.
NODE_WRITER_JUDGED = Counter("gpu_placement_node_writer_judged_nodes",
                             "Nodes a node writer (by its Lease) judged in its passes: `changed`, the nodes changed "
                             "since its last pass; `full`, every node (first pass, new leader, relist, resync).",
                             ["lease", "pass"])
# The outcome counter (gpu_placement/outcomes/counter.py): launch outcomes and node times, counted by one replica.
OUTCOMES_LEADING = Gauge("gpu_placement_outcomes_leading", "1 on the replica that holds the outcomes Lease and counts "
                         "launch outcomes and node lifecycle times for the cluster, else 0.", ["lease"])
OUTCOMES_COUNTED_UNTIL = Gauge("gpu_placement_outcomes_counted_until_timestamp_seconds",
                               "The outcomes watermark as this replica last read it from the Lease: events up to this "
                               "Unix time are counted (it trails the clock by the settle time; more only while the "
                               "deferred launches are at their bound).", ["lease"])
OUTCOMES_WRITES = Counter("gpu_placement_outcomes_writes",
                          "Watermark writes by the outcomes Lease's holder, by outcome: ok; conflict (another "
                          "replica wrote the Lease first: this one counts nothing, as meant); refused, timeout, "
                          "unreachable, not_found (nothing counted that turn; the next turn counts it).",
                          ["lease", "outcome"])
OUTCOMES_STATE_BYTES = Gauge("gpu_placement_outcomes_state_bytes",
                             "Size of the outcomes Lease's state annotation (the cluster's totals and deferred "
                             "launches, compressed) as this replica last read or wrote it; bounded at 224 KiB of the "
                             "Lease's 256 KiB of annotations.", ["lease"])
OUTCOMES_DEFERRED = Gauge("gpu_placement_outcomes_deferred_launches",
                          "Bound GPU pods the outcomes watermark passed with their launch undecided (containers still "
                          "being created), as last read from the Lease: each is counted once it starts or fails, or "
                          "as not_started an hour after it was taken.", ["lease"])
TELEMETRY_SKIPPED = Counter("gpu_placement_telemetry_samples_skipped",
                            "DCGM telemetry samples skipped, each alone, by why: non_finite (NaN or Inf), malformed.",
                            ["reason"])
for _reason in ("non_finite", "malformed"):  # both series from the start: rate() and alerts need a zero
    TELEMETRY_SKIPPED.labels(_reason)

API_OUTCOMES = ("ok", "conflict", "not_found", "refused", "timeout", "unreachable")


def api_outcome(exc: BaseException | None) -> str:
    """How one API call ended, as a bounded label: ok; conflict (409) or not_found (404); refused (any
    other HTTP answer: RBAC, validation, throttling); timeout; unreachable (TLS, connection)."""
    if exc is None:
        return "ok"
    status = getattr(exc, "status", None)  # gpu_placement.kube.api.ApiError
    if isinstance(status, int) and status > 0:
        return {404: "not_found", 409: "conflict"}.get(status, "refused")
    cause = getattr(exc, "reason", None) if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
    if isinstance(cause, TimeoutError | urllib3.exceptions.TimeoutError):
        return "timeout"
    return "unreachable"


TELEMETRY_SUCCESS = Gauge("gpu_placement_telemetry_last_success_timestamp_seconds",
                          "Unix time of the last DCGM telemetry fetch that parsed (0: none yet or not configured).")

_heard = [time.time()]


def heard_from_source() -> None:
    """A source calls this on every list, event and bookmark: the view is that fresh."""
    _heard[0] = time.time()


def last_heard() -> float:
    """Unix time the source last gave the view a list, an event or a bookmark."""
    return _heard[0]


def seconds_since_heard() -> float:
    return time.time() - _heard[0]


def exposition() -> bytes:
    return generate_latest()
