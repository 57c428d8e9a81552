"""The in-memory view of the cluster that both the extender and the webhook read.

Fed by a source (snapshot file or list+watch) one object change at a time; each change updates the
derived figures it touches (free GPU units and memory of one node, one namespace's usage) and tells
listeners which node changed, so per-request work never rescans the cluster.

Thread model: sources write from their own threads under `lock`; readers on the request path take
`lock` for the few hundred microseconds they need, so they never see half of a change. A relist is
applied as its changes, a slice at a time (`_replace`): readers see it as they see a watch's events.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpu_placement.base.config import Config
from gpu_placement.base.names import ANN_GPU_MEMORY
from gpu_placement.base.quantity import quantity_to_mib
from gpu_placement.facts.namespaces import NamespaceRecord
from gpu_placement.facts.nodes import NodeFacts, ValidatorState, charge
from gpu_placement.facts.pods import GpuRequests, PodRecord
from gpu_placement.observe import metrics
from gpu_placement.view.dra import DraState

__all__ = ["ClusterView", "Frozen", "Reservation", "Telemetry", "same_pod", "track_view"]

NodeListener = Callable[[str | None], None]  # a node name, or None for "everything changed"
_SLICE = 256  # relisted changes applied per hold of the lock
_NO_VALIDATOR = ValidatorState(None, False)


@dataclass(slots=True)
class Reservation:
    """GPU capacity held for a pod between /bind and the moment the view sees it bound."""

    pod: str
    node: str
    gpus: GpuRequests
    memory_annotation: str | None
    expires: float
    uid: str = ""  # the pod's UID: a pod recreated under the same name (new UID) is another pod


def same_pod(uid: str, other: str) -> bool:
    """Whether two UIDs may name one pod: equal, or one unknown (a snapshot, a test, an old caller)."""
    return not uid or not other or uid == other


@dataclass(slots=True, frozen=True)
class Telemetry:
    free_mib: int | None  # DCGM_FI_DEV_FB_FREE summed over the node's devices
    xid_errors: int  # devices with an XID event in the recent window
    at: float
    device_free_mib: tuple[int, ...] = ()  # each device's free framebuffer, largest first
    xid_devices: frozenset[str] = frozenset()  # UUIDs of the devices with those XID events (DRA taints them)
    xid_events: int = 0  # XID events (value changes) over the node's devices in the window: rollout metrics


@dataclass(slots=True, frozen=True)
class Frozen:
    """A bound pod's memory ask as first seen bound, and where it came from."""

    uid: str
    ask: str | None  # the quantity text charged, None: the unit's memory
    source: str  # "pod annotation", "namespace ml default", or no ask


@dataclass(slots=True)
class _Charge:
    node: str
    items: tuple[tuple[str, int, int | None], ...]  # (resource, units, MiB or None)


@dataclass(slots=True)
class _Used:
    units: dict[str, int] = field(default_factory=dict)
    mib: dict[str, int] = field(default_factory=dict)


