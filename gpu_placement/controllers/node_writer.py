"""One field of each Node kept by one replica: the base of the settled drivers, refused nodes and launch fences.

Each of them derives, from the view every replica shares, the value one label or annotation of a node
should carry, and one replica, elected by a Lease, writes where the Node differs: one JSON merge patch
per node (a null value removes the key), paced by a token bucket, each node its own unit of work (a
refused patch is logged, counted and retried on the next turns; the other nodes go on). Writing never
changes a verdict: every replica decides from the view, the written value included, the same before
and after the write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import ClassVar, Literal, Protocol

from kubernetes.client import ApiClient
from prometheus_client import Counter, Gauge

from gpu_placement.kube.api import OBJECT_TIMEOUT, write
from gpu_placement.kube.leader import Failures, LeaderLoop, Pacer, counted
from gpu_placement.kube.lease import Lease
from gpu_placement.observe.metrics import API_OUTCOMES
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


class NodeWriter(LeaderLoop):
    """Subclasses name the key (`section`, `key`), say which nodes are due (`_due`) and how a write reads in
    the log (`_wrote`), and wake the loop when their source changes (`self._wake.set()`)."""

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
        self.pacer = Pacer(settings.writes_per_second, settings.burst, clock)

    def _due(self) -> Mapping[str, str | None]:
        """Node -> the value it should carry (None: none), for the nodes whose value differs."""
        raise NotImplementedError

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
        due = self._due()
        self.failures.forget(set(self.failures.errors) - due.keys())  # written otherwise, or gone
        for node, value in sorted(due.items()):
            self._take_token(self.pacer)
            with self.failures.unit(node):
                self._patch(node, value)
        failing = self.failures.errors
        self.last_error = failing[min(failing)] if failing else None

    def _took_lead(self) -> None:
        self.log.info("%s: this replica now writes %s on the nodes", self.what, self.key)

    def _not_leading(self) -> None:
        self.failures.forget(list(self.failures.errors))  # the leader writes them now

    def _patch(self, node: str, value: str | None) -> None:
        body = {"metadata": {self.section: {self.key: value}}}  # null removes the key (JSON merge patch)
        with counted(self._writes_counter):
            write(self.api, "PATCH", f"/api/v1/nodes/{node}", body=body, timeout=OBJECT_TIMEOUT,
                  content_type="application/merge-patch+json")
        self.writes += 1
        self.log.info("%s: node %s: %s", self.what, node, self._wrote(value))
