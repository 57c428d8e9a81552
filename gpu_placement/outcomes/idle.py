"""Idle GPUs while GPU pods wait, and why they cannot use them (issue 33's live gauge).

At scrape time, from figures the view keeps current one change at a time (free units and MiB per
node and resource, the verdict of every GPU node, the pending GPU pods and the reason each waits):
the free units and memory on verified nodes, per GPU resource, while at least one pending GPU pod
asks for that resource, attributed to the strongest reason among those pods:

- `fragmented`: the pod waits for capacity (InsufficientGPU, InsufficientGPUMemory, or kube-scheduler's
  own `Insufficient <resource>`) and the verified nodes have the room in total, but no node in one piece;
- `quota`: the pod is held by a scheduling gate (Kueue's quota, for one: `SchedulingGated`);
- `policy`: the pod's own rules keep it off the free nodes (product, sharing level, driver or CUDA,
  compute capability, a soaking driver, its pools' node selection; so also a pod waiting for capacity
  while some verified node has its ask free: a node it may not use);
- `unverified`: the nodes it could use are not verified (NotValidated, NodeNotReady, DriverUpgrade, ...);
- `capacity`: it waits for capacity and the free room is smaller than its ask even in total.

So the series of one resource sum to its free units on verified nodes while pods wait for it, each
unit counted once. Nothing here runs per request: a scrape walks the GPU nodes of the resources
pending pods ask for (a dict each) and the pending GPU pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from gpu_placement.decide.rules import (
    BAD_LABEL,
    COMPUTE_CAPABILITY,
    DRIVER_SOAKING,
    DRIVER_TOO_OLD,
    DRIVER_UPGRADE,
    INSUFFICIENT_GPU,
    INSUFFICIENT_GPU_MEMORY,
    MIG_RECONFIGURING,
    NO_GPU,
    NODE_NOT_READY,
    NOT_VALIDATED,
    PRODUCT_MISMATCH,
    SHARING_MISMATCH,
    UNKNOWN_DRIVER,
    UNKNOWN_GPU_MEMORY,
)
from gpu_placement.facts.pods import PodRecord
from gpu_placement.observe.metrics import LatestFamilies
from gpu_placement.outcomes.record import AFFINITY, GATED, INSUFFICIENT, Outcomes, wait_reason
from gpu_placement.view.cluster import ClusterView

__all__ = ["REASONS", "Free", "IdleGpus", "free_on", "idle_sentence", "idle_while_waiting", "track_idle",
           "why_class"]

FRAGMENTED, QUOTA, POLICY, UNVERIFIED, CAPACITY = "fragmented", "quota", "policy", "unverified", "capacity"
REASONS = (FRAGMENTED, QUOTA, POLICY, UNVERIFIED, CAPACITY)  # strongest first: a unit goes to the first present
_MIB = 2**20
_CAPACITY_CODES = frozenset({INSUFFICIENT_GPU, INSUFFICIENT_GPU_MEMORY, INSUFFICIENT})
_POLICY_CODES = frozenset({PRODUCT_MISMATCH, SHARING_MISMATCH, DRIVER_TOO_OLD, COMPUTE_CAPABILITY, UNKNOWN_DRIVER,
                           DRIVER_SOAKING, UNKNOWN_GPU_MEMORY, BAD_LABEL, AFFINITY})
_UNVERIFIED_CODES = frozenset({NODE_NOT_READY, NO_GPU, NOT_VALIDATED, DRIVER_UPGRADE, MIG_RECONFIGURING})


@dataclass(slots=True, frozen=True)
class Free:
    """One resource's free room on verified nodes."""

    units: int  # in total
    nodes: int  # nodes with at least one unit free
    most: int  # the most on one node
    mib: int  # free memory those units stand for


def free_on(view: ClusterView, resource: str, verified: Iterable[str]) -> Free:
    """Free units and MiB of `resource` on these nodes (call under the view's lock)."""
    units = view.free_units.get(resource, {})
    mib = view.free_mib.get(resource, {})
    total = nodes = most = memory = 0
    for node in verified:
        free = units.get(node, 0)
        if free > 0:
            total += free
            nodes += 1
            most = max(most, free)
            memory += max(mib.get(node) or 0, 0)
    return Free(total, nodes, most, memory)


def why_class(reason: str, ask: int, free: Free) -> str | None:
    """Which of REASONS a pod waiting for `reason` (a code) and asking `ask` units stands for."""
    if reason == GATED:
        return QUOTA
    if reason in _CAPACITY_CODES:
        if free.units < ask:
            return CAPACITY
        # The room is there: in pieces (fragmented), or whole on a node the pod may not use (its pools'
        # node selection keeps it off before the extender ever sees that node): policy.
        return FRAGMENTED if ask > free.most else POLICY
    if reason in _POLICY_CODES:
        return POLICY
    if reason in _UNVERIFIED_CODES:
        return UNVERIFIED
    return None  # not waiting on anything we can name (no PodScheduled message yet)