class ClusterView:
    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeFacts] = {}
        self.pods: dict[str, PodRecord] = {}
        self.namespaces: dict[str, NamespaceRecord] = {}
        # Derived, per resource then node: what is free now. Readers index these directly.
        self.free_units: dict[str, dict[str, int]] = {}
        self.free_mib: dict[str, dict[str, int | None]] = {}
        self.capacity_mib: dict[str, dict[str, int | None]] = {}
        self.telemetry: dict[str, Telemetry] = {}
        self.namespace_usage: dict[str, dict[str, int]] = {}
        self.validators: dict[str, dict[str, bool]] = {}  # node -> validator pod key -> Ready
        # node -> validator pods made for it (by its DaemonSet) and not bound yet: the DRA taint controller
        # holds the node's rule back while any waits (gpu_placement/controllers/dra_taints.py), the device table says so
        self.waiting_validators: dict[str, set[str]] = {}
        # node -> pods there whose kubelet reports an allocated resource Unhealthy (KEP-4680): `unhealthy_on`
        self._unhealthy: dict[str, dict[str, PodRecord]] = {}
        # node -> DRA devices a launch fence keeps out, each with its reason (gpu_placement/decide/fences.py
        # writes it; the DRA fit and the DeviceTaintRules read it)
        self.fenced_devices: dict[str, dict[str, str]] = {}
        # namespace/template -> pods waiting for their claims from it (PodRecord.claim_templates)
        self.template_waiters: dict[str, set[str]] = {}
        self.nominated: dict[str, set[str]] = {}  # node -> unbound GPU pods nominated there (status.nominatedNodeName)
        # Kinds kept as records only, by key (gpu_placement/view/ingest.py OBJECT_KINDS): PodDisruptionBudgets
        # by namespace/name (the extender's /preempt), the mirrored ResourceQuotas by namespace (the webhook).
        self.poddisruptionbudgets: dict[str, Any] = {}
        self.resourcequotas: dict[str, Any] = {}
        self.reservations: dict[str, Reservation] = {}
        self.generation = 0  # bumped on every change: cheap "has anything changed" for callers
        self.listed: set[str] = set()  # kinds whose first full list is in
        # full lists of nodes or pods applied (the first ones too): a node writer, which judges only the nodes
        # marked changed, judges every node after one (gpu_placement/controllers/node_writer.py)
        self.relists = 0
        self.listed_at: dict[str, float] = {}  # OBJECT_KINDS -> when their first full list was in (clock)
        # kind -> resourceVersion of the newest event or list the live source applied: how far behind
        # kube-scheduler's informers the view may be (extender/settle.py). Empty for a snapshot.
        self.versions: dict[str, str] = {}
        self._node_pods: dict[str, set[str]] = {}
        self._charges: dict[str, _Charge] = {}
        self._frozen: dict[str, Frozen] = {}  # pod key -> its memory ask as first seen bound
        self._unseen_namespace: dict[str, set[str]] = {}  # namespace not listed yet -> pods frozen without it
        self._used: dict[str, _Used] = {}
        self._expiry: list[tuple[float, str]] = []
        self._listeners: list[NodeListener] = []
        self._free_listeners: list[Callable[[str], None]] = []
        self._pod_listeners: list[Callable[[str, PodRecord | None], None]] = []
        self._namespace_listeners: list[Callable[[str, NamespaceRecord | None], None]] = []
        self.dra = DraState(config.dra, self.lock)  # devices claimed through DRA (gpu_placement.dra)
        self.dra.subscribe(self._dra_devices_changed, self._dra_usage_changed)

    # -- reading -------------------------------------------------------------------------------
    def validator_state(self, node: str) -> ValidatorState:
        pods = self.validators.get(node)
        if not pods:
            return _NO_VALIDATOR
        ready = [key for key, ok in pods.items() if ok]
        return ValidatorState(ready[0] if ready else next(iter(pods)), bool(ready))

    def unhealthy_on(self, node: str) -> dict[str, str]:
        """The node's DRA devices a pod running on them reports unhealthy
        (status.containerStatuses[].allocatedResourcesStatus, KEP-4680), each with a sentence: the
        DeviceTaintRule controller taints them as it taints an XID device, and the DRA fit leaves them out
        (gpu_placement/decide/dra_fit.py). Found by the resourceID when it is `<driver>/<pool>/<device>`
        (the kubelet's form without a CDI device), else through the pod's claim (`claim:<name>[/<request>]`)
        and the CDI device NVIDIA's driver names `<claim uid>-<device>`. Call under `lock`."""
        pods = self._unhealthy.get(node)
        if not pods:
            return {}
        found: dict[str, str] = {}
        for pod in pods.values():
            for name, resource_id, message in pod.unhealthy:
                for device in self._devices_of(pod, name, resource_id):
                    found.setdefault(device, f"pod {pod.key} reports {device} Unhealthy ({name}"
                                             f"{': ' + message if message else ''})")
        return found

    def reported(self, pod: PodRecord) -> list[str]:
        """For `explain`: what the pod's kubelet reports Unhealthy, with the DRA device each is. Call under `lock`."""
        lines = []
        for name, resource_id, message in pod.unhealthy:
            devices = self._devices_of(pod, name, resource_id)
            where = f"device {', '.join(devices)} of node {pod.node}" if devices else "a device the view cannot name"
            lines.append(f"{name} ({resource_id}) is Unhealthy{': ' + message if message else ''}: {where}")
        return lines

    def devices_reported(self, pod: PodRecord) -> list[str]:
        """The DRA devices of the pod's node its kubelet reports Unhealthy, by name. Call under `lock`."""
        return [device for name, resource_id, _ in pod.unhealthy for device in self._devices_of(pod, name, resource_id)]

    def _devices_of(self, pod: PodRecord, name: str, resource_id: str) -> list[str]:
        driver = self.config.dra.driver
        parts = resource_id.split("/")
        if len(parts) == 3 and parts[0] == driver:
            return [parts[2]]
        if not name.startswith("claim:"):
            return []  # a device plugin's resource: its allocatable shows it
        entry, _, request = name[len("claim:"):].partition("/")
        claim = self.dra.claims.get(f"{pod.namespace}/{dict(pod.claim_names).get(entry, entry)}")
        if claim is None:
            return []
        served = [device for index, (owner, _pool, device) in enumerate(claim.allocated)
                  if owner == driver and (not request or index >= len(claim.results_for)
                                          or claim.results_for[index].split("/", 1)[0] == request)]
        named = [device for device in served if resource_id.endswith((f"-{device}", f"/{device}"))]
        return named or served

    def pods_on(self, node: str) -> list[PodRecord]:
        return [self.pods[key] for key in self._node_pods.get(node, ())]

    def charge_of(self, key: str) -> tuple[tuple[str, int, int | None], ...]:
        """What a bound pod holds on its node: (resource, units, MiB or None), as counted in `free_*`."""
        charge = self._charges.get(key)
        return charge.items if charge is not None else ()

    def used(self, node: str) -> tuple[dict[str, int], dict[str, int]]:
        used = self._used.get(node) or _Used()
        return dict(used.units), dict(used.mib)

    def subscribe(self, on_node: NodeListener, on_free: Callable[[str], None]) -> None:
        """`on_node(name)`: facts or validator of a node changed (None: all of them); `on_free(name)`:
        what is free on a node changed. Both are called under `lock`."""
        self._listeners.append(on_node)
        self._free_listeners.append(on_free)

    def subscribe_namespaces(self, on_namespace: Callable[[str, NamespaceRecord | None], None]) -> None:
        """`on_namespace(name, record)`: that namespace was added, changed or deleted (record None; a
        relist calls it for each difference only). Called under `lock`: keep it to noting the name."""
        self._namespace_listeners.append(on_namespace)

    def subscribe_records(self, on_pod: Callable[[str, PodRecord | None], None],
                          on_namespace: Callable[[str, NamespaceRecord | None], None]) -> None:
        """`on_pod(key, record)`, `on_namespace(name, record)`: that object changed (record None:
        deleted). Called under `lock`."""
        self._pod_listeners.append(on_pod)
        self.subscribe_namespaces(on_namespace)

    def reserved(self, node: str) -> dict[str, tuple[int, int]]:
        """Units and MiB held on `node` by reservations, per resource. Reservations are few: a scan."""
        held: dict[str, tuple[int, int]] = {}
        for pod, reservation in self.reservations.items():
            charged = self._charges.get(f"reservation:{pod}") if reservation.node == node else None
            for resource, units, mib in charged.items if charged else ():
                total = held.get(resource, (0, 0))
                held[resource] = (total[0] + units, total[1] + (mib or 0))
        return held

    # -- nodes ---------------------------------------------------------------------------------
    def upsert_node(self, facts: NodeFacts) -> None:
        with self.lock:
            facts = self.dra.merge(facts)  # what the node's ResourceSlices add to its labels
            old = self.nodes.get(facts.name)
            if old == facts:
                return  # a heartbeat or a field the rules do not read
            self.nodes[facts.name] = facts
            if old is None or _unit_sizes(old) != _unit_sizes(facts):  # new: pods may have come first
                self._recharge_node(facts.name)
            else:
                self._refresh_free(facts.name)
            self._changed(facts.name)

    def delete_node(self, name: str) -> None:
        with self.lock:
            self.dra.forget_node(name)  # its ResourceSlices go after it (garbage collector): no ghost from them
            if self.nodes.pop(name, None) is None:
                return
            self._refresh_free(name)
            self._changed(name)

    def replace_nodes(self, records: Iterable[NodeFacts]) -> None:
        self._replace("nodes", self.nodes, {facts.name: facts for facts in records}, self.delete_node,
                      self.upsert_node)

    # -- pods ----------------------------------------------------------------------------------
    def upsert_pod(self, pod: PodRecord) -> None:
        key = pod.key
        with self.lock:
            old = self.pods.get(key)
            if old == pod:
                return
            self.pods[key] = pod
            self._unaccount(key, old)
            if old is not None and not same_pod(old.uid, pod.uid):
                self.release(key, old.uid)  # the pod this one replaced is gone from the API server
            self._account(key, pod)
            for listener in self._pod_listeners:
                listener(key, pod)

    def delete_pod(self, key: str, uid: str = "") -> None:
        """The pod `key` of UID `uid` is gone. Only that pod: a late DELETED event of a pod recreated
        under the same name since (a StatefulSet's) leaves the new one's record and reservation alone."""
        with self.lock:
            old = self.pods.get(key)
            if old is not None and same_pod(old.uid, uid):
                del self.pods[key]
                if self._frozen.pop(key, None) is not None:
                    self._unseen_namespace.get(old.namespace, set()).discard(key)
                self._unaccount(key, old)
                for listener in self._pod_listeners:
                    listener(key, None)
            self.release(key, uid)  # a pod deleted between /bind and the watch holds nothing any more

    def replace_pods(self, records: Iterable[PodRecord] | dict[str, PodRecord]) -> None:
        """A full list of pods (records, or records by key)."""
        if not self.pods and "pods" not in self.listed:  # the first list: 150,000 pods go in as they come
            self._fill("pods", records.values() if isinstance(records, dict) else records, self.upsert_pod)
            return
        fresh = records if isinstance(records, dict) else {pod.key: pod for pod in records}
        self._replace("pods", self.pods, fresh, self._delete_listed_pod, self.upsert_pod)

    def _delete_listed_pod(self, key: str) -> None:
        """A relist without the pod: that pod (its UID) is gone; a reservation made for a newer pod of
        that name, which the list predates, stays."""
        old = self.pods.get(key)
        self.delete_pod(key, old.uid if old is not None else "")

    # -- namespaces ----------------------------------------------------------------------------
    def upsert_namespace(self, record: NamespaceRecord) -> None:
        with self.lock:
            old = self.namespaces.get(record.name)
            if old == record:
                return
            self.namespaces[record.name] = record
            # A changed namespace default does not re-charge running pods: their charge was fixed when
            # they were first seen bound (contract 6); pods bound from now on take the new default.
            # Pods seen before their namespace (the kinds are listed in parallel) are fixed now.
            for key in self._unseen_namespace.pop(record.name, ()):
                pod = self.pods.get(key)
                self._frozen.pop(key, None)
                if pod is not None and pod.node and key in self._charges:
                    self._charge(key, pod.node, pod.gpus, self._memory_annotation(pod))
            self._touch()
            for listener in self._namespace_listeners:
                listener(record.name, record)

    def delete_namespace(self, name: str) -> None:
        with self.lock:
            if self.namespaces.pop(name, None) is not None:
                self._touch()
                for listener in self._namespace_listeners:
                    listener(name, None)

    def replace_namespaces(self, records: Iterable[NamespaceRecord]) -> None:
        self._replace("namespaces", self.namespaces, {record.name: record for record in records},
                      self.delete_namespace, self.upsert_namespace)

    def _fill(self, kind: str, records: Iterable[Any], upsert: Callable[[Any], None], batch: int = 500) -> None:
        """The first list of a kind into an empty view: nothing to compare or delete, so the records
        go in as the list's pages arrive (a batch at a time under the lock), while the next page is
        still on its way, rather than all after the last one. Nothing decides from a view before
        every kind is listed; a list that fails half way leaves part of it, and the next list, now
        compared with it, puts that right."""
        pending: list[Any] = []
        for record in records:
            pending.append(record)
            if len(pending) >= batch:
                with self.lock:
                    for item in pending:
                        upsert(item)
                pending.clear()
        with self.lock:
            for item in pending:
                upsert(item)
            self.listed.add(kind)
            self._relisted(kind)

    def _replace(self, kind: str, current: dict[str, Any], fresh: dict[str, Any], delete: Callable[[str], None],
                 upsert: Callable[[Any], None]) -> None:
        """A full relist of one kind: apply only the differences, so a relist costs what changed.

        `fresh` is complete before the lock is taken (a live source hands in records built from pages
        as they arrive: no network I/O may happen under the lock, and a list that fails changes
        nothing), and the comparison runs outside it too. The changes are applied in slices of
        `_SLICE`, each under the lock, handing the GIL over in between: a reader waits for one slice
        (a few milliseconds), never for a relist of 10,000 changes. A reader may see a relist partly
        applied, as it sees a watch's events one at a time; `listed` marks the kind complete at the end."""
        changed = [record for key, record in fresh.items() if (old := current.get(key)) is not record and old != record]
        gone = list(current.keys() - fresh.keys())  # C-level set work; only this kind's source writes it
        # Changes first, deletions last: a reader catching the relist half applied sees at worst more
        # GPU use than there is (a new bound pod counted before an ended one is dropped), never less,
        # so a half-applied relist can refuse a pod for a few milliseconds but never overcommit a node.
        work: list[Callable[[], None]] = [*(partial(upsert, record) for record in changed),
                                          *(partial(delete, key) for key in gone)]
        for start in range(0, len(work), _SLICE):
            with self.lock:
                for step in work[start:start + _SLICE]:
                    step()
            if start + _SLICE < len(work):
                time.sleep(0)  # let a request waiting for the lock (or the GIL) in before the next slice
        with self.lock:
            self.listed.add(kind)
            self._relisted(kind)

    def _relisted(self, kind: str) -> None:
        if kind in ("nodes", "pods"):
            self.relists += 1

    # -- records without derived figures (OBJECT_KINDS) -------------------------------------------
    def upsert_object(self, kind: str, key: str, record: object) -> None:
        with self.lock:
            table = self._table(kind)
            if table.get(key) != record:
                table[key] = record
                self._touch()

    def delete_object(self, kind: str, key: str) -> None:
        with self.lock:
            if self._table(kind).pop(key, None) is not None:
                self._touch()

    def replace_objects(self, kind: str, records: dict[str, object]) -> None:
        with self.lock:
            table = self._table(kind)
            if table != records:
                table.clear()
                table.update(records)
                self._touch()
            if kind not in self.listed:
                self.listed_at[kind] = self.clock()
            self.listed.add(kind)

    def _table(self, kind: str) -> dict[str, Any]:
        if kind not in ("poddisruptionbudgets", "resourcequotas"):
            raise ValueError(f"unknown kind {kind!r}")
        table: dict[str, Any] = getattr(self, kind)
        return table

    # -- reservations and telemetry ------------------------------------------------------------
    def reserve(self, pod: str, node: str, gpus: GpuRequests, memory_annotation: str | None,
                uid: str = "") -> Reservation:
        with self.lock:
            self.release(pod)
            reservation = Reservation(pod, node, gpus, memory_annotation,
                                      self.clock() + self.config.reservation_ttl_seconds, uid)
            self.reservations[pod] = reservation
            heapq.heappush(self._expiry, (reservation.expires, pod))
            self._charge(f"reservation:{pod}", node, gpus, memory_annotation)
            self._touch()
            return reservation

    def release(self, pod: str, uid: str = "") -> None:
        """Drop the reservation of `pod` (namespace/name), unless it was made for another UID."""
        with self.lock:
            reservation = self.reservations.get(pod)
            if reservation is not None and same_pod(reservation.uid, uid):
                del self.reservations[pod]
                self._discharge(f"reservation:{pod}")
                self._touch()

    def expire_reservations(self) -> None:
        """Cheap when nothing is due: one comparison against the earliest expiry."""
        if not self._expiry or self._expiry[0][0] > self.clock():
            return
        with self.lock:
            now = self.clock()
            while self._expiry and self._expiry[0][0] <= now:
                _, pod = heapq.heappop(self._expiry)
                reservation = self.reservations.get(pod)
                if reservation is not None and reservation.expires <= now:
                    self.release(pod)

    def set_telemetry(self, readings: dict[str, Telemetry]) -> None:
        with self.lock:
            for node in self.telemetry.keys() | readings.keys():
                if self.telemetry.get(node) != readings.get(node):
                    if node in readings:
                        self.telemetry[node] = readings[node]
                    else:
                        self.telemetry.pop(node, None)
                    self._refresh_free(node)
                    self._touch()

    # -- accounting ----------------------------------------------------------------------------
    def _account(self, key: str, pod: PodRecord) -> None:
        if pod.active:
            usage = self.namespace_usage.setdefault(pod.namespace, {})
            for resource, count in pod.gpus + pod.standins:
                usage[resource] = usage.get(resource, 0) + count
            if pod.nominated and not pod.node:  # preemption made room there: /filter holds it (nominated.py)
                self.nominated.setdefault(pod.nominated, set()).add(key)
        if pod.node:
            self._node_pods.setdefault(pod.node, set()).add(key)
            if pod.active and pod.gpus:
                self._charge(key, pod.node, pod.gpus, self._memory_annotation(pod))
            if key in self.reservations:  # seen bound (here or elsewhere): the pod's own charge counts now
                self.release(key, pod.uid)
        if pod.validator_ready is not None and pod.node:
            self.validators.setdefault(pod.node, {})[key] = pod.validator_ready
            self._changed(pod.node)
        if pod.unhealthy and pod.node and pod.active:
            self._unhealthy.setdefault(pod.node, {})[key] = pod
            self._changed(pod.node)
        if pod.validator_ready is not None and pod.waits_for:
            self.waiting_validators.setdefault(pod.waits_for, set()).add(key)
            self._changed(pod.waits_for)
        for template in pod.claim_templates:
            self.template_waiters.setdefault(f"{pod.namespace}/{template}", set()).add(key)
        self._touch()

    def _unaccount(self, key: str, pod: PodRecord | None) -> None:
        if pod is None:
            return
        if pod.active:
            usage = self.namespace_usage.get(pod.namespace, {})
            for resource, count in pod.gpus + pod.standins:
                usage[resource] = usage.get(resource, 0) - count
                if usage[resource] <= 0:
                    del usage[resource]
        if pod.nominated and not pod.node:
            held = self.nominated.get(pod.nominated)
            if held is not None:
                held.discard(key)
                if not held:
                    del self.nominated[pod.nominated]
        if pod.node:
            self._node_pods.get(pod.node, set()).discard(key)
            self._discharge(key)
            validators = self.validators.get(pod.node)
            if validators and validators.pop(key, None) is not None:
                self._changed(pod.node)
            sick = self._unhealthy.get(pod.node)
            if sick and sick.pop(key, None) is not None:
                if not sick:
                    del self._unhealthy[pod.node]
                self._changed(pod.node)
        waiting = self.waiting_validators.get(pod.waits_for or "")
        if pod.waits_for and waiting is not None and key in waiting:
            waiting.discard(key)
            if not waiting:
                del self.waiting_validators[pod.waits_for]
            self._changed(pod.waits_for)
        for template in pod.claim_templates:
            waiters = self.template_waiters.get(f"{pod.namespace}/{template}")
            if waiters is not None:
                waiters.discard(key)
                if not waiters:
                    del self.template_waiters[f"{pod.namespace}/{template}"]
        self._touch()

    def _memory_annotation(self, pod: PodRecord) -> str | None:
        """The ask a bound pod is charged by, fixed the first time it is seen bound: a later edit of its
        annotation or of its namespace's default does not change what its process holds."""
        if pod.node:
            frozen = self._frozen.get(pod.key)
            if frozen is None or frozen.uid != pod.uid:  # first sight bound (or a new pod of that name)
                frozen = self._frozen[pod.key] = Frozen(pod.uid, *self._ask(pod))
                if pod.memory_annotation is None and pod.namespace not in self.namespaces:
                    self._unseen_namespace.setdefault(pod.namespace, set()).add(pod.key)
            return frozen.ask
        return self._ask(pod)[0]

    def ask_of(self, pod: PodRecord) -> str | None:
        """The memory ask a pod is (or, unbound, would be) charged by: its annotation, else its namespace's."""
        return self._memory_annotation(pod)

    def _ask(self, pod: PodRecord) -> tuple[str | None, str]:
        if pod.memory_annotation is not None:
            return pod.memory_annotation, "pod annotation"
        namespace = self.namespaces.get(pod.namespace)
        default = namespace.get(ANN_GPU_MEMORY) if namespace else None
        if default is not None:
            return default, f"namespace {pod.namespace} default"
        return None, "no ask: a whole device, or its memory / replicas on a shared one"

    def held(self, key: str) -> tuple[str, tuple[tuple[str, int, int | None], ...], Frozen] | None:
        """What a bound pod holds, for `explain`: (node, (resource, units, MiB), the frozen ask)."""
        with self.lock:
            charge_, frozen = self._charges.get(key), self._frozen.get(key)
            if charge_ is None or frozen is None:
                return None
            return charge_.node, charge_.items, frozen

    def _charge(self, key: str, node: str, gpus: GpuRequests, memory_annotation: str | None,
                refresh: bool = True) -> None:
        previous = self._charges.get(key)
        self._discharge(key, refresh=previous is not None and previous.node != node)
        facts = self.nodes.get(node)
        try:
            ask = quantity_to_mib(memory_annotation) if memory_annotation is not None else None
        except ValueError:
            ask = None  # a broken annotation charges the unit's memory; the webhook reports it
        items = tuple((res, count, charge(facts, res, count, ask) if facts else None) for res, count in gpus)
        self._charges[key] = _Charge(node, items)
        used = self._used.setdefault(node, _Used())
        for resource, count, mib in items:
            used.units[resource] = used.units.get(resource, 0) + count
            used.mib[resource] = used.mib.get(resource, 0) + (mib or 0)
        if refresh:
            self._refresh_free(node)
        self._touch()

    def _discharge(self, key: str, refresh: bool = True) -> None:
        old = self._charges.pop(key, None)
        if old is None:
            return
        used = self._used.get(old.node)
        if used is not None:
            for resource, count, mib in old.items:
                used.units[resource] = used.units.get(resource, 0) - count
                used.mib[resource] = used.mib.get(resource, 0) - (mib or 0)
        if refresh:
            self._refresh_free(old.node)
        self._touch()

    def _recharge_node(self, node: str) -> None:
        """The node's memory per unit changed (memory label, replicas, MIG layout): what each pod and
        reservation there holds changed with it."""
        for key in self._node_pods.get(node, ()):
            if key in self._charges:
                pod = self.pods[key]
                self._charge(key, node, pod.gpus, self._memory_annotation(pod), refresh=False)
        for pod_key_, reservation in self.reservations.items():
            if reservation.node == node:
                self._charge(f"reservation:{pod_key_}", node, reservation.gpus, reservation.memory_annotation,
                             refresh=False)
        self._refresh_free(node)

    def _refresh_free(self, node: str) -> None:
        facts = self.nodes.get(node)
        resources = set(facts.allocatable) if facts else set()
        for table in (self.free_units, self.free_mib, self.capacity_mib):
            for resource, per_node in table.items():
                if resource not in resources:
                    per_node.pop(node, None)
        if facts is None:
            return
        used = self._used.get(node) or _Used()
        reading = self.telemetry.get(node)
        for resource, units in facts.allocatable.items():
            unit = facts.unit_memory(resource)
            capacity = unit * units if unit is not None else None
            free = capacity - used.mib.get(resource, 0) if capacity is not None else None
            if free is not None and reading is not None and reading.free_mib is not None and facts.is_shared(resource):
                # Only shares: a whole device or a MIG slice is the device plugin's to give (allocatable),
                # and an idle GPU's free framebuffer is always a little below its total (driver reserve).
                free = min(free, reading.free_mib)
            self.free_units.setdefault(resource, {})[node] = units - used.units.get(resource, 0)
            self.free_mib.setdefault(resource, {})[node] = free
            self.capacity_mib.setdefault(resource, {})[node] = capacity
        for listener in self._free_listeners:
            listener(node)

    def _dra_devices_changed(self, node: str) -> None:
        """The node's ResourceSlices changed: its facts are merged again (labels first). Only a node the
        view has: a Node's slices are deleted after it (they are owned by it), and must not bring it back."""
        if node not in self.nodes:
            return
        self.upsert_node(self.dra.label_facts(node) or self.nodes[node])

    def _dra_usage_changed(self, node: str) -> None:
        """Claims allocated or freed devices on the node: what is free there changed (scores)."""
        self._touch()
        for listener in self._free_listeners:
            listener(node)

    def _changed(self, node: str | None) -> None:
        """Node facts or validator state changed: static verdicts of that node must be redone."""
        self._touch()
        for listener in self._listeners:
            listener(node)

    def _touch(self) -> None:
        self.generation += 1


def _unit_sizes(facts: NodeFacts) -> tuple[object, ...]:
    """What decides the memory a unit of each resource stands for on a node."""
    return facts.device_memory_mib, facts.replicas, facts.mig


def track_view(view: ClusterView, kinds: tuple[str, ...] = ("nodes", "pods", "namespaces")) -> None:
    """The view's own figures on /metrics: objects per kind, how fresh, whether listed, reservations."""
    sizes: dict[str, Callable[[], float]] = {
        "nodes": lambda: len(view.nodes), "pods": lambda: len(view.pods), "namespaces": lambda: len(view.namespaces),
    }
    for kind in kinds:
        metrics.CACHE_OBJECTS.labels(kind).set_function(sizes[kind])
    metrics.CACHE_AGE.set_function(metrics.seconds_since_heard)
    metrics.CACHE_READY.set_function(lambda: float(all(kind in view.listed for kind in kinds)))
    metrics.RESERVATIONS.set_function(lambda: len(view.reservations))
