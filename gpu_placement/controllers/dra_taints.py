"""DeviceTaintRules for the devices of unverified nodes: the DRA allocator's own readiness gate.

kube-scheduler's DRA plugin allocates devices from ResourceSlices and knows nothing of the GPU
Operator's validator, a driver upgrade or a MIG change. It does honour device taints: a device
tainted `NoSchedule` or `NoExecute` is given to no claim that does not tolerate the taint (k8s.io/
dynamic-resource-allocation v0.37.2, structured/internal/stable/allocator_stable.go
taintPreventsAllocation; `None` only reports), and a DeviceTaintRule taints every device its selector
matches as if the driver had (resource/v1 types.go). So, for every node with devices of the
configured driver whose node-level verdict is NotValidated, DriverUpgrade or MIGReconfiguring
(rules.dra_readiness), one rule:

    name      gpu-placement-<pool>        (NVIDIA's driver names each pool after its node)
    labels    app.kubernetes.io/managed-by: gpu-placement, gpu-placement.io/node: node_label_value(<node>)
    annotations  gpu-placement.io/node: <node>, gpu-placement.io/reason: <sentence>
    selector  {driver: <dra.driver>, pool: <pool>}
    taint     {key: gpu-placement.io/unverified, value: <reason code>, effect: <dra.taintEffect>}

and, where telemetry names a device by UUID (a recent XID), `gpu-placement-<pool>-<device>` for that
device alone (value XIDError); the same for a device a pod running on it reports Unhealthy in its
status (`allocatedResourcesStatus`, KEP-4680: value DeviceUnhealthy, `ClusterView.unhealthy_on`), for
as long as one does. Deleted when the node is verified again. A launch fence on the node's DRA devices
(claim pods gpu-placement routed failed to start there for the node's reasons, in a row: docs/rules.md,
LaunchFailures) is the pool's rule with value LaunchFailures, or the devices' own rules where every
failure named its device (allocatedResourcesStatus); none while its probe is open (one pod may take a
device then), and deleted once the fence lifts. Not tainted: NodeNotReady (a NotReady or
cordoned node already takes no pod, and NoExecute would turn every cordon into an eviction).

The validator's way in. GPU Operator 26.7's DRA validator proves a node by taking one of its GPUs
through a ResourceClaim (manifests/state-dra-validation: adminAccess, no toleration), and admin
access does not pass a taint. A rule on a node whose validator pod waits for its device would keep
the node unverified for ever, so while a validator pod made for the node is not bound yet, the
node's rule is held back (gpu_placement_dra_taint_holds); it comes back once the validator runs and
has its device (NoSchedule does not touch an allocation made). For the same reason `NoExecute`
becomes `NoSchedule` on a node whose validator holds a device through a claim: it would be evicted.
Which validators wait is the view's own index (`ClusterView.waiting_validators`), so a validator pod
already pending when this process started counts as much as one that arrives later.

A node's name goes into the annotation `gpu-placement.io/node` whole; the label of that key holds it
where it is a valid label value (at most 63 characters: a node name may have 253), else a 63-character
stand-in with a hash (`node_label_value`), so that `-l gpu-placement.io/node=...` still selects.

Each rule is its own unit of work (gpu_placement/kube/leader.py `Failures`): a write refused for one rule is
logged, counted, retried on the next turns (its node stays dirty), and the pass goes on with the
others (gpu_placement_dra_taint_failing_objects). kube-controller-manager writes every rule's status
as soon as it appears or changes (device_taint_eviction.go `maybeUpdateRuleStatus`, v1.37.2), so the
resourceVersion this controller was answered with is soon stale: deletes carry only the uid as a
precondition, and an update answered 409 is made again once on the rule as it is now.

In audit mode the rules only report (effect None): audit changes nothing a pod runs with. Each rule
is owned by the release's ValidatingWebhookConfiguration (`owner`, gpu_placement.kube.owner), so `helm
uninstall` leaves no device taint behind.

One writer, elected by a Lease (like the quota mirror); writes are paced (`writes_per_second`); rules
without our label are never touched, even with our name. The API version comes from discovery
(v1, else v1beta2, else v1alpha3); where none is served, a gauge and a log line say that only the
extender keeps DRA pods off unverified nodes.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from kubernetes.client import ApiClient

from gpu_placement.base.config import Config
from gpu_placement.decide.fences import Fences
from gpu_placement.decide.rules import (
    DRA_DEVICES,
    DRIVER_UPGRADE,
    LAUNCH_FAILURES,
    MIG_RECONFIGURING,
    NOT_VALIDATED,
    dra_readiness,
    launch_failures,
)
from gpu_placement.kube.api import (
    OBJECT_TIMEOUT,
    ApiConflict,
    ApiNotFound,
    api_error,
    get,
    get_or_none,
    request,
    write,
)
from gpu_placement.kube.discovery import GROUP, discover
from gpu_placement.kube.leader import Failures, LeaderLoop, Pacer, counted
from gpu_placement.kube.lease import Lease
from gpu_placement.kube.owner import Owner
from gpu_placement.observe.metrics import (
    API_OUTCOMES,
    DRA_TAINT_FAILING,
    DRA_TAINT_HOLDS,
    DRA_TAINT_LEADING,
    DRA_TAINT_RULES,
    DRA_TAINT_SERVED,
    DRA_TAINT_SUCCESS,
    DRA_TAINT_WRITES,
    DRA_TAINTED_DEVICES,
)
from gpu_placement.view.cluster import ClusterView

__all__ = [
    "DEVICE_UNHEALTHY",
    "MANAGED_BY",
    "NODE_LABEL",
    "TAINTED",
    "TAINT_KEY",
    "XID_ERROR",
    "Rule",
    "TaintController",
    "TaintSettings",
    "desired_rules",
    "node_label_value",
    "rule_node",
]

log = logging.getLogger("gpu_placement.dra")

TAINT_KEY = "gpu-placement.io/unverified"
NODE_LABEL = "gpu-placement.io/node"
REASON_ANNOTATION = "gpu-placement.io/reason"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpu-placement")
TAINTED = frozenset({NOT_VALIDATED, DRIVER_UPGRADE, MIG_RECONFIGURING})
XID_ERROR = "XIDError"
# A pod running on the device reports it Unhealthy (status.containerStatuses[].allocatedResourcesStatus,
# KEP-4680): tainted alone, as an XID device is, for as long as a pod reports it.
DEVICE_UNHEALTHY = "DeviceUnhealthy"
_SELECTOR = f"{MANAGED_BY[0]}={MANAGED_BY[1]}"
_ACTIONS = {"POST": "create", "PUT": "update", "DELETE": "delete"}
_NAME_LIMIT = 253
_LABEL_VALUE_LIMIT = 63
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # apimachinery IsLabelValue


@dataclass(slots=True, frozen=True)
class TaintSettings:
    lease_name: str = "gpu-placement-dra"
    lease_seconds: int = 30  # another replica takes over this long after the holder stops renewing
    renew_seconds: float = 10.0  # how often the holder renews (and a standby tries); also the idle wake-up
    resync_seconds: float = 300.0  # full pass against a fresh list: rules edited or deleted by hand
    settle_seconds: float = 0.2  # after a change, wait this long for its neighbours: one pass for a burst
    writes_per_second: float = 5.0  # the pace of creates, updates and deletes
    burst: int = 10
    owner: str | None = None  # the ValidatingWebhookConfiguration owning the rules (gpu_placement.kube.owner)


@dataclass(slots=True, frozen=True)
class Rule:
    name: str
    node: str
    pool: str
    device: str | None  # None: the whole pool
    reason: str  # the taint value: a reason code
    effect: str
    sentence: str  # for people, in an annotation
    devices: int  # how many devices it covers (metrics)


def _rule_name(*parts: str) -> str:
    name = "-".join(("gpu-placement", *parts))
    if len(name) <= _NAME_LIMIT:
        return name
    return f"gpu-placement-{hashlib.sha256(name.encode()).hexdigest()[:16]}"


def node_label_value(node: str) -> str:
    """The `gpu-placement.io/node` label of a node's rules: its name where that is a valid label value
    (apimachinery IsLabelValue: at most 63 characters), else the name's first 46 characters, a dash and
    16 hex digits of its SHA-256 (a node name may have 253 characters: a DNS subdomain)."""
    if len(node) <= _LABEL_VALUE_LIMIT and _LABEL_VALUE.match(node):
        return node
    digest = hashlib.sha256(node.encode()).hexdigest()[:16]
    head = re.sub(r"[^-A-Za-z0-9_.]", "-", node[:46]).strip("-_.") or "node"
    return f"{head}-{digest}"


def rule_node(rule: dict[str, Any]) -> str | None:
    """The node a rule of ours is for: its annotation, or (rules written before it) its label."""
    meta = rule.get("metadata") or {}
    node = (meta.get("annotations") or {}).get(NODE_LABEL) or (meta.get("labels") or {}).get(NODE_LABEL)
    return str(node) if node else None


def desired_rules(view: ClusterView, config: Config, node: str, fences: Fences | None = None
                  ) -> tuple[list[Rule], bool]:
    """The rules one node should have now, and whether its rule is held back for a waiting validator
    (one made for the node and not bound yet: the view's `waiting_validators`). Call under the view's lock."""
    dra, facts = view.dra, view.nodes.get(node)
    devices = dra.devices_on(node)
    if facts is None or not devices:
        return [], False
    pools = sorted({s.pool for s in dra.slices_of(node)})
    rejection = dra_readiness(facts, view.validator_state(node), config)
    if rejection is not None and rejection.code in TAINTED:
        if view.waiting_validators.get(node):
            return [], True
        effect = _effect(config)
        if effect == "NoExecute" and any(p.claims for k in view.validators.get(node, ()) if (p := view.pods.get(k))):
            effect = "NoSchedule"  # the validator holds one of these devices: it must not be evicted
        per_pool = {pool: sum(len(s.devices) for s in dra.slices_of(node) if s.pool == pool) for pool in pools}
        return [Rule(_rule_name(pool), node, pool, None, rejection.code, effect, rejection.message, per_pool[pool])
                for pool in pools], False
    fence = next((f for f in fences.closed(node) if f.resource == DRA_DEVICES), None) if fences is not None else None
    if fence is not None and not fence.devices:
        sentence = launch_failures(fence).message[:1024]
        per_pool = {pool: sum(len(s.devices) for s in dra.slices_of(node) if s.pool == pool) for pool in pools}
        return [Rule(_rule_name(pool), node, pool, None, LAUNCH_FAILURES, _effect(config), sentence, per_pool[pool])
                for pool in pools], False
    reading = view.telemetry.get(node)
    bad = reading.xid_devices if reading is not None else frozenset()
    sick = view.unhealthy_on(node)
    named = set(fence.devices) if fence is not None else set()
    rules: dict[str, Rule] = {}
    for slice_ in dra.slices_of(node) if bad or sick or named else ():
        for device in slice_.devices:
            name = _rule_name(slice_.pool, device.name)
            if device.uuid in bad:
                rules[name] = Rule(name, node, slice_.pool, device.name, XID_ERROR, _effect(config),
                                   f"{XID_ERROR}: telemetry reports a recent XID error on GPU {device.uuid} "
                                   "(DCGM_FI_DEV_XID_ERRORS)", 1)
            elif device.name in sick:
                rules[name] = Rule(name, node, slice_.pool, device.name, DEVICE_UNHEALTHY, _effect(config),
                                   f"{DEVICE_UNHEALTHY}: {sick[device.name]}"[:1024], 1)
            elif device.name in named and fence is not None:
                rules[name] = Rule(name, node, slice_.pool, device.name, LAUNCH_FAILURES, _effect(config),
                                   launch_failures(fence).message[:1024], 1)
    return list(rules.values()), False


class TaintController(LeaderLoop):
    what = "DRA taints"
    log = log

    def __init__(self, api: ApiClient, view: ClusterView, config: Config, namespace: str, identity: str,
                 settings: TaintSettings | None = None, clock: Callable[[], float] = time.monotonic,
                 fences: Fences | None = None) -> None:
        self.api, self.view, self.config, self.fences = api, view, config, fences
        self.settings = settings or TaintSettings()
        super().__init__(Lease(api, namespace, self.settings.lease_name, identity, self.settings.lease_seconds),
                         DRA_TAINT_LEADING.labels(self.settings.lease_name), self.settings.renew_seconds, clock,
                         settle_seconds=self.settings.settle_seconds)
        self._success = DRA_TAINT_SUCCESS.labels(self.settings.lease_name)
        self._success.set(time.time())
        for action in _ACTIONS.values():  # every series from the start: rate() and alerts need a zero
            for outcome in API_OUTCOMES:
                DRA_TAINT_WRITES.labels(action, outcome)
        self.version: str | None = None  # the DeviceTaintRule API version served; None: not served
        self.writes = 0
        self.owned: dict[str, dict[str, Any]] = {}  # our rules as last read or written, by name
        self.holds: set[str] = set()
        self.failures = Failures("DRA taints", log, DRA_TAINT_FAILING.labels(self.settings.lease_name))
        self._failed_on: dict[str, str] = {}  # rule name -> its node, while the rule is failing
        self._dirty: set[str] = set()
        self._everything = True
        self._dirty_lock = threading.Lock()
        self.pacer = Pacer(self.settings.writes_per_second, self.settings.burst, clock)
        self._said_unserved = False
        self._published: set[tuple[str, str]] = set()
        self._owner = Owner(self.settings.owner, "DRA taints") if self.settings.owner else None
        view.subscribe(self._node_changed, self._node_changed)  # validators waiting for a node too
        view.dra.subscribe(self._node_changed, lambda _node: None)
        if fences is not None:  # a launch fence began, lifted, or its probe opened
            fences.subscribe(self._node_changed)

    # -- events (under the view's lock: note and wake) -----------------------------------------
    def _node_changed(self, name: str | None) -> None:
        with self._dirty_lock:
            if name is None:
                self._everything = True
            else:
                self._dirty.add(name)
        self._wake.set()

    # -- running -------------------------------------------------------------------------------
    def _turn(self) -> None:
        """One turn: the Lease; then, leading, a full pass when due, else the nodes that changed."""
        self._lead()
        if not self.leading:
            self.last_error = None
            self._success.set(time.time())
            return
        if not {"nodes", "pods", "resourceslices"} <= self.view.listed:
            self.last_error = None
            return  # never act on a half-known view: a node not listed yet would look untainted
        if self._owner is not None and self._owner.read(self.api):
            self._next_resync = 0.0  # a new owner (helm upgrade after it was deleted): relist, mend all
        now = self.clock()
        if now >= self._next_resync:
            self._discover()
            if self.version is not None:
                self._relist()
            self._next_resync = now + self.settings.resync_seconds
            with self._dirty_lock:
                self._everything = True
        if self.version is None:
            self._success.set(time.time())
            return
        with self._dirty_lock:
            everything, names = self._everything, self._dirty
            self._everything, self._dirty = False, set()
        try:
            self._reconcile(None if everything else names)
        except BaseException:
            with self._dirty_lock:  # what was not done is done next time
                self._everything = self._everything or everything
                self._dirty |= names
            raise
        self._end_turn()

    def _end_turn(self) -> None:
        """The pass went through: the nodes of rules still failing are tried again next turn (the loop's
        next wake-up, not at once); the stamp moves only when nothing is failing."""
        failing = self.failures.errors
        with self._dirty_lock:
            self._dirty.update(self._failed_on[name] for name in failing if name in self._failed_on)
        self.last_error = failing[min(failing)] if failing else None
        if not failing:
            self._success.set(time.time())

    def _took_lead(self) -> None:
        log.info("DRA taints: this replica now keeps the DeviceTaintRules of unverified nodes")
        self._next_resync = 0.0

    def _not_leading(self) -> None:
        self.failures.forget(list(self.failures.errors))  # the leader writes them now
        self._failed_on.clear()

    def _discover(self) -> None:
        found = discover(self.api).taint_version
        if found != self.version or not self._said_unserved:
            if found is None:
                log.warning("DRA taints: the API server serves no DeviceTaintRule (resource.k8s.io v1, v1beta2 or "
                            "v1alpha3): only the extender keeps DRA pods of the gpu-placement scheduler off "
                            "unverified nodes; pods of other schedulers may get their devices")
            else:
                log.info("DRA taints: DeviceTaintRules at %s/%s, effect %s", GROUP, found, _effect(self.config))
            self._said_unserved = True
        self.version = found
        DRA_TAINT_SERVED.set(1.0 if found else 0.0)

    # -- the work ------------------------------------------------------------------------------
    def _reconcile(self, nodes: set[str] | None) -> None:
        """Make our rules of these nodes (None: of every node) what they should be, each rule on its own:
        one refused is kept in `failures` (its node retried next turn) and the others go on."""
        with self.view.lock:
            names = set(self.view.dra.nodes()) if nodes is None else set(nodes)
            if nodes is None:
                names |= {rule_node(r) or "" for r in self.owned.values()}
            wanted: dict[str, Rule] = {}
            for node in sorted(names):
                rules, held = desired_rules(self.view, self.config, node, self.fences)
                wanted.update((rule.name, rule) for rule in rules)
                if held and node not in self.holds:
                    log.info("DRA taints: node %s is not verified, but a validator pod waits for one of its devices: "
                             "no rule until it has one (a taint would keep it out)", node)
                    self.holds.add(node)
                elif not held:
                    self.holds.discard(node)
        owners = self._owner_refs()
        tried: set[str] = set()
        for name, rule in wanted.items():
            if owners is None:
                break  # no owner to give it (said once by Owner.read): write nothing the uninstall would miss
            current = self.owned.get(name)
            if current is None or _differs(current, rule, self.config.dra.driver, owners):
                tried.add(name)
                with self._unit(name, rule.node):
                    if current is None:
                        self._create(rule)
                    else:
                        self._update(current, rule)
        for name, current in list(self.owned.items()):
            on = rule_node(current)
            if name not in wanted and (nodes is None or on in names):
                tried.add(name)
                with self._unit(name, on or ""):
                    self._delete(current)
        # A failing rule of these nodes that is no longer to be written (its node verified since): forgotten.
        self.failures.forget(name for name in list(self.failures.errors)
                             if name not in tried and (nodes is None or self._failed_on.get(name) in names))
        self._publish()

    @contextmanager
    def _unit(self, name: str, node: str) -> Iterator[None]:
        """One rule's write: refused, it is kept failing with its node (retried next turn)."""
        with self.failures.unit(name):
            yield
        if name in self.failures.errors:
            self._failed_on[name] = node
        else:
            self._failed_on.pop(name, None)

    def _publish(self) -> None:
        DRA_TAINT_RULES.set(len(self.owned))
        DRA_TAINT_HOLDS.set(len(self.holds))
        counts: dict[tuple[str, str], int] = {}
        for rule in self.owned.values():
            taint = (rule.get("spec") or {}).get("taint") or {}
            key = (str(taint.get("value") or ""), str(taint.get("effect") or ""))
            covered = int(((rule.get("metadata") or {}).get("annotations") or {}).get("gpu-placement.io/devices") or 0)
            counts[key] = counts.get(key, 0) + covered
        for labels in self._published - counts.keys():  # reasons no rule has any more go to 0
            DRA_TAINTED_DEVICES.labels(*labels).set(0)
        for (reason, effect), count in counts.items():
            DRA_TAINTED_DEVICES.labels(reason, effect).set(count)
        self._published = set(counts)

    def _body(self, rule: Rule, current: dict[str, Any] | None) -> dict[str, Any]:
        selector = {"driver": self.config.dra.driver, "pool": rule.pool}
        if rule.device is not None:
            selector["device"] = rule.device
        meta: dict[str, Any] = {"name": rule.name,
                                "labels": {MANAGED_BY[0]: MANAGED_BY[1], NODE_LABEL: node_label_value(rule.node)},
                                "annotations": {REASON_ANNOTATION: rule.sentence, NODE_LABEL: rule.node,
                                                "gpu-placement.io/devices": str(rule.devices)}}
        if current is not None:  # keep what others added; a lost update is a 409
            old = current.get("metadata") or {}
            meta = {**old, "labels": {**(old.get("labels") or {}), **meta["labels"]},
                    "annotations": {**(old.get("annotations") or {}), **meta["annotations"]}}
            meta.pop("managedFields", None)
        owners = self._owner_refs()
        if owners:
            meta["ownerReferences"] = owners
        return {"apiVersion": f"{GROUP}/{self.version}", "kind": "DeviceTaintRule", "metadata": meta,
                "spec": {"deviceSelector": selector,
                         "taint": {"key": TAINT_KEY, "value": rule.reason, "effect": rule.effect}}}

    def _create(self, rule: Rule) -> None:
        try:
            created = self._write("POST", self._path(), self._body(rule, None))
        except ApiConflict:
            found = get_or_none(self.api, self._path(rule.name), timeout=OBJECT_TIMEOUT)
            if found is not None and not _ours(found):
                log.warning("DRA taints: a DeviceTaintRule %s exists that gpu-placement does not manage; left alone, "
                            "so node %s's devices are not tainted by gpu-placement: rename or remove it", rule.name,
                            rule.node)
                return
            if found is not None:
                self.owned[rule.name] = found
                self._update(found, rule)
            return
        self.owned[rule.name] = created
        log.info("DRA taints: tainted %s of node %s (%s=%s:%s): %s", f"device {rule.device}" if rule.device else
                 "every device", rule.node, TAINT_KEY, rule.reason, rule.effect, rule.sentence)

    def _update(self, current: dict[str, Any], rule: Rule) -> None:
        try:
            updated = self._write("PUT", self._path(rule.name), self._body(rule, current))
        except ApiConflict:
            # Changed since we read it (kube-controller-manager writes its status): once more, on what it is now.
            found = get_or_none(self.api, self._path(rule.name), timeout=OBJECT_TIMEOUT)
            if found is None:
                self.owned.pop(rule.name, None)
                self._create(rule)
                return
            if not _ours(found):
                self.owned.pop(rule.name, None)
                log.warning("DRA taints: DeviceTaintRule %s is no longer labelled as gpu-placement's; left alone",
                            rule.name)
                return
            updated = self._write("PUT", self._path(rule.name), self._body(rule, found))
        self.owned[rule.name] = updated
        log.info("DRA taints: node %s now %s:%s (%s)", rule.node, rule.reason, rule.effect, rule.sentence)

    def _delete(self, current: dict[str, Any]) -> None:
        meta = current.get("metadata") or {}
        name = str(meta.get("name") or "")
        # The uid alone: the resourceVersion we were answered with is stale as soon as kube-controller-manager
        # writes the rule's status (device_taint_eviction.go maybeUpdateRuleStatus), which it does for every rule.
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": meta.get("uid")}}
        self._take_token(self.pacer)
        with counted(DRA_TAINT_WRITES, "delete"):  # ApiNotFound: gone already, what was wanted
            write(self.api, "DELETE", self._path(name), body=options, timeout=OBJECT_TIMEOUT, settled=ApiNotFound)
        self.owned.pop(name, None)
        self.writes += 1
        log.info("DRA taints: removed %s: node %s is verified again", name, rule_node(current))

    def _owner_refs(self) -> list[dict[str, Any]] | None:
        """The rules' ownerReferences: [] without a configured owner; None while it is missing."""
        if self._owner is None:
            return []
        return None if self._owner.ref is None else [self._owner.ref]

    # -- HTTP ----------------------------------------------------------------------------------
    def _path(self, name: str | None = None) -> str:
        return f"/apis/{GROUP}/{self.version}/devicetaintrules" + (f"/{name}" if name else "")

    def _relist(self) -> None:
        items = get(self.api, self._path(), query=[("labelSelector", _SELECTOR)], timeout=OBJECT_TIMEOUT
                    ).get("items") or []
        self.owned = {str(item["metadata"]["name"]): item for item in items if _ours(item)}

    def _write(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._take_token(self.pacer)
        with counted(DRA_TAINT_WRITES, _ACTIONS[method]):
            response = request(self.api, method, path, body=body, timeout=OBJECT_TIMEOUT)
            if response.status >= 300:
                raise api_error(response)
            written: dict[str, Any] = orjson.loads(response.read())
            response.release_conn()
        self.writes += 1
        return written


def _ours(rule: dict[str, Any]) -> bool:
    labels = (rule.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY[0]) == MANAGED_BY[1])


def _effect(config: Config) -> str:
    """Audit mode changes nothing a pod runs with: its rules only report (effect None)."""
    return "None" if config.mode == "audit" else config.dra.taint_effect


def _differs(current: dict[str, Any], rule: Rule, driver: str, owners: list[dict[str, Any]]) -> bool:
    spec = current.get("spec") or {}
    selector = spec.get("deviceSelector") or {}
    taint = spec.get("taint") or {}
    meta = current.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    return (selector.get("driver"), selector.get("pool"), selector.get("device"), taint.get("key"),
            taint.get("value"), taint.get("effect"), annotations.get(REASON_ANNOTATION), annotations.get(NODE_LABEL),
            labels.get(NODE_LABEL), meta.get("ownerReferences") or []) != (
        driver, rule.pool, rule.device, TAINT_KEY, rule.reason, rule.effect, rule.sentence, rule.node,
        node_label_value(rule.node), owners)
