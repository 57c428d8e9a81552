"""ResourceClaimTemplates written from a namespace's GPU policy (docs/dra.md): what a GPU pod
of a `dra` namespace takes instead of `nvidia.com/*` resources.

One template per sharing level the namespace gives (its own level, and the narrower ones a pod may
choose: `shared`, and each MIG profile within it that some device publishes), each for ONE device:

    apiVersion: resource.k8s.io/v1
    kind: ResourceClaimTemplate
    metadata: {name: gpu-placement-<level>-<digest>, labels: {app.kubernetes.io/managed-by: gpu-placement}}
    spec:
      metadata: {labels: {app.kubernetes.io/managed-by: gpu-placement}}    (copied into each claim)
      spec:
        devices:
          requests:
          - name: gpu
            exactly:
              deviceClassName: gpu.nvidia.com          (mig.nvidia.com for a MIG level)
              allocationMode: ExactCount
              count: 1
              selectors: [{cel: {expression: ...}}]    (MIG profile, products, memory, driver)
          config:                                      (the `shared` level: NVIDIA's opaque GpuConfig)
          - requests: [gpu]
            opaque: {driver: gpu.nvidia.com, parameters: {apiVersion: resource.nvidia.com/v1beta1,
                     kind: GpuConfig, sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Default}}}}

A pod asking N devices of a level gets N claims from that one template (`plan`), each container the
claims of its own ask, so containers see only their own devices, as with the device plugin, and the
set of templates a namespace can need is small and known before any pod arrives (its policy and the
MIG profiles the cluster publishes): the service keeps them (gpu_placement/controllers/templates.py), admission
only names them. The name carries a digest of the spec, so pods of one shape share one template, a
changed policy gives new names (a template's spec is immutable), and the webhook can tell its own
template from one someone else wrote under that name (`digest`).

Checked against the source: k8s.io/api resource/v1 types.go at v0.37.2 (ResourceClaimTemplateSpec,
ExactDeviceRequest, DeviceClaimConfiguration, OpaqueDeviceConfiguration) and core/v1 (PodResourceClaim,
ResourceClaim in container resources); the CEL environment of k8s.io/dynamic-resource-allocation/cel
v0.37.2 (`device.attributes[<domain>]`, `device.capacity[<domain>]`, the base library's `semver`,
`quantity` and ext.Strings `replace`); NVIDIA's driver (dra-driver-nvidia-gpu: attributes `productName`,
`driverVersion` (semver), `profile` (go-nvlib MigProfileInfo.String: `1g.10gb`, `1g.10gb+me`), capacity
`memory` in bytes; api/nvidia.com/resource/v1beta1 GpuConfig, GpuSharing, TimeSlicingConfig, MpsConfig,
behind the driver's feature gates TimeSlicingSettings and MPSSupport).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.base.cuda import Version, driver_table
from gpu_placement.facts.dra import Device, DeviceClass, device_product, implicit_name
from gpu_placement.facts.pods import GpuRequests, container_gpu_requests
from gpu_placement.facts.policy import NamespacePolicy
from gpu_placement.facts.sharing import SHARED, Sharing, sharing_of_resource

__all__ = [
    "MANAGED_BY",
    "REQUEST",
    "ClaimPlan",
    "ClaimPolicy",
    "Template",
    "claim_policy",
    "class_of",
    "device_hard",
    "devices_quota_key",
    "dra_level",
    "dra_profile",
    "keeps_resource",
    "level_of",
    "levels_for",
    "name_groups",
    "one_count",
    "plan",
    "plugin_profile",
    "product_selector",
    "semver_text",
    "spec_digest",
    "template_for",
    "wanted_templates",
]

MANAGED_BY = ("app.kubernetes.io/managed-by", "gpu-placement")
REQUEST = "gpu"  # the one request of each template; containers name the claim, not the request
NVIDIA_CONFIG = "resource.nvidia.com/v1beta1"
_QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"  # corev1.ResourceClaimsPerClass (k8s.io/api v0.37.2)
_SLUG = re.compile(r"[^a-z0-9]+")


@dataclass(slots=True, frozen=True)
class ClaimPolicy:
    """What a namespace's annotations decide about the devices, beyond the sharing level."""

    products: tuple[str, ...] = ()  # nvidia.com/gpu.product values (GFD's form: spaces as dashes), as written
    memory: str | None = None  # gpu-memory as written (a Kubernetes quantity)
    memory_mib: int | None = None
    cuda: Version | None = None  # the namespace's CUDA floor; the driver table gives the driver for it
    shares: bool = False  # some device is shared by its memory (consumable capacity): `shared` asks a share

    @property
    def share(self) -> str | None:
        """What a `shared` claim asks of a device shared by memory: the namespace's gpu-memory, in the
        canonical form the API server stores a quantity in (so the stored template keeps its digest)."""
        if not self.shares or self.memory_mib is None:
            return None
        size = self.memory_mib * 2**20
        for suffix, power in (("Ti", 40), ("Gi", 30), ("Mi", 20)):
            if size % 2**power == 0:
                return f"{size >> power}{suffix}"
        return f"{self.memory_mib}Mi"  # pragma: no cover: a whole number of MiB always divides

    @property
    def min_driver(self) -> Version | None:
        return driver_table().min_driver(self.cuda) if self.cuda is not None else None


