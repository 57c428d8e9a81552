"""One replay: the trace's tasks arrive one by one and go through what a live cluster runs.

For each task, in arrival order (tasks never leave; one that fits nowhere fails and is deleted, as the
ATC'23 simulator does):

1. The pod appears in gpu-placement's view as the watch shows a new pod (`Ingest.event`).
2. kube-scheduler's own filters pass some nodes (`scheduler.KubeScheduler`), and only those are sent to
   the extender, as the chart configures it (nodeCacheCapable: node names).
3. The extender's `/filter`: `Placement.filter`, then its best tier (`Placement.tier`: the nodes tied at the
   best score, at most `tier_size` drawn at random), the code extender/app.py's route calls, on the same view.
4. kube-scheduler takes the tier's one node as it is (its single-feasible-node path), or scores the tier's
   nodes with its own plugins (the extender, with no prioritizeVerb, adds 0) and takes the highest.
   `tier_size` 0 models a configuration that still calls `/prioritize`: every passing node, the plugins'
   scores plus the extender's (`Placement.scores`) times `weight`.
5. In `dra` mode kube-scheduler's DRA allocator picks the devices inside the node
   (`gpu_placement.decide.allocator`) and writes the claim's allocation, which the view then reads as
   the ResourceClaim watch delivers it.
6. `/bind` as extender/app.py does it: the fit checked again with reservations (`Placement.recheck`),
   the reservation made, then `SnapshotBinder.bind` shows the pod bound in the view as the pod watch
   would. The device plugin (device-plugin mode) picks the replica or GPUs on the node.

The GPU milli arrived and placed after every task give the allocation curve, averaged per percent of
arrived capacity the way the simulator's analysis does it (experiments/analysis/merge_alloc_discrete.py:
the percent is the arrived milli over 10 x GPUs, rounded; allocation is the mean over the tasks of that
percent, else of the percents either side).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from extender.binding import SnapshotBinder
from gpu_placement.base.config import Config, Scoring
from gpu_placement.decide.placement import Placement
from gpu_placement.decide.requirements import Requirements
from gpu_placement.facts.dra import DRA_KINDS
from gpu_placement.replay.cluster import DRA, Cluster, ReplayNode, TaskPod, build_cluster, claim_object, task_pod
from gpu_placement.replay.scheduler import KubeScheduler
from gpu_placement.replay.trace import Task
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import FILE_KINDS, Ingest

__all__ = ["Placed", "Point", "ReplayError", "Run", "points", "replay"]

Progress = Callable[[int, int], None]


class ReplayError(RuntimeError):
    """The replay found the decision code contradicting itself (a bug, not bad input)."""


@dataclass(slots=True, frozen=True)
class Point:
    arrived_pct: int
    allocated_pct: float
    unallocated_gpus: float


@dataclass(slots=True, frozen=True)
class Placed:
    pod: str
    node: str
    devices: tuple[tuple[int, int], ...]  # (GPU index on the node, milli placed there)


@dataclass(slots=True)
class Run:
    strategy: str
    seed: int
    gpus: int
    points: list[Point] = field(default_factory=list)
    placements: list[Placed] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    arrivals: int = 0  # tasks that arrived
    copies: int = 0  # of them, copies of listed tasks drawn to reach the arrivals asked (`<name>-tuned-<i>`)


def _run_now(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Drive a coroutine that never suspends (SnapshotBinder.bind) to its end, without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise ReplayError("the binder waited for I/O; the replay binds synchronously")


class _DevicePlugin:
    """Which GPUs the device plugin gives on a node (device-plugin mode): whole GPUs, lowest index
    first; a replica on the GPU with the fewest replicas in use (NVIDIA k8s-device-plugin
    internal/rm/allocate.go, default policy `distributed`; its ties fall to Go map order, here the
    lowest index)."""

    def __init__(self) -> None:
        self.whole: dict[str, set[int]] = {}
        self.replicas: dict[str, list[int]] = {}

    def give(self, node: ReplayNode, task: Task, replica: bool) -> tuple[tuple[int, int], ...]:
        if replica:
            counts = self.replicas.setdefault(node.name, [0] * node.gpus)
            index = min(range(node.gpus), key=lambda i: (counts[i], i))
            counts[index] += 1
            return ((index, task.milli),)
        used = self.whole.setdefault(node.name, set())
        free = [i for i in range(node.gpus) if i not in used][:task.gpus]
        used.update(free)
        return tuple((i, task.milli) for i in free)


def _view_of(cluster: Cluster, config: Config, seed: int) -> tuple[ClusterView, Ingest, Placement]:
    """The view fed the cluster's objects through the ingest a snapshot goes through
    (gpu_placement/app/assembly.py core_from_objects), and the extender's Placement on it."""
    view, ingest = ClusterView(config), Ingest(config)
    by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in (*FILE_KINDS, *DRA_KINDS)}
    for obj in cluster.objects:
        kind = Ingest.kind_of(obj)
        if kind is not None:
            by_kind[kind].append(obj)
    with view.lock:
        for kind in (*FILE_KINDS, *(k for k in DRA_KINDS if by_kind[k])):
            ingest.replace(view, kind, by_kind[kind])
    return view, ingest, Placement(view, config, seed=seed)


def _bind(view: ClusterView, placement: Placement, binder: SnapshotBinder, req: Requirements, pod: TaskPod,
          node: str) -> str | None:
    """extender/app.py `_recheck_and_reserve`, then `SnapshotBinder.bind`: the error, or None."""
    meta = pod.pod["metadata"]
    with view.lock:
        view.expire_reservations()
        problem = placement.recheck(req, node)
        if problem is not None:
            return problem
        memory = f"{req.memory_mib}Mi" if req.memory_mib is not None else None
        view.reserve(pod.key, node, req.gpus, memory, meta["uid"])
    _run_now(binder.bind(meta["namespace"], meta["name"], meta["uid"], node))
    return None


