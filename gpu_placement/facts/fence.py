"""A node's launch fence: GPU pods that fail to start there for the node's reasons, learned from their launches.

The rule (docs/rules.md, LaunchFailures). Per node and GPU resource, the launches the kubelet reported
(facts/launch.py: STARTED, or FAILED with a cause) are ordered by when it reported them (the launch's
anchor: `status.startTime`, else the binding). Counting back from the newest: a failure for a node
cause (`FENCE_CAUSES`) counts, a start ends the run, a pod-side failure (image pull, pod config, its
own exit code) or a kubelet rejection of another kind (OutOfcpu, NodeAffinity) neither counts nor ends
it. `threshold` failures in a row fence the resource on the node: its pods are refused there, other
resources' are not.

What the cluster holds decides it, so every replica decides the same and a restart forgets nothing: the
failed pods themselves (live evidence), and, because a Job controller or the pod GC deletes failed
pods, the fence as the fence leader wrote it on the Node (`gpu-placement.io/launch-fence`, parsed
here). The verdict is the one OR the other, so replicas agree before the write lands.

It lifts only on evidence, each with a time in the cluster later than the fence's first failure:
- the GPU Operator revalidated the node: a validator pod turned Ready (its Ready lastTransitionTime);
- the device plugin's or the driver's pod was recreated or restarted (its creation, its last restart);
- the node rebooted: its `status.nodeInfo.bootID` differs from the one written with the fence (then
  the node's Ready transition, or the fence's last failure, is the time);
- a GPU pod of that resource started on the node: the probe. After a backoff from the last failure
  (`probeMinutes`, doubled for each failed probe, at most `probeMaxMinutes`) the fence lets one pod
  through; while a pod of that resource is bound there and not yet reported (the probe in flight), it
  refuses again. A probe that fails is one more failure in the row: the backoff doubles.
Time alone never lifts it; it only opens the probe. The latest evidence is kept per resource in the
annotation (`clear`): failures before it never count again, even when the pod that started is gone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_placement.base.config import LaunchFence
from gpu_placement.base.timestamps import parse_time
from gpu_placement.facts.launch import (
    CONTAINER_RUNTIME,
    CONTAINER_TOOLKIT,
    CUDA_INIT,
    DEVICE_PLUGIN,
    DEVICE_UNHEALTHY,
    FAILED,
    PENDING,
    STARTED,
)
from gpu_placement.facts.nodes import NodeFacts
from gpu_placement.facts.soak import OperatorPod

__all__ = ["DESCRIPTIONS", "FENCE_CAUSES", "LIFTS", "NO_FENCES", "Entry", "Fence", "FenceNote",
           "Launched", "Lift", "NodeFences", "desired_note", "encode_note", "node_fences", "parse_note", "stamp"]

# The node's causes that fence: the GPU stack's and the container runtime's. `kubelet_rejected` (OutOfcpu,
# NodeAffinity, Evicted: a race with another scheduler or node pressure) is the node's but says nothing of
# its GPUs: it neither counts nor ends a run, like the pod's own causes.
FENCE_CAUSES = (DEVICE_UNHEALTHY, DEVICE_PLUGIN, CONTAINER_TOOLKIT, CUDA_INIT, CONTAINER_RUNTIME)
DESCRIPTIONS = {
    DEVICE_UNHEALTHY: "a device given to the pod reported Unhealthy",
    DEVICE_PLUGIN: "the kubelet's device manager could not allocate the GPUs, UnexpectedAdmissionError",
    CONTAINER_TOOLKIT: "the NVIDIA container toolkit could not set up the container",
    CUDA_INIT: "CUDA or NVML failed to initialise in the container",
    CONTAINER_RUNTIME: "the container runtime could not create or start the container",
}
LIFTS = ("validator", "plugin", "driver", "reboot", "started")  # what lifted a fence (the metric's label)


def stamp(seconds: float) -> str:
    """An RFC 3339 time to the second, as Kubernetes writes them."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


@dataclass(slots=True, frozen=True)
class Launched:
    """One GPU pod's launch on the node, as the fence reads it."""

    at: float  # the launch's anchor: when the kubelet took it
    state: str  # STARTED, FAILED or PENDING (bound, nothing reported yet)
    cause: str
    resources: tuple[str, ...]
    key: str = ""  # namespace/name: orders launches reported in the same second
    devices: tuple[str, ...] = ()  # DRA devices its kubelet reported Unhealthy (allocatedResourcesStatus)


@dataclass(slots=True, frozen=True)
class Entry:
    """One resource's part of the annotation: a fence, or only the time of the evidence that last lifted one."""

    cause: str = ""
    count: int = 0
    since: float = 0.0
    last: float = 0.0
    clear: float | None = None
    devices: tuple[str, ...] = ()  # DRA: the devices the failures named; () the node's

    @property
    def fenced(self) -> bool:
        return self.count > 0


