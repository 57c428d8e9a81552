"""`--pods` from a live cluster: `kubectl get pods -A -o json` read as the tasks that arrive.

Which pods arrive, and why the others do not:

- finished pods (`Succeeded`, `Failed`) hold nothing;
- DaemonSet pods and static pods (mirror pods) go where their node is, whatever any score says, and
  run on every node they are for: they are not replayed. What a bound one requests (CPU, memory, one
  of the node's pods) is taken off its node before the first arrival, as it is on the real node;
- pods asking MIG slices or ResourceClaims are left out: the replay's GPUs are whole GPUs and shares
  of them, and the output says how many were.

A pod that arrives asks what kube-scheduler charges it (`kubefilters.pod_requests`: containers, init
containers, sidecars, overhead); GPUs from the configured whole-GPU resources (`nvidia.com/gpu`), and
a time-sliced replica (`nvidia.com/gpu.shared`) as 1/`replicas` of one GPU; the products it accepts
from `gpu-placement.io/gpu-products`. Node selectors and affinities are not read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.decide.kubefilters import pod_requests
from gpu_placement.replay.trace import DEFAULT_CPU_MILLI, DEFAULT_MEMORY_MIB, MILLI, Task, TraceError

__all__ = ["Held", "PodList", "read_pod_source", "tasks_from_pods"]

_FINISHED = ("Succeeded", "Failed")
_MIRROR = "kubernetes.io/config.mirror"


@dataclass(slots=True)
class Held:
    """What pods that are not replayed hold on one node."""

    cpu_milli: int = 0
    memory_mib: int = 0
    pods: int = 0


@dataclass(slots=True)
class PodList:
    tasks: list[Task]
    held: dict[str, Held] = field(default_factory=dict)  # node -> what its DaemonSet and static pods request
    left_out: Counter[str] = field(default_factory=Counter)  # why -> pods


def _pinned(meta: Mapping[str, Any]) -> bool:
    """A DaemonSet's pod, or a static pod's mirror: it runs where its node is."""
    owners = meta.get("ownerReferences") or ()
    return any(isinstance(o, Mapping) and o.get("kind") == "DaemonSet" and o.get("controller") for o in owners) or (
        _MIRROR in (meta.get("annotations") or {}))


def tasks_from_pods(objects: Sequence[Mapping[str, Any]], config: Config, replicas: int, source: str) -> PodList:
    pods = [o for o in objects if o.get("kind") == "Pod"]
    if not pods:
        raise TraceError(f"{source}: no Pod objects (expected `kubectl get pods -A -o json` output, or the "
                         "trace's task CSV)")
    found = PodList([])
    seen: set[str] = set()
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        if status.get("phase") in _FINISHED:
            found.left_out["finished (Succeeded or Failed)"] += 1
            continue
        asked = pod_requests(spec)
        cpu, memory = asked.get("cpu", 0), -(-asked.get("memory", 0) // 2**20)
        if _pinned(meta):
            found.left_out["DaemonSet or static: kept on their node"] += 1
            node = spec.get("nodeName")
            if isinstance(node, str) and node:
                held = found.held.setdefault(node, Held())
                held.cpu_milli += cpu
                held.memory_mib += memory
                held.pods += 1
            continue
        if spec.get("resourceClaims") or any(r.startswith(n.MIG_RESOURCE_PREFIX) for r in asked):
            found.left_out["asking MIG slices or ResourceClaims (not modelled)"] += 1
            continue
        whole = sum(asked.get(r, 0) for r in config.gpu_resources)
        shares = asked.get(config.shared_resource, 0)
        if whole:
            gpus, milli = whole, MILLI
        elif shares:  # a replica is 1/replicas of one GPU
            gpus, milli = 1, min(MILLI, shares * MILLI // max(1, replicas))
        else:
            gpus, milli = 0, 0
        name = f"{meta.get('namespace') or 'default'}.{meta.get('name') or ''}"
        if name in seen:
            raise TraceError(f"{source}: pod {name} is listed twice")
        seen.add(name)
        products = (meta.get("annotations") or {}).get(n.ANN_PRODUCTS) or ""
        models = tuple(p.strip() for p in products.split(",") if p.strip()) if gpus else ()
        found.tasks.append(Task(name, cpu or DEFAULT_CPU_MILLI, memory or DEFAULT_MEMORY_MIB, gpus, milli, models))
    if not found.tasks:
        raise TraceError(f"{source}: none of its {len(pods)} pods would arrive (" + ", ".join(
            f"{count} {why}" for why, count in found.left_out.items()) + ")")
    return found


def read_pod_source(path: str | Path, config: Config, replicas: int) -> PodList:
    """`--pods`: the trace's task CSV, or a `kubectl get pods -A -o json` file (or a folder of them)."""
    from gpu_placement.replay.trace import read_tasks_csv
    from gpu_placement.view.snapshot import SnapshotError, read_objects

    source = Path(path)
    if source.is_file() and source.suffix.lower() == ".csv":
        return PodList(read_tasks_csv(source))
    try:
        return tasks_from_pods(read_objects(source), config, replicas, str(source))
    except SnapshotError as exc:
        raise TraceError(str(exc)) from None
