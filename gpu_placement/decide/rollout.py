"""Driver rollouts as the service tracks them: every node's soak state kept current, and the
driver versions compared.

A node's state (`soak.node_soak`) changes with its labels, its driver and validator pods, its
telemetry, and the clock: a soak ends at a time no object change announces. The states that end by
time wait in a heap; `expire()`, called at the start of every extender request (one comparison
when nothing is due, like reservation expiry), re-reads the nodes whose time came and tells the
listeners (placement redoes that node's cached verdicts). Nothing here is kept only in memory but
the first XID seen during a soak (`telemetry`), which Prometheus gives back after a restart while
it is inside the telemetry window.

Per driver version (the node's `nvidia.com/cuda.driver-version.full`) it keeps, one node change at
a time: nodes by state, GPU pods placed on those nodes and how many of them failed, and XID events
per node-hour from DCGM telemetry. The metrics label the two highest versions `newest` and
`previous`, which is what the `GpuDriverVersionRegression` alert compares.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from gpu_placement.base.config import Config
from gpu_placement.base.cuda import VersionError, format_version, parse_version
from gpu_placement.base.deadlines import Deadlines
from gpu_placement.base.names import ANN_CANARY
from gpu_placement.facts.nodes import NodeFacts
from gpu_placement.facts.pods import PodRecord
from gpu_placement.facts.soak import (
    DONE,
    NO_SOAK,
    PENDING,
    SOAKING,
    STATES,
    OperatorPod,
    Soak,
    first_driver,
    node_soak,
    settled_version,
)
from gpu_placement.observe.metrics import LatestFamilies
from gpu_placement.view.cluster import ClusterView, Telemetry

__all__ = ["UNKNOWN_VERSION", "Rollout", "VersionFigures", "releases", "track_rollout"]

UNKNOWN_VERSION = "unknown"  # the version label of nodes that publish no driver version


@dataclass(slots=True)
class VersionFigures:
    """One driver version's aggregates."""

    states: Counter[str] = field(default_factory=Counter)
    gpu_pods: int = 0
    failed_pods: int = 0
    xid_events: int = 0
    telemetry_nodes: int = 0  # nodes with a fresh DCGM reading: the XID rate's denominator

    @property
    def nodes(self) -> int:
        return sum(self.states.values())


@dataclass(slots=True, frozen=True)
class _Share:
    """What one node adds to its version's figures, kept to take it out again on its next change."""

    version: str
    state: str
    gpu_pods: int
    failed_pods: int
    xid_events: int
    telemetry: bool


