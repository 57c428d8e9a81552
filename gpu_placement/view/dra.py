"""The view's DRA part: devices per node, device classes, claims and templates, allocations.

Fed by `gpu_placement.view.ingest` (snapshot or list+watch) one object at a time, under the view's lock.
A node's facts come from its labels; where a label is missing (a cluster running the DRA driver
without GPU Feature Discovery), the node's ResourceSlice attributes fill it in (`merge`), so the
same rules judge both worlds. On a cluster without DRA this holds nothing and `merge` is two dict
lookups.

Device use, in one place (what decide/dra_fit.py fits against, and what a replay of the allocator
reads): per node and device, how many allocated claims hold it (`used_on`) and, for devices shared
by capacity (`allowMultipleAllocations`), what their allocations consume of each capacity
(`consumed_on`, from `status.allocation.devices.results[].consumedCapacity`, milli-units). A result
with `adminAccess` (a monitor: a DCGM exporter) shares the device without taking it and counts in
neither, as kube-scheduler counts it (pkg/scheduler/framework/plugins/dynamicresources/
allocateddevices.go `foreachAllocatedDevice`, v1.37.2: "Is not considered as allocated").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sized
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_placement.base.config import Dra as DraConfig
from gpu_placement.base.cuda import Version
from gpu_placement.facts.dra import (
    Claim,
    Device,
    DeviceClass,
    Request,
    Slice,
    claim_from_json,
    class_from_json,
    device_product,
    implicit_name,
    slice_from_json,
    template_from_json,
)
from gpu_placement.facts.nodes import NodeFacts

__all__ = ["DraState", "MadeForPod", "PodClaims"]

_NOTHING: tuple[Device, ...] = ()
NodeListener = Callable[[str], None]


@dataclass(slots=True, frozen=True)
class PodClaims:
    """What a pod's `spec.resourceClaims` ask of the configured GPU classes."""

    classes: tuple[str, ...]  # GPU device classes requested, sorted (monitors' admin-access claims aside)
    missing: str | None = None  # a referenced claim or template the view does not have (yet)
    # The requests of its claims not allocated yet (templates, claims still to be allocated) that ask a GPU
    # class, alternatives in order: what the allocator still has to find on a node.
    requests: tuple[Request, ...] = ()
    monitor: bool = False  # its only GPU claims have admin access (a DCGM exporter): never routed nor charged


_NO_CLAIMS = PodClaims(())


@dataclass(slots=True)
class MadeForPod:
    """The claims kube-controller-manager has made so far for one pod from its templates."""

    claims: int = 0
    devices: dict[str, int] = field(default_factory=dict)  # class -> devices, as ResourceQuota charges them


