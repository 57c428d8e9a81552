"""The quota is hard from the first second: /validate admits a quota namespace's GPU pod only while the
API server's own quota admission enforces that quota (or a lower one).

Each replica counts only what it admitted itself (webhook/quota.py), so two replicas, each within the
quota, can together admit up to twice it. What makes the limit hard across replicas is the
ResourceQuota the mirror keeps (gpu_placement/controllers/quota_mirror.py): Kubernetes' quota admission runs after
every webhook and checks and counts each pod atomically (a compare-and-swap of the quota's
`status.used` in etcd). But it enforces `status.hard`, which the quota controller writes after the
mirror created or changed the ResourceQuota: until then, for the first second or so after the
annotation is set, nothing but the replicas' own counts stands in the way.

So /validate waits for it: it lets a pod asking for resource R through only when the namespace's
`gpu-placement` ResourceQuota, as its watch shows it, has had `status.hard[requests.R] <= N` with a
`status.used` figure for it for the last SETTLE_SECONDS, N being the figure the mirror writes for that
key (gpu_placement/decide/dra_quota.py `mirror_hard`, the one function both call: the annotation's
figure, a class's two names at one count, raised by the namespace's monitors' room). The
API server's quota admission reads the ResourceQuota from its own informer, which may show the counted
status later than the webhook's watch does: a pod let in the moment the webhook saw it was, in a burst
split between two replicas, admitted by an API server that did not enforce it yet (3 pods against a
quota of 2, the 4 after them refused `exceeded quota`). Otherwise the pod is refused with a sentence
to try again in a few seconds (503: nothing is wrong with the pod), and the API server's atomic check
is always the one that decides the last unit. A raised quota is enforced at its old, lower figure
until the controller catches up (the API server refuses the extra pods meanwhile) and passes on; a
lowered one refuses pods until the new figure has been in force for SETTLE_SECONDS. A replica is not
Ready until SETTLE_SECONDS after its first list of ResourceQuotas (`settled_readiness`), so a restart
refuses nothing that was in force before it.

A claim pod of a `dra` namespace is charged its stand-ins at its create and its claims' devices per
class (and `requests.<extendedResourceName>`) when they are made (gpu_placement/decide/dra_quota.py): it passes only
when every one of those keys is enforced at the mirror's figure or below (`keys_pending`).

Holds while the annotation is being set: a replica whose view does not show the annotation yet treats
the namespace as having none, for the milliseconds its watch is behind (a namespace created with the
annotation is read from the API server when the view lacks it, so it is gated from its first pod).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpu_placement.base import names as n
from gpu_placement.facts.pods import GpuRequests
from gpu_placement.facts.resourcequotas import MIRROR_NAME, SETTLE_SECONDS, QuotaStatus
from gpu_placement.view.cluster import ClusterView

__all__ = ["GATED_HOLD_SECONDS", "QUOTA_PENDING", "keys_pending", "quota_pending", "settled_readiness"]

QUOTA_PENDING = "QuotaPending"
# When a replica's hold (a pod it admitted that its view has not shown) is settled by a list of the
# namespace's pods, with the gate on. The API server's quota refuses what several replicas let in
# together beyond the quota, and those pods never come: without the gate their holds must last
# reservationTTLSeconds (60 s) against watch lag; with it the API server is the limit, so they are
# settled after a few seconds, and the namespace is not kept full by pods that do not exist.
GATED_HOLD_SECONDS = 5.0


def quota_pending(namespace: str, wanted: Mapping[str, int], status: QuotaStatus | None, asks: GpuRequests,
                  now: float) -> list[tuple[str, str]]:
    """(QUOTA_PENDING, sentence) for the first resource the pod asks for whose quota the API server does
    not enforce yet at the mirror's figure or below; [] when it does for all of them. `wanted`: what the
    mirror writes for the namespace (gpu_placement/decide/dra_quota.py `mirror_hard`, the same function)."""
    keys = {f"requests.{resource}": resource for resource, _ in asks}
    return keys_pending(namespace, wanted, status, list(keys), keys, now)


def keys_pending(namespace: str, wanted: Mapping[str, int], status: QuotaStatus | None, keys: Sequence[str],
                 names: Mapping[str, str], now: float) -> list[tuple[str, str]]:
    """The same for ResourceQuota keys: each of `keys` must have been enforced at `wanted[key]` (the mirror's
    figure) or below for the last SETTLE_SECONDS. A claim pod of a `dra` namespace is charged its stand-ins,
    devices per class and `requests.<extendedResourceName>` (gpu_placement/decide/dra_quota.py): all of them
    gated. `names`: how a sentence names a key (default: the key)."""
    for key in keys:
        limit = wanted.get(key)
        if limit is None:
            continue  # NotInQuota says so
        if status is not None and status.settled(key, limit, now, SETTLE_SECONDS):
            continue
        enforced = status.enforced(key) if status is not None else None
        if enforced is None:
            state = (f"ResourceQuota {namespace}/{MIRROR_NAME} does not exist yet" if status is None else
                     f"ResourceQuota {namespace}/{MIRROR_NAME} has not been counted for {key} yet")
            why = "gpu-placement writes it and Kubernetes' quota controller counts it within seconds of the annotation"
        elif enforced > limit:
            state = f"the API server still enforces {enforced} (ResourceQuota {namespace}/{MIRROR_NAME})"
            why = "the lower figure takes over within seconds"
        else:
            state = f"ResourceQuota {namespace}/{MIRROR_NAME} was counted at {enforced} only a moment ago"
            why = (f"the API server's quota admission reads it from its cache, which may lag, so {SETTLE_SECONDS:g} s "
                   "pass first")
        return [(QUOTA_PENDING,
                 f"namespace {namespace} may use {limit} {names.get(key, key)} ({n.ANN_QUOTA}), but {state}: {why}, "
                 "and until then GPU pods are refused so that never more than the quota is admitted: try again in a "
                 "few seconds (if this lasts, check the gpu-placement webhook's quota mirror: its log and "
                 "gpu_placement_quota_mirror_* metrics)")]
    return []


def settled_readiness(ready: Callable[[], tuple[bool, str]], view: ClusterView) -> Callable[[], tuple[bool, str]]:
    """`ready`, and not before SETTLE_SECONDS after the view's first list of ResourceQuotas: every figure
    that list showed is as new to the gate as one just counted, and would refuse pods until then."""
    def readiness() -> tuple[bool, str]:
        ok, why = ready()
        listed = view.listed_at.get("resourcequotas")
        age = view.clock() - listed if listed is not None else SETTLE_SECONDS
        if not ok or age >= SETTLE_SECONDS:
            return ok, why
        return False, (f"ResourceQuotas listed {age:.1f} s ago: the quota gate trusts a figure it has seen "
                       f"for {SETTLE_SECONDS:g} s")
    return readiness
