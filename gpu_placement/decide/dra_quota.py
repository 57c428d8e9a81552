"""A `dra` namespace's quota as kube-apiserver charges it, and what a claim pod will be charged.

What the API server charges (kube-apiserver v1.37.2, pkg/quota/v1/evaluator/core):
- a ResourceClaim, when kube-controller-manager makes it from the pod's template (resource_claims.go
  `Usage`): `<class>.deviceclass.resource.k8s.io/devices` for each device it asks (each claim of ours
  is one device); and, with the DRAExtendedResource feature gate (alpha and off in 1.34 and 1.35, beta
  and on in 1.36, GA and locked on in 1.37: pkg/features/kube_features.go), `addExtendedResourceQuota`
  also charges it `requests.deviceclass.resource.kubernetes.io/<class>` and, where the DeviceClass
  names `extendedResourceName: X` (NVIDIA's gpu.nvidia.com names nvidia.com/gpu), `requests.X`. Only
  keys the ResourceQuota lists restrict anything (`MatchingResources`). Where the gate is off the API
  server drops `extendedResourceName` from DeviceClasses it stores (pkg/registry/resource/deviceclass
  strategy.go `dropDisabledDRAExtendedResourceFields`), so the view's classes tell which world it is.
- a pod, at its create (pods.go `podComputeUsageHelper`): `requests.R` for each extended resource R
  its containers ask for. This one is atomic across webhook replicas: it is the pod's own admission.

Claims are charged after the pod exists, so a pod whose claims the API server then refuses is
admitted and stays Pending. So /mutate gives every claim pod of gpu-placement's scheduler in a `dra`
namespace with a quota a stand-in extended resource per device, by level (`gpu-placement.io/gpu`,
`gpu-placement.io/gpu.shared`, `gpu-placement.io/mig-<profile>`: gpu_placement/facts/sharing.py
`standin_of`), and the mirror writes `requests.<stand-in>` = the annotation's figure for that level:
the API server refuses the pod itself at create, per level, atomically. No node has a stand-in: the
chart's scheduler profile ignores the group for node fit (NodeResourcesFit `ignoredResourceGroups`),
kube-scheduler's DynamicResources plugin looks only at extended resources a DeviceClass maps, and the
kubelet drops extended resources its node lacks before its own fit check
(pkg/kubelet/lifecycle/predicate.go `removeMissingExtendedResources`).

The mirror writes (`claim_hard`), beyond `requests.<resource>` of the annotation: the stand-ins per
level; the devices per class (`device_hard`); and, where the view's DeviceClass of a class names X,
`requests.X` and `requests.deviceclass.resource.kubernetes.io/<class>` (those listed) no lower than that
class's devices, so claims charged there are not refused below the devices key. /validate counts the
same keys (`claim_charge`, `claim_usage`) and refuses first. What the mirror writes is `mirror_hard`,
which the quota gate reads too: it waits for exactly the figures the mirror writes.

The two names of a class (X and the implicit one) limit the same devices, since every claim of the class
is charged to both: in the annotation they are one count, the lower figure binding both
(gpu_placement/decide/claims.py `one_count`; docs/webhook.md, "Two names for one class's GPUs").

A pod that asks an extended resource a DeviceClass serves (`nvidia.com/gpu`, or the class's implicit
`deviceclass.resource.kubernetes.io/<class>`) and lands where kube-scheduler serves it through DRA is
charged twice as well: `requests.<what it asked>` at its create, and the claim kube-scheduler makes
for it (annotated resource.kubernetes.io/extended-resource-claim, owned by the pod) the class's devices
and both names of the class, less what the pod asked of each (resource_claims.go
`addExtendedResourceQuota`, `getVerifiedPodUsage`): a pod asking `nvidia.com/gpu: 1` is charged
requests.nvidia.com/gpu once, at its create, and its claim requests.deviceclass.resource.kubernetes.io/
gpu.nvidia.com (only where the class names an extendedResourceName: the claim evaluator's
`MatchingResources`). So /validate counts against each name of a class (`resource_usage`) the pods
asking either name and the claims of the class that kube-scheduler did not make for a pod, and charges
a pod asking one name the other too where the quota lists it (`plain_charge`; a pod the device plugin
serves is never charged the second: counted anyway, the count errs on the side of refusing early).

Monitors (claims whose every request has admin access: a DCGM exporter) are charged like any claim
(resource_claims_test.go: "Admins are *not* exempt from quota"; allocationMode All counts 32 devices).
So that they never take a namespace's quota, the mirror raises every key they are charged by what they
are charged, for their claims and for the claims their pods wait for (`monitor_devices`,
`monitor_room`), and /validate counts the namespace's use without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.decide.claims import device_hard, devices_quota_key, one_count
from gpu_placement.facts.dra import DeviceClass, implicit_name
from gpu_placement.facts.pods import GpuRequests, effective_gpu_requests
from gpu_placement.facts.sharing import Sharing, is_standin, parse_sharing, sharing_of_resource, standin_of
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.dra import DraState

__all__ = ["ClaimCharge", "by_kind", "claim_charge", "claim_hard", "claim_names", "claim_usage", "is_standin_key",
           "level_quota", "mapped", "mirror_hard", "monitor_devices", "monitor_room", "plain_charge", "pod_standins",
           "raised_names", "resource_usage"]

_REQUESTS = "requests."
_DEVICES = devices_quota_key("")  # the suffix


def mirror_hard(quota: Mapping[str, int], config: Config, dra: bool, classes: Mapping[str, DeviceClass],
                monitors: Mapping[str, int], claims: Mapping[str, str] | None = None) -> dict[str, int]:
    """The ResourceQuota `spec.hard` the mirror writes for a namespace's annotation, and so the figure the
    quota gate waits to see enforced for each key (webhook/quota_gate.py): one function for both, or the
    gate waits for a figure the mirror never writes. `requests.<resource>` for each resource (the names of
    one class's devices at one count, `one_count`); in a `dra` namespace (`dra`) what claim pods are
    charged (`claim_hard`, or `claims` where the caller has it already); each key raised by what the
    namespace's monitors are charged there (`monitors`: devices per class, `monitor_devices`;
    `monitor_room`). `classes`: the view's DeviceClasses (hold its lock)."""
    hard = {f"{_REQUESTS}{resource}": count for resource, count in sorted(one_count(quota, classes).items())}
    if dra:
        claims = claim_hard(quota, config, classes) if claims is None else claims
        hard.update((key, int(value)) for key, value in claims.items())
    for key, extra in monitor_room(hard, monitors, classes).items():
        hard[key] += extra
    return hard


