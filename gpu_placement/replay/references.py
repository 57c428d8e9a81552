"""The ATC'23 paper's reference policies, Best-fit and FGD, as its simulator runs them
(hkust-adsl/kubernetes-scheduler-simulator), on the replay's task sequences: the yardsticks of
docs/replay.md's family tables.

The simulator's scheduler, followed here (scripts/generate_config_and_run.py's profile):

- every task, CPU-only ones too, is placed by the policy under test alone (every default score plugin
  off), on a node that passes NodeResourcesFit (CPU, memory, pods) and the Open-Gpu-Share filter (a GPU
  model the task accepts, and room on its GPUs: `gpus` GPUs with `milli` free each); the highest score
  wins; among equals the smallest node name (the simulator's `selectHost`, patched "for reproducibility"),
  where each name starts with the node's place in a `rand.Perm` drawn right after the tasks
  (simulator.go `syncClusterResourceList`): a fixed order per seed, so ties pack onto the same nodes;
- the policy also picks the GPUs: whole GPUs lowest index first (`AllocateExclusiveGpuId`); a share on
  the tightest GPU that has room (Best-fit, `allocateGpuIdBasedOnBestFit`) or on the GPU whose use
  scores best (FGD);
- **Best-fit** (pkg/simulator/plugin/best_fit_score.go): `int((1 - sum_i w_i (free_i - ask_i) / max_i)
  x 100)` over CPU (max 128 CPUs) and GPU milli (max 8 GPUs), weights 0.5 each;
- **FGD** (fgd_score.go, pkg/utils/frag.go `NodeGpuShareFragAmountScore`): `int(sigmoid((frag before -
  frag after) / 1000) x 100)`, where a node's fragmentation sums, over the typical pods (the task
  list's (CPU, GPU milli, GPUs, models) asks, most frequent first up to 95 % of the tasks, CPU-only
  ones included: `GetTypicalPods` with the paper's `typicalPodsConfig`), each one's frequency times
  the GPU milli it could not use: its GPUs too small for it when it fits (GPUs and CPU), else
  everything free.

Both run in O(changed nodes) a task: a node's score for a kind of task is redone only when the node
changed since that kind was last seen. The curve comes out as `simulate.points` computes it.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpu_placement.replay.gorand import GoRand
from gpu_placement.replay.simulate import Placed, Run, points
from gpu_placement.replay.trace import MILLI, NodeRow, Task, arrivals

__all__ = ["REFERENCES", "best_fit_score", "fgd_score", "frag_amount", "reference_replay", "simulator_arrivals",
           "typical_pods"]

REFERENCES = ("best-fit", "fgd")
MAX_SPEC_CPU = 128_000  # gpushareutils.MaxSpecCpu
MAX_SPEC_GPU = 8_000  # gpushareutils.MaxSpecGpu
MAX_NODE_SCORE = 100
POPULARITY = 0.95  # typicalPodsConfig.podPopularityThreshold: 95 (%)
SIMULATOR_PODS = 1001  # pods a simulated node allows

# A kind of task as the simulator's PodResource sees it: (CPU milli, GPU milli each, GPUs, accepted models).
Kind = tuple[int, int, int, tuple[str, ...]]
Typical = tuple[tuple[Kind, float], ...]


def _kind_of(task: Task) -> Kind:
    return (task.cpu_milli, task.milli, task.gpus, task.models)


def typical_pods(tasks: Sequence[Task], popularity: float = POPULARITY) -> Typical:
    """`GetTypicalPods` (isInvolvedCpuPods, step 1): the kinds by count, most first, until they hold
    `popularity` of the tasks, their frequencies renormalised to 1. Equal counts: by kind (the
    simulator's order there is Go's map order)."""
    counts = Counter(_kind_of(t) for t in tasks)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    total, kept, cumulative = len(tasks), [], 0
    for kind, count in ranked:
        if cumulative >= popularity * total:
            break
        kept.append((kind, count))
        cumulative += count
    return tuple((kind, count / cumulative) for kind, count in kept)


def _accessible(model: str, models: tuple[str, ...]) -> bool:
    return not models or model in models


@dataclass(slots=True)
class _Curve:
    """A node's fragmentation (GPU milli) as a function of its free CPU, for one GPU state."""

    total: int
    cpus: list[int]
    saved: list[float]

    def at(self, cpu_left: int) -> float:
        index = bisect.bisect_right(self.cpus, cpu_left)
        return self.total - (self.saved[index - 1] if index else 0.0)