class Rollout:
    """Soak states of every node of `view`. Listeners are called under the view's lock with the name
    of a node whose state changed."""

    def __init__(self, view: ClusterView, config: Config, clock: Callable[[], float] = time.time) -> None:
        self.view, self.config, self.clock = view, config, clock
        self.states: dict[str, Soak] = {}
        self.versions: dict[str, VersionFigures] = {}
        self._drivers: dict[str, dict[str, OperatorPod]] = {}  # node -> pod key -> driver pod
        self._validators: dict[str, dict[str, OperatorPod]] = {}
        self._operator_node: dict[str, str] = {}  # operator pod key -> its node
        self._placed: dict[str, tuple[str, bool]] = {}  # GPU pod key -> (node, failed)
        self._pods_on: dict[str, list[int]] = {}  # node -> [GPU pods, failed]
        self._xid: dict[str, tuple[str, float]] = {}  # node -> (driver pod uid, first XID seen while soaking)
        self._proven: Counter[str] = Counter()  # version -> nodes that run it settled (see `_prove`)
        self._proving: dict[str, str] = {}  # node -> the version it counts for in `_proven`
        self._first: dict[str, str] = {}  # node on its first driver -> version: waits on `_proven`
        self._shares: dict[str, _Share] = {}
        self._due = Deadlines()
        self._listeners: list[Callable[[str], None]] = []
        self._rereaders: list[Callable[[str], None]] = []
        with view.lock:
            for key, pod in view.pods.items():
                self._pod_changed(key, pod, notify=False)
            for name in view.nodes:
                self._evaluate(name, notify=False)
            for name in list(view.telemetry):  # an XID of a soak still in the window, as after a restart
                self._free_changed(name)
            view.subscribe(self._node_changed, self._free_changed)
            view.subscribe_records(self._pod_changed, lambda name, record: None)

    # -- reading -------------------------------------------------------------------------------
    def soak(self, node: str) -> Soak:
        return self.states.get(node, NO_SOAK)

    def subscribe(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    def subscribe_reread(self, listener: Callable[[str], None]) -> None:
        """`listener(node)`: the node's state was re-read (its Node, its driver or validator pods, an XID, or
        the clock), whether or not it changed: what its settled driver is made of may have (the settled-driver
        writer judges those nodes only). Called under the view's lock."""
        self._rereaders.append(listener)

    def expire(self) -> None:
        """Soaks that ended by the clock: cheap when none is due (one comparison)."""
        if not self._due.any_due(self.clock()):
            return
        with self.view.lock:
            for name in self._due.pop_due(self.clock()):
                self._evaluate(name)

    def canary_namespaces(self) -> list[str]:
        with self.view.lock:
            return sorted(name for name, ns in self.view.namespaces.items() if ns.get(ANN_CANARY) == "true")

    def figures(self) -> dict[str, VersionFigures]:
        """A copy of the per-version aggregates, newest version first."""
        self.expire()
        with self.view.lock:
            copies = {version: VersionFigures(Counter(f.states), f.gpu_pods, f.failed_pods, f.xid_events,
                                              f.telemetry_nodes) for version, f in self.versions.items()}
        return dict(sorted(copies.items(), key=lambda item: _order(item[0]), reverse=True))

    def settled_due(self, names: Iterable[str] | None = None) -> dict[str, str]:
        """Nodes whose `gpu-placement.io/settled-driver` should change, with the version to write (the rollout
        leader's work: gpu_placement/controllers/settled_drivers.py), of the nodes `names` (those re-read since
        the writer's last pass: `subscribe_reread`) or every node. Writing it changes no node's state."""
        self.expire()
        with self.view.lock:
            due = {}
            states = self.states
            judged = states.items() if names is None else ((name, states[name]) for name in names if name in states)
            for name, soak in judged:
                facts = self.view.nodes.get(name)
                version = settled_version(facts, self._driver(name), soak) if facts is not None else None
                if version is not None and facts is not None and facts.settled_driver != version:
                    due[name] = format_version(version)
            return due

    def xid_per_node_hour(self, figures: VersionFigures) -> float | None:
        if not figures.telemetry_nodes:
            return None
        return figures.xid_events / figures.telemetry_nodes / (self.config.telemetry.xid_window_seconds / 3600)

    # -- changes -------------------------------------------------------------------------------
    def _node_changed(self, name: str | None) -> None:
        for node in ([name] if name is not None else list({*self.view.nodes, *self.states})):
            self._evaluate(node)

    def _free_changed(self, name: str) -> None:
        """Telemetry (and pods) of a node changed: an XID on a soaking node fails its soak; the XID
        figures of its version move."""
        reading = self.view.telemetry.get(name)
        state = self.states.get(name)
        if reading is not None and reading.xid_errors and state is not None and state.state == SOAKING:
            driver = self._driver(name)
            if driver is not None and self._xid.get(name, ("",))[0] != driver.uid:
                self._xid[name] = (driver.uid, self.clock())
                self._evaluate(name)
                return
        share = self._shares.get(name)
        if share is not None and (share.xid_events, share.telemetry) != _reading(reading):
            self._share(name)

    def _pod_changed(self, key: str, pod: PodRecord | None, notify: bool = True) -> None:
        if (pod is None or (pod.operator is None and not pod.gpus)) and key not in self._operator_node \
                and key not in self._placed:
            return  # most pods: no GPU, not the operator's (this runs for every pod event)
        before = self._operator_node.pop(key, None)
        if before is not None:
            self._drivers.get(before, {}).pop(key, None)
            self._validators.get(before, {}).pop(key, None)
        if pod is not None and pod.operator is not None and pod.node and not pod.operator.plugin:
            table = self._drivers if pod.validator_ready is None else self._validators
            table.setdefault(pod.node, {})[key] = pod.operator
            self._operator_node[key] = pod.node
        if before is not None or key in self._operator_node:
            for node in {name for name in (before, self._operator_node.get(key)) if name is not None}:
                self._evaluate(node, notify)
        self._count_placed(key, pod)

    def _count_placed(self, key: str, pod: PodRecord | None) -> None:
        old = self._placed.pop(key, None)
        new = (pod.node, pod.failed) if pod is not None and pod.node and pod.gpus else None
        if old == new:
            if new is not None:
                self._placed[key] = new
            return
        for entry, sign in ((old, -1), (new, 1)):
            if entry is not None:
                counts = self._pods_on.setdefault(entry[0], [0, 0])
                counts[0] += sign
                counts[1] += sign * entry[1]
                if counts == [0, 0]:
                    del self._pods_on[entry[0]]
        if new is not None:
            self._placed[key] = new
        for node in {entry[0] for entry in (old, new) if entry is not None}:
            self._share(node)

    # -- state ---------------------------------------------------------------------------------
    def _driver(self, name: str) -> OperatorPod | None:
        return _newest(self._drivers.get(name))

    def _evaluate(self, name: str, notify: bool = True) -> None:
        """Re-read one node's state; nodes on their first driver that wait on its version follow."""
        work = [name]
        seen: set[str] = set()
        while work:
            node = work.pop()
            if node in seen:
                continue
            seen.add(node)
            for version in self._reevaluate(node, notify):
                work.extend(other for other, v in self._first.items() if v == version and other != node)

    def _reevaluate(self, name: str, notify: bool) -> set[str]:
        """Returns the versions whose count of proven nodes crossed zero (first-driver nodes depend on it)."""
        for reread in self._rereaders:
            reread(name)
        facts = self.view.nodes.get(name)
        old = self.states.get(name)
        driver = self._driver(name)
        new = None
        self._first.pop(name, None)
        if facts is not None:
            xid = self._xid.get(name)
            version = _version(facts)
            others = self._proven[version] - (self._proving.get(name) == version)  # never the node itself
            new = node_soak(facts, driver, _newest(self._validators.get(name)),
                            xid[1] if xid is not None and driver is not None and xid[0] == driver.uid else None,
                            others > 0, self.clock(), self.config.rollout)
            if driver is not None and first_driver(facts, driver):
                self._first[name] = version
        if new is None:
            self.states.pop(name, None)
            self._xid.pop(name, None)
        else:
            self.states[name] = new
            if new.until is not None and (old is None or old.until != new.until):
                self._due.add(new.until, name)
        crossed = self._prove(name, new)
        self._share(name)
        if notify and _placement_key(old) != _placement_key(new):
            for listener in self._listeners:
                listener(name)
        return crossed

    def _prove(self, name: str, soak: Soak | None) -> set[str]:
        """A node proves its version when it runs it settled (done or pending) and not merely as the
        first driver of a new node: those count on others, never on each other."""
        proven = soak.version or UNKNOWN_VERSION if soak is not None and soak.state in (DONE, PENDING) \
            and name not in self._first else None
        before = self._proving.pop(name, None)
        if proven is not None:
            self._proving[name] = proven
        if before == proven:
            return set()
        crossed = set()
        for version, sign in ((before, -1), (proven, 1)):
            if version is not None:
                self._proven[version] += sign
                if self._proven[version] == (1 if sign > 0 else 0):  # from none to one, or back
                    crossed.add(version)
                if self._proven[version] <= 0:
                    del self._proven[version]
        return crossed

    def _share(self, name: str) -> None:
        old = self._shares.pop(name, None)
        soak = self.states.get(name)
        new = None
        facts = self.view.nodes.get(name)
        if soak is not None and facts is not None and (facts.gpu_present or any(facts.capacity.values())):
            pods, failed = self._pods_on.get(name, (0, 0))
            new = _Share(soak.version or UNKNOWN_VERSION, soak.state, pods, failed,
                         *_reading(self.view.telemetry.get(name)))
            self._shares[name] = new
        if old == new:
            return
        for share, sign in ((old, -1), (new, 1)):
            if share is None:
                continue
            figures = self.versions.setdefault(share.version, VersionFigures())
            figures.states[share.state] += sign
            if not figures.states[share.state]:
                del figures.states[share.state]
            figures.gpu_pods += sign * share.gpu_pods
            figures.failed_pods += sign * share.failed_pods
            figures.xid_events += sign * share.xid_events
            figures.telemetry_nodes += sign * share.telemetry
            if not figures.states:
                del self.versions[share.version]

    # -- metrics -------------------------------------------------------------------------------
    def families(self) -> list[Metric]:
        figures = self.figures()
        release = releases(figures)
        nodes = GaugeMetricFamily("gpu_placement_driver_nodes", "GPU nodes by driver version "
                                  "(nvidia.com/cuda.driver-version.full), release (newest, previous, older: the "
                                  "versions ranked) and rollout state (done, pending, upgrading, soaking, failed).",
                                  labels=["version", "release", "state"])
        pods = GaugeMetricFamily("gpu_placement_driver_gpu_pods", "GPU pods placed on nodes of this driver version "
                                 "(bound; running or finished, as long as the pod exists).",
                                 labels=["version", "release"])
        failed = GaugeMetricFamily("gpu_placement_driver_gpu_pods_failed", "Of those GPU pods, the ones in phase "
                                   "Failed.", labels=["version", "release"])
        xid = GaugeMetricFamily("gpu_placement_driver_xid_per_node_hour", "XID events (application XIDs 13, 31, 43, "
                                "45 left out) per node-hour over the telemetry window, on nodes of this driver "
                                "version with a fresh DCGM reading.", labels=["version", "release"])
        for version, f in figures.items():
            labels = [version, release[version]]
            for state in STATES:
                nodes.add_metric([*labels, state], f.states.get(state, 0))
            pods.add_metric(labels, f.gpu_pods)
            failed.add_metric(labels, f.failed_pods)
            rate = self.xid_per_node_hour(f)
            if rate is not None:
                xid.add_metric(labels, rate)
        return [nodes, pods, failed, xid]


def releases(figures: Iterable[str]) -> dict[str, str]:
    """`newest` and `previous` for the two highest driver versions, `older` for the rest."""
    ranked = sorted((v for v in figures if v != UNKNOWN_VERSION), key=_order, reverse=True)
    names = {version: ("newest", "previous")[i] if i < 2 else "older" for i, version in enumerate(ranked)}
    return {version: names.get(version, UNKNOWN_VERSION) for version in figures}


def _version(facts: NodeFacts) -> str:
    return format_version(facts.driver) if facts.driver is not None else UNKNOWN_VERSION


def _order(version: str) -> tuple[int, ...]:
    try:
        return parse_version(version)
    except VersionError:
        return ()


def _newest(pods: dict[str, OperatorPod] | None) -> OperatorPod | None:
    """A node's pod of one kind; two only while the old one terminates: the newer counts."""
    if not pods:
        return None
    return max(pods.values(), key=lambda pod: pod.created or 0.0)


def _reading(reading: Telemetry | None) -> tuple[int, bool]:
    """A node's part of its version's XID rate: events, and whether it has a reading at all."""
    return (reading.xid_events, True) if reading is not None else (0, False)


def _placement_key(soak: Soak | None) -> str:
    """What placement's verdicts and scores depend on."""
    return soak.state if soak is not None and soak.avoided else ""


_exported = LatestFamilies()


def track_rollout(rollout: Rollout) -> Rollout:
    """Export this rollout's figures on /metrics (one per process: the service's)."""
    _exported.current = rollout
    return rollout