def level_quota(quota: Mapping[str, int], config: Config,
                classes: Mapping[str, DeviceClass] | None = None) -> dict[Sharing, int]:
    """The annotation's figures by level: the levels' resources (`nvidia.com/gpu`, the shared resource,
    `nvidia.com/mig-<profile>`); several whole-GPU resources (gpuResources) add up, as in `device_hard`.
    A class's implicit name is no level: its pods keep it (gpu_placement/decide/claims.py `keeps_resource`)
    and carry no stand-in; its figure binds the class's other name (`one_count`)."""
    levels: dict[Sharing, int] = {}
    for resource, count in one_count(quota, classes or {}).items():
        if config.is_gpu_resource(resource) and not resource.startswith(n.IMPLICIT_CLASS_PREFIX):
            level = sharing_of_resource(resource, config)
            levels[level] = levels.get(level, 0) + count
    return levels


def claim_hard(quota: Mapping[str, int], config: Config, classes: Mapping[str, DeviceClass]) -> dict[str, str]:
    """What the mirror writes for a `dra` namespace beyond `requests.<resource>`: the stand-ins per level, the
    devices per class, and the names of a class that names an extendedResourceName (`requests.X` and
    `requests.deviceclass.resource.kubernetes.io/<class>`, where listed) raised to the class's devices:
    the API server charges every claim of the class to both. `classes`: the view's DeviceClasses (hold
    its lock)."""
    figures = one_count(quota, classes)
    devices = device_hard(quota, config, classes)
    hard = dict(devices)
    for level, count in sorted(level_quota(quota, config, classes).items(), key=lambda item: item[0].text):
        hard[f"{_REQUESTS}{standin_of(level)}"] = str(count)
    for name, floor in _floors(quota, devices, classes).items():
        hard[f"{_REQUESTS}{name}"] = str(max(figures[name], floor))
    return hard


def _floors(quota: Mapping[str, int], devices: Mapping[str, str], classes: Mapping[str, DeviceClass]
            ) -> dict[str, int]:
    """For each listed name of a class that names an extendedResourceName, the devices of the classes
    charged to it: its `requests.` key may not be lower, or the API server refuses their claims there."""
    floors: dict[str, int] = {}
    for key, count in devices.items():
        device_class = key[: -len(_DEVICES)]
        found = classes.get(device_class)
        for name in _names(device_class, found) if found is not None else ():
            if name in quota:
                floors[name] = floors.get(name, 0) + int(count)
    return floors


