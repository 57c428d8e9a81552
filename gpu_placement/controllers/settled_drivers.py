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
from collections.abc import Callable, Collection
from dataclasses import dataclass

from kubernetes.client import ApiClient

from gpu_placement.base.names import ANN_SETTLED_DRIVER
from gpu_placement.controllers.node_writer import NodeWriter
from gpu_placement.decide.rollout import Rollout
from gpu_placement.observe.metrics import (
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
    resync_seconds: float = 300.0  # every node judged, changed or not: what a listener missed is mended


class SettledDrivers(NodeWriter):
    what = "settled drivers"
    log = log
    key = ANN_SETTLED_DRIVER

    def __init__(self, api: ApiClient, rollout: Rollout, namespace: str, identity: str,
                 settings: SettledSettings | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.rollout = rollout
        self.settings = settings or SettledSettings()
        super().__init__(api, rollout.view, namespace, identity, self.settings, clock, SETTLED_DRIVER_LEADING,
                         SETTLED_DRIVER_FAILING, SETTLED_DRIVER_WRITES)
        # every node the rollout re-reads: its Node, its driver or validator pods or its telemetry changed, or
        # the clock ended its soak (Rollout.expire)
        rollout.subscribe_reread(self.node_changed)

    def _expire(self) -> None:
        self.rollout.expire()

    def _due(self, names: Collection[str] | None) -> dict[str, str | None]:
        return dict(self.rollout.settled_due(names))

    def _wrote(self, value: str | None) -> str:
        return f"runs driver {value} settled ({ANN_SETTLED_DRIVER})"
