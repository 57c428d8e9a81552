"""Namespaces as the rules see them: their name, our annotations and our labels only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_placement.base.names import PREFIX

__all__ = ["NamespaceRecord", "namespace_from_json"]


@dataclass(slots=True, frozen=True)
class NamespaceRecord:
    name: str
    annotations: dict[str, str]  # only gpu-placement.io/*: what the platform team set
    resource_version: str = ""
    uid: str = ""  # for owner references to the Namespace (the quota mirror's ResourceQuotas)
    labels: dict[str, str] = field(default_factory=dict)  # only gpu-placement.io/*: the opt-in label
    terminating: bool = False  # metadata.deletionTimestamp set: being deleted, nothing new may be created there

    def get(self, key: str) -> str | None:
        return self.annotations.get(key)


def namespace_from_json(obj: Mapping[str, Any]) -> NamespaceRecord:
    meta = obj.get("metadata") or {}
    annotations = {k: str(v) for k, v in (meta.get("annotations") or {}).items() if k.startswith(PREFIX)}
    labels = {k: str(v) for k, v in (meta.get("labels") or {}).items() if k.startswith(PREFIX)}
    return NamespaceRecord(str(meta.get("name") or ""), annotations, str(meta.get("resourceVersion") or ""),
                           str(meta.get("uid") or ""), labels, terminating=bool(meta.get("deletionTimestamp")))
