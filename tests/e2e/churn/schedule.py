"""The churn run's plan, from a seed: which fault hits which node when and how it heals, which Jobs
arrive when, and the timeline of actions the harness plays (pure: no API server, no clock).

Faults (docs/performance.md, "A simulated fleet under churn", says how each is played):

- `kernel`: a kernel update left the driver unbuilt: the validator pod turns not Ready and every GPU
  pod bound there fails to start (the NVIDIA runtime hook: `driver not loaded`); healed when the
  driver is rebuilt (validator Ready again).
- `upgrade`: the GPU Operator's driver upgrade, in waves: `nvidia.com/gpu-driver-upgrade-state`
  through its states, the node cordoned, its GPU pods evicted, the validator re-run, uncordoned.
- `not-ready`: the kubelet posts Ready=False (its runtime is down) for a while.
- `silent-plugin`, `silent-cuda`: the GPUs are lost without a trace in labels, validator or
  allocatable; every GPU pod bound there fails, rejected by the device plugin's Allocate
  (UnexpectedAdmissionError) or exiting with a CUDA/NVML initialisation error. Healed by a reboot:
  the kubelet down for REBOOT_SECONDS, the validator not Ready meanwhile, then run again (Ready anew).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["GPU_STATES", "KERNEL", "KINDS", "NOT_READY", "REBOOT_SECONDS", "SILENT", "SILENT_CUDA",
           "SILENT_PLUGIN", "UPGRADE", "Action", "Fault", "JobSpec", "Plan", "make_plan", "timeline"]

KERNEL, UPGRADE, NOT_READY = "kernel", "upgrade", "not-ready"
SILENT_PLUGIN, SILENT_CUDA = "silent-plugin", "silent-cuda"
KINDS = (KERNEL, UPGRADE, NOT_READY, SILENT_PLUGIN, SILENT_CUDA)
SILENT = (SILENT_PLUGIN, SILENT_CUDA)

# What a GPU pod bound to the node meets (tests/e2e/churn/stages.py plays each):
OK, PLUGIN, CUDA, TOOLKIT, DOWN = "ok", "plugin", "cuda", "toolkit", "down"
GPU_STATES = (OK, PLUGIN, CUDA, TOOLKIT, DOWN)

REBOOT_SECONDS = 20.0
# The GPU Operator's upgrade states (nvidia.com/gpu-driver-upgrade-state, k8s-operator-libs'
# upgrade/consts.go), seconds after the node's upgrade begins. Pods are evicted only once every pod bound
# before the cordon ran a full minute, so none of them can read as a launch that failed to start.
UPGRADE_STEPS = ((0.0, "upgrade-required"), (5.0, "cordon-required"), (10.0, "wait-for-jobs-required"),
                 (70.0, "pod-deletion-required"), (75.0, "drain-required"), (80.0, "pod-restart-required"),
                 (110.0, "validation-required"), (115.0, "uncordon-required"), (120.0, "upgrade-done"))
UPGRADE_SECONDS = UPGRADE_STEPS[-1][0]
# Whole GPUs a pod asks for, and the Job's completions (= parallelism), with their weights.
GPU_SIZES = ((1, 30), (2, 20), (4, 25), (8, 25))
COMPLETIONS = ((1, 70), (2, 20), (4, 10))
RUNTIME = (90.0, 300.0)  # seconds a healthy GPU pod runs before it succeeds
GPUS_PER_NODE = 8  # the fleet's nodes: the GPU Operator's labels of an 8-GPU H100 node
RESIDENT_SIZES = ((2, 50), (4, 50))
RESIDENT_ARRIVALS = 60.0


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    node: str
    start: float  # seconds from the run's start
    end: float  # healthy again
    wave: int = 0  # the driver upgrade's wave (1, 2, ...); 0 for other faults

    @property
    def silent(self) -> bool:
        return self.kind in SILENT


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: str
    arrival: float
    gpus: int  # per pod
    completions: int  # = parallelism: that many pods at once
    runtime: float  # seconds each pod runs once started


@dataclass(frozen=True, slots=True)
class Action:
    at: float
    node: str
    op: str  # "gpu" | "kubelet" | "validator" | "upgrade" | "cordon" | "evict"
    value: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    seed: int
    nodes: tuple[str, ...]
    seconds: float  # Jobs arrive and faults come and go within this
    faults: tuple[Fault, ...]
    jobs: tuple[JobSpec, ...]

    @property
    def pods(self) -> int:
        """GPU pods of work the Jobs ask for (retries come on top), the resident ones included."""
        return sum(job.completions for job in self.jobs)

    @property
    def residents(self) -> int:
        return sum(1 for job in self.jobs if job.name.startswith("resident"))

    @property
    def silent(self) -> int:
        return sum(1 for fault in self.faults if fault.silent)


def _weighted(rng: random.Random, table: tuple[tuple[int, int], ...]) -> int:
    return rng.choices([v for v, _ in table], weights=[w for _, w in table])[0]


def make_plan(seed: int = 45, nodes: int = 1000, minutes: float = 8.0, pods: int = 2000, fill: float = 0.6,
              kernel: int = 6, not_ready: int = 6, silent: int = 6, waves: int = 2, wave_size: int = 8) -> Plan:
    """Faults on distinct nodes (one fault per node in a run, so the GPU states never overlap), each
    healed before the run's last 15 s. Jobs: first the fleet's resident work, long training Jobs of 2 or
    4 GPUs that fill `fill` of its GPUs within the first RESIDENT_ARRIVALS seconds and outlast the run
    (a GPU fleet runs busy: there, a node whose pods fail at once is the emptiest node, the one a
    spreading scheduler picks); then `pods` GPU pods of short Jobs, arriving uniformly over all but the
    last 30 s."""
    rng = random.Random(seed)
    names = tuple(f"gpu-{i:04d}" for i in range(nodes))
    seconds = minutes * 60.0
    if seconds < UPGRADE_SECONDS + 120:
        raise ValueError(f"a run of {minutes} minutes is too short for a driver upgrade wave")
    if kernel + not_ready + silent + waves * wave_size > nodes:
        raise ValueError(f"{nodes} nodes are too few for the faults asked")
    pool = list(names)
    rng.shuffle(pool)
    last = seconds - 15.0
    faults: list[Fault] = []

    def window(shortest: float, longest: float) -> tuple[float, float]:
        length = rng.uniform(shortest, longest)
        start = rng.uniform(0.1 * seconds, last - length)
        return start, start + length

    for _ in range(kernel):
        start, end = window(60.0, 150.0)
        faults.append(Fault(KERNEL, pool.pop(), start, end))
    for _ in range(not_ready):
        start, end = window(30.0, 120.0)
        faults.append(Fault(NOT_READY, pool.pop(), start, end))
    for i in range(silent):
        start, end = window(90.0 + REBOOT_SECONDS, 180.0 + REBOOT_SECONDS)
        faults.append(Fault(SILENT_CUDA if i % 2 else SILENT_PLUGIN, pool.pop(), start, end))
    # Waves start from 20 % of the run on, the last one late enough to end in time.
    span = last - UPGRADE_SECONDS - 30.0 - 0.2 * seconds
    for wave in range(1, waves + 1):
        begin = 0.2 * seconds + span * (wave - 1) / max(1, waves - 1)
        for _ in range(wave_size):
            start = begin + rng.uniform(0.0, 30.0)
            faults.append(Fault(UPGRADE, pool.pop(), start, start + UPGRADE_SECONDS, wave))

    jobs: list[JobSpec] = []
    resident = 0
    while resident < fill * nodes * GPUS_PER_NODE:
        gpus = _weighted(rng, RESIDENT_SIZES)
        jobs.append(JobSpec("resident", rng.uniform(0.0, RESIDENT_ARRIVALS), gpus, 1, seconds + 600.0))
        resident += gpus
    total = 0
    while total < pods:
        completions = min(_weighted(rng, COMPLETIONS), pods - total)
        jobs.append(JobSpec("", rng.uniform(0.0, seconds - 30.0), _weighted(rng, GPU_SIZES), completions,
                            round(rng.uniform(*RUNTIME), 1)))
        total += completions
    jobs.sort(key=lambda j: j.arrival)
    named = tuple(JobSpec(f"{j.name or 'job'}-{i:05d}", j.arrival, j.gpus, j.completions, j.runtime)
                  for i, j in enumerate(jobs))
    return Plan(seed, names, seconds, tuple(sorted(faults, key=lambda f: (f.start, f.node))), named)


def timeline(plan: Plan) -> list[Action]:
    """Every action of the run in time order. `gpu` sets what a GPU pod bound to the node meets (one of
    GPU_STATES); `kubelet` up/down; `validator` passing/failing; `upgrade` the upgrade
    state label (empty: removed); `cordon` on/off; `evict` the node's GPU pods."""
    out: list[Action] = []
    for f in plan.faults:
        n = f.node
        if f.kind == KERNEL:
            out += [Action(f.start, n, "gpu", TOOLKIT), Action(f.start, n, "validator", "failing"),
                    Action(f.end, n, "validator", "passing"), Action(f.end, n, "gpu", OK)]
        elif f.kind == NOT_READY:
            out += [Action(f.start, n, "gpu", DOWN), Action(f.start, n, "kubelet", "down"),
                    Action(f.end, n, "kubelet", "up"), Action(f.end, n, "gpu", OK)]
        elif f.silent:
            reboot = f.end - REBOOT_SECONDS
            out += [Action(f.start, n, "gpu", PLUGIN if f.kind == SILENT_PLUGIN else CUDA),
                    Action(reboot, n, "gpu", DOWN), Action(reboot, n, "kubelet", "down"),
                    Action(reboot, n, "validator", "failing"),
                    Action(f.end, n, "kubelet", "up"), Action(f.end, n, "validator", "passing"),
                    Action(f.end, n, "gpu", OK)]
        else:
            for offset, state in UPGRADE_STEPS:
                out.append(Action(f.start + offset, n, "upgrade", state))
                if state == "cordon-required":
                    out.append(Action(f.start + offset, n, "cordon", "on"))
                elif state == "pod-deletion-required":
                    out.append(Action(f.start + offset, n, "evict"))
                elif state == "pod-restart-required":
                    out.append(Action(f.start + offset, n, "validator", "failing"))
                elif state == "validation-required":
                    out.append(Action(f.start + offset, n, "validator", "passing"))
                elif state == "uncordon-required":
                    out.append(Action(f.start + offset, n, "cordon", "off"))
    order = {"gpu": 0, "kubelet": 1, "upgrade": 2, "cordon": 3, "validator": 4, "evict": 5}
    return sorted(out, key=lambda a: (a.at, order[a.op], a.node))