def idle_while_waiting(outcomes: Outcomes, extender: Mapping[str, str] | None = None
                       ) -> dict[tuple[str, str], tuple[int, int]]:
    """(resource, reason) -> (free units, free bytes) on verified nodes, for every resource a pending GPU
    pod asks for and every reason of REASONS (zeros included). `extender`: pod key -> the reason the
    extender last rejected it for (its own /filter answers, where it serves them), else the codes of the
    pod's PodScheduled message."""
    view = outcomes.view
    outcomes.prime()
    with view.lock:
        waiting: dict[str, list[tuple[str, int]]] = {}  # resource -> [(reason, ask)]
        for key, pod in outcomes.pending.items():
            reason = _reason(key, pod, extender)
            if reason is not None:
                for resource, count in pod.gpus:
                    waiting.setdefault(resource, []).append((reason, count))
        verified = outcomes.verified() if waiting else []
        free = {resource: free_on(view, resource, verified) for resource in waiting}
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for resource, pods in waiting.items():
        room = free[resource]
        classes = {cls for reason, ask in pods if (cls := why_class(reason, ask, room)) is not None}
        strongest = next((cls for cls in REASONS if cls in classes), None)
        for cls in REASONS:
            out[(resource, cls)] = (room.units, room.mib * _MIB) if cls == strongest else (0, 0)
    return out


def _reason(key: str, pod: PodRecord, extender: Mapping[str, str] | None) -> str | None:
    if pod.node or not pod.active or not pod.gpus or pod.launch is None:
        return None
    if extender is not None and key in extender:
        return extender[key]
    reason = wait_reason(pod.launch.waiting)
    return None if reason == "none" else reason


class IdleGpus:
    """The gauges on /metrics: `gpu_placement_idle_gpus` and `gpu_placement_idle_gpu_memory_bytes`."""

    def __init__(self, outcomes: Outcomes) -> None:
        self.outcomes = outcomes
        # Resources exported once keep their series, at 0 while no pod waits: a series that vanished would
        # leave its last value standing in Prometheus' lookback wherever no staleness marker ends it.
        self._resources: set[str] = set()

    def families(self) -> list[Metric]:
        from gpu_placement.report.cluster_metrics import tracker_for

        tracker = tracker_for(self.outcomes.view)
        extender = None
        if tracker is not None:
            with self.outcomes.view.lock:  # the extender changes it from its request path, under this lock
                extender = {key: waiting.reason for key, waiting in tracker.waiting.items()}
        figures = idle_while_waiting(self.outcomes, extender or None)
        self._resources.update(resource for resource, _ in figures)
        for resource in self._resources:
            for reason in REASONS:
                figures.setdefault((resource, reason), (0, 0))
        units = GaugeMetricFamily("gpu_placement_idle_gpus", "Free GPU units on verified nodes while GPU pods asking "
                                  "for that resource are pending, by why those pods cannot use them: fragmented, "
                                  "quota, policy, unverified, capacity (docs/outcomes.md); each unit in one reason.",
                                  labels=["resource", "reason"])
        memory = GaugeMetricFamily("gpu_placement_idle_gpu_memory_bytes", "The GPU memory those idle units stand for.",
                                   labels=["resource", "reason"])
        for (resource, reason), (free, free_bytes) in sorted(figures.items()):
            units.add_metric([resource, reason], free)
            memory.add_metric([resource, reason], free_bytes)
        return [units, memory]


def idle_sentence(view: ClusterView, resource: str, ask: int, verified: Iterable[str]) -> str | None:
    """For `explain`: the room is there, just not in one piece. None when a node has it, or the cluster
    has less than the ask in total."""
    with view.lock:
        room = free_on(view, resource, verified)
    if not room.units >= ask > room.most:
        return None
    what = "GPUs" if resource == "nvidia.com/gpu" else resource
    return (f"{room.units} {what} free across {room.nodes} verified node{'s' if room.nodes != 1 else ''}, at most "
            f"{room.most} on one: the pod asks {ask} (fragmented: it would fit if the free ones were on one node)")


_exported = LatestFamilies()


def track_idle(outcomes: Outcomes) -> IdleGpus:
    """Export the idle-GPU gauges of this view on /metrics (one per process: the service's)."""
    idle = IdleGpus(outcomes)
    _exported.current = idle
    return idle