def _curve(model: str, gpu_left: tuple[int, ...], typical: Typical) -> _Curve:
    total = sum(gpu_left)
    steps: dict[int, float] = {}
    for (cpu, milli, gpus, models), freq in typical:
        # CPU-only kinds (XL, XR), no access (NA), too few GPUs (Q1, Q2), too little CPU (Q4): all free is a
        # fragment; Q3 (fits): only its GPUs too small for it.
        if milli == 0 or not _accessible(model, models) or sum(left >= milli for left in gpu_left) < gpus:
            continue
        small = sum(left for left in gpu_left if left < milli)
        steps[cpu] = steps.get(cpu, 0.0) + freq * (total - small)
    cpus = sorted(steps)
    saved, running = [], 0.0
    for cpu in cpus:
        running += steps[cpu]
        saved.append(running)
    return _Curve(total, cpus, saved)


def frag_amount(model: str, cpu_left: int, gpu_left: Sequence[int], typical: Typical) -> float:
    """`NodeGpuShareFragAmountScore`: the node's expected GPU fragment (milli) for the typical pods."""
    return _curve(model, tuple(sorted(gpu_left)), typical).at(cpu_left)


def best_fit_score(cpu_left: int, gpu_left: Sequence[int], task: Task) -> int:
    """`getBestFitScore`, before NormalizeScore (which keeps the order and the ties)."""
    waste = (0.5 * (cpu_left - task.cpu_milli) / MAX_SPEC_CPU
             + 0.5 * (sum(gpu_left) - task.total_milli) / MAX_SPEC_GPU)
    return int((1.0 - waste) * MAX_NODE_SCORE)


def _sigmoid_score(before: float, after: float) -> int:
    x = (before - after) / MILLI
    return int(MAX_NODE_SCORE / (1.0 + math.exp(-x)) if x > -700 else 0)


@dataclass(slots=True)
class _Node:
    row: NodeRow
    cpu_left: int
    memory_left: int
    pods_left: int
    gpu_left: list[int]


@dataclass(slots=True)
class _Shape:
    scores: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)  # node -> (score, GPUs given)
    seen: int = 0


class _Simulator:
    def __init__(self, rows: Sequence[NodeRow], policy: str, typical: Typical, cpu_only_kube: bool = False) -> None:
        self.nodes = [_Node(r, r.cpu_milli, r.memory_mib, SIMULATOR_PODS, [MILLI] * r.gpus) for r in rows]
        self.policy = policy
        self.cpu_only_kube = cpu_only_kube
        self.typical = typical
        self.curves: dict[tuple[str, tuple[int, ...]], _Curve] = {}
        self.shapes: dict[tuple[Kind, int], _Shape] = {}
        self.log: list[int] = []

    def frag(self, model: str, cpu_left: int, gpu_left: tuple[int, ...]) -> float:
        key = (model, tuple(sorted(gpu_left)))
        curve = self.curves.get(key)
        if curve is None:
            curve = self.curves[key] = _curve(model, key[1], self.typical)
        return curve.at(cpu_left)

    def judge(self, node: _Node, task: Task) -> tuple[int, tuple[int, ...]] | None:
        """(score, GPUs the policy gives) when the node passes the filters, else None."""
        if node.pods_left < 1 or node.cpu_left < task.cpu_milli or node.memory_left < task.memory_mib:
            return None
        left = node.gpu_left
        if not task.gpus and self.cpu_only_kube:
            return _kube_score(node, task), ()
        if task.gpus:
            if not node.row.gpus or not _accessible(node.row.model, task.models):
                return None
            if task.share:
                fits = [i for i, free in enumerate(left) if free >= task.milli]
                if not fits:
                    return None
            else:
                whole = [i for i, free in enumerate(left) if free == MILLI]
                if len(whole) < task.gpus:
                    return None
                given = tuple(whole[:task.gpus])
        else:
            given = ()
        if self.policy == "best-fit":
            if task.share:
                given = (min(fits, key=lambda i: (left[i], i)),)
            return best_fit_score(node.cpu_left, left, task), given
        before = self.frag(node.row.model, node.cpu_left, tuple(left))
        cpu_after = node.cpu_left - task.cpu_milli
        if task.share:
            best: tuple[int, tuple[int, ...]] | None = None
            for i in fits:
                after_left = list(left)
                after_left[i] -= task.milli
                score = _sigmoid_score(before, self.frag(node.row.model, cpu_after, tuple(after_left)))
                if best is None or score > best[0]:
                    best = (score, (i,))
            return best
        after_left = list(left)
        for i in given:
            after_left[i] = 0
        return _sigmoid_score(before, self.frag(node.row.model, cpu_after, tuple(after_left))), given

    def candidates(self, task: Task) -> dict[int, tuple[int, tuple[int, ...]]]:
        key = (_kind_of(task), task.memory_mib)
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = _Shape(seen=len(self.log))
            changed: Sequence[int] | set[int] = range(len(self.nodes))
        else:
            changed = set(self.log[shape.seen:])
            shape.seen = len(self.log)
        for index in changed:
            verdict = self.judge(self.nodes[index], task)
            if verdict is None:
                shape.scores.pop(index, None)
            else:
                shape.scores[index] = verdict
        return shape.scores

    def bind(self, index: int, task: Task, given: tuple[int, ...]) -> None:
        node = self.nodes[index]
        node.cpu_left -= task.cpu_milli
        node.memory_left -= task.memory_mib
        node.pods_left -= 1
        for i in given:
            node.gpu_left[i] -= task.milli
        self.log.append(index)


