"""Which `gpu-placement.io/*` keys are read where, and the sentence for one that is not.

A misspelt key is silently nothing: `gpu-placement.io/qouta` on a namespace leaves it without a quota,
`gpu-placement.io/gpu-product` on a pod leaves its product choice to the namespace default. Every such
key gets a sentence naming it, where it is, the closest key that is read there (difflib, as pools
are matched), and, for a namespace-only key written on a pod (`quota`, `pools`), that it belongs on the
namespace. The webhook sends these as admission warnings; `explain`, `namespaces`, the metric
`gpu_placement_namespace_policy_problems` and the Namespace Events use the same sentences.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

from gpu_placement.base import names as n
from gpu_placement.base.text import quoted

__all__ = ["NAMESPACE_KEYS", "POD_KEYS", "SYSTEM_KEYS", "closest", "shown_key", "unread_namespace_keys",
           "unread_pod_keys"]

# Read on a namespace (gpu_placement/facts/policy.py parse_policy; the extender reads canary).
NAMESPACE_KEYS = (n.ANN_SHARING, n.ANN_QUOTA, n.ANN_POOLS, n.ANN_GPU_MEMORY, n.ANN_PRODUCTS, n.ANN_CUDA,
                  n.ANN_CANARY, n.ANN_ALLOCATION)
# Read on a pod (gpu_placement/decide/requirements.py, gpu_placement/facts/policy.py pod_annotation_problems).
POD_KEYS = (n.ANN_SHARING, n.ANN_GPU_MEMORY, n.ANN_PRODUCTS, n.ANN_CUDA, n.ANN_CUDA_COMPAT, n.ANN_MIN_DRIVER,
            n.ANN_MIN_COMPUTE)
# Written by gpu-placement itself: never a user's typo.
SYSTEM_KEYS = (n.ANN_ADMITTED, n.REGISTERED_ANNOTATION)
# The name part of a qualified annotation key (apimachinery validation.IsQualifiedName): what the API
# server lets onto an object. A key that is not one came in a forged review, and is shown quoted.
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_NAMED_AT_MOST = 5  # unread keys named one by one; more are counted


def shown_key(key: str) -> str:
    """An annotation key for a sentence: as written when the API server would take it (a qualified name),
    else quoted, escaped and cut (base/text.py `quoted`)."""
    return key if _NAME.fullmatch(key.removeprefix(n.PREFIX)) else quoted(key, 80)


def closest(key: str, known: Iterable[str]) -> str | None:
    """The known key a misspelt one most likely meant, compared without the shared prefix."""
    if not _NAME.fullmatch(key.removeprefix(n.PREFIX)):
        return None  # no key anyone can set is like it (and difflib's time grows with its length)
    names = {k.removeprefix(n.PREFIX): k for k in known}
    found = difflib.get_close_matches(key.removeprefix(n.PREFIX), list(names), n=1, cutoff=0.6)
    return names[found[0]] if found else None


def unread_namespace_keys(annotations: Mapping[str, object], namespace: str) -> list[str]:
    """One sentence per gpu-placement.io/* annotation on a namespace that nothing reads."""
    sentences = []
    for key in sorted(annotations):
        if not key.startswith(n.PREFIX) or key in NAMESPACE_KEYS or key in SYSTEM_KEYS:
            continue
        guess = closest(key, NAMESPACE_KEYS)
        if key in POD_KEYS:
            fix = f"it is a pod annotation: set it on the pods, or use a namespace annotation ({_list(NAMESPACE_KEYS)})"
        elif guess:
            fix = f"did you mean {guess}?"
        else:
            fix = f"namespace annotations: {_list(NAMESPACE_KEYS)}; remove it or fix its name"
        sentences.append(f"annotation {shown_key(key)} on namespace {namespace} is not read by gpu-placement: {fix}")
    return sentences


def unread_pod_keys(annotations: Mapping[str, object], where: str) -> list[str]:
    """One sentence per gpu-placement.io/* annotation on a pod that nothing reads (`where`: "pod ns/name")."""
    sentences = []
    unread = [key for key in annotations if key.startswith(n.PREFIX) and key not in POD_KEYS and key not in SYSTEM_KEYS]
    for key in sorted(unread)[:_NAMED_AT_MOST]:
        if key in NAMESPACE_KEYS:
            sentences.append(f"annotation {key} on {where} is a namespace annotation, not read on a pod: set it on "
                             "the namespace (the platform team's), or remove it from the pod")
            continue
        guess = closest(key, POD_KEYS)
        fix = f"did you mean {guess}?" if guess else f"pod annotations: {_list(POD_KEYS)}; remove it or fix its name"
        sentences.append(f"annotation {shown_key(key)} on {where} is not read by gpu-placement, so the pod gets its "
                         f"namespace's defaults instead: {fix}")
    if len(unread) > _NAMED_AT_MOST:
        sentences.append(f"{len(unread) - _NAMED_AT_MOST} more {n.PREFIX}* annotations on {where} are not read by "
                         "gpu-placement")
    return sentences


def _list(keys: Iterable[str]) -> str:
    return ", ".join(keys)
