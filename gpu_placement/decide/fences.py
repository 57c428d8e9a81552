"""Launch fences as the service tracks them: every node's fences (gpu_placement/facts/fence.py) kept current.

A node's fences change with its GPU pods' launches, the GPU Operator's pods on it, its Node (boot ID,
the annotation the fence leader writes), and the clock: a probe opens at a time no object change
announces. Those times wait in a heap; `expire()`, called at the start of every extender request (one
comparison when nothing is due), re-reads the nodes whose time came. Listeners hear of a node whose
fences changed as placement sees them (placement redoes that node's verdicts); watchers hear each
fence begun or lifted (Events, metrics).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from gpu_placement.base.config import Config
from gpu_placement.base.deadlines import Deadlines
from gpu_placement.decide.rules import DRA_DEVICES, launch_failures
from gpu_placement.facts.fence import (
    FENCE_CAUSES,
    NO_FENCES,
    Fence,
    FenceNote,
    Launched,
    NodeFences,
    desired_note,
    encode_note,
    node_fences,
)
from gpu_placement.facts.launch import FAILED
from gpu_placement.facts.pods import PodRecord
from gpu_placement.facts.soak import OperatorPod
from gpu_placement.observe.metrics import LAUNCH_FENCE_CHANGES, LatestFamilies
from gpu_placement.view.cluster import ClusterView

__all__ = ["Fences", "track_fences"]

_Key = tuple[tuple[str, str, tuple[str, ...]], ...]  # closed fences: (resource, reason, DRA devices named)
# (node, the fence begun or lifted, None or what lifted it): a fence's start or end, for Events
Watcher = Callable[[str, Fence, str | None], None]


class Fences:
    """Launch fences of every node of `view`. Listeners and watchers are called under the view's lock."""

    def __init__(self, view: ClusterView, config: Config, clock: Callable[[], float] = time.time) -> None:
        self.view, self.config, self.clock = view, config, clock
        self.settings = config.launch_fence
        self.states: dict[str, NodeFences] = {}
        self._node_of: dict[str, str] = {}  # key of a pod that counts (GPU or GPU Operator pod) -> its node
        # GPU pods that failed to start for a fencing cause, by key -> node, and counted per node: a node with
        # fewer than `threshold` and no annotation has no fence, found without reading its pods
        self._failing: dict[str, str] = {}
        self._failures: Counter[str] = Counter()
        self._due = Deadlines()
        self._keys: dict[str, _Key] = {}  # node -> its closed fences as placement last heard
        self._listeners: list[Callable[[str], None]] = []
        self._watchers: list[Watcher] = []
        self._rereaders: list[Callable[[str], None]] = []
        for event in ("fenced", "lifted"):
            LAUNCH_FENCE_CHANGES.labels(event)  # every series from the start: rate() needs a zero
        if not self.settings.enabled:
            return
        with view.lock:
            for key, pod in view.pods.items():
                if _counts(pod) and pod.node:
                    self._node_of[key] = pod.node
                    self._count_failure(key, pod)
            for name in view.nodes:
                self._evaluate(name, notify=False)
            view.subscribe(self._node_changed, lambda name: None)
            view.subscribe_records(self._pod_changed, lambda name, record: None)

    # -- reading -------------------------------------------------------------------------------
    def state(self, node: str) -> NodeFences:
        return self.states.get(node, NO_FENCES)

    def closed(self, node: str) -> tuple[Fence, ...]:
        """The node's fences that refuse pods now (their probe not open). Call under the view's lock."""
        state = self.states.get(node)
        return state.closed(self.clock()) if state is not None else ()

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """`listener(node)`: the node's closed fences changed (placement's verdicts of it)."""
        self._listeners.append(listener)

    def subscribe_reread(self, listener: Callable[[str], None]) -> None:
        """`listener(node)`: the node was re-read (its Node, its pods, or the clock), whether or not its fences
        changed: what its annotation is made of may have (the fence writer judges those nodes only)."""
        self._rereaders.append(listener)

    def watch(self, watcher: Watcher) -> None:
        """`watcher(node, fence, lifted_by)`: a fence began (lifted_by None) or was lifted."""
        self._watchers.append(watcher)

    def expire(self) -> None:
        """Probes that opened by the clock: cheap when none is due (one comparison)."""
        if not self._due.any_due(self.clock()):
            return
        with self.view.lock:
            for name in self._due.pop_due(self.clock()):
                self._evaluate(name)

    def probe_taken(self, node: str, resources: Sequence[tuple[str, int]]) -> str | None:
        """At /bind, for a node that passes: when one of the pod's resources passes only by its open probe
        and a pod holds a reservation of it there (bound a moment ago, not yet in the view; /bind releases
        the pod's own first), the probe is taken: the fence's reason. Call under the view's lock."""
        state = self.states.get(node)
        if state is None or not state.fences:
            return None
        asked = {resource for resource, _ in resources}
        for fence in state.fences:
            if fence.resource in asked and any(
                    reservation.node == node and any(resource == fence.resource for resource, _ in reservation.gpus)
                    for reservation in self.view.reservations.values()):
                return launch_failures(fence).message
        return None

    def due(self, names: Iterable[str] | None = None) -> dict[str, str]:
        """Nodes whose `gpu-placement.io/launch-fence` should change, with the value to write (the fence
        leader's work: gpu_placement/controllers/launch_fences.py), of the nodes `names` (those re-read
        since the writer's last pass: `subscribe_reread`) or every node. Writing it changes no verdict."""
        self.expire()
        with self.view.lock:
            found = {}
            nodes = self.view.nodes
            judged = nodes.items() if names is None else ((name, nodes[name]) for name in names if name in nodes)
            for name, facts in judged:
                state = self.states.get(name, NO_FENCES)
                if state is NO_FENCES and not facts.launch_fence:
                    continue
                wanted = desired_note(facts, state)
                if wanted is not None and wanted != FenceNote():
                    found[name] = encode_note(wanted)
            return found

    # -- changes -------------------------------------------------------------------------------
    def _node_changed(self, name: str | None) -> None:
        for node in ([name] if name is not None else list({*self.view.nodes, *self.states})):
            self._evaluate(node)

    def _pod_changed(self, key: str, pod: PodRecord | None) -> None:
        counts = pod is not None and pod.node is not None and _counts(pod)
        if not counts and key not in self._node_of:
            return  # most pods: no GPU, not the GPU Operator's (this runs for every pod event)
        before = self._node_of.pop(key, None)
        self._count_failure(key, pod if counts else None)
        if counts:
            assert pod is not None and pod.node is not None
            self._node_of[key] = pod.node
        for node in {before, pod.node if counts and pod is not None else None} - {None}:
            self._evaluate(node)  # type: ignore[arg-type]

    def _count_failure(self, key: str, pod: PodRecord | None) -> None:
        before = self._failing.pop(key, None)
        if before is not None:
            self._failures[before] -= 1
            if self._failures[before] <= 0:
                del self._failures[before]
        launch = pod.launch if pod is not None else None
        if pod is not None and pod.node and launch is not None and launch.state == FAILED \
                and launch.cause in FENCE_CAUSES:
            self._failing[key] = pod.node
            self._failures[pod.node] += 1

    def _evaluate(self, name: str, notify: bool = True) -> None:
        for reread in self._rereaders:
            reread(name)
        facts = self.view.nodes.get(name)
        old = self.states.get(name, NO_FENCES)
        if old is NO_FENCES and (facts is None or (not facts.launch_fence
                                                   and self._failures[name] < self.settings.threshold)):
            return  # most nodes, most events: no fence was, none can be
        new = NO_FENCES
        if facts is not None:
            launches: list[Launched] = []
            operators: list[tuple[str, OperatorPod]] = []
            for pod in self.view.pods_on(name):
                if pod.operator is not None:
                    role = "validator" if pod.validator_ready is not None else "plugin" if pod.operator.plugin \
                        else "driver"
                    operators.append((role, pod.operator))
                launch = pod.launch
                if launch is not None and launch.anchor is not None:
                    # a claim pod gpu-placement routed (no GPU resource): its DRA devices, named if it says which
                    resources = tuple(resource for resource, _ in pod.gpus) or (DRA_DEVICES,)
                    devices = tuple(self.view.devices_reported(pod)) if pod.unhealthy and not pod.gpus else ()
                    launches.append(Launched(launch.anchor, launch.state, launch.cause, resources, pod.key, devices))
            new = node_fences(facts, launches, operators, self.settings)
        if new.fences or new.lifted or new.clears:
            self.states[name] = new
        else:
            self.states.pop(name, None)
        now = self.clock()
        when = new.next_change(now)
        if when is not None and when != old.next_change(now):
            self._due.add(when, name)
        key = _key(new, now)
        changed = self._keys.get(name, ()) != key
        if key:
            self._keys[name] = key
        else:
            self._keys.pop(name, None)
        fenced = {device: launch_failures(fence).message for fence in new.closed(now)
                  if fence.resource == DRA_DEVICES for device in fence.devices}
        if fenced != self.view.fenced_devices.get(name, {}):
            if fenced:
                self.view.fenced_devices[name] = fenced
            else:
                self.view.fenced_devices.pop(name, None)
        if not notify:
            return
        if changed:
            for listener in self._listeners:
                listener(name)
        if facts is not None:  # a node deleted lifts nothing: it is gone
            self._announce(name, old, new)

    def _announce(self, name: str, old: NodeFences, new: NodeFences) -> None:
        before = {fence.resource: fence for fence in old.fences}
        after = {fence.resource: fence for fence in new.fences}
        for resource, fence in after.items():
            if resource not in before:
                LAUNCH_FENCE_CHANGES.labels("fenced").inc()
                for watcher in self._watchers:
                    watcher(name, fence, None)
        lifts = {**dict(new.evidence), **{lift.resource: lift.by for lift in new.lifted}}
        for resource, fence in before.items():
            if resource not in after:
                LAUNCH_FENCE_CHANGES.labels("lifted").inc()
                for watcher in self._watchers:
                    watcher(name, fence, lifts.get(resource, "evidence"))

    # -- metrics -------------------------------------------------------------------------------
    def families(self) -> list[Metric]:
        with self.view.lock:
            causes = Counter(fence.cause for state in self.states.values() for fence in state.fences)
            nodes = sum(1 for state in self.states.values() if state.fences)
        fenced = GaugeMetricFamily("gpu_placement_launch_fenced", "Node fences (a node and a GPU resource) that "
                                   "gpu-placement holds because GPU pods failed to start there for the node's "
                                   "reasons (LaunchFailures), by the cause of the newest failure.", labels=["cause"])
        for cause in FENCE_CAUSES:
            fenced.add_metric([cause], causes.get(cause, 0))
        total = GaugeMetricFamily("gpu_placement_launch_fenced_nodes", "Nodes with at least one launch fence.",
                                  value=nodes)
        return [fenced, total]


def _counts(pod: PodRecord) -> bool:
    return pod.launch is not None or pod.operator is not None


def _key(state: NodeFences, now: float) -> _Key:
    """What placement's verdicts depend on: the closed fences, their reasons and the DRA devices they name."""
    return tuple((fence.resource, launch_failures(fence).message, fence.devices) for fence in state.closed(now))


_exported = LatestFamilies()


def track_fences(fences: Fences) -> Fences:
    """Export these fences' figures on /metrics (one per process: the service's)."""
    _exported.current = fences
    return fences