def simulator_arrivals(rows: Sequence[NodeRow], tasks: Sequence[Task], ratio: float | None,
                       seed: int) -> tuple[list[Task], dict[str, int]]:
    """The tasks in the order they arrive (`trace.arrivals`), and each node's rank among equal scores: its
    place in the `rand.Perm` the simulator draws next, which prefixes the node's name."""
    rng = GoRand(seed)
    order = arrivals(tasks, sum(r.gpus for r in rows) * MILLI, ratio, seed, rng=rng)
    by_name = sorted(r.name for r in rows)
    perm = rng.perm(len(by_name))
    return order, {name: perm[i] for i, name in enumerate(by_name)}


def _kube_score(node: _Node, task: Task) -> int:
    """kube-scheduler's default scores for a CPU-only task, as the replay places those (replay/scheduler.py):
    NodeResourcesFit LeastAllocated over CPU and memory plus BalancedAllocation."""
    row = node.row
    cpu = (row.cpu_milli - node.cpu_left + task.cpu_milli, row.cpu_milli)
    memory = (row.memory_mib - node.memory_left + task.memory_mib, row.memory_mib)
    least = sum((total - used) * MAX_NODE_SCORE // total for used, total in (cpu, memory)) // 2

    def balanced(extra_cpu: int, extra_memory: int) -> int:
        fractions = [min(1.0, (cpu[0] - extra_cpu) / cpu[1]), min(1.0, (memory[0] - extra_memory) / memory[1])]
        return int((1 - abs(fractions[0] - fractions[1]) / 2) * MAX_NODE_SCORE)

    with_pod, without = balanced(0, 0), balanced(task.cpu_milli, task.memory_mib)
    return least + MAX_NODE_SCORE // 2 + (MAX_NODE_SCORE // 2 + with_pod - without) // 2


def reference_replay(rows: Sequence[NodeRow], tasks: Sequence[Task], order: Sequence[Task], policy: str,
                     ranks: dict[str, int], seed: int = 0, progress: Callable[[int, int], None] | None = None,
                     cpu_only_kube: bool = False) -> Run:
    """Place `order` with `policy` (best-fit or fgd) as the paper's simulator does; typical pods from `tasks`
    (the listed tasks, before copies, as the simulator's `SetTypicalPods`); equal scores go to the node of
    lowest rank (`simulator_arrivals`). `cpu_only_kube`: CPU-only tasks placed by kube-scheduler's default
    scores instead, as the replay places them (where a cluster with gpu-placement puts them)."""
    if policy not in REFERENCES:
        raise ValueError(f"{policy!r}: the references are {', '.join(REFERENCES)}")
    sim = _Simulator(rows, policy, typical_pods(tasks) if policy == "fgd" else (), cpu_only_kube)
    rank = [ranks[r.name] for r in rows]
    gpus = sum(r.gpus for r in rows)
    listed = set(tasks)
    run = Run(policy, seed, gpus, arrivals=len(order), copies=sum(t not in listed for t in order))
    samples: list[tuple[int, int]] = []
    arrived = placed = 0
    for number, task in enumerate(order):
        arrived += task.total_milli
        scores = sim.candidates(task)
        if scores:
            top = max(score for score, _ in scores.values())
            index = min((i for i, (score, _) in scores.items() if score == top), key=rank.__getitem__)
            given = scores[index][1]
            sim.bind(index, task, given)
            placed += task.total_milli
            run.placements.append(Placed(task.name, sim.nodes[index].row.name,
                                         tuple((i, task.milli) for i in given)))
        else:
            run.failed.append(task.name)
        samples.append((arrived, placed))
        if progress is not None:
            progress(number + 1, len(order))
    run.points = points(samples, gpus)
    return run


def fgd_score(model: str, cpu_left: int, gpu_left: Sequence[int], task: Task, typical: Typical) -> int:
    """FGD's score of the task on a lone node in that state (its best GPU for a share); -1: it does not fit."""
    sim = _Simulator([NodeRow("n", cpu_left, 1 << 40, len(gpu_left), model)], "fgd", typical)
    sim.nodes[0].gpu_left = list(gpu_left)
    verdict = sim.judge(sim.nodes[0], task)
    return -1 if verdict is None else verdict[0]
