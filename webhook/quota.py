"""Namespace GPU quota: what is in use, what this replica just admitted, and the over-quota sentences.

In use = the view's `namespace_usage` (GPU asks of the namespace's non-terminal pods, resource names
as stored, so after the rewrite). Pods this replica allowed that the view has not shown yet (holds)
only warn: anyone who reaches the webhook port can make a hold with a forged AdmissionReview, so a
hold must never refuse a team's pod. A burst (a Job with parallelism 20) is stopped at the quota by
the ResourceQuota the service mirrors (gpu_placement/controllers/quota_mirror.py), which the API server checks
atomically at each create, across any number of webhook replicas.

A hold is dropped only when it is known how it ended:
- the view has the pod (same namespace/name and, when both are known, the same uid): it counts there;
- this webhook later denied the same pod (the API server called again): that create did not happen;
- `reservationTTLSeconds` after it was made, a list of the namespace's pods that started after that
  moment does not have it: the create failed later (another webhook or the API server's quota
  refused it). A pod in that list that the view still lacks (a stalled watch) stays held, so a
  watch that stopped telling never lets more than the quota in. `webhook/holds.py` makes the lists.
Time alone ends a hold only where there is no API server to ask (`--snapshot`).

A pod of a `dra` namespace asks for no GPU resource: its ResourceClaims, which kube-controller-manager
makes from its templates after the pod exists, take the devices, and `view.dra.namespace_devices`
counts them once they exist. So its hold (in ResourceQuota keys: gpu_placement/decide/dra_quota.py) is not dropped
when the view shows the pod: its stand-ins count in the view's pods from then on, and the rest is
what the pod's claims have not charged yet; it ends when all of them exist (`charged`), or when the
pod, once seen, is gone or finished (`gone`), or as above.

Each replica holds only what it admitted itself; holds are bounded per namespace (MAX_HOLDS).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.base.text import units
from gpu_placement.decide.claims import devices_quota_key, one_count
from gpu_placement.decide.dra_quota import mapped, raised_names
from gpu_placement.facts.dra import DeviceClass, implicit_name
from gpu_placement.facts.pods import GpuRequests, PodRecord
from gpu_placement.facts.sharing import is_standin
from gpu_placement.observe.metrics import QUOTA_HOLD_OLDEST, QUOTA_HOLD_SETTLEMENTS, QUOTA_HOLDS
from gpu_placement.view.cluster import ClusterView, same_pod

__all__ = ["MAX_HOLDS", "NOT_IN_QUOTA", "OVER_QUOTA", "Reservations", "held_warnings", "name_advice", "quota_problems",
           "unheld_names"]

OVER_QUOTA = "OverQuota"
NOT_IN_QUOTA = "NotInQuota"
# How a hold ended (gpu_placement_quota_hold_settlements_total): the view showed the pod; this webhook
# denied it later; a list of the namespace's pods lacked it; its time ran out (no API server); a claim
# pod's claims all exist; a claim pod the view showed is gone or finished; the namespace had MAX_HOLDS.
SETTLEMENTS = ("seen", "released", "not_created", "expired", "charged", "gone", "evicted")
# Holds kept per namespace: the oldest goes first past it. Only forged reviews (or a quota of thousands of
# units) reach it; a hold only warns, and forged ones would otherwise pile up.
MAX_HOLDS = 1024


@dataclass(slots=True)
class _Held:
    uid: str
    gpus: GpuRequests
    made: float
    due: float  # from then on, a list of the namespace's pods started later settles it
    claims: int = 0  # a pod of a `dra` namespace: the claims its templates will make (0: a device-plugin pod)
    seen: bool = False  # such a pod was in the view: from then on the view tells when it is gone
    standins: bool = False  # such a pod carries its stand-ins: once seen, the view counts them (namespace_usage)


class Reservations:
    """Pods admitted here, by namespace then `namespace/name`. Callers hold `view.lock`.

    `listed`: holds are settled by lists of pods (`settle`, fed by webhook/holds.py) and never expire
    by time alone; False (no API server) lets them expire `ttl_seconds` after they were made."""

    def __init__(self, view: ClusterView, ttl_seconds: float, listed: bool = False) -> None:
        self.view = view
        self.ttl = ttl_seconds
        self.listed = listed
        self._by_namespace: dict[str, dict[str, _Held]] = {}
        self._next_sweep = 0.0
        self._settled = {outcome: QUOTA_HOLD_SETTLEMENTS.labels(outcome) for outcome in SETTLEMENTS}
        me = weakref.ref(self)  # the registry must not keep a replaced instance (tests make many) alive

        def figures(index: int) -> float:
            live = me()
            if live is None:
                return 0.0
            with view.lock:
                return live._figures()[index]

        QUOTA_HOLDS.set_function(lambda: figures(0))
        QUOTA_HOLD_OLDEST.set_function(lambda: figures(1))

    def pending(self, namespace: str, exclude: str = "") -> dict[str, int]:
        """GPU asks held for the namespace, after dropping what the view has seen (or, unlisted, what
        expired). `exclude`: the pod being decided, whose own earlier hold (the API server retried a
        call that timed out) must not count against it."""
        held = self._by_namespace.get(namespace)
        if not held:
            return {}
        self._prune(namespace, held, self.view.clock())
        total: dict[str, int] = {}
        for key, item in held.items():
            if key == exclude:
                continue
            for resource, count in self._uncharged(item):
                total[resource] = total.get(resource, 0) + count
        return total

    def hold(self, namespace: str, key: str, uid: str, gpus: GpuRequests, claims: int = 0,
             standins: bool = False) -> None:
        """`claims`: for a pod of a `dra` namespace, how many claims its templates make; `gpus` are then
        ResourceQuota keys (gpu_placement/decide/dra_quota.py: stand-ins, devices per class, requests.<extended>), and
        `standins` whether the pod carries its stand-ins."""
        now = self.view.clock()
        held = self._by_namespace.setdefault(namespace, {})
        if key not in held and len(held) >= MAX_HOLDS:
            del held[min(held, key=lambda k: held[k].made)]
            self._settled["evicted"].inc()
        held[key] = _Held(uid, gpus, now, now + self.ttl, claims, standins=standins)
        if now >= self._next_sweep:  # namespaces nobody asks about again must not keep their entries
            self._next_sweep = now + self.ttl
            for name, held in list(self._by_namespace.items()):
                self._prune(name, held, now)

    def release(self, namespace: str, key: str, uid: str) -> None:
        """This webhook denied the pod after all (a later call for the same pod): its create will not
        happen, whatever an earlier call allowed."""
        held = self._by_namespace.get(namespace)
        item = held.get(key) if held else None
        if held is not None and item is not None and (not uid or not item.uid or item.uid == uid):
            del held[key]
            self._settled["released"].inc()
            if not held:
                del self._by_namespace[namespace]

    def overdue(self, now: float) -> list[str]:
        """Namespaces with a hold whose time is up and the view has not seen: a list of their pods
        will settle them."""
        due = []
        for name, held in list(self._by_namespace.items()):
            self._prune(name, held, now)
            if any(item.due <= now and not item.seen for item in held.values()):
                due.append(name)
        return due

    def settle(self, namespace: str, listed_at: float, present: Mapping[str, str]) -> int:
        """A list of the namespace's pods (key -> uid) that started at `listed_at` is in. A hold due by
        then whose pod it lacks will not come: dropped (a claim pod the view has shown ends by the view).
        Returns how many were dropped."""
        held = self._by_namespace.get(namespace)
        if not held:
            return 0
        gone = [key for key, item in held.items() if item.due <= listed_at and not item.seen and (
            key not in present or (item.uid and present[key] and present[key] != item.uid))]
        for key in gone:
            del held[key]
        self._settled["not_created"].inc(len(gone))
        if not held:
            del self._by_namespace[namespace]
        return len(gone)

    def __len__(self) -> int:
        return sum(len(held) for held in self._by_namespace.values())

    def _figures(self) -> tuple[float, float]:
        """(holds, age of the oldest in seconds) for a scrape; the caller holds `view.lock`."""
        made = [item.made for held in self._by_namespace.values() for item in held.values()]
        return float(len(made)), (self.view.clock() - min(made) if made else 0.0)

    def _prune(self, namespace: str, held: dict[str, _Held], now: float) -> None:
        pods = self.view.pods
        for key, item in list(held.items()):
            seen = pods.get(key)
            if seen is not None and not same_pod(item.uid, seen.uid):
                seen = None  # another pod of that name: this one is not (or no longer) there
            outcome = self._claim_outcome(item, seen) if item.claims else "seen" if seen is not None else None
            if outcome is None and not self.listed and item.due <= now:
                outcome = "expired"
            if outcome is not None:
                del held[key]
                self._settled[outcome].inc()
        if not held:
            del self._by_namespace[namespace]

    def _claim_outcome(self, item: _Held, seen: PodRecord | None) -> str | None:
        """A claim pod's hold: ends when all its claims exist (they count in the view's namespace
        devices from then on), or when the pod the view showed is gone or finished."""
        if seen is not None:
            item.seen = True
            item.uid = item.uid or seen.uid
        made = self.view.dra.made_for_pod.get(item.uid) if item.uid else None
        if made is not None and made.claims >= item.claims:
            return "charged"
        if item.seen and (seen is None or not seen.active):
            return "gone"
        return None

    def _uncharged(self, item: _Held) -> GpuRequests:
        """What the held pod will still take: a claim pod's asks less what the view counts of it already
        (its stand-ins once it is seen; what its claims made so far charge)."""
        if not item.claims:
            return item.gpus
        dra = self.view.dra
        made = dra.made_for_pod.get(item.uid) if item.uid else None
        charged: dict[str, int] = {}
        for device_class, number in made.devices.items() if made is not None else ():
            for charged_key in (devices_quota_key(device_class), *_extended_keys(device_class, dra.classes)):
                charged[charged_key] = charged.get(charged_key, 0) + number
        counted = item.seen and item.standins
        return tuple((key, count - charged.get(key, 0)) for key, count in item.gpus
                     if count > charged.get(key, 0) and not (counted and _is_standin_key(key)))


def _extended_keys(name: str, classes: Mapping[str, DeviceClass]) -> tuple[str, ...]:
    """`requests.X` and `requests.deviceclass.resource.kubernetes.io/<class>` for a DeviceClass naming
    extendedResourceName X: where the API server charges its claims too."""
    found = classes.get(name)
    return (f"requests.{found.extended_resource}", f"requests.{implicit_name(name)}") if (
        found is not None and found.extended_resource) else ()


def _is_standin_key(key: str) -> bool:
    return key.startswith("requests.") and is_standin(key[len("requests."):])


def quota_problems(namespace: str, quota: Mapping[str, int], used: Mapping[str, int], asks: GpuRequests,
                   names: Mapping[str, str] | None = None,
                   advice: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(reason code, sentence) for each resource the pod would take past the namespace's quota, counting what
    the view shows in use (holds only warn: `held_warnings`). `names`: how the sentence names a key (a claim
    pod's ResourceQuota keys, gpu_placement/decide/dra_quota.py); `advice`: what a NotInQuota sentence tells
    to do for a resource, where the default would mislead (`name_advice`)."""
    problems: list[tuple[str, str]] = []
    for key, count in asks:
        limit = quota.get(key)
        resource = names.get(key, key) if names else key
        if limit is None:
            listed = ",".join(f"{r}={c}" for r, c in sorted(quota.items()))
            fix = (advice or {}).get(key) or (f"ask for a listed resource, or add {resource}=<count> to {n.ANN_QUOTA} "
                                              "on the namespace")
            problems.append((NOT_IN_QUOTA, f"namespace {namespace} may not use {resource}: its {n.ANN_QUOTA} lists "
                                           f"only {listed} and this pod asks for {count} {resource}: {fix}"))
            continue
        in_use = used.get(key, 0)
        if in_use > limit:  # pods the quota did not hold when they came: no request fits until some end
            problems.append((OVER_QUOTA, f"namespace {namespace} may use {limit} {resource} ({n.ANN_QUOTA}); "
                                         f"{units(in_use)} in use, already over its quota by pods admitted before "
                                         "gpu-placement held them to it (installed or switched to enforce since, or "
                                         f"the quota lowered since), and this pod asks {count} more: no GPU pod of "
                                         "the namespace is admitted until it is under its quota again: end some of "
                                         "those pods, or raise the quota on the namespace"))
        elif in_use + count > limit:
            problems.append((OVER_QUOTA, f"namespace {namespace} may use {limit} {resource} ({n.ANN_QUOTA}); "
                                         f"{units(in_use)} in use and this pod asks {count} more: lower the "
                                         "request or raise the quota on the namespace"))
    return problems


