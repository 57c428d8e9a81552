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
from collections.abc import Callable, Collection
from dataclasses import dataclass

from kubernetes.client import ApiClient

from gpu_placement.base.names import ANN_LAUNCH_FENCE
from gpu_placement.controllers.node_writer import NodeWriter
from gpu_placement.decide.fences import Fences
from gpu_placement.observe.metrics import (
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
    resync_seconds: float = 300.0  # every node judged, changed or not: what a listener missed is mended


class LaunchFenceWriter(NodeWriter):
    what = "launch fences"
    log = log
    key = ANN_LAUNCH_FENCE

    def __init__(self, api: ApiClient, fences: Fences, namespace: str, identity: str,
                 settings: FenceSettings | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.fences = fences
        self.settings = settings or FenceSettings()
        super().__init__(api, fences.view, namespace, identity, self.settings, clock, LAUNCH_FENCE_LEADING,
                         LAUNCH_FENCE_FAILING, LAUNCH_FENCE_WRITES)
        # every node the fences re-read: its Node, its GPU pods' launches or its GPU Operator pods changed, or
        # the clock opened its probe (Fences.expire)
        fences.subscribe_reread(self.node_changed)

    def _expire(self) -> None:
        self.fences.expire()

    def _due(self, names: Collection[str] | None) -> dict[str, str | None]:
        return dict(self.fences.due(names))
