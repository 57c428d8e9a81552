"""resource.k8s.io objects as slim records: what the rules, the taint controller and `explain` read.

Wire shapes as the API serves them (k8s.io/api resource/v1 types.go at v0.37.2; v1beta2 is the
same; v1beta1 nests a device's fields under `basic` and puts a request's class on the request):

    ResourceSlice    spec.driver, spec.pool.name, spec.nodeName, spec.devices[].{name, attributes,
                     capacity, taints, allowMultipleAllocations}; attribute values are
                     {"string"|"version"|"int"|"bool": v}; capacity {name: {value, requestPolicy}}
    DeviceClass      metadata.creationTimestamp, spec.selectors[].cel.expression, spec.extendedResourceName
    ResourceClaim    metadata.annotations[resource.kubernetes.io/extended-resource-claim],
                     spec.devices.requests[].exactly (deviceClassName, allocationMode, count, selectors,
                     adminAccess, capacity.requests) or .firstAvailable[] (the same, by name, in order),
                     status.allocation.devices.results[].{driver, pool, device, consumedCapacity}
    ResourceClaimTemplate  spec.spec: a ResourceClaimSpec

Consumable capacity (KEP-5075, DRAConsumableCapacity: beta and on in 1.36 and 1.37): a device with
`allowMultipleAllocations: true` may be given to several claims, each consuming part of its capacity
(`capacity.requests` in the request; what it asks nothing of, the capacity's `requestPolicy.default`,
else all of it). The amounts are kept in milli-units (Kubernetes' MilliValue) so shares add up exactly.

What NVIDIA's driver publishes (dra-driver-nvidia-gpu v0.4.1, cmd/gpu-kubelet-plugin/deviceinfo.go and
mig.go): one pool per node, named after it; per device `gpu-<minor>` (MIG: `gpu-<minor>-mig-...`)
the attributes `type` ("gpu", "mig"), `uuid`, `productName`, `brand`, `architecture`, version-typed
`driverVersion`, `cudaDriverVersion`, `cudaComputeCapability`; MIG devices `parentUUID`, `profile`;
capacity `memory` in bytes. Its own taints (device_health.go): `gpu.nvidia.com/xid=<code>`,
`gpu.nvidia.com/gpu-lost`, `gpu.nvidia.com/unmonitored`. With its `ConsumableShares` feature gate and
`--consumable-shares=memory` (kubernetes-sigs/dra-driver-nvidia-gpu v0.5,
cmd/gpu-kubelet-plugin/consumable_shares.go `applyConsumableShares`) each GPU and MIG device also says
`allowMultipleAllocations: true`, its `memory` rounded down to whole MiB with `requestPolicy` default
all of it, validRange min 1Mi, step 1Mi (`unlimited` and a share count: default 0).

Junk values become None, never an exception: the objects are written by drivers and users.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gpu_placement.base import names as n
from gpu_placement.base.cuda import Version, VersionError, parse_version
from gpu_placement.base.quantity import QuantityError, parse_quantity
from gpu_placement.base.timestamps import parse_time

__all__ = ["DRA_BY_KIND", "DRA_KINDS", "EXTENDED_CLAIM", "IMPLICIT_PREFIX", "Alternative", "Ask", "Capacity", "Claim",
           "Device", "DeviceClass", "Request", "Slice", "Taint", "claim_from_json", "class_from_json", "device_product",
           "implicit_name", "milli", "slice_from_json", "template_from_json"]

# The view's DRA kinds, listed and watched only when the API server serves them (gpu_placement.kube.discovery).
DRA_KINDS = ("deviceclasses", "resourceclaimtemplates", "resourceclaims", "resourceslices")
DRA_BY_KIND = {"DeviceClass": "deviceclasses", "ResourceClaimTemplate": "resourceclaimtemplates",
               "ResourceClaim": "resourceclaims", "ResourceSlice": "resourceslices"}


# resourceapi.ResourceDeviceClassPrefix (k8s.io/api resource/v1 types.go): every DeviceClass also answers to
# `deviceclass.resource.kubernetes.io/<class>` as an extended resource (DRAExtendedResource).
IMPLICIT_PREFIX = n.IMPLICIT_CLASS_PREFIX
# resourceapi.ExtendedResourceClaimAnnotation: on the claim kube-scheduler makes for a pod's extended resources.
EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"
_MIB = 2**20
_ALL_DEVICES = 32  # resourceapi.AllocationResultsMaxSize: what allocationMode All is charged
_SHARING = "gpu-placement.io/sharing"  # on gpu-placement's templates (gpu_placement/decide/claims.py Template.body)
_TYPE_IN_CEL = re.compile(r"""attributes\[\s*['"]([^'"]+)['"]\s*\]\s*\.\s*type\s*==\s*['"]([\w.-]+)['"]""")