def held_warnings(namespace: str, quota: Mapping[str, int], used: Mapping[str, int], pending: Mapping[str, int],
                  asks: GpuRequests, names: Mapping[str, str] | None = None) -> list[str]:
    """Pods admitted moments ago that the view has not shown yet do not refuse a pod, since a caller that is
    not the API server could have made them up (docs/webhook.md, "Who may hold quota"): they are told."""
    texts = []
    for key, count in asks:
        limit, recent = quota.get(key), pending.get(key, 0)
        if limit is None or not recent or used.get(key, 0) + recent + count <= limit:
            continue
        resource = names.get(key, key) if names else key
        texts.append(f"namespace {namespace} may use {limit} {resource} ({n.ANN_QUOTA}); {units(used.get(key, 0))} "
                     f"in use, {recent} more admitted moments ago may yet be created, and this pod asks {count} "
                     "more: if they all are, this one goes over the quota (where gpu-placement mirrors the quota "
                     "into a ResourceQuota, the API server refuses it)")
    return texts


# -- a DeviceClass's two names (docs/webhook.md, "Two names for one class's GPUs") ----------------------------

def name_advice(quota: Mapping[str, int], asks: GpuRequests, config: Config, dra: bool,
                classes: Mapping[str, DeviceClass]) -> dict[str, str]:
    """What NotInQuota tells a pod asking a class's implicit name (`deviceclass.resource.kubernetes.io/<class>`)
    that the quota does not list, where the class names an extendedResourceName X that it does: the two
    names are one count (gpu_placement/decide/claims.py `one_count`), so X is the plain fix; listing the
    implicit name too is offered only where it would then be held to the quota (`unheld_names`)."""
    advice: dict[str, str] = {}
    figures = one_count(quota, classes)
    for resource, _ in asks:
        if resource in quota or not resource.startswith(n.IMPLICIT_CLASS_PREFIX):
            continue
        device_class = resource[len(n.IMPLICIT_CLASS_PREFIX):]
        other = mapped(classes, device_class)
        if other is None or other not in quota:
            continue
        fix = f"ask for {other} instead (the same devices of DeviceClass {device_class})"
        if not unheld_names("", {**quota, resource: figures[other]}, ((resource, 1),), config, dra, classes):
            fix += (f", or add {resource}={figures[other]} to {n.ANN_QUOTA} on the namespace (the two names share one "
                    "count: listed both, the lower figure binds both)")
        advice[resource] = fix
    return advice


