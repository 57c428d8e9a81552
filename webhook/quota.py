"""Namespace GPU quota: what is in use, what this replica just admitted, and the over-quota sentences.

In use = the view's `namespace_usage` (GPU asks of the namespace's non-terminal pods, resource names
as stored, so after the rewrite) + pods this replica allowed in the last `reservationTTLSeconds` that
the view has not shown yet. Without the second part, a burst of pods (a Job with parallelism 20)
would each be checked against the same stale usage and all pass. A held pod is dropped as soon as
the view has it (same namespace/name and, when both are known, the same uid), or when its time is up
(the create failed later, or another webhook denied it).

Each replica holds only what it admitted itself: with 2 replicas a burst split between them can pass
a quota by what the other replica admitted in the last moments. The watch closes that gap within
its latency.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpu_placement import names as n
from gpu_placement.pods import GpuRequests
from gpu_placement.view import ClusterView
from webhook.text import units

__all__ = ["NOT_IN_QUOTA", "OVER_QUOTA", "Reservations", "quota_problems"]

OVER_QUOTA = "OverQuota"
NOT_IN_QUOTA = "NotInQuota"


@dataclass(slots=True)
class _Held:
    uid: str
    gpus: GpuRequests
    expires: float


class Reservations:
    """Pods admitted here, by namespace then `namespace/name`. Callers hold `view.lock`."""

    def __init__(self, view: ClusterView, ttl_seconds: float) -> None:
        self.view = view
        self.ttl = ttl_seconds
        self._by_namespace: dict[str, dict[str, _Held]] = {}
        self._next_sweep = 0.0

    def pending(self, namespace: str, exclude: str = "") -> dict[str, int]:
        """GPU asks held for the namespace, after dropping what the view has seen or what expired.
        `exclude`: the pod being decided, whose own earlier hold (the API server retried a call that
        timed out) must not count against it."""
        held = self._by_namespace.get(namespace)
        if not held:
            return {}
        self._prune(namespace, held, self.view.clock())
        total: dict[str, int] = {}
        for key, item in held.items():
            if key == exclude:
                continue
            for resource, count in item.gpus:
                total[resource] = total.get(resource, 0) + count
        return total

    def hold(self, namespace: str, key: str, uid: str, gpus: GpuRequests) -> None:
        now = self.view.clock()
        self._by_namespace.setdefault(namespace, {})[key] = _Held(uid, gpus, now + self.ttl)
        if now >= self._next_sweep:  # namespaces nobody asks about again must not keep their entries
            self._next_sweep = now + self.ttl
            for name, held in list(self._by_namespace.items()):
                self._prune(name, held, now)

    def __len__(self) -> int:
        return sum(len(held) for held in self._by_namespace.values())

    def _prune(self, namespace: str, held: dict[str, _Held], now: float) -> None:
        pods = self.view.pods
        for key, item in list(held.items()):
            seen = pods.get(key)
            if item.expires <= now or (seen is not None and (not item.uid or not seen.uid or seen.uid == item.uid)):
                del held[key]
        if not held:
            del self._by_namespace[namespace]


def quota_problems(namespace: str, quota: Mapping[str, int], used: Mapping[str, int], pending: Mapping[str, int],
                   asks: GpuRequests) -> list[tuple[str, str]]:
    """(reason code, sentence) for each resource the pod would take past the namespace's quota."""
    problems: list[tuple[str, str]] = []
    for resource, count in asks:
        limit = quota.get(resource)
        if limit is None:
            listed = ",".join(f"{r}={c}" for r, c in sorted(quota.items()))
            problems.append((NOT_IN_QUOTA, f"namespace {namespace} may not use {resource}: its {n.ANN_QUOTA} lists "
                                           f"only {listed} and this pod asks for {count} {resource}: ask for a listed "
                                           f"resource, or add {resource}=<count> to {n.ANN_QUOTA} on the namespace"))
            continue
        recent = pending.get(resource, 0)
        in_use = used.get(resource, 0) + recent
        if in_use + count > limit:
            just = f" ({recent} of them admitted moments ago)" if recent else ""
            problems.append((OVER_QUOTA, f"namespace {namespace} may use {limit} {resource} ({n.ANN_QUOTA}); "
                                         f"{units(in_use)} in use{just} and this pod asks {count} more: lower the "
                                         "request or raise the quota on the namespace"))
    return problems
