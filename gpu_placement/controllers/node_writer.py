"""One field of each Node kept by one replica: the base of the settled drivers, refused nodes and launch fences.

Each of them derives, from the view every replica shares, the value one label or annotation of a node
should carry, and one replica, elected by a Lease, writes where the Node differs: one JSON merge patch
per node (a null value removes the key), paced by a token bucket, each node its own unit of work (a
refused patch is logged, counted and retried on the next turns; the other nodes go on). Writing never
changes a verdict: every replica decides from the view, the written value included, the same before
and after the write.

A pass costs what changed: each writer's listeners mark the nodes whose value may have changed (a
`ChangedNodes`, gpu_placement/view/changed.py), and a pass judges those, with the nodes whose last write
failed. Every node is judged on the first pass, on becoming the leader, after the view relisted nodes or
pods, after a pass that failed or was cut short, and every `resync_seconds` (300 s: whatever a listener
missed is mended within that). `judged` counts the nodes judged (gpu_placement_node_writer_judged_nodes_total).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import ClassVar, Literal, Protocol

from kubernetes.client import ApiClient
from prometheus_client import Counter, Gauge

from gpu_placement.kube.api import OBJECT_TIMEOUT, write
from gpu_placement.kube.leader import Failures, LeaderLoop, Pacer, counted
from gpu_placement.kube.lease import Lease
from gpu_placement.observe.metrics import API_OUTCOMES, NODE_WRITER_JUDGED
from gpu_placement.view.changed import ChangedNodes
from gpu_placement.view.cluster import ClusterView

__all__ = ["NodeWriter", "WriterSettings"]


class WriterSettings(Protocol):
    """What each writer's settings dataclass holds (each has its own Lease name and pace)."""

    @property
    def lease_name(self) -> str: ...
    @property
    def lease_seconds(self) -> int: ...
    @property
    def renew_seconds(self) -> float: ...
    @property
    def settle_seconds(self) -> float: ...
    @property
    def writes_per_second(self) -> float: ...
    @property
    def burst(self) -> int: ...
    @property
    def resync_seconds(self) -> float: ...


class NodeWriter(LeaderLoop):
    """Subclasses name the key (`section`, `key`), say which of some nodes are due (`_due`) and how a write
    reads in the log (`_wrote`), and call `node_changed(name)` from the listeners of what their value is made
    of (it marks the node and wakes the loop)."""

    section: ClassVar[Literal["labels", "annotations"]] = "annotations"
    key: ClassVar[str]
    log: logging.Logger

    def __init__(self, api: ApiClient, view: ClusterView, namespace: str, identity: str, settings: WriterSettings,
                 clock: Callable[[], float], leading: Gauge, failing: Gauge, writes: Counter) -> None:
        self.api, self.view = api, view
        super().__init__(Lease(api, namespace, settings.lease_name, identity, settings.lease_seconds),
                         leading.labels(settings.lease_name), settings.renew_seconds, clock,
                         settle_seconds=settings.settle_seconds)
        for outcome in API_OUTCOMES:
            writes.labels(outcome)  # every series from the start: rate() needs a zero
        self._writes_counter = writes
        self.failures = Failures(self.what, self.log, failing.labels(settings.lease_name))
        self.writes = 0
        self.judged = 0  # nodes judged, over all passes: a pass after one node event judges that node
        self._judged = {kind: NODE_WRITER_JUDGED.labels(settings.lease_name, kind) for kind in ("changed", "full")}
        self.pacer = Pacer(settings.writes_per_second, settings.burst, clock)
        self.resync_seconds = settings.resync_seconds
        self.changed = ChangedNodes()  # marked and taken under the view's lock
        self._relists = -1  # the view's relists as the last pass saw them

    def node_changed(self, name: str | None) -> None:
        """A listener's: the value of node `name` (None: of every node) may have changed. Called under the
        view's lock, as every listener of the view, the rollout and the fences is. Only the leader wakes: a
        standby's turn is a try for the Lease (an API call), due every `renew_seconds`, not on each event."""
        self.changed.mark(name)
        if self.leading:
            self._wake.set()

    def _expire(self) -> None:
        """Before a pass: let the clock end what it ended (soaks, probes), which marks those nodes."""

    def _due(self, names: Collection[str] | None) -> Mapping[str, str | None]:
        """Of the nodes `names` (None: every node), node -> the value it should carry (None: none), for those
        whose value differs. Called under the view's lock."""
        raise NotImplementedError

    def judge(self) -> Mapping[str, str | None]:
        """The nodes due now, of those changed since the last call (every node on a resync); counted in
        `judged`. The pass's own; a benchmark's and a test's too."""
        self._expire()
        with self.view.lock:
            now = self.clock()
            names = self.changed.take()
            if now >= self._next_resync or self.view.relists != self._relists:
                names = None
                self._next_resync = now + self.resync_seconds
                self._relists = self.view.relists
            if names is not None:
                names |= self.failures.errors.keys()  # retried on every pass until written
            due = self._due(names)
            count = len(names) if names is not None else len(self.view.nodes)
        self.judged += count
        self._judged["changed" if names is not None else "full"].inc(count)
        return due

    def _wrote(self, value: str | None) -> str:
        """The log's words for a write of `value`."""
        return f"{self.key}={value}" if value is not None else f"{self.key} removed"

    def _turn(self) -> None:
        self._lead()
        if not self.leading:
            self.last_error = None
            return
        if not {"nodes", "pods"} <= self.view.listed:
            return  # a half-listed view has nodes without their pods: it would judge them wrongly
        done = False
        try:
            due = self.judge()
            self.failures.forget(set(self.failures.errors) - due.keys())  # written otherwise, or gone
            for node, value in sorted(due.items()):
                self._take_token(self.pacer)
                with self.failures.unit(node):
                    self._patch(node, value)
            done = True
        finally:
            if not done:
                self._next_resync = 0.0  # the nodes taken and not written: every node on the next pass
        failing = self.failures.errors
        self.last_error = failing[min(failing)] if failing else None

    def _took_lead(self) -> None:
        self.log.info("%s: this replica now writes %s on the nodes", self.what, self.key)
        self._next_resync = 0.0  # whatever changed while another replica led: every node on the first pass

    def _not_leading(self) -> None:
        self.failures.forget(list(self.failures.errors))  # the leader writes them now
        with self.view.lock:
            self.changed.take()  # the leader judges them; this replica judges all if it leads one day

    def _patch(self, node: str, value: str | None) -> None:
        body = {"metadata": {self.section: {self.key: value}}}  # null removes the key (JSON merge patch)
        with counted(self._writes_counter):
            write(self.api, "PATCH", f"/api/v1/nodes/{node}", body=body, timeout=OBJECT_TIMEOUT,
                  content_type="application/merge-patch+json")
        self.writes += 1
        self.log.info("%s: node %s: %s", self.what, node, self._wrote(value))