def raised_names(quota: Mapping[str, int], config: Config, classes: Mapping[str, DeviceClass]
                 ) -> dict[str, tuple[int, int]]:
    """In a `dra` namespace, the listed names of a class whose `requests.` key `claim_hard` raises above their
    figure (the quota gives other GPUs of the class too, whose claims are charged there): name -> (figure,
    what the key is written at). A pod kept on such a name pays only that key at its create, so the API
    server would not hold it to the figure: `keeps_resource` converts `nvidia.com/gpu` pods there (their
    stand-ins hold them), and /validate refuses pods asking the implicit name (webhook/quota.py)."""
    figures = one_count(quota, classes)
    return {name: (figures[name], floor) for name, floor in _floors(quota, device_hard(quota, config, classes),
                                                                     classes).items() if floor > figures[name]}


def mapped(classes: Mapping[str, DeviceClass], device_class: str) -> str | None:
    """The extended resource a DeviceClass names (only where the API server kept the field: DRAExtendedResource)."""
    found = classes.get(device_class)
    return found.extended_resource if found is not None else None


def is_standin_key(key: str) -> bool:
    return key.startswith(_REQUESTS) and is_standin(key[len(_REQUESTS):])


@dataclass(slots=True, frozen=True)
class ClaimCharge:
    """What a claim pod will be charged, by ResourceQuota key, and whether the API server charges it at
    the pod's own create."""

    asks: GpuRequests  # (quota key, units), sorted
    levels: tuple[tuple[Sharing, int], ...]  # devices of gpu-placement's templates, by level
    covered: bool  # every device is of a level, and the pod's stand-ins cover each level: atomic at create


def claim_charge(dra: DraState, namespace: str, spec: Mapping[str, Any], standins: GpuRequests) -> ClaimCharge:
    """The charges of the claims the pod's templates make (claims that exist are charged already), and
    of its stand-ins. `standins`: the pod's own (effective) stand-in requests. Hold the view's lock."""
    asks: dict[str, int] = {}
    levels: dict[Sharing, int] = {}
    every_device_levelled = True
    for entry in spec.get("resourceClaims") or ():
        name = entry.get("resourceClaimTemplateName") if isinstance(entry, Mapping) else None
        template = dra.templates.get(f"{namespace}/{name}") if name else None
        if template is None or template.monitor:  # a monitor's claim has room of its own (`monitor_room`)
            continue
        level = _level(template.level)
        for device_class, count in template.devices:
            if device_class not in dra.gpu_classes:
                continue
            _add(asks, devices_quota_key(device_class), count)
            found = dra.classes.get(device_class)
            for name in _names(device_class, found) if found is not None else ():  # requests.X and the implicit name
                _add(asks, f"{_REQUESTS}{name}", count)
            if level is None:
                every_device_levelled = False
                continue
            levels[level] = levels.get(level, 0) + count
            _add(asks, f"{_REQUESTS}{standin_of(level)}", count)
    own = dict(standins)
    covered = bool(levels) and every_device_levelled and all(
        own.get(standin_of(level), 0) >= count for level, count in levels.items())
    return ClaimCharge(tuple(sorted(asks.items())), tuple(sorted(levels.items(), key=lambda item: item[0].text)),
                       covered)


def pod_standins(spec: Mapping[str, Any]) -> GpuRequests:
    return effective_gpu_requests(spec, is_standin)


def claim_usage(usage: Mapping[str, int], devices: Mapping[str, int], classes: Mapping[str, DeviceClass],
                keys: Any, extended: Mapping[str, int] | None = None,
                monitors: Mapping[str, int] | None = None) -> dict[str, int]:
    """What the API server counts for each key in the namespace, monitors aside, from the view: `usage`
    (its pods' GPU and stand-in requests, view.namespace_usage), `devices` (its claims' devices per class)
    and, of those, `extended` (the claims kube-scheduler made for pods' extended resources:
    view.dra.namespace_extended) and `monitors` (admin-access claims: view.dra.namespace_monitors)."""
    used: dict[str, int] = {}
    for key in keys:
        if key.endswith(_DEVICES):
            device_class = key[: -len(_DEVICES)]
            used[key] = devices.get(device_class, 0) - (monitors or {}).get(device_class, 0)
        elif key.startswith(_REQUESTS):
            used[key] = resource_usage(key[len(_REQUESTS):], usage, devices, classes, extended, monitors)
    return used


def _names(device_class: str, found: DeviceClass) -> frozenset[str]:
    """The extended resources whose quota a claim of the class is charged: its extendedResourceName and
    its implicit name, both only where it names one (the claim evaluator's `MatchingResources` matches
    the implicit key only for a class with an extendedResourceName)."""
    return frozenset((found.extended_resource, implicit_name(device_class))) if found.extended_resource \
        else frozenset()


