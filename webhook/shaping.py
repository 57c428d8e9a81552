"""Was this GPU pod shaped by /mutate? /validate's check that a `failurePolicy: Ignore` outage of the
mutating webhook never admits a GPU pod unshaped into a namespace with a GPU policy.

The chart runs /mutate with `failurePolicy: Ignore` (a webhook outage must not block the non-GPU pods
it also sees) and /validate with `Fail`. So when /mutate could not be reached, the API server goes on
without its patch, and /validate, which runs after every mutating webhook, is the one place that can
still say no. It asks the question /mutate answers: the patch /mutate would make for this pod now,
under the same policy. /mutate's patches are idempotent, so a pod it shaped gets an empty one. The
`gpu-placement.io/admitted` annotation is part of that patch: it records the sharing level, the
resources after the rewrite, the pools and the scheduler, and must match the pod as it is; a tenant
who writes it by hand with another shape (or writes the shape without it) is told the pod was not
shaped. A tenant who writes exactly what /mutate would have written has a shaped pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.facts.policy import NamespacePolicy
from webhook.patches import escape

__all__ = ["NOT_SHAPED", "NOT_SHAPED_ALLOWED", "governed", "unshaped", "unshaped_warning"]

NOT_SHAPED = "NotShaped"
NOT_SHAPED_ALLOWED = "NotShapedAllowed"  # a namespace without a GPU policy: let in, with a warning

# The fields a /mutate patch touches, as a user reads them in the pod (patch paths are JSON Pointers).
_FIELDS = {"/spec/tolerations": "spec.tolerations", "/spec/nodeSelector": "spec.nodeSelector",
           "/spec/affinity": "spec.affinity", "/spec/schedulerName": "spec.schedulerName",
           "/metadata/annotations/" + escape(n.ANN_ADMITTED): f"the {n.ANN_ADMITTED} annotation",
           "/metadata/annotations/" + escape(n.ANN_GPU_MEMORY): f"the {n.ANN_GPU_MEMORY} annotation",
           "/metadata/annotations": "its gpu-placement.io annotations", "/metadata": "its gpu-placement.io annotations"}


def governed(policy: NamespacePolicy, config: Config) -> bool:
    """Whether the namespace has a GPU policy that /mutate applies: any gpu-placement.io/* namespace
    annotation, or `defaultNamespacePolicy: deny` (which makes every namespace's access a policy)."""
    return policy.annotated or config.default_namespace_policy == "deny"


def unshaped(ops: Sequence[Mapping[str, Any]], namespace: str, where: str) -> str:
    """The denial sentence for a pod /mutate would still patch with `ops` (webhook/admission.py
    `Admission._shape`, the function /mutate itself uses): what it lacks, why, and what to do."""
    fields = list(dict.fromkeys(_field(str(op["path"])) for op in ops))
    return (f"{where} was not shaped by gpu-placement's mutating webhook, which GPU pods in namespace {namespace} "
            f"must be (the namespace has a GPU policy); it lacks "
            f"{', '.join(fields)}. Most likely the webhook could not be reached when the pod was created (its "
            "failurePolicy is Ignore, so the API server went on without it): create the pod again. If this "
            "keeps happening, check the gpu-placement webhook's pods and its MutatingWebhookConfiguration")


def unshaped_warning(ops: Sequence[Mapping[str, Any]], where: str) -> str:
    """The warning for the same pod in a namespace without a GPU policy, which it may enter unshaped:
    kubectl prints it, so the user learns the pod will not be placed by gpu-placement."""
    fields = list(dict.fromkeys(_field(str(op["path"])) for op in ops))
    return (f"{where} was not shaped by gpu-placement's mutating webhook: it lacks {', '.join(fields)}, so it keeps "
            "its scheduler and runs without gpu-placement's GPU node checks. Most likely the webhook could not be "
            "reached when the pod was created (its failurePolicy is Ignore, so the API server went on without it): "
            "create the pod again to have it placed by gpu-placement")


def _field(path: str) -> str:
    for prefix, field in _FIELDS.items():
        if path == prefix or path.startswith(prefix + "/"):
            return field
    if "/resources/" in path:
        return "the GPU resource rewrite"
    return path
