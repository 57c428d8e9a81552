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

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.facts.namespaces import not_selected

__all__ = ["Route", "Webhook", "bypass_reasons", "new_pod_route", "node_name_lines",
           "scheduler_route"]

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
        reasons.append(not_selected(namespace, config, namespace_labels))
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


@dataclass(slots=True, frozen=True)
class Route:
    """How a pod about to be created goes through the cluster: whether the webhook sees its CREATE and
    whether gpu-placement's scheduler profile (with the extender) places it; sentences when not."""

    webhook: bool = True
    extender: bool = True
    notes: tuple[str, ...] = ()
    node_name: str | None = None  # spec.nodeName: no scheduler at all
    refused: str | None = None  # the API server refuses the create itself (its namespace does not exist)


def new_pod_route(pod: Mapping[str, Any], config: Config, asks_gpu: bool, namespace: str,
                  namespace_labels: Mapping[str, str] | None) -> Route:
    """Before admission: does the webhook see this pod? `namespace_labels` None: the namespace is not
    in the cluster (or the snapshot), so the API server's NamespaceLifecycle admission refuses the pod."""
    if namespace_labels is None:
        text = (f"namespace {namespace} does not exist (not in the cluster or the snapshot): the API server refuses "
                f"the pod (namespaces \"{namespace}\" not found); create the namespace first, or check its spelling")
        return Route(True, True, (text,), refused=text)
    if not asks_gpu:
        return Route()
    if namespace in config.exempt_namespaces:
        return Route(False, False, (f"namespace {namespace} is exempt (exemptNamespaces): the webhook never sees this "
                                    "pod, so it is not shaped and gets no GPU checks",))
    if not config.selects(namespace_labels):
        return Route(False, False, (not_selected(namespace, config, namespace_labels),))
    return Route()


def scheduler_route(before: Route, pod: Mapping[str, Any], config: Config, asks_gpu: bool) -> Route:
    """After admission (`pod` as the webhook left it): which scheduler, if any, places it."""
    spec = pod.get("spec") or {}
    notes = list(before.notes)
    node = spec.get("nodeName") or None
    if node and asks_gpu:
        notes.append(f"spec.nodeName is {node}: no scheduler ever sees this pod, gpu-placement's extender included; "
                     f"the kubelet of {node} runs it if the node's own admission takes it (resource counts, node "
                     "selector and affinity, host ports, NoExecute taints: pkg/kubelet/lifecycle generalFilter), "
                     "without gpu-placement's checks")
        return Route(before.webhook, False, tuple(notes), str(node), before.refused)
    scheduler = spec.get("schedulerName") or _DEFAULT_SCHEDULER
    if asks_gpu and scheduler != config.scheduler_name:
        why = ("the webhook never saw it" if not before.webhook else
               "audit mode changes no pod" if config.mode == "audit" else
               "the webhook keeps a scheduler a pod names, other than default-scheduler")
        notes.append(f"its schedulerName stays {scheduler}, not {config.scheduler_name} ({why}): gpu-placement's "
                     "extender never sees it; its verdicts below are what it would decide")
        return Route(before.webhook, False, tuple(notes), None, before.refused)
    return Route(before.webhook, before.extender, tuple(notes), None, before.refused)


def node_name_lines(node: str, exists: bool, verdict: str | None) -> list[str]:
    """What happens to a pod created with spec.nodeName, from what the cluster holds about that node.
    `verdict`: gpu-placement's word on the node ("ready" or the reason code and sentence)."""
    if not exists:
        return [f"no node named {node}: no kubelet runs the pod; it stays Pending until kube-controller-manager's "
                "pod garbage collector deletes it, about 40 s later (PodGC: node no longer exists; "
                "pkg/controller/podgc gcOrphaned), and a controller that owns it makes the same pod again",
                "fix spec.nodeName (kubectl get nodes), or leave it out and let the scheduler choose"]
    if verdict == "ready":
        return [f"node {node} exists and gpu-placement would take GPU pods there (ready), but the pod skips its "
                "per-pod checks (CUDA, driver, product, GPU memory, quota of free devices); leave spec.nodeName out "
                "and use a nodeSelector to be checked"]
    return [f"node {node} exists but gpu-placement keeps GPU pods off it ({verdict}): the kubelet runs this pod there "
            "anyway, on a node gpu-placement has not verified; leave spec.nodeName out and use a nodeSelector"]


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