@dataclass(slots=True, frozen=True)
class Template:
    """One ResourceClaimTemplate the service keeps in a namespace."""

    namespace: str
    name: str
    level: Sharing
    device_class: str
    selectors: tuple[str, ...]  # of its one request; with `alternatives`, those every alternative carries
    config: Mapping[str, Any] | None  # the opaque parameters (GpuConfig), or None
    digest: str  # of the claim spec: what a template of this name must hold
    policy: ClaimPolicy = field(default_factory=ClaimPolicy)
    # A product list of more than one: `firstAvailable` subrequests in the order written, each (name, its
    # selectors); the allocator takes the first it can satisfy (KEP-4816).
    alternatives: tuple[tuple[str, tuple[str, ...]], ...] = ()
    share: str | None = None  # capacity.requests.memory: a share of a device shared by memory (KEP-5075)

    def claim_spec(self, driver: str) -> dict[str, Any]:
        return _claim_spec(self.device_class, self.selectors, self.config, driver, self.alternatives, self.share)

    def body(self, driver: str, version: str = "v1") -> dict[str, Any]:
        labels = {MANAGED_BY[0]: MANAGED_BY[1]}
        annotations = {n.PREFIX + "sharing": self.level.text}
        return {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaimTemplate",
                "metadata": {"name": self.name, "namespace": self.namespace, "labels": dict(labels),
                             "annotations": annotations},
                "spec": {"metadata": {"labels": dict(labels), "annotations": dict(annotations)},
                         "spec": self.claim_spec(driver)}}

    def matches(self, device: Device, device_type: str | None) -> str | None:
        """Why `device` cannot serve this template's request (None: it can), read the way its class
        and CEL selectors read it: for `explain` and the tests that hold the two to each other."""
        if device_type is not None and device.type != device_type:
            return f"type {device.type}"
        if self.level.kind == "mig" and device.profile != dra_profile(self.level.profile):
            return f"profile {device.profile or 'none'}"
        policy = self.policy
        if policy.products and device_product(device) not in policy.products:
            return f"product {device.product}"
        if self.share is not None and device.shared and (device.memory_mib or 0) < (policy.memory_mib or 0):
            return f"memory {device.memory_mib} MiB"
        if policy.memory_mib is not None and (device.memory_mib or 0) < policy.memory_mib:
            return f"memory {device.memory_mib} MiB"
        floor = policy.min_driver
        if floor is not None and (device.driver is None or _pad(device.driver) < _pad(floor)):
            return f"driver {semver_text(device.driver) if device.driver else 'unknown'}"
        return None


