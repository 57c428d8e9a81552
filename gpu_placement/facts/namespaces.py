"""Namespaces as the rules see them: their name, our annotations and our labels only; and whether the
webhook sees their pods (the opt-in label as namespaceSelection reads it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.base.names import PREFIX

__all__ = ["NamespaceRecord", "label_problem", "namespace_from_json", "not_selected"]


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


def not_selected(namespace: str, config: Config, labels: Mapping[str, str] | None = None) -> str:
    """Why the webhook never sees the namespace's pods (namespaceSelection), and how to opt it in."""
    if config.namespace_selection == "optIn":
        value = (labels or {}).get(n.LABEL_ENABLED)
        has = (f"it is labelled {n.LABEL_ENABLED}={value}, and only the exact value true opts in (label values are "
               "case-sensitive)") if value is not None else f"it has no label {n.LABEL_ENABLED}=true"
        fix = "--overwrite " if value is not None else ""
        return (f"namespace {namespace} is not opted in (namespaceSelection optIn: {has}): the webhook never sees its "
                f"pods; kubectl label {fix}namespace {namespace} {n.LABEL_ENABLED}=true opts it in, for pods created "
                "from then on")
    return (f"namespace {namespace} is opted out ({n.LABEL_ENABLED}=false): the webhook never sees its pods")


def label_problem(namespace: str, labels: Mapping[str, str], config: Config) -> str | None:
    """The opt-in label set to a value the namespaceSelector does not take as meant (`True`, `yes`, `False`):
    the sentence saying what it does instead; None when the label is absent, `true` or `false`."""
    value = labels.get(n.LABEL_ENABLED)
    if value is None or value in ("true", "false"):
        return None
    if config.namespace_selection == "optIn":
        return not_selected(namespace, config, labels)
    return (f"namespace {namespace} is labelled {n.LABEL_ENABLED}={value}: only the exact value false opts a "
            "namespace out (namespaceSelection optOut; label values are case-sensitive), so gpu-placement acts "
            f"on its pods; write true, or false to opt it out")