class DraState:
    def __init__(self, config: DraConfig, lock: threading.RLock | None = None) -> None:
        self.config = config
        self.lock = lock or threading.RLock()
        self.gpu_classes = frozenset(config.device_classes)
        self.active = False  # some DRA kind was listed: the API server serves resource.k8s.io
        # Claims are made from the templates gpu-placement keeps (v1 or v1beta2 `exactly` requests); False
        # where the API serves only an older version: `dra` namespaces then stay on the device plugin.
        self.templates_kept = True
        self.slices: dict[str, Slice] = {}
        self.classes: dict[str, DeviceClass] = {}
        self.claims: dict[str, Claim] = {}
        self.templates: dict[str, Claim] = {}
        # extended resource -> the GPU class kube-scheduler allocates for it: each class's extendedResourceName
        # (the newest class naming it; tie: the lower name) and its implicit deviceclass.resource.kubernetes.io/
        self.extended: dict[str, str] = {}
        self._by_node: dict[str, dict[str, Slice]] = {}  # node -> slice name -> slice
        self._devices: dict[str, tuple[Device, ...]] = {}  # node -> its devices, every slice's
        self._sharing_nodes: set[str] = set()  # nodes with a device shared by memory: `shares_memory`, per /mutate
        self._pool_node: dict[str, str] = {}  # pool -> node (NVIDIA names each pool after its node)
        self._used: dict[str, dict[str, int]] = {}  # node -> device -> claims holding it (monitors aside)
        # node -> device -> capacity -> what allocated claims consume of it (milli-units; consumable capacity)
        self._consumed: dict[str, dict[str, dict[str, int]]] = {}
        self._label_facts: dict[str, NodeFacts] = {}  # node -> facts from labels alone, where slices add some
        # What ResourceQuota charges: the devices of every claim that exists, by namespace then class; and
        # what the claims made for each pod from its templates charge (the webhook's quota holds).
        self.namespace_devices: dict[str, dict[str, int]] = {}
        # Of those, the claims kube-scheduler made for pods' extended resources (DRAExtendedResource): the API
        # server takes what their pods asked off their extendedResourceName charges (resource_claims.go
        # addExtendedResourceQuota); and the monitors' (admin access is not exempt from quota: resource_claims_test.go).
        self.namespace_extended: dict[str, dict[str, int]] = {}
        self.namespace_monitors: dict[str, dict[str, int]] = {}
        self.monitor_templates: dict[str, int] = {}  # namespace -> its admin-access templates
        self.made_for_pod: dict[str, MadeForPod] = {}  # pod UID -> its claims that exist
        self._on_devices: list[NodeListener] = []
        self._on_usage: list[NodeListener] = []
        self._on_monitors: list[Callable[[str], None]] = []

    def subscribe(self, on_devices: NodeListener, on_usage: NodeListener) -> None:
        """`on_devices(node)`: the node's published devices changed; `on_usage(node)`: which of them
        claims hold changed. Called under the lock."""
        self._on_devices.append(on_devices)
        self._on_usage.append(on_usage)

    def subscribe_monitors(self, on_namespace: Callable[[str], None]) -> None:
        """`on_namespace(name)`: a monitor's claim there came or went (the quota mirror gives the
        namespace room for what the API server charges it). Called under the lock."""
        self._on_monitors.append(on_namespace)

    # -- reading -------------------------------------------------------------------------------
    def devices_on(self, node: str) -> tuple[Device, ...]:
        return self._devices.get(node, _NOTHING)

    def slices_of(self, node: str) -> tuple[Slice, ...]:
        return tuple(self._by_node.get(node, {}).values())

    def used_on(self, node: str) -> Mapping[str, int]:
        """Device name -> how many allocated claims hold it (monitors' admin-access claims aside)."""
        return self._used.get(node) or {}

    def consumed_on(self, node: str) -> Mapping[str, Mapping[str, int]]:
        """Device name -> capacity -> what allocated claims consume of it (status...consumedCapacity, milli)."""
        return self._consumed.get(node) or {}

    def shares_memory(self) -> bool:
        """Some device of the driver is shared by its memory (allowMultipleAllocations with capacity
        `memory`): `shared` templates then ask a share of it (gpu_placement/decide/claims.py)."""
        return bool(self._sharing_nodes)  # kept by `_reindex`: /mutate asks it for every pod

    def nodes(self) -> list[str]:
        return sorted(self._devices)

    def node_of_pool(self, pool: str) -> str:
        return self._pool_node.get(pool, pool)

    def pod_claims(self, namespace: str, spec: Mapping[str, Any]) -> PodClaims:
        """The GPU classes a pod's claims request; `missing` names a claim or template not in the view."""
        entries = spec.get("resourceClaims")
        if not entries or not isinstance(entries, list):
            return _NO_CLAIMS
        classes: set[str] = set()
        requests: list[Request] = []
        missing = None
        monitor = False
        for entry in entries:
            if not isinstance(entry, Mapping):
                continue
            if entry.get("resourceClaimName"):
                what, table, name = "ResourceClaim", self.claims, entry["resourceClaimName"]
            elif entry.get("resourceClaimTemplateName"):
                what, table, name = "ResourceClaimTemplate", self.templates, entry["resourceClaimTemplateName"]
            else:
                continue
            found = table.get(f"{namespace}/{name}")
            if found is None:
                missing = missing or f"{what} {namespace}/{name}"
                continue
            gpu = [r for r in found.requests if any(a.device_class in self.gpu_classes for a in r)]
            if found.monitor:
                monitor = monitor or bool(gpu)
                continue
            classes.update(c for c in found.classes if c in self.gpu_classes)
            if not found.allocated:
                requests.extend(r for r in gpu if not all(a.admin for a in r))
        if classes or missing:
            return PodClaims(tuple(sorted(classes)), missing, tuple(requests))
        return PodClaims((), None, (), True) if monitor else _NO_CLAIMS

    def backed(self, resources: Iterable[str]) -> frozenset[str]:
        """Those extended resources a configured GPU class serves through DRA (DRAExtendedResource: on a
        node without that resource in allocatable, the scheduler allocates a device of the class)."""
        if not self.extended:
            return frozenset()
        return frozenset(r for r in resources if r in self.extended)

    # -- ingest --------------------------------------------------------------------------------
    def replace(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """A full list of one DRA kind (gpu_placement.view.ingest hands it over)."""
        self.active = True
        {"resourceslices": self.replace_slices, "deviceclasses": self.replace_classes,
         "resourceclaims": self.replace_claims, "resourceclaimtemplates": self.replace_templates}[kind](objects)

    def count(self, kind: str) -> int:
        kept: dict[str, Sized] = {"resourceslices": self.slices, "deviceclasses": self.classes,
                                  "resourceclaims": self.claims, "resourceclaimtemplates": self.templates}
        return len(kept[kind])

    def event(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        key = f"{meta.get('namespace') or 'default'}/{name}"
        if event_type == "DELETED":
            {"resourceslices": lambda: self.delete_slice(name), "deviceclasses": lambda: self.delete_class(name),
             "resourceclaims": lambda: self.delete_claim(key),
             "resourceclaimtemplates": lambda: self.delete_template(key)}[kind]()
            return
        {"resourceslices": self.upsert_slice, "deviceclasses": self.upsert_class, "resourceclaims": self.upsert_claim,
         "resourceclaimtemplates": self.upsert_template}[kind](obj)

    # -- node facts ----------------------------------------------------------------------------
    def merge(self, facts: NodeFacts) -> NodeFacts:
        """The node's facts with what its ResourceSlices add: labels win; a missing product, driver,
        CUDA or compute capability comes from the devices' attributes."""
        devices = self._devices.get(facts.name)
        if not devices:
            self._label_facts.pop(facts.name, None)
            return facts
        self._label_facts[facts.name] = facts
        gpu = next((d for d in devices if d.type in (None, "gpu")), devices[0])
        product = facts.product or device_product(gpu)
        driver = facts.driver or _first(d.driver for d in devices)
        cuda: Version | None = facts.max_cuda
        source = facts.max_cuda_source
        if cuda is None or source == "driver table":  # the driver's own word beats the table
            found = _first(d.cuda for d in devices)
            if found is not None:
                cuda, source = found[:2], f"ResourceSlice cudaDriverVersion ({self.config.driver})"
        compute = facts.compute or _first(d.compute for d in devices)
        return replace(facts, product=product, driver=driver, max_cuda=cuda, max_cuda_source=source,
                       compute=compute, dra_devices=len(devices))

    def label_facts(self, node: str) -> NodeFacts | None:
        return self._label_facts.get(node)

    def forget_node(self, node: str) -> None:
        """The Node is gone: its label facts with it (its slices, deleted after it, are the slices' events)."""
        self._label_facts.pop(node, None)

    # -- slices --------------------------------------------------------------------------------
    def upsert_slice(self, obj: Mapping[str, Any]) -> None:
        record = slice_from_json(obj)
        with self.lock:
            if record.driver != self.config.driver:
                self.delete_slice(record.name)  # a slice whose driver changed, or a snapshot's other drivers
                return
            old = self.slices.get(record.name)
            if old == record:
                return
            self.slices[record.name] = record
            touched = {record.node or record.pool}
            if old is not None:
                touched.add(old.node or old.pool)
                self._by_node.get(old.node or old.pool, {}).pop(record.name, None)
            self._by_node.setdefault(record.node or record.pool, {})[record.name] = record
            if record.node:
                self._pool_node[record.pool] = record.node
            for node in touched:
                self._reindex(node)

    def delete_slice(self, name: str) -> None:
        with self.lock:
            old = self.slices.pop(name, None)
            if old is not None:
                node = old.node or old.pool
                self._by_node.get(node, {}).pop(name, None)
                self._reindex(node)

    def replace_slices(self, objects: Iterable[Mapping[str, Any]]) -> None:
        fresh = [o for o in objects]
        names = {str((o.get("metadata") or {}).get("name") or "") for o in fresh}
        with self.lock:
            for name in set(self.slices) - names:
                self.delete_slice(name)
            for obj in fresh:
                self.upsert_slice(obj)

    def _reindex(self, node: str) -> None:
        slices = self._by_node.get(node)
        devices = tuple(d for s in sorted(slices.values(), key=lambda s: s.name) for d in s.devices) if slices else ()
        if not slices:
            self._by_node.pop(node, None)
        if devices == self._devices.get(node, _NOTHING):
            return
        if devices:
            self._devices[node] = devices
        else:
            self._devices.pop(node, None)
        if any(d.shared and d.capacity_of("memory") is not None for d in devices):
            self._sharing_nodes.add(node)
        else:
            self._sharing_nodes.discard(node)
        for listener in self._on_devices:
            listener(node)

    # -- classes -------------------------------------------------------------------------------
    def upsert_class(self, obj: Mapping[str, Any]) -> None:
        record = class_from_json(obj)
        with self.lock:
            self.classes[record.name] = record
            self._reextend()

    def delete_class(self, name: str) -> None:
        with self.lock:
            if self.classes.pop(name, None) is not None:
                self._reextend()

    def replace_classes(self, objects: Iterable[Mapping[str, Any]]) -> None:
        records = [class_from_json(o) for o in objects]
        with self.lock:
            self.classes = {r.name: r for r in records}
            self._reextend()

    def _reextend(self) -> None:
        """Which class serves each extended resource, as kube-scheduler's cache decides it
        (k8s.io/dynamic-resource-allocation v0.37.2 deviceclass/extendedresourcecache `updateResourceName2class`):
        of classes naming the same extendedResourceName, the newest (tie: the lower name); every class also
        serves its implicit name. Only configured GPU classes are kept."""
        chosen: dict[str, DeviceClass] = {}
        for found in self.classes.values():
            name = found.extended_resource
            if not name:
                continue
            other = chosen.get(name)
            if other is None or (found.created, other.name) > (other.created, found.name):
                chosen[name] = found
        extended = {name: found.name for name, found in chosen.items() if found.name in self.gpu_classes}
        extended.update((implicit_name(name), name) for name in self.classes if name in self.gpu_classes)
        self.extended = extended

    # -- claims and templates ------------------------------------------------------------------
    def upsert_claim(self, obj: Mapping[str, Any]) -> None:
        record = claim_from_json(obj)
        with self.lock:
            old = self.claims.get(record.key)
            if old == record:
                return
            self.claims[record.key] = record
            self._count(old, -1)
            self._count(record, +1)

    def delete_claim(self, key: str) -> None:
        with self.lock:
            self._count(self.claims.pop(key, None), -1)

    def replace_claims(self, objects: Iterable[Mapping[str, Any]]) -> None:
        records = {r.key: r for r in (claim_from_json(o) for o in objects)}
        with self.lock:
            for key in set(self.claims) - records.keys():
                self.delete_claim(key)
            for record in records.values():
                if self.claims.get(record.key) != record:
                    self._count(self.claims.get(record.key), -1)
                    self.claims[record.key] = record
                    self._count(record, +1)

    def _charge(self, claim: Claim, step: int) -> None:
        """The claim's devices in its namespace's figures (what ResourceQuota counts), its pod's count."""
        if claim.devices:
            _add(self.namespace_devices, claim.namespace, claim.devices, step)
            if claim.extended:
                _add(self.namespace_extended, claim.namespace, claim.devices, step)
            if claim.monitor:
                _add(self.namespace_monitors, claim.namespace, claim.devices, step)
                for listener in self._on_monitors:
                    listener(claim.namespace)
        if claim.owner:
            made = self.made_for_pod.setdefault(claim.owner, MadeForPod())
            made.claims += step
            for device_class, number in claim.devices:
                made.devices[device_class] = made.devices.get(device_class, 0) + step * number
                if made.devices[device_class] <= 0:
                    del made.devices[device_class]
            if made.claims <= 0:
                del self.made_for_pod[claim.owner]

    def mig_profiles(self) -> set[str]:
        """Every MIG profile a device of the driver publishes (`profile`, NVIDIA's spelling: 1g.10gb+me)."""
        return {d.profile for devices in self._devices.values() for d in devices if d.type == "mig" and d.profile}

    def _count(self, claim: Claim | None, step: int) -> None:
        """Which devices of our driver allocated claims hold, and what they consume of shared ones, per
        node: the fit and the scores read it. Monitors' claims hold nothing (they share)."""
        if claim is None:
            return
        self._charge(claim, step)
        if not claim.allocated:
            return
        touched = set()
        admin = claim.shared_results
        for index, (driver, pool, device) in enumerate(claim.allocated):
            if driver != self.config.driver or (index < len(admin) and admin[index]):
                continue  # an admin-access result is not an allocation (allocateddevices.go foreachAllocatedDevice)
            node = self.node_of_pool(pool)
            used = self._used.setdefault(node, {})
            used[device] = used.get(device, 0) + step
            if used[device] <= 0:
                del used[device]
            if not used:
                del self._used[node]
            if index < len(claim.consumed) and claim.consumed[index]:
                self._consume(node, device, claim.consumed[index], step)
            touched.add(node)
        for node in touched:
            for listener in self._on_usage:
                listener(node)

    def _consume(self, node: str, device: str, amounts: tuple[tuple[str, int], ...], step: int) -> None:
        on_node = self._consumed.setdefault(node, {})
        held = on_node.setdefault(device, {})
        for name, amount in amounts:
            held[name] = held.get(name, 0) + step * amount
            if held[name] <= 0:
                del held[name]
        if not held:
            del on_node[device]
        if not on_node:
            del self._consumed[node]

    def upsert_template(self, obj: Mapping[str, Any]) -> None:
        record = template_from_json(obj)
        with self.lock:
            self._monitor_template(self.templates.get(record.key), -1)
            self.templates[record.key] = record
            self._monitor_template(record, +1)

    def delete_template(self, key: str) -> None:
        with self.lock:
            self._monitor_template(self.templates.pop(key, None), -1)

    def replace_templates(self, objects: Iterable[Mapping[str, Any]]) -> None:
        records = {r.key: r for r in (template_from_json(o) for o in objects)}
        with self.lock:
            self.templates = records
            self.monitor_templates = {}
            for record in records.values():
                self._monitor_template(record, +1)

    def _monitor_template(self, template: Claim | None, step: int) -> None:
        """Namespaces with admin-access templates (monitors): their pods' claims are charged by quota."""
        if template is None or not template.monitor:
            return
        count = self.monitor_templates.get(template.namespace, 0) + step
        if count > 0:
            self.monitor_templates[template.namespace] = count
        else:
            self.monitor_templates.pop(template.namespace, None)


def _add(table: dict[str, dict[str, int]], namespace: str, devices: tuple[tuple[str, int], ...], step: int) -> None:
    used = table.setdefault(namespace, {})
    for device_class, number in devices:
        used[device_class] = used.get(device_class, 0) + step * number
        if used[device_class] <= 0:
            del used[device_class]
    if not used:
        del table[namespace]


def _first(values: Iterable[Version | None]) -> Version | None:
    return next((v for v in values if v is not None), None)