def unheld_names(namespace: str, quota: Mapping[str, int], asks: GpuRequests, config: Config, dra: bool,
                 classes: Mapping[str, DeviceClass]) -> list[tuple[str, str]]:
    """NotInQuota for a pod asking a class's implicit name that the API server could not hold to the quota at
    its create: in a `dra` namespace whose quota also gives other GPUs of the class (a shared level), the
    mirror raises that name's key to all the class's devices, since their claims are charged there too
    (gpu_placement/decide/dra_quota.py `raised_names`); the pod pays only that key at its create and carries
    no stand-in. A pod asking the class's extendedResourceName there gets claims from the namespace's
    templates instead, held by its stand-ins (gpu_placement/decide/claims.py `keeps_resource`)."""
    if not dra:
        return []
    raised = raised_names(quota, config, classes)
    problems = []
    for resource, _ in asks:
        if resource not in raised or not resource.startswith(n.IMPLICIT_CLASS_PREFIX):
            continue
        figure, written = raised[resource]
        device_class = resource[len(n.IMPLICIT_CLASS_PREFIX):]
        other = mapped(classes, device_class) or n.GPU_RESOURCE
        instead = f"ask for {other} instead" if other in quota else (
            f"list {other}={figure} in {n.ANN_QUOTA} in its place and ask for {other}")
        problems.append((NOT_IN_QUOTA, (
            f"namespace {namespace} may not use {resource} beside the other GPUs of DeviceClass {device_class} its "
            f"{n.ANN_QUOTA} gives: the API server charges their claims to requests.{resource} as well, so that key "
            f"is written at {written}, and a pod asking {resource} could not be held to {figure} at its create: "
            f"{instead} (gpu-placement gives it a device of {device_class}, held to the quota)")))
    return problems
