"""kube-scheduler around the extender, as far as the replay needs it: its own filters and scores, and
how it picks the node from the sum of its plugins' and the extender's scores.

The chart runs kube-scheduler v1.37 with its default plugins in gpu-placement's profile and the
extender's `/filter` only: it answers the best tier (simulate.py, `Placement.tier`), so kube-scheduler
takes its one node as it is (`schedulePod`'s single-feasible-node path) or, with several, scores them
with its plugins alone (the extender has no prioritizeVerb: `HTTPExtender.Prioritize` gives each 0).
With `config.scoring.tierSize` 0 it also calls `/prioritize`, at `weight` (the chart's
`scheduler.extender.weight`, 5):

- Filters (pkg/scheduler/framework/plugins): NodeResourcesFit (CPU, memory, pods and extended
  resources against allocatable), NodeUnschedulable, and in `dra` mode DynamicResources (the claim
  must fit the node's devices: `gpu_placement.decide.allocator`). The other default filters (ports,
  volumes, affinity, taints) pass every node here: the replay's pods name none of those.
- Scores, per node: NodeResourcesFit with its default LeastAllocated strategy over CPU and memory
  (weight 1; noderesources/least_allocated.go), NodeResourcesBalancedAllocation (weight 1;
  balanced_allocation.go `balancedResourceScorer`), and the extender's 0..10 scaled by
  `weight * MaxNodeScore / MaxExtenderPriority` (schedule_one.go `prioritizeNodes`). The other default
  score plugins give every node the same score here (no taints, affinity, spread constraints or
  images), so they change no choice and are left out.
- The node with the highest sum wins; among equals, one at random (schedule_one.go gives each node a
  random `Randomizer`, framework/sorted_nodes.go orders by it): here a seeded `random.Random`, so a
  replay is repeatable.

Each pod's candidates come from a cache per shape of pod (CPU, memory, GPU ask), brought up to date
node by node as pods land, as Placement does it: a pod costs set operations and the nodes changed
since its shape was last seen, not a pass over every node.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpu_placement.decide.allocator import Allocation, first_fit
from gpu_placement.replay.cluster import DRA, GPU_CLASS, ReplayNode, TaskPod

__all__ = ["KubeScheduler"]

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
_TYPES = {GPU_CLASS: "gpu"}


@dataclass(slots=True)
class _Node:
    spec: ReplayNode
    cpu: int = 0  # milli-CPU requested by the pods bound here
    memory: int = 0  # MiB
    pods: int = 0
    extended: dict[str, int] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)  # dra: device -> claims holding it
    consumed: dict[str, dict[str, int]] = field(default_factory=dict)  # dra: device -> capacity -> milli-units
    given: dict[object, list[Allocation] | None] = field(default_factory=dict)  # dra: the allocator's answer per ask


@dataclass(slots=True)
class _Shape:
    feasible: set[str]
    scores: dict[str, int]
    seen: int


class KubeScheduler:
    def __init__(self, nodes: Sequence[ReplayNode], mode: str, weight: int, seed: int) -> None:
        self.mode = mode
        self.weight = weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        self.nodes = {node.name: _Node(node) for node in nodes}
        self.random = random.Random(seed)
        self._shapes: dict[tuple[object, ...], _Shape] = {}
        self._log: list[str] = []

    # -- filters and scores --------------------------------------------------------------------
    def candidates(self, pod: TaskPod) -> tuple[set[str], dict[str, int]]:
        """The nodes kube-scheduler's own filters pass for the pod, and their plugin scores (before the
        extender's)."""
        shape = self._shapes.get(pod.shape)
        if shape is None:
            shape = self._shapes[pod.shape] = _Shape(set(), {}, len(self._log))
            for name in self.nodes:
                self._judge(shape, pod, name)
        elif shape.seen < len(self._log):
            for name in set(self._log[shape.seen:]):
                self._judge(shape, pod, name)
            shape.seen = len(self._log)
        return shape.feasible, shape.scores

    def _judge(self, shape: _Shape, pod: TaskPod, name: str) -> None:
        node = self.nodes[name]
        if self._fits(node, pod):
            shape.feasible.add(name)
            shape.scores[name] = self._score(node, pod)
        else:
            shape.feasible.discard(name)
            shape.scores.pop(name, None)

    def _fits(self, node: _Node, pod: TaskPod) -> bool:
        spec = node.spec
        if node.pods + 1 > spec.pods or node.cpu + pod.cpu_milli > spec.cpu_milli \
                or node.memory + pod.memory_mib > spec.memory_mib:
            return False
        if spec.obj.get("spec", {}).get("unschedulable"):
            return False
        for resource, count in pod.extended:
            if node.extended.get(resource, 0) + count > spec.extended.get(resource, 0):
                return False
        if pod.asks:
            return self.mode == DRA and self.allocate(spec.name, pod) is not None
        return True

    def _score(self, node: _Node, pod: TaskPod) -> int:
        """NodeResourcesFit (LeastAllocated, CPU and memory weighted 1 each) + BalancedAllocation."""
        spec = node.spec
        cpu, memory = node.cpu + pod.cpu_milli, node.memory + pod.memory_mib
        least = (_least(cpu, spec.cpu_milli) + _least(memory, spec.memory_mib)) // 2
        with_pod = _balanced((cpu, memory), (spec.cpu_milli, spec.memory_mib))
        without = _balanced((node.cpu, node.memory), (spec.cpu_milli, spec.memory_mib))
        return least + MAX_NODE_SCORE // 2 + (MAX_NODE_SCORE // 2 + with_pod - without) // 2

    def allocate(self, name: str, pod: TaskPod) -> list[Allocation] | None:
        """The devices the DRA allocator gives the pod's claim on the node (None: it does not fit)."""
        node = self.nodes[name]
        given: list[Allocation] | Literal[False] | None = node.given.get(pod.asks, False)
        if given is False:  # not asked yet (None: it does not fit)
            given = node.given[pod.asks] = first_fit(node.spec.devices, node.held, node.consumed, pod.asks, _TYPES)
        return given

    # -- choice --------------------------------------------------------------------------------
    def choose(self, totals: Mapping[str, int]) -> str | None:
        """The highest total; among equals one at random."""
        if not totals:
            return None
        best = max(totals.values())
        tied = [name for name, total in totals.items() if total == best]
        return tied[0] if len(tied) == 1 else self.random.choice(sorted(tied))

    def extender_total(self, extender: int, plugins: int) -> int:
        return extender * self.weight + plugins

    # -- binding -------------------------------------------------------------------------------
    def bind(self, name: str, pod: TaskPod, allocation: Sequence[Allocation] = ()) -> None:
        node = self.nodes[name]
        node.cpu += pod.cpu_milli
        node.memory += pod.memory_mib
        node.pods += 1
        for resource, count in pod.extended:
            node.extended[resource] = node.extended.get(resource, 0) + count
        devices = {d.name: d for d in node.spec.devices}
        node.given.clear()
        for given in allocation:
            if devices[given.device].shared:
                held = node.consumed.setdefault(given.device, {})
                for capacity, amount in given.consumed:
                    held[capacity] = held.get(capacity, 0) + amount
            else:
                node.held[given.device] = node.held.get(given.device, 0) + 1
        self._log.append(name)


def _least(requested: int, capacity: int) -> int:
    """leastRequestedScore."""
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def _balanced(requested: tuple[int, int], allocatable: tuple[int, int]) -> int:
    """balancedResourceScore for two resources: (1 - std) * MaxNodeScore, std = |f1 - f2| / 2."""
    fractions = [min(1.0, r / a) for r, a in zip(requested, allocatable, strict=True) if a]
    std = abs(fractions[0] - fractions[1]) / 2 if len(fractions) == 2 else 0.0
    return int((1 - std) * MAX_NODE_SCORE) if not math.isnan(std) else 0
