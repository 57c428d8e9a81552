"""The ResourceQuota named gpu-placement in a namespace, as the API server's quota admission reads it.

Quota admission (k8s.io/apiserver plugin/resourcequota, v1.37) enforces a ResourceQuota's
`status.hard` against its `status.used`, not its spec: a quota the quota controller has not counted
yet restricts nothing, and one whose `status.hard` names a resource without a `status.used` figure
refuses every pod asking for it ("status unknown for quota"). The webhook watches the one quota the
mirror keeps per namespace (name `gpu-placement`, fieldSelector: the only one its RBAC may read) to
know when the API server really enforces a namespace's `gpu-placement.io/quota`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_placement.base.quantity import QuantityError, quantity_to_int

__all__ = ["MIRROR_NAME", "QuotaStatus", "quota_from_json"]

MIRROR_NAME = "gpu-placement"


@dataclass(slots=True, frozen=True)
class QuotaStatus:
    namespace: str
    hard: Mapping[str, int]  # status.hard, the entries whose value is a whole number (requests.*, devices per class)
    used: frozenset[str]  # status.used: the resources it has counted

    def enforces(self, resource: str) -> int | None:
        """The most of `resource` the API server lets the namespace's pods request together, or None
        when it does not enforce one (not in status.hard, or not counted yet)."""
        return self.enforced(f"requests.{resource}")

    def enforced(self, key: str) -> int | None:
        """The figure the API server enforces for a ResourceQuota key (`requests.nvidia.com/gpu`,
        `gpu.nvidia.com.deviceclass.resource.k8s.io/devices`), or None when it enforces none yet."""
        return self.hard.get(key) if key in self.used else None


def quota_from_json(obj: Mapping[str, Any]) -> QuotaStatus:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    hard: dict[str, int] = {}
    for key, value in (status.get("hard") or {}).items():
        try:
            hard[str(key)] = quantity_to_int(value)
        except (QuantityError, TypeError, ValueError):
            continue  # not a count: no key of ours
    used = status.get("used") or {}
    return QuotaStatus(str(meta.get("namespace") or "default"), hard,
                       frozenset(str(key) for key in used) if isinstance(used, dict) else frozenset())
