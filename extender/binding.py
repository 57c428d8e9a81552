"""Where `/bind` sends a binding: the API server, or (snapshot mode) the snapshot's own record."""

from __future__ import annotations

from typing import Protocol

from gpu_placement.pods import PodRecord, pod_key
from gpu_placement.snapshot import SnapshotSource
from gpu_placement.view import ClusterView

__all__ = ["BindError", "Binder", "SnapshotBinder"]


class BindError(Exception):
    """The binding was refused; the message says by whom and why, for the extender's `Error`."""


class Binder(Protocol):
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...


class SnapshotBinder:
    """Records the binding and shows the pod bound in the view, as the API server's watch would.

    A pod the snapshot does not hold (created after it was taken) is recorded too; its reservation
    then holds its GPUs until `reservationTTLSeconds`, since no watch will show it bound."""

    def __init__(self, view: ClusterView, source: SnapshotSource | None = None) -> None:
        self.view = view
        self.source = source

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        with self.view.lock:
            pod = self.view.pods.get(pod_key(namespace, name))
            if pod is not None and uid and pod.uid and uid != pod.uid:
                raise BindError(f"pod {namespace}/{name} has UID {pod.uid}, not {uid}: it was replaced")
            if pod is not None and pod.node and pod.node != node:
                raise BindError(f"pod {namespace}/{name} is already assigned to node {pod.node}")
            if self.source is not None:
                self.source.record_binding(namespace, name, node)
            if pod is None:
                return
            self.view.upsert_pod(PodRecord(pod.namespace, pod.name, pod.uid, node, pod.active, pod.gpus,
                                           pod.memory_annotation, pod.validator_ready))