@dataclass(slots=True, frozen=True)
class FenceNote:
    """`gpu-placement.io/launch-fence` parsed: the boot it was written in, and per resource its Entry."""

    boot_id: str = ""
    resources: tuple[tuple[str, Entry], ...] = ()

    def entry(self, resource: str) -> Entry | None:
        return next((entry for name, entry in self.resources if name == resource), None)


def parse_note(text: str | None) -> FenceNote:
    """The annotation as written; what cannot be read counts as no annotation (the leader writes it again)."""
    if not text:
        return FenceNote()
    try:
        data = json.loads(text)
    except ValueError:
        return FenceNote()
    if not isinstance(data, Mapping):
        return FenceNote()
    resources = []
    for name, raw in sorted((data.get("resources") or {}).items()) if isinstance(data.get("resources"),
                                                                               Mapping) else ():
        if not isinstance(raw, Mapping):
            continue
        count = raw.get("count")
        since, last, clear = parse_time(raw.get("since")), parse_time(raw.get("last")), parse_time(raw.get("clear"))
        if isinstance(count, int) and count > 0 and since is not None and raw.get("cause") in FENCE_CAUSES:
            devices = raw.get("devices")
            named = tuple(sorted(str(d) for d in devices)) if isinstance(devices, list) else ()
            resources.append((str(name), Entry(str(raw["cause"]), count, since, last or since, clear, named)))
        elif clear is not None:
            resources.append((str(name), Entry(clear=clear)))
    return FenceNote(str(data.get("bootID") or ""), tuple(resources))


def encode_note(note: FenceNote) -> str:
    resources: dict[str, dict[str, Any]] = {}
    for name, entry in note.resources:
        fields: dict[str, Any] = {}
        if entry.fenced:
            fields = {"cause": entry.cause, "count": entry.count, "since": stamp(entry.since),
                      "last": stamp(entry.last)}
            if entry.devices:
                fields["devices"] = list(entry.devices)
        if entry.clear is not None:
            fields["clear"] = stamp(entry.clear)
        resources[name] = fields
    return json.dumps({"bootID": note.boot_id, "resources": resources}, sort_keys=True, separators=(",", ":"))


@dataclass(slots=True, frozen=True)
class Fence:
    """One fenced resource on a node. `probing`: a pod of it is on the node with no launch reported yet."""

    resource: str
    cause: str  # the newest failure's cause
    count: int  # failures in a row
    since: float  # the first of them (the kubelet's time)
    last: float  # the newest
    probe_at: float  # when one pod may go through
    probing: bool = False
    devices: tuple[str, ...] = ()  # DRA: the devices every failure of the run named Unhealthy; () the node's

    def open(self, now: float) -> bool:
        """The probe: one pod may go to the node now."""
        return now >= self.probe_at and not self.probing


@dataclass(slots=True, frozen=True)
class Lift:
    """A fence that evidence lifted: which resource, by what and when (for the Event and the metric)."""

    resource: str
    by: str  # one of LIFTS
    at: float


@dataclass(slots=True, frozen=True)
class NodeFences:
    """A node's fences, by resource, and the fences the annotation holds that evidence lifted."""

    fences: tuple[Fence, ...] = ()
    lifted: tuple[Lift, ...] = ()
    clears: tuple[tuple[str, float], ...] = ()  # per resource that had a fence: the evidence that lifts it
    evidence: tuple[tuple[str, str], ...] = ()  # per resource, the latest lifting evidence (one of LIFTS)

    def closed(self, now: float) -> tuple[Fence, ...]:
        """The fences that refuse pods now (the probe not open)."""
        return tuple(fence for fence in self.fences if not fence.open(now))

    def next_change(self, now: float) -> float | None:
        """When a probe opens by the clock, if one will."""
        times = [fence.probe_at for fence in self.fences if fence.probe_at > now and not fence.probing]
        return min(times) if times else None


NO_FENCES = NodeFences()


