"""Audit mode's /mutate: the patch is not sent, it is told.

In audit mode nothing a pod runs with changes (no scheduler, no node selection, no tolerations, no
resource rewrite, no annotation): /mutate allows the pod with no patch and a warning saying what
enforce mode would have done, which `kubectl` prints as `Warning: ...`. The warning is built from the
patch itself, so it cannot say something the patch would not do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_placement.base import names as n
from webhook.patches import Patch

__all__ = ["KEEP_OFF", "would_do"]

KEEP_OFF = f"keep it off GPU nodes (required node affinity {n.GPU_PRESENT} NotIn [true])"
_PREFIX = "audit mode, nothing changed: enforce mode would "


def would_do(ops: Patch, pools: Sequence[str] = ()) -> str:
    """One sentence: what the patch `ops` would change on the pod (annotations aside: bookkeeping)."""
    scheduler: str | None = None
    selector: dict[str, str] = {}
    tolerations: list[str] = []
    rewrites: dict[str, str] = {}
    affinity = keep_off = False
    removed: set[str] = set()
    for op in ops:
        path = op["path"]
        value: Any = op.get("value")  # JSON, shaped as the path says
        if path == "/spec/schedulerName":
            scheduler = value
        elif path == "/spec/nodeSelector":
            selector.update(value)
        elif path.startswith("/spec/nodeSelector/"):
            selector[_unescape(path.rsplit("/", 1)[1])] = value
        elif path.startswith("/spec/tolerations"):
            tolerations += [_toleration(t) for t in (value if isinstance(value, list) else [value])]
        elif path.startswith("/spec/affinity"):
            affinity = True
            keep_off = keep_off or _keeps_off(value)
        elif "/resources/" in path:
            resource = _unescape(path.rsplit("/", 1)[1])
            if op["op"] == "remove":
                removed.add(resource)
            elif resource != n.GPU_RESOURCE:
                rewrites[n.GPU_RESOURCE] = resource
    parts = []
    if n.GPU_RESOURCE in removed and rewrites:
        parts.append(f"rewrite {n.GPU_RESOURCE} to {rewrites[n.GPU_RESOURCE]}")
    if scheduler:
        parts.append(f"set schedulerName {scheduler}")
    if selector:
        parts.append("add nodeSelector " + ",".join(f"{k}={v}" for k, v in selector.items()))
    if tolerations:
        parts.append("add tolerations " + ", ".join(dict.fromkeys(tolerations)))
    if keep_off:
        parts.append(KEEP_OFF)
    elif affinity:
        parts.append(f"require the nodes of pools {', '.join(pools)}" if pools else "add a required node affinity")
    return _PREFIX + ("; ".join(parts) if parts else "record its GPU decision in annotations only")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _toleration(toleration: dict[str, Any]) -> str:
    key = toleration.get("key") or "every taint"
    effect = toleration.get("effect")
    return f"{key}:{effect}" if effect else key


def _keeps_off(value: Any) -> bool:
    """Whether an affinity value holds our keep-off-GPU-nodes expression anywhere."""
    if isinstance(value, dict):
        if value.get("key") == n.GPU_PRESENT and value.get("operator") == "NotIn":
            return True
        return any(_keeps_off(v) for v in value.values())
    if isinstance(value, list):
        return any(_keeps_off(v) for v in value)
    return False