def template_for(namespace: str, level: Sharing, policy: ClaimPolicy, config: Config) -> Template:
    """The template for pods of `level` in a namespace whose policy is `policy`."""
    dra = config.dra
    domain = f"device.attributes['{dra.driver}']"
    selectors: list[str] = []
    device_class = dra.mig_class if level.kind == "mig" else dra.gpu_class
    if level.kind == "mig":
        selectors.append(f"{domain}.profile == '{dra_profile(level.profile)}'")
    if len(policy.products) == 1:
        selectors.append(product_selector(dra.driver, policy.products))
    if policy.memory is not None:
        selectors.append(f"device.capacity['{dra.driver}'].memory.compareTo(quantity('{policy.memory}')) >= 0")
    floor = policy.min_driver
    if floor is not None:
        selectors.append(f"{domain}.driverVersion.compareTo(semver('{semver_text(floor)}')) >= 0")
    alternatives: tuple[tuple[str, tuple[str, ...]], ...] = ()
    if len(policy.products) > 1:  # one alternative per product, in the order written: the first that fits wins
        names = _alternative_names(policy.products)
        alternatives = tuple((name, (*selectors[:1], product_selector(dra.driver, (product,)), *selectors[1:]))
                             for name, product in zip(names, policy.products, strict=True))
    share = policy.share if level.kind == "shared" else None
    config_params = _sharing_config(level, policy, config)
    digest = spec_digest(_claim_spec(device_class, tuple(selectors), config_params, dra.driver, alternatives, share))
    slug = _SLUG.sub("-", "gpu" if level.kind == "exclusive" else level.text.lower()).strip("-")
    return Template(namespace, f"gpu-placement-{slug}-{digest[:10]}", level, device_class, tuple(selectors),
                    config_params, digest, policy, alternatives, share)


def product_selector(driver: str, products: Iterable[str]) -> str:
    """productName as published ("NVIDIA H100 80GB HBM3"), compared in GPU Feature Discovery's form, the
    form gpu-placement.io/gpu-products is written in."""
    listed = ", ".join(f"'{product}'" for product in products)
    return f"device.attributes['{driver}'].productName.replace(' ', '-') in [{listed}]"


def _alternative_names(products: Sequence[str]) -> list[str]:
    """A subrequest name per product (a DNS label: `nvidia-h100-80gb-hbm3`), unique in the request."""
    names: list[str] = []
    for index, product in enumerate(products):
        name = _SLUG.sub("-", product.lower()).strip("-")[:56] or "product"
        names.append(name if name not in names else f"{name}-{index}")
    return names


def levels_for(level: Sharing, profiles: Iterable[str]) -> list[Sharing]:
    """The levels a pod of a namespace at `level` may be given: its own, `shared`, and each published
    MIG profile (in the device plugin's spelling, `1g.10gb.me`) within it. Not `shared` under a MIG
    level: through DRA a claim's device is its own, so `shared` is a whole GPU time-sliced among the
    claim's containers, more than a MIG slice (`dra_level`)."""
    found = [level]
    if level not in (SHARED,) and level.kind != "mig":
        found.append(SHARED)
    for profile in sorted(set(profiles)):
        candidate = Sharing("mig", profile)
        if candidate not in found and candidate.within(level):
            found.append(candidate)
    return found


def dra_level(asked: Sharing, namespace_level: Sharing) -> Sharing:
    """The level a pod gets through DRA: its own narrower ask, except `shared` in a MIG namespace, which
    through DRA would be a whole GPU (`levels_for`): the namespace's MIG level then."""
    return namespace_level if asked == SHARED and namespace_level.kind == "mig" else asked


def dra_profile(profile: str) -> str:
    """A MIG profile as NVIDIA's DRA driver publishes it (`1g.10gb+me`) from the device plugin's resource
    spelling the sharing annotation uses (`1g.10gb.me`)."""
    head, dot, rest = profile.partition("gb.")
    return f"{head}gb+{rest.replace('.', ',')}" if dot else profile


def plugin_profile(profile: str) -> str:
    """The inverse: `1g.10gb+me` -> `1g.10gb.me`."""
    head, plus, rest = profile.partition("+")
    return f"{head}.{rest.replace(',', '.')}" if plus else profile


def devices_quota_key(device_class: str) -> str:
    """The ResourceQuota resource name Kubernetes charges a claim's devices of this class to
    (pkg/quota/v1/evaluator/core/resource_claims.go V1ResourceByDeviceClass at v1.37.2)."""
    return device_class + _QUOTA_SUFFIX


def semver_text(version: Version) -> str:
    """`550.54.14`, `535.129.3`: strict semver (three parts, no leading zeros), as CEL's semver() takes
    it and NVIDIA's driver publishes it."""
    return ".".join(str(part) for part in _pad(version))


