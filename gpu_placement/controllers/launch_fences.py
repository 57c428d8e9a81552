"""Each node's launch fences, kept on the Node: what a restart and the failed pods' deletion must not forget.

A fence (docs/rules.md, LaunchFailures) is learned from failed GPU pods, and a Job controller or the pod
garbage collector deletes failed pods; once they are gone, nothing in the cluster says the node was
fenced. So one replica writes it: the annotation `gpu-placement.io/launch-fence` on each node with a
fence (its cause, count, first and last failure, the node's boot ID), and, once evidence lifted it, the
time of that evidence (`clear`), so the failures before it never count again
(gpu_placement/facts/fence.py).

Writing it changes no verdict: every replica's verdict is the annotation's fence or the pods' own run,
so they decide the same before and after the write, whichever replica leads, and after any restart.

One writer, elected by a Lease (like the settled drivers); one JSON merge patch per node whose value is
due, paced (`writes_per_second`), each node its own unit of work (a refused patch is logged, counted and
retried on the next turns). The RBAC for it is `patch` on nodes (charts/.../webhook-rbac.yaml).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes.client import ApiClient

from gpu_placement.base.names import ANN_LAUNCH_FENCE
from gpu_placement.decide.fences import Fences
from gpu_placement.kube.api import OBJECT_TIMEOUT, write
from gpu_placement.kube.leader import Failures, LeaderLoop, PassInterrupted, counted
from gpu_placement.kube.lease import Lease
from gpu_placement.observe.metrics import (
    API_OUTCOMES,
    LAUNCH_FENCE_FAILING,
    LAUNCH_FENCE_LEADING,
    LAUNCH_FENCE_WRITES,
)

__all__ = ["FenceSettings", "LaunchFenceWriter"]

log = logging.getLogger("gpu_placement.fences")


@dataclass(slots=True, frozen=True)
class FenceSettings:
    lease_name: str = "gpu-placement-launch-fences"
    lease_seconds: int = 30  # another replica takes over this long after the holder stops renewing
    renew_seconds: float = 10.0  # how often the holder renews and looks for due nodes; a standby tries
    settle_seconds: float = 0.2  # after a change, wait this long for its neighbours: one pass for a burst
    writes_per_second: float = 10.0  # the pace of the patches
    burst: int = 20


class LaunchFenceWriter(LeaderLoop):
    what = "launch fences"
    log = log

    def __init__(self, api: ApiClient, fences: Fences, namespace: str, identity: str,
                 settings: FenceSettings | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.fences = api, fences
        self.settings = settings or FenceSettings()
        super().__init__(Lease(api, namespace, self.settings.lease_name, identity, self.settings.lease_seconds),
                         LAUNCH_FENCE_LEADING.labels(self.settings.lease_name), self.settings.renew_seconds, clock,
                         settle_seconds=self.settings.settle_seconds)
        for outcome in API_OUTCOMES:
            LAUNCH_FENCE_WRITES.labels(outcome)  # every series from the start: rate() needs a zero
        self.failures = Failures("launch fences", log, LAUNCH_FENCE_FAILING.labels(self.settings.lease_name))
        self.writes = 0
        self._tokens = float(self.settings.burst)
        self._refilled = clock()
        fences.subscribe(lambda _node: self._wake.set())  # a fence began, lifted, or its probe opened or failed
        fences.watch(lambda _node, _fence, _by: self._wake.set())

    def _turn(self) -> None:
        self._lead()
        if not self.leading:
            self.last_error = None
            return
        if not {"nodes", "pods"} <= self.fences.view.listed:
            return  # a half-listed view has nodes without their pods: a lift it cannot see yet
        due = self.fences.due()
        self.failures.forget(set(self.failures.errors) - due.keys())  # written otherwise, or gone
        for node, value in sorted(due.items()):
            self._take_token()
            with self.failures.unit(node):
                self._patch(node, value)
        failing = self.failures.errors
        self.last_error = failing[min(failing)] if failing else None

    def _took_lead(self) -> None:
        log.info("launch fences: this replica now records each node's launch fences (%s)", ANN_LAUNCH_FENCE)

    def _not_leading(self) -> None:
        self.failures.forget(list(self.failures.errors))  # the leader writes them now

    def _patch(self, node: str, value: str) -> None:
        body = {"metadata": {"annotations": {ANN_LAUNCH_FENCE: value}}}
        with counted(LAUNCH_FENCE_WRITES):
            write(self.api, "PATCH", f"/api/v1/nodes/{node}", body=body, timeout=OBJECT_TIMEOUT,
                  content_type="application/merge-patch+json")
        self.writes += 1
        log.info("launch fences: node %s %s=%s", node, ANN_LAUNCH_FENCE, value)

    def _take_token(self) -> None:
        """One token per patch; a long paced pass renews the Lease on the way."""
        while True:
            now = self.clock()
            self._tokens = min(float(self.settings.burst),
                               self._tokens + (now - self._refilled) * self.settings.writes_per_second)
            self._refilled = now
            if self._tokens >= 1:
                self._tokens -= 1
                return
            if self._stop.wait((1 - self._tokens) / self.settings.writes_per_second):
                raise PassInterrupted("stopping")
            self._still_leading()