def replay(nodes: Sequence[ReplayNode], tasks: Sequence[Task], order: Sequence[Task], mode: str, strategy: str,
           seed: int, weight: int = 5, replicas: int = 2, config: Config | None = None,
           progress: Progress | None = None, tier_size: int = 8) -> Run:
    """Replay `order` (tasks as they arrive; `tasks`: the trace, to size the cluster's time-sliced pool
    and claim templates) on a fresh cluster of `nodes` with scoring `strategy` and /filter's best tier of
    `tier_size` (the chart's 8; 0: every passing node, and /prioritize at `weight`)."""
    base = config or Config()
    config = replace(base, scoring=replace(base.scoring or Scoring(), strategy=strategy, tier_size=tier_size))
    cluster = build_cluster(copy.deepcopy(list(nodes)), tasks, mode, replicas)
    view, ingest, placement = _view_of(cluster, config, seed)
    binder = SnapshotBinder(view)
    kube = KubeScheduler(cluster.nodes, mode, weight, seed)
    by_name = {node.name: node for node in cluster.nodes}
    plugin = _DevicePlugin()
    listed = set(tasks)
    run = Run(strategy, seed, cluster.gpus, arrivals=len(order), copies=sum(task not in listed for task in order))
    samples: list[tuple[int, int]] = []
    arrived = placed = 0
    for index, task in enumerate(order):
        pod = task_pod(task, cluster, index)
        arrived += task.total_milli
        node = _place(pod, task, cluster, view, ingest, placement, binder, kube, by_name, plugin, run)
        if node is not None:
            placed += task.total_milli
        samples.append((arrived, placed))
        if progress is not None:
            progress(index + 1, len(order))
    run.points = points(samples, cluster.gpus)
    return run


def _place(pod: TaskPod, task: Task, cluster: Cluster, view: ClusterView, ingest: Ingest, placement: Placement,
           binder: SnapshotBinder, kube: KubeScheduler, nodes: dict[str, ReplayNode], plugin: _DevicePlugin,
           run: Run) -> str | None:
    feasible, plugin_scores = kube.candidates(pod)
    if not pod.gpu:  # a CPU-only task: the default scheduler, no extender; the view sees it run there
        node = kube.choose({name: plugin_scores[name] for name in feasible})
        if node is not None:
            kube.bind(node, pod)
            bound = {**pod.pod, "spec": {**pod.pod["spec"], "nodeName": node}, "status": {"phase": "Running"}}
            ingest.event(view, "pods", "ADDED", bound)
        return node
    ingest.event(view, "pods", "ADDED", pod.pod)
    req = placement.requirements(pod.pod)
    passed = placement.filter(req, list(feasible)).passed if feasible else []
    if placement.config.scoring.tier_size:  # sorted: the tier's draw is the seed's, whatever the sets' order
        totals = {name: plugin_scores[name] for name in placement.tier(req, sorted(passed))}
    else:
        totals = {name: kube.extender_total(score, plugin_scores[name])
                  for name, score in placement.scores(req, passed)}
    node = kube.choose(totals)
    if node is None:
        run.failed.append(pod.key)
        ingest.event(view, "pods", "DELETED", pod.pod)  # the simulator deletes a task it could not place
        return None
    allocation = kube.allocate(node, pod) if cluster.mode == DRA else []
    if cluster.mode == DRA:
        if allocation is None:
            raise ReplayError(f"{pod.key}: the DRA allocator passed node {node} and then found no device there")
        claim = claim_object(pod, node, [(a.device, a.consumed) for a in allocation], task.gpus, task.milli)
        ingest.event(view, "resourceclaims", "ADDED", claim)
    problem = _bind(view, placement, binder, req, pod, node)
    if problem is not None:
        raise ReplayError(f"{pod.key}: /bind refused node {node}, which /filter passed: {problem}")
    kube.bind(node, pod, allocation or ())
    if cluster.mode == DRA:
        index = {d.name: i for i, d in enumerate(nodes[node].devices)}
        devices = tuple((index[a.device], task.milli) for a in allocation or ())
    else:
        devices = plugin.give(nodes[node], task, replica=bool(pod.extended) and pod.extended[0][0].endswith(".shared"))
    run.placements.append(Placed(pod.key, node, devices))
    return node


def points(samples: Sequence[tuple[int, int]], gpus: int) -> list[Point]:
    """The curve as merge_alloc_discrete.py computes it from the simulator's per-task log lines: per
    percent of arrived capacity (rounded), the mean allocation of the tasks that arrived at it, else of
    the percents either side. A percent no task arrived near (a small trace's big tasks jump over some)
    carries the allocation of the last task that arrived below it. The curve ends where arrivals end."""
    if not gpus or not samples:
        return []
    by_pct: dict[int, list[float]] = {}
    for arrived, placed in samples:
        by_pct.setdefault(round(arrived / gpus / 10), []).append(round(placed / gpus / 10, 2))
    curve = []
    last = 0.0
    ordered = sorted((arrived / gpus / 10, round(placed / gpus / 10, 2)) for arrived, placed in samples)
    cursor = 0
    for pct in range(0, max(by_pct) + 1):
        while cursor < len(ordered) and ordered[cursor][0] <= pct:
            last = ordered[cursor][1]
            cursor += 1
        values = by_pct.get(pct) or [v for p in (pct - 1, pct, pct + 1) for v in by_pct.get(p, ())]
        allocated = round(sum(values) / len(values), 2) if values else last
        curve.append(Point(pct, allocated, round(gpus * (100 - allocated) / 100, 1)))
    return curve