def spec_digest(spec: Mapping[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()


# -- a pod's claims --------------------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class ClaimPlan:
    """The claims a GPU pod gets: pod claim name -> template, and per container the claims it names."""

    claims: tuple[tuple[str, Template], ...]
    containers: tuple[tuple[str, int, tuple[str, ...]], ...]  # (field, index, claim names)
    resources: tuple[tuple[str, int], ...]  # the asks converted: resource -> devices (the effective rule)

    def devices(self) -> dict[str, int]:
        """Devices per class, as the API server's quota charges the claims."""
        counts: dict[str, int] = {}
        for _, template in self.claims:
            counts[template.device_class] = counts.get(template.device_class, 0) + 1
        return counts


def plan(spec: Mapping[str, Any], levels: Mapping[str, Template], is_gpu_resource: Any,
         taken: Iterable[str] = ()) -> ClaimPlan:
    """One claim per device. For each GPU resource: sidecars and app containers get disjoint claims
    (they run together); an init container takes the claims after the sidecars started before it,
    which later containers reuse (it has ended by then). So the pod holds what Kubernetes' effective
    request rule says it holds (gpu_placement.facts.pods.effective_gpu_requests), no more. `levels`: resource
    -> its template."""
    used = set(taken)
    names: dict[str, list[str]] = {}

    def claim(resource: str, index: int) -> str:
        have = names.setdefault(resource, [])
        while len(have) <= index:
            base = _SLUG.sub("-", levels[resource].level.text if levels[resource].level.kind != "exclusive"
                             else "gpu").strip("-")
            name = f"{base}-{len(have)}"
            while name in used:
                name += "-gp"
            used.add(name)
            have.append(name)
        return have[index]

    containers: list[tuple[str, int, tuple[str, ...]]] = []
    sidecars: dict[str, int] = {}
    for index, init in enumerate(spec.get("initContainers") or ()):
        asked = container_gpu_requests(init, is_gpu_resource)
        mine = []
        for resource, count in sorted(asked.items()):
            start = sidecars.get(resource, 0)
            mine += [claim(resource, start + i) for i in range(count)]
            if init.get("restartPolicy") == "Always":
                sidecars[resource] = start + count
        containers.append(("initContainers", index, tuple(mine)))
    offset = dict(sidecars)
    for index, container in enumerate(spec.get("containers") or ()):
        asked = container_gpu_requests(container, is_gpu_resource)
        mine = []
        for resource, count in sorted(asked.items()):
            start = offset.get(resource, 0)
            mine += [claim(resource, start + i) for i in range(count)]
            offset[resource] = start + count
        containers.append(("containers", index, tuple(mine)))
    claims = tuple((name, levels[resource]) for resource in sorted(names) for name in names[resource])
    return ClaimPlan(claims, tuple(c for c in containers if c[2]),
                     tuple((resource, len(names[resource])) for resource in sorted(names)))


def level_of(resource: str, pod_level: Sharing, config: Config) -> Sharing:
    """The level a GPU resource is served at: `nvidia.com/gpu` at the pod's level, the others by name."""
    return pod_level if resource in config.gpu_resources else sharing_of_resource(resource, config)


# -- pieces -----------------------------------------------------------------------------------------------

def _claim_spec(device_class: str, selectors: Sequence[str], config: Mapping[str, Any] | None,
                driver: str, alternatives: Sequence[tuple[str, Sequence[str]]] = (),
                share: str | None = None) -> dict[str, Any]:
    if alternatives:
        request: dict[str, Any] = {"name": REQUEST, "firstAvailable": [
            {"name": name, **_device_request(device_class, alternative, share)} for name, alternative in alternatives]}
    else:
        request = {"name": REQUEST, "exactly": _device_request(device_class, selectors, share)}
    devices: dict[str, Any] = {"requests": [request]}
    if config is not None:
        devices["config"] = [{"requests": [REQUEST], "opaque": {"driver": driver, "parameters": dict(config)}}]
    return {"devices": devices}


def _device_request(device_class: str, selectors: Sequence[str], share: str | None) -> dict[str, Any]:
    # allocationMode and count written out: the API server defaults them, and the stored template must
    # compare equal to this one (the digest).
    request: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    if selectors:
        request["selectors"] = [{"cel": {"expression": expression}} for expression in selectors]
    if share is not None:  # on a device without allowMultipleAllocations, the whole device (that holds it)
        request["capacity"] = {"requests": {"memory": share}}
    return request


def _sharing_config(level: Sharing, policy: ClaimPolicy, config: Config) -> dict[str, Any] | None:
    """NVIDIA's opaque GpuConfig for the `shared` level: time-slicing or MPS (dra.sharedStrategy); with
    MPS the namespace's gpu-memory becomes the memory each client may pin."""
    dra = config.dra
    if level.kind != "shared" or dra.shared_strategy == "None":
        return None
    if dra.shared_strategy == "TimeSlicing":
        sharing: dict[str, Any] = {"strategy": "TimeSlicing",
                                   "timeSlicingConfig": {"interval": dra.time_slicing_interval}}
    else:
        mps: dict[str, Any] = {}
        if dra.mps_active_thread_percentage is not None:
            mps["defaultActiveThreadPercentage"] = dra.mps_active_thread_percentage
        if policy.memory is not None:
            mps["defaultPinnedDeviceMemoryLimit"] = policy.memory
        sharing = {"strategy": "MPS", "mpsConfig": mps}
    return {"apiVersion": NVIDIA_CONFIG, "kind": "GpuConfig", "sharing": sharing}


def _pad(version: Version) -> Version:
    return (*version, 0, 0, 0)[:3]


# -- a namespace's templates, and its quota in devices ------------------------------------------------------

def claim_policy(policy: NamespacePolicy, shares: bool = False) -> ClaimPolicy:
    """The part of a namespace's policy that its templates' selectors carry. `shares`: some device of the
    driver is shared by memory (gpu_placement/view/dra.py `shares_memory`)."""
    return ClaimPolicy(policy.product_order, policy.gpu_memory, policy.gpu_memory_mib, policy.cuda, shares)


def wanted_templates(policy: NamespacePolicy, mig_profiles: set[str], config: Config,
                     shares: bool = False) -> list[Template]:
    """The templates a `dra` namespace needs: one per level a pod there may be given, and with a quota,
    only of the device classes it gives devices of."""
    levels = levels_for(policy.sharing, {plugin_profile(p) for p in mig_profiles})
    wanted = claim_policy(policy, shares)
    templates = [template_for(policy.namespace, level, wanted, config) for level in levels]
    if policy.quota is None:
        return templates
    allowed = device_hard(policy.quota, config)
    return [t for t in templates if devices_quota_key(t.device_class) in allowed]


def device_hard(quota: Mapping[str, int], config: Config,
                classes: Mapping[str, DeviceClass] | None = None) -> dict[str, str]:
    """`gpu-placement.io/quota` as ResourceQuota charges claims: devices per class. MIG resources count
    against the MIG class, a class's implicit name against that class, the others (whole and shared GPUs)
    against the GPU class; each claim of ours is one device (pkg/quota/v1/evaluator/core/resource_claims.go
    at v1.37.2). The two names of a class (`classes`: the view's, `one_count`) count its devices once."""
    figures = one_count(quota, classes or {})
    groups = {name: group for group in name_groups(classes or {}) for name in group} if len(figures) > 1 and any(
        name.startswith(n.IMPLICIT_CLASS_PREFIX) for name in figures) else {}
    per_class: dict[str, int] = {}
    counted: set[tuple[frozenset[str], str]] = set()
    for resource, count in figures.items():
        if not config.is_gpu_resource(resource):
            continue
        device_class = class_of(resource, config)
        group = groups.get(resource)
        if group is not None:
            if (group, device_class) in counted:
                continue  # the class's other name is counted already: the same devices (at the same figure)
            counted.add((group, device_class))
        per_class[device_class] = per_class.get(device_class, 0) + count
    return {devices_quota_key(device_class): str(count) for device_class, count in sorted(per_class.items())}


def class_of(resource: str, config: Config) -> str:
    """The device class a GPU resource of the annotation takes devices of in a `dra` namespace: its own
    class for an implicit name, else the MIG or the GPU class by its level (`device_hard`)."""
    if resource.startswith(n.IMPLICIT_CLASS_PREFIX):
        return resource[len(n.IMPLICIT_CLASS_PREFIX):]
    return config.dra.mig_class if sharing_of_resource(resource, config).kind == "mig" else config.dra.gpu_class


def name_groups(classes: Mapping[str, DeviceClass]) -> list[frozenset[str]]:
    """The extended resources that name the same devices: an `extendedResourceName` X with the implicit
    name `deviceclass.resource.kubernetes.io/<class>` of each class naming it. kube-apiserver charges every
    claim of such a class to both (resource_claims.go `addExtendedResourceQuota`: a claim kube-scheduler
    made for a pod is charged the name the pod did not pay at its create)."""
    groups: dict[str, set[str]] = {}
    for device_class, found in sorted(classes.items()):
        if found.extended_resource:
            groups.setdefault(found.extended_resource, {found.extended_resource}).add(implicit_name(device_class))
    return [frozenset(group) for _, group in sorted(groups.items())]


def one_count(quota: Mapping[str, int], classes: Mapping[str, DeviceClass]) -> dict[str, int]:
    """The annotation's figures, with the names of one class's devices (`name_groups`) at one count: each
    is a limit on the same devices, so they do not add up, and the lowest one listed binds all of them
    (docs/webhook.md, "Two names for one class's GPUs")."""
    figures = dict(quota)
    if len(quota) < 2 or not any(name.startswith(n.IMPLICIT_CLASS_PREFIX) for name in quota):
        return figures  # each group has an implicit name: none is listed twice (the common case, on /validate)
    for group in name_groups(classes):
        listed = [name for name in group if name in quota]
        if len(listed) > 1:
            lowest = min(quota[name] for name in listed)
            figures.update((name, lowest) for name in listed)
    return figures


# -- pods the cluster serves through DRA without claims of ours -----------------------------------------

def keeps_resource(gpus: GpuRequests, level: Sharing, policy: NamespacePolicy, extended: Mapping[str, str],
                   classes: Mapping[str, DeviceClass], config: Config, routed: bool) -> bool:
    """Whether a GPU pod of a `dra` namespace keeps its resources as written, served through DRA by the
    cluster itself (DRAExtendedResource, GA in 1.37: on a node without the resource in its allocatable,
    kube-scheduler makes a claim for a device of the DeviceClass naming it), instead of claims from the
    namespace's templates. `extended`: resource -> the GPU class kube-scheduler allocates for it
    (gpu_placement/view/dra.py); `routed`: the pod goes to gpu-placement's scheduler, whose extender holds
    it to the namespace's CUDA floor by the node's driver.

    Kept when the cluster maps every GPU resource the pod asks, and:
    - a resource is a class's implicit name (`deviceclass.resource.kubernetes.io/<class>`): the pod
      asked for that class's devices itself; or
    - the pod's level is `exclusive`, it goes to gpu-placement's scheduler, the namespace holds devices
      to no product list and no device memory (only a claim's CEL selector holds one device to them:
      a namespace asking either gets claims), and its quota gives no other level of a class the API
      server charges to the same resource (a `shared` claim of gpu.nvidia.com counts against
      requests.nvidia.com/gpu too): the pod's own create is then charged its whole GPUs, atomically,
      and its claim is not charged them again (resource_claims.go `addExtendedResourceQuota`).
    """
    if not gpus or not all(resource in extended for resource, _ in gpus):
        return False
    if any(resource.startswith(n.IMPLICIT_CLASS_PREFIX) for resource, _ in gpus):
        return True
    if level.kind != "exclusive" or not routed or policy.products or policy.gpu_memory is not None:
        return False
    charged = {classes[extended[resource]].extended_resource for resource, _ in gpus
               if extended[resource] in classes}
    for resource in policy.quota or {}:
        other = sharing_of_resource(resource, config)
        if not config.is_gpu_resource(resource) or other.kind == "exclusive":
            continue
        device_class = classes.get(config.dra.mig_class if other.kind == "mig" else config.dra.gpu_class)
        if device_class is not None and device_class.extended_resource in charged:
            return False
    return True