@dataclass(slots=True, frozen=True)
class Taint:
    key: str
    value: str
    effect: str  # None, NoSchedule, NoExecute (unknown effects count as None, as the allocator reads them)

    @property
    def blocks(self) -> bool:
        """Whether the allocator refuses the device to a claim that does not tolerate it."""
        return self.effect in n.BLOCKING_EFFECTS

    def text(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


@dataclass(slots=True, frozen=True)
class Capacity:
    """One consumable capacity of a device (resource/v1 DeviceCapacity), in milli-units (Kubernetes'
    MilliValue: "1" is 1000) so that shares add up exactly."""

    name: str
    value: int
    default: int | None = None  # requestPolicy.default: what a request that asks nothing of it consumes
    valid_values: tuple[int, ...] = ()  # requestPolicy.validValues, ascending
    minimum: int | None = None  # requestPolicy.validRange
    maximum: int | None = None
    step: int | None = None


# One `exactly` request as the allocator reads it: the class, ExactCount's count (0: All), and the capacity
# asked of each device (name, milli-units), empty when it asks none.
Ask = tuple[str, int, tuple[tuple[str, int], ...]]


@dataclass(slots=True, frozen=True)
class Alternative:
    """One way to serve a claim's request: its `exactly` request, or one of its `firstAvailable`
    subrequests (the allocator tries them in order and takes the first it can satisfy)."""

    name: str  # the subrequest's name; "" for `exactly`
    device_class: str
    count: int  # ExactCount's count; 0: allocationMode All
    capacity: tuple[tuple[str, int], ...] = ()  # capacity.requests per device, milli-units
    selectors: tuple[str, ...] = ()  # CEL expressions (the allocator evaluates them; decide/dra_fit.py reads
    # the forms gpu-placement writes)
    admin: bool = False  # adminAccess (only `exactly` may set it): shares devices already in use

    @property
    def ask(self) -> Ask:
        return (self.device_class, self.count, self.capacity)


Request = tuple[Alternative, ...]  # a request's alternatives, in order (one for `exactly`)


@dataclass(slots=True, frozen=True)
class Device:
    name: str
    type: str | None  # NVIDIA: "gpu" or "mig"
    uuid: str | None
    product: str | None  # productName as published ("NVIDIA H100 80GB HBM3")
    driver: Version | None
    cuda: Version | None  # cudaDriverVersion: the highest CUDA the driver supports
    compute: Version | None
    memory_mib: int | None
    profile: str | None  # MIG profile, e.g. "1g.10gb"
    taints: tuple[Taint, ...] = ()
    shared: bool = False  # allowMultipleAllocations: several claims may each consume part of its capacity
    capacity: tuple[Capacity, ...] = ()  # every capacity it publishes, sorted by name

    def capacity_of(self, name: str) -> Capacity | None:
        return next((c for c in self.capacity if c.name == name), None)


@dataclass(slots=True, frozen=True)
class Slice:
    name: str
    driver: str
    pool: str
    node: str | None  # spec.nodeName; None for network-attached pools
    devices: tuple[Device, ...]


@dataclass(slots=True, frozen=True)
class DeviceClass:
    name: str
    extended_resource: str | None  # spec.extendedResourceName (DRAExtendedResource)
    device_type: str | None  # the `type` its CEL selector asks for, when it names one plainly
    created: float = 0.0  # metadata.creationTimestamp: the newer of two classes naming one resource serves it


@dataclass(slots=True, frozen=True)
class Claim:
    """A ResourceClaim or ResourceClaimTemplate (no status): which classes it asks for, what it got."""

    namespace: str
    name: str
    classes: tuple[str, ...]  # every class named by a request (exactly, or any firstAvailable entry)
    selectors: int = 0  # CEL selectors in its requests (not evaluated here: the allocator does)
    tolerations: tuple[tuple[str, str, str, str], ...] = ()  # (key, operator, value, effect) of its requests
    allocated: tuple[tuple[str, str, str], ...] = ()  # (driver, pool, device) from status.allocation
    admin: bool = False  # adminAccess: may share devices already in use
    devices: tuple[tuple[str, int], ...] = ()  # (class, devices) as ResourceQuota charges them
    digest: str = ""  # templates: of spec.spec, to tell gpu-placement's own templates (gpu_placement.decide.claims)
    owner: str = ""  # claims made for a pod from a template: the pod's UID (its controller reference)
    level: str = ""  # gpu-placement's templates: their gpu-placement.io/sharing (the level of each claim made)
    requests: tuple[Request, ...] = ()  # every request, its alternatives in order
    consumed: tuple[tuple[tuple[str, int], ...], ...] = ()  # per `allocated` entry: its consumedCapacity (milli)
    extended: bool = False  # made by kube-scheduler for a pod's extended resources (EXTENDED_CLAIM: "true")
    results_for: tuple[str, ...] = ()  # per `allocated` entry: the request it serves (`request/subrequest`)
    shared_results: tuple[bool, ...] = ()  # per `allocated` entry: adminAccess (the device is not taken)

    @property
    def asks(self) -> tuple[Ask, ...]:
        """The `exactly` requests, as the allocator reads them (firstAvailable ones are in `requests`)."""
        return tuple(r[0].ask for r in self.requests if len(r) == 1 and not r[0].name)

    @property
    def monitor(self) -> bool:
        """Every request has admin access (a DCGM exporter's claim): it shares devices in use, takes none."""
        return bool(self.requests) and all(a.admin for r in self.requests for a in r)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _attribute(attributes: Mapping[str, Any], name: str, driver: str) -> Any:
    """A device attribute's value, by its short name or qualified with the driver's domain."""
    raw = attributes.get(name)
    if raw is None:
        raw = attributes.get(f"{driver}/{name}")
    if not isinstance(raw, Mapping):
        return None
    for kind in ("string", "version", "int", "bool"):
        if kind in raw:
            return raw[kind]
    return None


def _version(value: Any) -> Version | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_version(value.split("-", 1)[0].split("+", 1)[0])  # semver pre-release or build
    except VersionError:
        return None


def _memory_mib(capacity: Any, driver: str) -> int | None:
    if not isinstance(capacity, Mapping):
        return None
    raw = capacity.get("memory") or capacity.get(f"{driver}/memory")
    value = raw.get("value") if isinstance(raw, Mapping) else None
    if value is None:
        return None
    try:
        return int(parse_quantity(value) // _MIB)
    except (QuantityError, ValueError, TypeError):
        return None


def milli(value: Any) -> int | None:
    """A quantity in milli-units (Kubernetes' MilliValue, rounded up), None when it is not one."""
    if value is None or isinstance(value, bool):
        return None
    try:
        amount = parse_quantity(value) * 1000
    except (QuantityError, ValueError, TypeError):
        return None
    return -(-amount.numerator // amount.denominator)


def _capacities(capacity: Any) -> tuple[Capacity, ...]:
    if not isinstance(capacity, Mapping):
        return ()
    found = []
    for name, raw in sorted(capacity.items(), key=lambda item: str(item[0])):
        value = milli(raw.get("value")) if isinstance(raw, Mapping) else None
        if value is None:
            continue
        policy = found_policy if isinstance(found_policy := raw.get("requestPolicy"), Mapping) else {}
        valid = found_range if isinstance(found_range := policy.get("validRange"), Mapping) else {}
        values = [v for v in (milli(x) for x in policy.get("validValues") or ()) if v is not None]
        found.append(Capacity(sys.intern(str(name)), value, milli(policy.get("default")), tuple(sorted(values)),
                              milli(valid.get("min")), milli(valid.get("max")), milli(valid.get("step"))))
    return tuple(found)


def _taints(items: Any) -> tuple[Taint, ...]:
    taints = []
    for taint in items if isinstance(items, list) else ():
        if isinstance(taint, Mapping) and isinstance(taint.get("key"), str):
            taints.append(Taint(taint["key"], str(taint.get("value") or ""), str(taint.get("effect") or "None")))
    return tuple(taints)


def _device(raw: Mapping[str, Any], driver: str) -> Device:
    body = basic if isinstance(basic := raw.get("basic"), Mapping) else raw  # v1beta1
    attributes = found if isinstance(found := body.get("attributes"), Mapping) else {}
    text = {key: value if isinstance(value := _attribute(attributes, key, driver), str) else None
            for key in ("type", "uuid", "productName", "profile")}
    return Device(
        name=str(raw.get("name") or ""),
        type=sys.intern(text["type"]) if text["type"] else None,
        uuid=text["uuid"],
        product=sys.intern(text["productName"]) if text["productName"] else None,
        driver=_version(_attribute(attributes, "driverVersion", driver)),
        cuda=_version(_attribute(attributes, "cudaDriverVersion", driver)),
        compute=_version(_attribute(attributes, "cudaComputeCapability", driver)),
        memory_mib=_memory_mib(body.get("capacity"), driver),
        profile=text["profile"],
        taints=_taints(body.get("taints")),
        shared=body.get("allowMultipleAllocations") is True,
        capacity=_capacities(body.get("capacity")),
    )


def slice_from_json(obj: Mapping[str, Any]) -> Slice:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    driver = str(spec.get("driver") or "")
    pool = str((spec.get("pool") or {}).get("name") or "")
    node = spec.get("nodeName")
    devices = listed if isinstance(listed := spec.get("devices"), list) else []
    return Slice(str(meta.get("name") or ""), sys.intern(driver), sys.intern(pool),
                 sys.intern(node) if isinstance(node, str) and node else None,
                 tuple(_device(d, driver) for d in devices if isinstance(d, Mapping)))


def class_from_json(obj: Mapping[str, Any]) -> DeviceClass:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = str(meta.get("name") or "")
    device_type = None
    for selector in spec.get("selectors") or ():
        expression = ((selector or {}).get("cel") or {}).get("expression") if isinstance(selector, Mapping) else None
        found = _TYPE_IN_CEL.search(expression) if isinstance(expression, str) else None
        if found:
            device_type = found.group(2)
    extended = spec.get("extendedResourceName")
    return DeviceClass(name, extended if isinstance(extended, str) and extended else None, device_type,
                       parse_time(meta.get("creationTimestamp")) or 0.0)


def implicit_name(device_class: str) -> str:
    """`deviceclass.resource.kubernetes.io/<class>`: the extended resource every DeviceClass answers to."""
    return IMPLICIT_PREFIX + device_class


def _requests(spec: Any) -> Iterable[Mapping[str, Any]]:
    """Every request and firstAvailable alternative of a ResourceClaimSpec (v1/v1beta2 `exactly`, or
    v1beta1's class on the request itself)."""
    devices = (spec or {}).get("devices") if isinstance(spec, Mapping) else None
    for request in (devices or {}).get("requests") or () if isinstance(devices, Mapping) else ():
        if not isinstance(request, Mapping):
            continue
        if isinstance(request.get("exactly"), Mapping):
            yield request["exactly"]
        elif request.get("deviceClassName"):
            yield request
        for alternative in request.get("firstAvailable") or ():
            if isinstance(alternative, Mapping):
                yield alternative


def _devices(spec: Any) -> tuple[tuple[str, int], ...]:
    """Devices per class, the way Kubernetes' quota evaluator counts a claim (pkg/quota/v1/evaluator/core
    resource_claims.go at v1.37.2): ExactCount its count (1 when unset), All the worst case (32), a
    firstAvailable list the most any of its alternatives of a class could take."""
    counts: dict[str, int] = {}
    devices = (spec or {}).get("devices") if isinstance(spec, Mapping) else None
    for request in (devices or {}).get("requests") or () if isinstance(devices, Mapping) else ():
        if not isinstance(request, Mapping):
            continue
        alternatives = [request["exactly"]] if isinstance(request.get("exactly"), Mapping) else [
            a for a in request.get("firstAvailable") or () if isinstance(a, Mapping)]
        if not alternatives and request.get("deviceClassName"):
            alternatives = [request]  # v1beta1
        most: dict[str, int] = {}
        for alternative in alternatives:
            name = alternative.get("deviceClassName")
            if not isinstance(name, str):
                continue
            mode = alternative.get("allocationMode") or "ExactCount"
            count = alternative.get("count")
            number = _ALL_DEVICES if mode == "All" else (count if isinstance(count, int) and count > 0 else 1) \
                if mode == "ExactCount" else 0
            most[name] = max(most.get(name, 0), number)
        for name, number in most.items():
            counts[name] = counts.get(name, 0) + number
    return tuple(sorted((sys.intern(k), v) for k, v in counts.items() if v))


def _alternative(raw: Mapping[str, Any], name: str) -> Alternative | None:
    device_class = raw.get("deviceClassName")
    if not isinstance(device_class, str) or not device_class:
        return None
    mode = raw.get("allocationMode") or "ExactCount"
    count = raw.get("count")
    number = 0 if mode == "All" else count if type(count) is int and count > 0 else 1  # not a bool: type() is
    capacity = found if isinstance(found := raw.get("capacity"), Mapping) else {}
    asked = requests if isinstance(requests := capacity.get("requests"), Mapping) else {}
    wants = tuple(sorted((sys.intern(str(k)), v) for k, q in asked.items() if (v := milli(q)) is not None))
    selectors = tuple(expression for selector in raw.get("selectors") or ()
                      if isinstance(expression := _cel(selector), str))
    return Alternative(sys.intern(name), sys.intern(device_class), number, wants, selectors,
                       raw.get("adminAccess") is True)


def _cel(selector: Any) -> Any:
    cel = selector.get("cel") if isinstance(selector, Mapping) else None
    return cel.get("expression") if isinstance(cel, Mapping) else None


def _request_alternatives(spec: Any) -> tuple[Request, ...]:
    """Each request of a ResourceClaimSpec with its alternatives in order: `exactly` (v1, v1beta2; v1beta1's
    request itself) as one, `firstAvailable` as its subrequests."""
    devices = (spec or {}).get("devices") if isinstance(spec, Mapping) else None
    found: list[Request] = []
    for request in (devices or {}).get("requests") or () if isinstance(devices, Mapping) else ():
        if not isinstance(request, Mapping):
            continue
        if isinstance(request.get("exactly"), Mapping):
            alternatives = [_alternative(request["exactly"], "")]
        elif request.get("firstAvailable"):
            alternatives = [_alternative(a, str(a.get("name") or "")) for a in request["firstAvailable"]
                            if isinstance(a, Mapping)]
        else:
            alternatives = [_alternative(request, "")]  # v1beta1
        kept = tuple(a for a in alternatives if a is not None)
        if kept:
            found.append(kept)
    return tuple(found)


def _consumed(result: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    raw = result.get("consumedCapacity")
    if not isinstance(raw, Mapping):
        return ()
    return tuple(sorted((sys.intern(str(k)), v) for k, q in raw.items() if (v := milli(q)) is not None))


def _claim(namespace: str, name: str, spec: Any, status: Any, digest: str = "", owner: str = "",
           level: str = "", extended: bool = False) -> Claim:
    classes: list[str] = []
    selectors = 0
    tolerations: list[tuple[str, str, str, str]] = []
    admin = False
    for request in _requests(spec):
        if isinstance(request.get("deviceClassName"), str) and request["deviceClassName"] not in classes:
            classes.append(sys.intern(request["deviceClassName"]))
        selectors += len(request.get("selectors") or ())
        admin = admin or request.get("adminAccess") is True
        for toleration in request.get("tolerations") or ():
            if isinstance(toleration, Mapping):
                tolerations.append((str(toleration.get("key") or ""), str(toleration.get("operator") or "Equal"),
                                    str(toleration.get("value") or ""), str(toleration.get("effect") or "")))
    allocated: list[tuple[str, str, str]] = []
    consumed: list[tuple[tuple[str, int], ...]] = []
    served: list[str] = []
    admin_results: list[bool] = []
    allocation = (status or {}).get("allocation") if isinstance(status, Mapping) else None
    results = ((allocation or {}).get("devices") or {}).get("results") if isinstance(allocation, Mapping) else None
    for result in results if isinstance(results, list) else ():
        if isinstance(result, Mapping):
            allocated.append((sys.intern(str(result.get("driver") or "")), sys.intern(str(result.get("pool") or "")),
                              str(result.get("device") or "")))
            consumed.append(_consumed(result))
            served.append(str(result.get("request") or ""))
            admin_results.append(result.get("adminAccess") is True)
    return Claim(sys.intern(namespace), name, tuple(sorted(classes)), selectors, tuple(tolerations),
                 tuple(allocated), admin, _devices(spec), digest, owner, level, _request_alternatives(spec),
                 tuple(consumed) if any(consumed) else (), extended, tuple(served),
                 tuple(admin_results) if any(admin_results) else ())


def claim_from_json(obj: Mapping[str, Any]) -> Claim:
    meta = obj.get("metadata") or {}
    owner = next((str(o.get("uid") or "") for o in meta.get("ownerReferences") or ()
                  if isinstance(o, Mapping) and o.get("kind") == "Pod" and o.get("controller")), "")
    annotations = meta.get("annotations")
    extended = isinstance(annotations, Mapping) and annotations.get(EXTENDED_CLAIM) == "true" and bool(owner)
    return _claim(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), obj.get("spec"),
                  obj.get("status"), owner=owner, extended=extended)


def template_from_json(obj: Mapping[str, Any]) -> Claim:
    meta = obj.get("metadata") or {}
    spec = (obj.get("spec") or {}).get("spec")
    labels = meta.get("labels") or {}
    ours = isinstance(labels, Mapping) and labels.get("app.kubernetes.io/managed-by") == "gpu-placement"
    digest = hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest() if ours else ""
    annotations = meta.get("annotations")
    level = annotations.get(_SHARING) if ours and isinstance(annotations, Mapping) else None
    return _claim(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), spec, None, digest,
                  level=sys.intern(level) if isinstance(level, str) else "")


def device_product(device: Device) -> str | None:
    """The product as GPU Feature Discovery labels it (`nvidia.com/gpu.product`: spaces become dashes),
    so `gpu-placement.io/gpu-products` matches a device the same way it matches a node label."""
    return device.product.strip().replace(" ", "-") if device.product else None
