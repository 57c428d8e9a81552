"""Nodes that offer a GPU resource kube-scheduler will not send to the extender.

kube-scheduler calls an extender only for pods that ask for one of its `managedResources`, by exact
name. A pod asking for a GPU resource missing from that list (a MIG profile new to the cluster, say)
is filtered and bound by kube-scheduler alone: no validator, upgrade or MIG-state check, and no
reservation. This watches the nodes and says so: a warning per resource, once, and a gauge of the
nodes offering it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from gpu_placement.observe import metrics
from gpu_placement.view.cluster import ClusterView

__all__ = ["UnmanagedResources"]

log = logging.getLogger("gpu_placement.extender")


class UnmanagedResources:
    def __init__(self, view: ClusterView, managed: Iterable[str]) -> None:
        self.view = view
        self.managed = frozenset(managed)
        self.offering: dict[str, set[str]] = {}  # unmanaged GPU resource -> nodes with some allocatable
        self._warned: set[str] = set()
        with view.lock:
            view.subscribe(self._node_changed, _free_changed)
            for name in list(view.nodes):
                self._node_changed(name)

    def _node_changed(self, name: str | None) -> None:
        """Called under the view's lock on every node change: a set update per GPU resource."""
        if name is None:
            for nodes in self.offering.values():
                nodes.clear()
            for node in list(self.view.nodes):
                self._node_changed(node)
            return
        facts = self.view.nodes.get(name)
        offered = {res for res, units in facts.allocatable.items() if units > 0} if facts else set()
        is_gpu = self.view.config.is_gpu_resource
        for resource in offered - self.managed:
            if not is_gpu(resource):
                continue
            nodes = self.offering.setdefault(resource, set())
            if name not in nodes:
                nodes.add(name)
                metrics.UNMANAGED_GPU_NODES.labels(resource).set(len(nodes))
            if resource not in self._warned:
                self._warned.add(resource)
                log.warning("node %s offers %s, which is not in kube-scheduler's managedResources: pods asking "
                            "for it are scheduled and bound without the extender (no validator, upgrade or MIG "
                            "checks, no reservation); add it to the chart's extraMigResources", name, resource)
        for resource, nodes in self.offering.items():
            if name in nodes and resource not in offered:
                nodes.discard(name)
                metrics.UNMANAGED_GPU_NODES.labels(resource).set(len(nodes))


def _free_changed(_: str) -> None:
    """What is free does not change which resources a node offers."""
