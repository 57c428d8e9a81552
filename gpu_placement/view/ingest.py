"""Kubernetes JSON into view records: the one place both sources (snapshot, list+watch) go through."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpu_placement.base.config import Config
from gpu_placement.facts.budgets import budget_from_json, budget_key
from gpu_placement.facts.dra import DRA_BY_KIND, DRA_KINDS
from gpu_placement.facts.namespaces import NamespaceRecord, namespace_from_json
from gpu_placement.facts.nodes import NodeFacts, node_from_json
from gpu_placement.facts.pods import PodRecord, pod_from_json, pod_key, resource_version
from gpu_placement.facts.resourcequotas import SETTLE_SECONDS, QuotaStatus, observed, quota_from_json
from gpu_placement.view.cluster import ClusterView

__all__ = ["FILE_KINDS", "KINDS", "OBJECT_KINDS", "Ingest"]

KINDS = ("namespaces", "nodes", "pods")  # namespaces first: pods' memory defaults come from them
# Kinds kept as records only (ClusterView.upsert_object), watched where a component needs them:
# (key of an object, its record).
OBJECT_KINDS: dict[str, tuple[Callable[[Mapping[str, Any]], str], Callable[[Mapping[str, Any]], object]]] = {
    "poddisruptionbudgets": (budget_key, budget_from_json),  # the extender's /preempt
    "resourcequotas": (lambda obj: str((obj.get("metadata") or {}).get("namespace") or ""), quota_from_json),
}
FILE_KINDS = (*KINDS, "poddisruptionbudgets")  # what a snapshot holds (no API server enforces quotas there)
_BY_KIND = {"Node": "nodes", "Pod": "pods", "Namespace": "namespaces",
            "PodDisruptionBudget": "poddisruptionbudgets"}


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
        return pod_from_json(obj, self.config.is_gpu_resource, self._is_validator, self._is_driver,
                             self.config.scheduler_name,
                             with_cpu=self.config.scoring.strategy == "fragmentation", is_plugin=self._is_plugin)

    def namespace(self, obj: Mapping[str, Any]) -> NamespaceRecord:
        return namespace_from_json(obj)

    def _is_validator(self, namespace: str, labels: Mapping[str, str]) -> bool:
        validator = self.config.validator
        return namespace == validator.namespace and validator.selector.matches(labels)

    def _is_driver(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """The GPU Operator's driver pods: in the operator's namespace (the validator's)."""
        return namespace == self.config.validator.namespace and self.config.rollout.driver_selector.matches(labels)

    def _is_plugin(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """The GPU Operator's device plugin pods (the launch fence lifts when one restarts or is recreated)."""
        fence = self.config.launch_fence
        return fence.enabled and namespace == self.config.validator.namespace and fence.plugin_selector.matches(labels)

    def replace(self, view: ClusterView, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """A full list of one kind: the view keeps what is unchanged and drops what is gone."""
        if kind == "nodes":
            view.replace_nodes(self.node(obj) for obj in objects)
        elif kind == "pods":
            view.replace_pods({pod.key: pod for pod in map(self.pod, objects)})
        elif kind == "namespaces":
            view.replace_namespaces(self.namespace(obj) for obj in objects)
        elif kind in DRA_KINDS:
            view.dra.replace(kind, list(objects))
            with view.lock:
                view.listed.add(kind)
        elif kind in OBJECT_KINDS:
            view.replace_objects(kind, dict(self._object(view, kind, obj) for obj in objects))
        else:
            raise ValueError(f"unknown kind {kind!r}")

    def relist(self, view: ClusterView, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """A full list from the API server, as `replace`, where a pod of the resourceVersion the view
        holds keeps its record: a relist of 150,000 pods builds only those that changed, which is most
        of the Python work it does while the request path waits for the GIL."""
        if kind != "pods" or (not view.pods and "pods" not in view.listed):  # the first: nothing to keep
            self.replace(view, kind, objects)  # (pods into the empty view as the pages come: ClusterView._fill)
            return
        current = view.pods  # read without the lock: only this kind's watch thread writes it
        fresh: dict[str, PodRecord] = {}
        for obj in objects:
            meta = obj.get("metadata") or {}
            key = pod_key(meta.get("namespace") or "default", meta.get("name") or "")
            known = current.get(key)
            if known is None or not known.version or known.version != resource_version(meta) or known.uid != (
                    meta.get("uid") or ""):
                known = self.pod(obj)
            fresh[key] = known
        view.replace_pods(fresh)

    def event(self, view: ClusterView, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED); BOOKMARK and ERROR are the watcher's business."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        deleted = event_type == "DELETED"
        if kind == "nodes":
            view.delete_node(name) if deleted else view.upsert_node(self.node(obj))
        elif kind == "pods":
            key = pod_key(str(meta.get("namespace") or "default"), name)
            view.delete_pod(key, str(meta.get("uid") or "")) if deleted else view.upsert_pod(self.pod(obj))
        elif kind == "namespaces":
            view.delete_namespace(name) if deleted else view.upsert_namespace(self.namespace(obj))
        elif kind in DRA_KINDS:
            view.dra.event(kind, event_type, obj)
        elif kind in OBJECT_KINDS:
            key, record = self._object(view, kind, obj)
            view.delete_object(kind, key) if deleted else view.upsert_object(kind, key, record)
        else:
            raise ValueError(f"unknown kind {kind!r}")

    @staticmethod
    def _object(view: ClusterView, kind: str, obj: Mapping[str, Any]) -> tuple[str, object]:
        key_of, build = OBJECT_KINDS[kind]
        key, record = key_of(obj), build(obj)
        if isinstance(record, QuotaStatus):  # when the view saw each figure change: the quota gate's settle time
            record = observed(record, view.resourcequotas.get(key), view.clock(), SETTLE_SECONDS)
        return key, record

    @staticmethod
    def kind_of(obj: Mapping[str, Any]) -> str | None:
        kind = str(obj.get("kind") or "")
        return _BY_KIND.get(kind) or DRA_BY_KIND.get(kind)