def resource_usage(resource: str, usage: Mapping[str, int], devices: Mapping[str, int],
                   classes: Mapping[str, DeviceClass], extended: Mapping[str, int] | None = None,
                   monitors: Mapping[str, int] | None = None) -> int:
    """What the API server counts against `requests.<resource>` in a namespace, monitors aside: its pods
    asking it, and for each class charged to it, its claims but those kube-scheduler made for a pod's
    extended resources (their pod's own create paid for what it asked) and monitors' (the mirror gives
    their charge room of its own: `monitor_room`), and the pods asking the class's other name (their
    claim pays this one)."""
    total = usage.get(resource, 0)
    for device_class, found in classes.items():
        names = _names(device_class, found)
        if resource in names:
            total += devices.get(device_class, 0) - (extended or {}).get(device_class, 0) - (
                monitors or {}).get(device_class, 0)
            total += sum(usage.get(other, 0) for other in names if other != resource)
    return total


def monitor_devices(view: ClusterView, namespace: str) -> dict[str, int]:
    """Devices per class the API server charges a namespace's monitors (admin-access claims: not exempt
    from quota, resource_claims_test.go "admin"): their claims that exist, and those their pods wait for
    from admin-access templates (the resourceclaim controller retries a create the quota refused, so the
    room must be there before the claim is). Call under the view's lock."""
    dra = view.dra
    devices = dict(dra.namespace_monitors.get(namespace) or {})
    for key, waiting in view.template_waiters.items():
        template = dra.templates.get(key) if key.startswith(namespace + "/") else None
        if template is not None and template.monitor:
            for device_class, count in template.devices:
                devices[device_class] = devices.get(device_class, 0) + count * len(waiting)
    return devices


def monitor_room(hard: Mapping[str, int], monitors: Mapping[str, int], classes: Mapping[str, DeviceClass]
                 ) -> dict[str, int]:
    """How much each key of `hard` is raised so that monitors' claims never take a namespace's quota: their
    devices per class, and each name of a class they are charged to (`_names`)."""
    room: dict[str, int] = {}
    for device_class, count in monitors.items():
        keys = [devices_quota_key(device_class)]
        found = classes.get(device_class)
        keys += [f"{_REQUESTS}{name}" for name in (_names(device_class, found) if found is not None else ())]
        for key in keys:
            if key in hard and count:
                room[key] = room.get(key, 0) + count
    return room


def plain_charge(gpus: GpuRequests, classes: Mapping[str, DeviceClass], listed: Any) -> GpuRequests:
    """What a pod asking extended resources is charged by quota: each at its create, and where a class
    serves one through DRA, the class's other name by the claim kube-scheduler makes for it (only the
    names `listed`: a ResourceQuota restricts only what it lists)."""
    asks = dict(gpus)
    for resource, count in gpus:
        for device_class, found in classes.items():
            names = _names(device_class, found)
            if resource in names:
                for other in names - {resource}:
                    if other in listed:
                        asks[other] = asks.get(other, 0) + count
    return tuple(sorted(asks.items()))


def by_kind(asks: GpuRequests) -> list[GpuRequests]:
    """A claim pod's asks in the order a refusal names them: its levels (what the annotation says), then
    devices per class, then requests.<extendedResourceName>. One level over is over on all three: the
    first kind that is over is the one worth a sentence."""
    kinds: list[list[tuple[str, int]]] = [[], [], []]
    for key, count in asks:
        kinds[0 if is_standin_key(key) else 1 if key.endswith(_DEVICES) else 2].append((key, count))
    return [tuple(kind) for kind in kinds if kind]


def claim_names(keys: Any, config: Config) -> dict[str, str]:
    """How a sentence names each key: a level by its resource (what the annotation says), `requests.X`
    by what charges it there."""
    names: dict[str, str] = {}
    for key in keys:
        if is_standin_key(key):
            names[key] = _standin_level(key[len(_REQUESTS):]).resource(config)
        elif key.startswith(_REQUESTS + n.IMPLICIT_CLASS_PREFIX):
            names[key] = f"{key} (what pods asking {key[len(_REQUESTS):]} and claims of its DeviceClass are charged)"
        elif key.startswith(_REQUESTS):
            extended = key[len(_REQUESTS):]
            names[key] = (f"{key} (what pods asking {extended} and claims of a DeviceClass naming it as "
                          "extendedResourceName are charged)")
    return names


def _standin_level(standin: str) -> Sharing:
    name = standin.split("/", 1)[1]
    return parse_sharing("exclusive" if name == "gpu" else "shared" if name == "gpu.shared" else name)


def _level(text: str) -> Sharing | None:
    try:
        return parse_sharing(text) if text else None
    except ValueError:
        return None


def _add(asks: dict[str, int], key: str, count: int) -> None:
    asks[key] = asks.get(key, 0) + count