def node_fences(facts: NodeFacts, launches: Iterable[Launched], operators: Iterable[tuple[str, OperatorPod]],
                settings: LaunchFence) -> NodeFences:
    """The node's fences from what the cluster holds: its GPU pods' launches, the GPU Operator's pods on it
    by role ("validator", "plugin", "driver"), its boot ID, and the annotation."""
    if not settings.enabled:
        return NO_FENCES
    note = parse_note(facts.launch_fence)
    evidence = _evidence(facts, note, operators)
    by_resource: dict[str, list[Launched]] = {}
    for launch in launches:
        for resource in launch.resources:
            by_resource.setdefault(resource, []).append(launch)
    fences: list[Fence] = []
    lifted: list[Lift] = []
    clears: list[tuple[str, float]] = []
    latest: list[tuple[str, str]] = []
    for resource in sorted(by_resource.keys() | {name for name, _ in note.resources}):
        entry = note.entry(resource) or Entry()
        mine = sorted(by_resource.get(resource, ()), key=lambda launch: (launch.at, launch.key))
        started = max((launch.at for launch in mine if launch.state == STARTED), default=None)
        lift = max([*evidence, *([Lift(resource, "started", started)] if started is not None else [])],
                   key=lambda found: found.at, default=None)
        reset = max(entry.clear or 0.0, lift.at if lift is not None else 0.0)
        if lift is not None:
            latest.append((resource, lift.by))
        kept = entry if entry.fenced and entry.since > reset else None
        if entry.fenced and kept is None and lift is not None:
            lifted.append(Lift(resource, lift.by, lift.at))
        run = _run([launch for launch in mine if launch.at > reset])
        live = run if run is not None and run.count >= settings.threshold else None
        fence = _merge(kept, live)
        if fence is None:
            if entry.fenced:
                clears.append((resource, reset))
            continue
        # A pod bound during the run and not reported yet: the probe in flight (or one sent before the fence)
        probing = any(launch.state == PENDING and launch.at >= fence.since for launch in mine)
        failed_probes = max(0, fence.count - settings.threshold)
        backoff = min(settings.probe_minutes * 2 ** min(failed_probes, 30), settings.probe_max_minutes) * 60
        fences.append(Fence(resource, fence.cause, fence.count, fence.since, fence.last, fence.last + backoff,
                            probing, fence.devices))
    return NodeFences(tuple(fences), tuple(lifted), tuple(clears), tuple(latest))


def _evidence(facts: NodeFacts, note: FenceNote, operators: Iterable[tuple[str, OperatorPod]]) -> list[Lift]:
    """Each piece of lifting evidence on the node, with its time (for every resource alike): a validator
    pod's turn to Ready; a device plugin or driver pod's creation or last container restart; a reboot."""
    found: list[Lift] = []
    for role, pod in operators:
        if role == "validator":
            if pod.ready_since is not None:
                found.append(Lift("", role, pod.ready_since))
            continue
        times = [t for t in (pod.created, pod.last_restart) if t is not None]
        if times:
            found.append(Lift("", role, max(times)))
    fenced = [entry for _, entry in note.resources if entry.fenced]
    if note.boot_id and facts.boot_id and note.boot_id != facts.boot_id and fenced:
        at = max([entry.last for entry in fenced] + ([facts.ready_since] if facts.ready and facts.ready_since else []))
        found.append(Lift("", "reboot", at))
    return found


@dataclass(slots=True, frozen=True)
class _Run:
    cause: str
    count: int
    since: float
    last: float
    devices: tuple[str, ...] = ()


def _run(launches: list[Launched]) -> _Run | None:
    """The node-cause failures in a row at the end of the launches (ordered by time), if any."""
    count, since, last, cause = 0, 0.0, 0.0, ""
    named: set[str] = set()
    every = True  # every failure of the run named its devices
    for launch in reversed(launches):
        if launch.state == STARTED:
            break
        if launch.state != FAILED or launch.cause not in FENCE_CAUSES:
            continue
        if not count:
            last, cause = launch.at, launch.cause
        count += 1
        since = launch.at
        named.update(launch.devices)
        every = every and bool(launch.devices)
    return _Run(cause, count, since, last, tuple(sorted(named)) if every else ()) if count else None


def _merge(kept: Entry | None, live: _Run | None) -> _Run | None:
    if kept is None:
        return live
    if live is None:
        return _Run(kept.cause, kept.count, kept.since, kept.last, kept.devices)
    devices = tuple(sorted({*kept.devices, *live.devices})) if kept.devices and live.devices else ()
    return _Run(live.cause if live.last >= kept.last else kept.cause, max(kept.count, live.count),
                min(kept.since, live.since), max(kept.last, live.last), devices)


def desired_note(facts: NodeFacts, state: NodeFences) -> FenceNote | None:
    """What the fence leader writes on the Node for this state; None when the annotation says it already.
    Fences as they stand (with the boot they stand in), and for a fence lifted the time of the evidence
    that lifted it (`clear`), so that the failures before it never count again."""
    note = parse_note(facts.launch_fence)
    entries = dict(note.resources)
    for resource, clear in state.clears:
        entries[resource] = Entry(clear=clear)
    for fence in state.fences:
        old = entries.get(resource := fence.resource)
        entries[resource] = Entry(fence.cause, fence.count, fence.since, fence.last, old.clear if old else None,
                                  fence.devices)
    wanted = FenceNote(facts.boot_id if (state.fences or state.clears) else note.boot_id,
                       tuple(sorted(entries.items())))
    return None if wanted == note else wanted

