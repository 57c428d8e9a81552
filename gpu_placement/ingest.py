"""Kubernetes JSON into view records: the one place both sources (snapshot, list+watch) go through."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_placement.config import Config
from gpu_placement.namespaces import NamespaceRecord, namespace_from_json
from gpu_placement.nodes import NodeFacts, node_from_json
from gpu_placement.pods import PodRecord, pod_from_json, pod_key
from gpu_placement.view import ClusterView

__all__ = ["KINDS", "Ingest"]

KINDS = ("namespaces", "nodes", "pods")  # namespaces first: pods' memory defaults come from them
_BY_KIND = {"Node": "nodes", "Pod": "pods", "Namespace": "namespaces"}


class Ingest:
    def __init__(self, config: Config) -> None:
        self.config = config

    def node(self, obj: Mapping[str, Any]) -> NodeFacts:
        return node_from_json(obj, self._pool_of)

    def _pool_of(self, labels: Mapping[str, str]) -> str | None:
        """Pool membership for the capacity metrics: by nodeSelector (a pool with tolerations only
        names no labels, so no node is counted in it)."""
        for pool in self.config.pools.values():
            if pool.node_selector and all(labels.get(k) == v for k, v in pool.node_selector.items()):
                return pool.name
        return None

    def pod(self, obj: Mapping[str, Any]) -> PodRecord:
        return pod_from_json(obj, self.config.is_gpu_resource, self._is_validator, self._is_driver)

    def namespace(self, obj: Mapping[str, Any]) -> NamespaceRecord:
        return namespace_from_json(obj)

    def _is_validator(self, namespace: str, labels: Mapping[str, str]) -> bool:
        validator = self.config.validator
        return namespace == validator.namespace and validator.selector.matches(labels)

    def _is_driver(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """The GPU Operator's driver pods: in the operator's namespace (the validator's)."""
        return namespace == self.config.validator.namespace and self.config.rollout.driver_selector.matches(labels)

    def replace(self, view: ClusterView, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """A full list of one kind: the view keeps what is unchanged and drops what is gone."""
        if kind == "nodes":
            view.replace_nodes(self.node(obj) for obj in objects)
        elif kind == "pods":
            view.replace_pods(self.pod(obj) for obj in objects)
        elif kind == "namespaces":
            view.replace_namespaces(self.namespace(obj) for obj in objects)
        else:
            raise ValueError(f"unknown kind {kind!r}")

    def event(self, view: ClusterView, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED); BOOKMARK and ERROR are the watcher's business."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        deleted = event_type == "DELETED"
        if kind == "nodes":
            view.delete_node(name) if deleted else view.upsert_node(self.node(obj))
        elif kind == "pods":
            key = pod_key(str(meta.get("namespace") or "default"), name)
            view.delete_pod(key) if deleted else view.upsert_pod(self.pod(obj))
        elif kind == "namespaces":
            view.delete_namespace(name) if deleted else view.upsert_namespace(self.namespace(obj))
        else:
            raise ValueError(f"unknown kind {kind!r}")

    @staticmethod
    def kind_of(obj: Mapping[str, Any]) -> str | None:
        return _BY_KIND.get(str(obj.get("kind") or ""))
