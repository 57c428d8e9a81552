"""Whether a pod that exists went through gpu-placement, and if not, why: for `explain pod/NAME`.

A GPU pod is gpu-placement's when the webhook admitted it (annotation `gpu-placement.io/admitted`) and
its scheduler is gpu-placement's profile, the one kube-scheduler runs with the extender. A pod can miss
either step for reasons the cluster shows: its namespace is exempt or not opted in
(`namespaceSelection`), it names another scheduler (the webhook keeps any scheduler a pod names but
default-scheduler), it is a DaemonSet pod (they keep theirs), or it was created before the webhook
existed, before a ready replica wrote the webhooks into it, or while no replica answered (the mutating
webhook's failurePolicy is Ignore, so such pods are created unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_placement import names as n
from gpu_placement.config import Config

__all__ = ["Webhook", "bypass_reasons"]

_DEFAULT_SCHEDULER = "default-scheduler"


@dataclass(slots=True, frozen=True)
class Webhook:
    """The MutatingWebhookConfiguration as read from the cluster: None fields where it could not be read."""

    name: str | None  # None: no gpu-placement MutatingWebhookConfiguration in the cluster
    created: str | None = None  # its creationTimestamp (RFC 3339, so it compares as text)
    failure_policy: str | None = None
    webhooks: int | None = None  # how many it holds: 0 until a ready replica writes them (the chart's install)
    registered: str | None = None  # when a replica wrote them (annotation gpu-placement.io/webhooks-registered)


def bypass_reasons(pod: Mapping[str, Any], config: Config, asks_gpu: bool, webhook: Webhook | None = None,
                   namespace_labels: Mapping[str, str] | None = None) -> list[str]:
    """Sentences saying how this pod went around gpu-placement; empty when it did not.
    `namespace_labels`: the pod's namespace's labels, when known (they decide whether it is opted in)."""
    if not asks_gpu:
        return []
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    namespace = meta.get("namespace") or "default"
    scheduler = spec.get("schedulerName") or _DEFAULT_SCHEDULER
    admitted = n.ANN_ADMITTED in (meta.get("annotations") or {})
    daemonset = any(o.get("kind") == "DaemonSet" and o.get("controller") for o in meta.get("ownerReferences") or ()
                    if isinstance(o, dict))
    reasons = []
    if namespace in config.exempt_namespaces:
        reasons.append(f"namespace {namespace} is exempt (exemptNamespaces): the webhook never sees its pods")
    elif not admitted and namespace_labels is not None and not config.selects(namespace_labels):
        reasons.append(_not_selected(namespace, config))
    elif not admitted:
        reasons.append(_not_admitted(meta, webhook))
    if scheduler != config.scheduler_name:
        if daemonset:
            why = "DaemonSet pods keep their scheduler"
        elif scheduler != _DEFAULT_SCHEDULER:
            why = "the webhook keeps a scheduler a pod names, other than default-scheduler"
        else:
            why = "the webhook sets it only on pods it admits"
        reasons.append(f"its schedulerName is {scheduler}, not {config.scheduler_name} ({why}): gpu-placement's "
                       "extender never saw it, and its verdicts below are what it would have decided")
    return reasons


def _not_selected(namespace: str, config: Config) -> str:
    if config.namespace_selection == "optIn":
        return (f"namespace {namespace} is not opted in (namespaceSelection optIn: it has no label "
                f"{n.LABEL_ENABLED}=true): the webhook never sees its pods; kubectl label namespace {namespace} "
                f"{n.LABEL_ENABLED}=true opts it in, for pods created from then on")
    return (f"namespace {namespace} is opted out ({n.LABEL_ENABLED}=false): the webhook never sees its pods")


def _not_admitted(meta: Mapping[str, Any], webhook: Webhook | None) -> str:
    missing = f"no {n.ANN_ADMITTED} annotation: the webhook did not admit it"
    if webhook is None:
        return f"{missing} (the webhook configuration was not read, so not why)"
    if webhook.name is None:
        return f"{missing}: there is no gpu-placement MutatingWebhookConfiguration in the cluster"
    if webhook.webhooks == 0:
        return (f"{missing}: MutatingWebhookConfiguration {webhook.name} has no webhooks yet: no webhook replica "
                "has been ready since it was installed (a replica writes them once it is)")
    created = str(meta.get("creationTimestamp") or "")
    if created and webhook.created and created < webhook.created:
        return (f"{missing}: the pod was created at {created}, before MutatingWebhookConfiguration "
                f"{webhook.name} ({webhook.created})")
    if created and webhook.registered and created < webhook.registered:
        return (f"{missing}: the pod was created at {created}, before a webhook replica wrote the webhooks into "
                f"MutatingWebhookConfiguration {webhook.name} ({webhook.registered})")
    if webhook.failure_policy == "Ignore":
        return (f"{missing}: most likely it was created while no webhook replica answered "
                f"(MutatingWebhookConfiguration {webhook.name} has failurePolicy Ignore, so the API server created it "
                "unchanged); the webhook's logs and gpu_placement_requests_total around its creationTimestamp tell")
    return f"{missing}, although MutatingWebhookConfiguration {webhook.name} exists"

