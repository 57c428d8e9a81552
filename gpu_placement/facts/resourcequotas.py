"""The ResourceQuota named gpu-placement in a namespace, as the API server's quota admission reads it.

Quota admission (k8s.io/apiserver plugin/resourcequota, v1.37) enforces a ResourceQuota's
`status.hard` against its `status.used`, not its spec: a quota the quota controller has not counted
yet restricts nothing, and one whose `status.hard` names a resource without a `status.used` figure
refuses every pod asking for it ("status unknown for quota"). The webhook watches the one quota the
mirror keeps per namespace (name `gpu-placement`, fieldSelector: the only one its RBAC may read) to
know when the API server really enforces a namespace's `gpu-placement.io/quota`.

The API server's quota admission reads ResourceQuotas from its own informer (resource_access.go
`GetQuotas`: the lister; a live read only before that lister has synced), which may show a change
later than the webhook's watch does. A figure the webhook sees enforced may not be enforced yet by the
API server, so each record keeps when the view saw each key's figure change (`changes`), and the gate
asks whether a key has been enforced at a figure or below for the last few seconds (`settled`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_placement.base.quantity import QuantityError, quantity_to_int

__all__ = ["MIRROR_NAME", "SETTLE_SECONDS", "QuotaStatus", "observed", "quota_from_json"]

MIRROR_NAME = "gpu-placement"
# How long a figure must have been enforced in the webhook's view before the API server's informer is
# trusted to show it too: its lag behind the watch is milliseconds, seconds only on a starved API server.
SETTLE_SECONDS = 2.0


@dataclass(slots=True, frozen=True)
class QuotaStatus:
    namespace: str
    hard: Mapping[str, int]  # status.hard, the entries whose value is a whole number (requests.*, devices per class)
    used: frozenset[str]  # status.used: the resources it has counted
    # key -> (when the view saw it change, the figure enforced from then: None for none), oldest first: the
    # last change older than the settle time and every one since (`observed`)
    changes: Mapping[str, tuple[tuple[float, int | None], ...]] = field(default_factory=dict, compare=False)

    def enforced(self, key: str) -> int | None:
        """The figure the API server enforces for a ResourceQuota key (`requests.nvidia.com/gpu`,
        `gpu.nvidia.com.deviceclass.resource.k8s.io/devices`), or None when it enforces none yet."""
        return self.hard.get(key) if key in self.used else None

    def settled(self, key: str, limit: int, now: float, seconds: float) -> bool:
        """Whether the view has shown `key` enforced at `limit` or below for the last `seconds`: what the
        API server's own informer then shows too. A figure raised from one at or below `limit` stays
        settled (the API server enforces the old one or the new one); one lowered to it, or a key just
        counted, is not, until `seconds` have passed."""
        since = now - seconds
        changes = self.changes.get(key, ())
        if not changes or changes[0][0] > since:
            return False  # not seen for that long: the view's first list, or the key new
        if len(changes) == 1:  # unchanged since (the common case: /validate asks on every GPU pod)
            figure = changes[0][1]
            return figure is not None and figure <= limit
        start = max(i for i, (at, _) in enumerate(changes) if at <= since)
        return all(figure is not None and figure <= limit for _, figure in changes[start:])


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


def observed(status: QuotaStatus, previous: QuotaStatus | None, now: float, keep: float) -> QuotaStatus:
    """`status` as the view saw it at `now`, with the changes of `previous` carried on: a change is
    kept while the settle check may reach it (`keep` seconds) and the last one older than that."""
    changes: dict[str, tuple[tuple[float, int | None], ...]] = {}
    before = previous.changes if previous is not None else {}
    for key in {*before, *(key for key in status.hard if key in status.used)}:
        figure = status.enforced(key)
        history = before.get(key, ())
        if not history or history[-1][1] != figure:
            history = (*history, (now, figure))
        older = [i for i, (at, _) in enumerate(history) if at <= now - keep]
        if older:
            history = history[older[-1]:]
        if len(history) == 1 and history[0][1] is None and history[0][0] <= now - keep:
            continue  # not enforced for longer than anyone asks: as never seen
        changes[key] = history
    return QuotaStatus(status.namespace, status.hard, status.used, changes)
