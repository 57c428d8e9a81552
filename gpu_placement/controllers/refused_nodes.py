"""The nodes gpu-placement refuses every GPU pod for, labelled, so kube-scheduler leaves them out itself.

kube-scheduler's adaptive sample (`percentageOfNodesToScore` unset: about 10 % of 5,000 nodes) is safe with
an extender only if the extender does not reject what the sample holds: a pod would be declared
unschedulable while unsampled nodes fit, and preemption would evict on the sample. Most of what
gpu-placement rejects on a node is the node's own state, whatever the pod: not Ready or cordoned, no GPU
found, no Ready validator, a driver upgrade or MIG change under way (`node_readiness`,
gpu_placement/decide/rules.py). So one replica writes it: the label `gpu-placement.io/refused: <code>` on
each GPU node with such a reason, removed when the reason goes; and the webhook requires, in every GPU pod it
shapes, that the label be absent (webhook/shaping.py `refused_affinity`): kube-scheduler's NodeAffinity
then filters those nodes before its sample is counted. GPU Operator's own pods are not shaped (its namespace
is exempt), so they still land on the nodes they are to validate.

The label lags the view by a patch: the extender still judges every node it is sent, so a node refused a
moment ago is rejected there as before, and a node just verified waits for its label to go (NodeAffinity's
queueing hint requeues the pod on that Node update). Only GPU nodes are labelled (GPUs found, offered or
published): other nodes never fit a GPU pod in kube-scheduler's own filters.

One writer, elected by a Lease (like the settled drivers); one JSON merge patch per node whose label is due,
paced, each node its own unit of work. The RBAC for it is `patch` on nodes (charts/.../webhook-rbac.yaml).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from kubernetes.client import ApiClient

from gpu_placement.base.config import Config
from gpu_placement.base.names import LABEL_REFUSED
from gpu_placement.controllers.node_writer import NodeWriter
from gpu_placement.decide.rules import node_readiness
from gpu_placement.facts.nodes import NodeFacts
from gpu_placement.observe.metrics import REFUSED_FAILING, REFUSED_LEADING, REFUSED_WRITES
from gpu_placement.view.cluster import ClusterView

__all__ = ["RefusedNodes", "RefusedSettings", "refused_due"]

log = logging.getLogger("gpu_placement.refused")


@dataclass(slots=True, frozen=True)
class RefusedSettings:
    lease_name: str = "gpu-placement-refused"
    lease_seconds: int = 30  # another replica takes over this long after the holder stops renewing
    renew_seconds: float = 10.0  # how often the holder renews and looks for due nodes; a standby tries
    settle_seconds: float = 0.2  # after a change, wait this long for its neighbours: one pass for a burst
    writes_per_second: float = 20.0  # the pace of the patches (a first install labels every refused node once)
    burst: int = 50
    resync_seconds: float = 300.0  # every node judged, changed or not: what a listener missed is mended


def _gpu_node(facts: NodeFacts) -> bool:
    return facts.gpu_present or any(count > 0 for count in facts.allocatable.values()) or facts.dra_devices > 0


def refused_due(view: ClusterView, config: Config, names: Iterable[str] | None = None) -> dict[str, str | None]:
    """Node -> the label it should carry (a code; None: none) where that differs from what it carries; of the
    nodes `names` (a node gone is not due), or every node. The label is made of the Node and its validator
    pods only (`node_readiness`): the view marks a node changed on either (ClusterView.subscribe)."""
    due: dict[str, str | None] = {}
    with view.lock:
        nodes = view.nodes
        judged = nodes.items() if names is None else ((name, nodes[name]) for name in names if name in nodes)
        for name, facts in judged:
            rejection = node_readiness(facts, view.validator_state(name), config) if _gpu_node(facts) else None
            wanted = rejection.code if rejection is not None else None
            if wanted != facts.refused:
                due[name] = wanted
    return due


class RefusedNodes(NodeWriter):
    what = "refused nodes"
    log = log
    section = "labels"
    key = LABEL_REFUSED

    def __init__(self, api: ApiClient, view: ClusterView, config: Config, namespace: str, identity: str,
                 settings: RefusedSettings | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.settings = settings or RefusedSettings()
        super().__init__(api, view, namespace, identity, self.settings, clock, REFUSED_LEADING, REFUSED_FAILING,
                         REFUSED_WRITES)
        view.subscribe(self.node_changed, lambda _node: None)  # its facts or its validator pods changed

    def _due(self, names: Collection[str] | None) -> dict[str, str | None]:
        return refused_due(self.view, self.config, names)

    def _wrote(self, value: str | None) -> str:
        return f"labelled {LABEL_REFUSED}={value}" if value else f"no longer refused ({LABEL_REFUSED} removed)"
