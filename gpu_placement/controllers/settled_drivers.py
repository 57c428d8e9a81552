"""The settled driver of each node, kept on the Node: what tells a driver change from a reinstall.

A driver pod recreated with the driver the node already ran (an operator upgrade that rolls the
DaemonSet for another reason, a ClusterPolicy edit, `kubectl delete pod`) is not a new driver, and
nothing the GPU Operator keeps says which driver the node ran before its pod was replaced: the
upgrade controller moves a node through the same states for any new ControllerRevision, whatever
changed in it (NVIDIA/k8s-operator-libs pkg/upgrade `podInSyncWithDS` compares revision hashes),
and GPU Feature Discovery's labels show the version now, not the one before. So one replica writes
it: the annotation `gpu-placement.io/settled-driver: <version>` on each node that runs a driver
settled (past its soak, excused from it, or a reinstall of the driver it had; facts/soak.py
`settled_version`). A driver pod of that version does not soak; any other does (docs/rollouts.md).

Writing it changes no verdict: the value is the version the node already runs settled, so every
replica decides the same before and after the write, whichever replica leads, and after any restart
(the annotation is in the Node, which every replica and `gpu-placement rollout` read).

One writer, elected by a Lease (like the quota mirror); one JSON merge patch per node whose value is
due, paced (`writes_per_second`), each node its own unit of work (a refused patch is logged, counted
and retried on the next turns). The RBAC for it is `patch` on nodes (charts/.../webhook-rbac.yaml).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes.client import ApiClient

from gpu_placement.base.names import ANN_SETTLED_DRIVER
from gpu_placement.decide.rollout import Rollout
from gpu_placement.kube.api import OBJECT_TIMEOUT, write
from gpu_placement.kube.leader import Failures, LeaderLoop, PassInterrupted, counted
from gpu_placement.kube.lease import Lease
from gpu_placement.observe.metrics import (
    API_OUTCOMES,
    SETTLED_DRIVER_FAILING,
    SETTLED_DRIVER_LEADING,
    SETTLED_DRIVER_WRITES,
)

__all__ = ["SettledDrivers", "SettledSettings"]

log = logging.getLogger("gpu_placement.rollout")


@dataclass(slots=True, frozen=True)
class SettledSettings:
    lease_name: str = "gpu-placement-drivers"
    lease_seconds: int = 30  # another replica takes over this long after the holder stops renewing
    renew_seconds: float = 10.0  # how often the holder renews and looks for due nodes; a standby tries
    settle_seconds: float = 0.2  # after a change, wait this long for its neighbours: one pass for a burst
    writes_per_second: float = 10.0  # the pace of the patches (a first install patches every GPU node once)
    burst: int = 20


class SettledDrivers(LeaderLoop):
    what = "settled drivers"
    log = log

    def __init__(self, api: ApiClient, rollout: Rollout, namespace: str, identity: str,
                 settings: SettledSettings | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.rollout = api, rollout
        self.settings = settings or SettledSettings()
        super().__init__(Lease(api, namespace, self.settings.lease_name, identity, self.settings.lease_seconds),
                         SETTLED_DRIVER_LEADING.labels(self.settings.lease_name), self.settings.renew_seconds, clock,
                         settle_seconds=self.settings.settle_seconds)
        for outcome in API_OUTCOMES:
            SETTLED_DRIVER_WRITES.labels(outcome)  # every series from the start: rate() needs a zero
        self.failures = Failures("settled drivers", log, SETTLED_DRIVER_FAILING.labels(self.settings.lease_name))
        self.writes = 0
        self._tokens = float(self.settings.burst)
        self._refilled = clock()
        rollout.subscribe(lambda _node: self._wake.set())  # a soak ended or began: a value may be due

    def _turn(self) -> None:
        self._lead()
        if not self.leading:
            self.last_error = None
            return
        if not {"nodes", "pods"} <= self.rollout.view.listed:
            return  # a half-listed view has nodes without their driver pods: nothing is settled yet
        due = self.rollout.settled_due()
        self.failures.forget(set(self.failures.errors) - due.keys())  # settled otherwise, or gone
        for node, version in sorted(due.items()):
            self._take_token()
            with self.failures.unit(node):
                self._patch(node, version)
        failing = self.failures.errors
        self.last_error = failing[min(failing)] if failing else None

    def _took_lead(self) -> None:
        log.info("settled drivers: this replica now records each node's settled driver (%s)", ANN_SETTLED_DRIVER)

    def _not_leading(self) -> None:
        self.failures.forget(list(self.failures.errors))  # the leader writes them now

    def _patch(self, node: str, version: str) -> None:
        body = {"metadata": {"annotations": {ANN_SETTLED_DRIVER: version}}}
        with counted(SETTLED_DRIVER_WRITES):
            write(self.api, "PATCH", f"/api/v1/nodes/{node}", body=body, timeout=OBJECT_TIMEOUT,
                  content_type="application/merge-patch+json")
        self.writes += 1
        log.info("settled drivers: node %s runs driver %s settled (%s)", node, version, ANN_SETTLED_DRIVER)

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
