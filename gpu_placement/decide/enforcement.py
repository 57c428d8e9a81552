"""Whether gpu-placement acts in a namespace at all, and so whether its quota is in force.

The webhook configurations select namespaces by label (`namespaceSelection`, the chart's
namespaceSelector) and leave out `exemptNamespaces`: in any other namespace no pod reaches the webhook,
so a `gpu-placement.io/quota` there limits nothing, and in audit mode the webhook refuses nothing. One
place answers the question for the metrics, `explain`, `namespaces` and the Events, so they agree.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.facts.namespaces import NamespaceRecord

__all__ = ["quota_enforced", "selection_state"]


def selection_state(name: str, labels: Mapping[str, str], config: Config) -> str:
    """`opted-in`, `exempt`, `not-opted-in` (optIn, label absent or not exactly "true"), `opted-out`."""
    if name in config.exempt_namespaces:
        return "exempt"
    if config.selects(labels):
        return "opted-in"
    return "not-opted-in" if config.namespace_selection == "optIn" else "opted-out"


def quota_enforced(record: NamespaceRecord, config: Config) -> tuple[bool, str]:
    """Whether the namespace's quota annotation limits anything, and if not, the reason in a few words."""
    state = selection_state(record.name, record.labels, config)
    if state == "exempt":
        return False, "exempt namespace (exemptNamespaces)"
    if state == "not-opted-in":
        value = record.labels.get(n.LABEL_ENABLED)
        return False, (f"not opted in: labelled {n.LABEL_ENABLED}={value}, only true opts in" if value is not None
                       else f"not opted in: no label {n.LABEL_ENABLED}=true")
    if state == "opted-out":
        return False, f"opted out ({n.LABEL_ENABLED}=false)"
    if config.mode == "audit":
        return False, "audit mode: the webhook only warns"
    return True, ""
