"""`gpu-placement.io/quota` mirrored into a ResourceQuota the API server enforces.

For every namespace gpu-placement acts in (`namespaceSelection`) whose annotation parses, one
ResourceQuota named `gpu-placement`, labelled `app.kubernetes.io/managed-by: gpu-placement`, with
`requests.<resource>` for each resource of the annotation (the only form quota accepts for extended
resources). The API server's quota admission runs after every mutating and validating webhook, so it
counts the rewritten resource names, and it is atomic across any number of webhook replicas: the
quota is hard. /validate still answers first, with the friendlier sentence.

Owner: the release's ValidatingWebhookConfiguration (`owner`, read on every turn of the leader), so the
garbage collector deletes every mirrored quota when `helm uninstall` deletes it; recreated (a new uid),
the quotas are written again at once; without one, the quota's own Namespace. In audit
mode nothing is wanted anywhere: the mirror deletes what it kept in enforce mode (audit enforces
nothing), and so it does in a namespace that leaves the selection.

One loop per webhook replica; only the holder of its Lease writes. The view's namespace events say
which namespaces changed (work proportional to what changed); a full pass runs on taking the lead
and every `resync_seconds`, over the namespaces in the view and the ResourceQuotas listed by our
label. A ResourceQuota without our label is never touched, even one named `gpu-placement`. An
annotation that does not parse leaves the mirror as it was (/validate denies GPU pods there anyway);
a namespace the view does not have, or one being deleted (`deletionTimestamp`: the namespace controller
deletes its content, and NamespaceLifecycle refuses anything new there with 403 NamespaceTerminating,
which is settled, not failed), is left to the API server (its quota goes with it).

Each namespace's ResourceQuota, and each template, is its own unit of work (gpu_placement/kube/leader.py
`Failures`): a write refused for that object is logged, counted, retried on the next turns, and the
pass goes on; `gpu_placement_quota_mirror_failing_objects` counts those failing now. A long pass renews
the Lease between namespaces and stops if another replica took it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client import ApiClient

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.decide.dra_quota import mirror_hard, monitor_devices
from gpu_placement.facts.namespaces import NamespaceRecord
from gpu_placement.facts.pods import PodRecord
from gpu_placement.facts.policy import NamespacePolicy, parse_policy
from gpu_placement.facts.resourcequotas import MIRROR_NAME
from gpu_placement.kube.api import (
    OBJECT_TIMEOUT,
    ApiError,
    ApiNotFound,
    get,
    get_or_none,
    write,
)
from gpu_placement.kube.leader import Failures, LeaderLoop, counted, namespace_terminating
from gpu_placement.kube.lease import Lease
from gpu_placement.kube.owner import Owner
from gpu_placement.observe.metrics import (
    API_OUTCOMES,
    QUOTA_MIRROR_FAILING,
    QUOTA_MIRROR_LEADING,
    QUOTA_MIRROR_SUCCESS,
    QUOTA_MIRROR_WRITES,
)
from gpu_placement.view.cluster import ClusterView

__all__ = ["MANAGED_BY", "MIRROR_NAME", "MirrorSettings", "QuotaMirror"]

log = logging.getLogger("gpu_placement.quota_mirror")

MANAGED_BY = ("app.kubernetes.io/managed-by", "gpu-placement")
_SELECTOR = f"{MANAGED_BY[0]}={MANAGED_BY[1]}"
_ACTIONS = {"POST": "create", "PUT": "update", "DELETE": "delete"}


@dataclass(slots=True, frozen=True)
class MirrorSettings:
    lease_name: str = "gpu-placement-quota-mirror"
    lease_seconds: int = 30  # another replica takes over this long after the holder stops renewing
    renew_seconds: float = 10.0  # how often the holder renews (and a standby tries)
    resync_seconds: float = 300.0  # full pass: what no event told us (a ResourceQuota edited by hand)
    owner: str | None = None  # the ValidatingWebhookConfiguration owning the quotas; None: their Namespace


class QuotaMirror(LeaderLoop):
    what = "quota mirror"
    log = log

    def __init__(self, api: ApiClient, view: ClusterView, config: Config, namespace: str, identity: str,
                 settings: MirrorSettings | None = None) -> None:
        self.api, self.view, self.config = api, view, config
        self.settings = settings or MirrorSettings()
        super().__init__(Lease(api, namespace, self.settings.lease_name, identity, self.settings.lease_seconds),
                         QUOTA_MIRROR_LEADING.labels(self.settings.lease_name), self.settings.renew_seconds,
                         time.monotonic)
        self._success = QUOTA_MIRROR_SUCCESS.labels(self.settings.lease_name)
        self._success.set(time.time())  # staleness counts from the start, not from 1970
        for action in _ACTIONS.values():  # every series from the start: rate() and alerts need a zero
            for outcome in API_OUTCOMES:
                QUOTA_MIRROR_WRITES.labels(action, outcome)
        self.writes = 0  # creates, updates and deletes made: for tests and the log
        self.failures = Failures("quota mirror", log)  # ResourceQuotas by namespace/name, with their errors
        self._failing = QUOTA_MIRROR_FAILING.labels(self.settings.lease_name)
        self._failing.set(0)
        self.templates: Any = None  # controllers/templates.TemplateKeeper where resource.k8s.io is served
        self._dirty: set[str] = set()
        self._dirty_lock = threading.Lock()
        self._classes: tuple[bool, tuple[tuple[str, str], ...]] = (False, ())
        self._owner = Owner(self.settings.owner, "quota mirror") if self.settings.owner else None
        view.subscribe_records(self._pod_changed, self._changed)
        view.dra.subscribe_monitors(self._monitors_changed)

    # -- events --------------------------------------------------------------------------------
    def _changed(self, name: str, _record: NamespaceRecord | None) -> None:
        """View listener (under the view's lock): note the name, wake the loop."""
        with self._dirty_lock:
            self._dirty.add(name)
        self._wake.set()

    def _pod_changed(self, key: str, record: PodRecord | None) -> None:
        """View listener (under the view's lock, for every pod): a pod of a namespace where an old template
        is kept for waiting pods may have its claims now, or be gone; a pod waiting for a monitor's claim
        needs room for it first (`monitor_room`): take that namespace again."""
        namespace = key.split("/", 1)[0]
        if (self.templates is not None and namespace in self.templates.kept_namespaces) or (
                namespace in self.view.dra.monitor_templates and (record is None or record.claim_templates)):
            self._changed(namespace, None)

    def _monitors_changed(self, namespace: str) -> None:
        self._changed(namespace, None)

    # -- running -------------------------------------------------------------------------------
    def _turn(self) -> None:
        """One turn: renew or take the Lease when due; then, leading, a full pass when due or the
        namespaces that changed. An object's failed write is kept for the next turn and the pass goes
        on; an error that ends the pass is logged once and the next turn makes a full pass."""
        self._lead()
        if not self.leading:
            self.last_error = None
            self._success.set(time.time())  # a standby's whole job: know who leads
            return
        if "namespaces" not in self.view.listed:
            self.last_error = None
            return  # never act on a half-known view: a missing namespace would look unannotated
        if self._owner is not None and self._owner.read(self.api):
            self._next_resync = 0.0  # a new owner (helm upgrade after it was deleted): mend everything now
        if self._classes_changed():
            self._next_resync = 0.0  # requests.<extendedResourceName> follows the DeviceClasses (_wanted)
        now = time.monotonic()
        if now >= self._next_resync:
            with self._dirty_lock:
                self._dirty.clear()
            self.resync()
            self._next_resync = now + self.settings.resync_seconds
        else:
            with self._dirty_lock:
                names, self._dirty = self._dirty, set()
            for name in sorted(names):
                self._still_leading()
                self.reconcile(name)
        self._end_turn()

    def _end_turn(self) -> None:
        """The pass went through: the namespaces of objects still failing are tried again next turn (not
        at once: the loop's next wake-up); the stamp moves only when nothing is failing."""
        failing = self._failing_keys()
        self._failing.set(len(failing))
        with self._dirty_lock:
            self._dirty.update(key.split("/", 1)[0] for key in failing)
        self.last_error = failing[min(failing)] if failing else None
        if not failing:
            self._success.set(time.time())

    def _failing_keys(self) -> dict[str, str]:
        failing = dict(self.failures.errors)
        if self.templates is not None:
            failing.update(self.templates.failures.errors)
        return failing

    def _took_lead(self) -> None:
        log.info("quota mirror: this replica now keeps the namespaces' ResourceQuotas")
        self._next_resync = 0.0  # whatever happened while another replica led

    def _not_leading(self) -> None:
        with self._dirty_lock:
            self._dirty.clear()  # the leader sees the same events
        self.failures.forget(set(self.failures.errors))  # the leader writes them now
        if self.templates is not None:
            self.templates.failures.forget(set(self.templates.failures.errors))
        self._failing.set(0)

    # -- the work ------------------------------------------------------------------------------
    def _wanted(self, name: str) -> tuple[bool, dict[str, str] | None, str]:
        """(known, the spec.hard wanted or None for no mirror, the namespace's uid). Not known: the view
        has no such namespace, or its annotation does not parse: leave the mirror as it is."""
        record = self.view.namespaces.get(name)
        if record is None:
            return False, None, ""
        if self.config.mode == "audit" or not self.config.selects(record.labels) or (
                name in self.config.exempt_namespaces):
            return True, None, record.uid  # gpu-placement enforces nothing here
        policy = parse_policy(record, name, self.config)
        if n.ANN_QUOTA in policy.errors:
            return False, None, record.uid
        if policy.quota is None:
            return True, None, record.uid
        if policy.mode(self.config) == "dra" and self.templates is not None and "deviceclasses" not in self.view.listed:
            return False, None, record.uid  # its DeviceClasses say what claims are charged: not known yet
        with self.view.lock:
            # What the API server charges claim pods, room for the monitors' admin-access claims: the figures
            # the quota gate waits for (gpu_placement/decide/dra_quota.py `mirror_hard`, one function for both).
            hard = mirror_hard(policy.quota, self.config, policy.mode(self.config) == "dra", self.view.dra.classes,
                               monitor_devices(self.view, name))
        return True, {key: str(count) for key, count in hard.items()}, record.uid

    def _classes_changed(self) -> bool:
        """Whether the GPU DeviceClasses' extendedResourceName (or their first list) changed since the last turn."""
        with self.view.lock:
            classes = self.view.dra.classes
            seen = ("deviceclasses" in self.view.listed, tuple(sorted(
                (name, found.extended_resource or "") for name, found in classes.items()
                if name in self.view.dra.gpu_classes)))
        changed, self._classes = seen != self._classes, seen
        return changed

    def reconcile(self, name: str) -> None:
        record = self.view.namespaces.get(name)
        if record is not None and record.terminating:
            self._leave(name)
            return
        known, wanted, uid = self._wanted(name)
        if self.templates is not None:
            if record is not None:
                self.templates.reconcile(name, self._template_policy(name, record), record.uid)
            else:
                self.templates.leave(name)  # gone: its templates went with it
        if not known:
            self.failures.forget([f"{name}/{MIRROR_NAME}"])
            return
        with self.failures.unit(f"{name}/{MIRROR_NAME}"):
            self._apply(name, self._get(name), wanted, uid)

    def resync(self) -> None:
        """Every namespace the view has, against every ResourceQuota we own (one list call)."""
        owned = {(quota.get("metadata") or {}).get("namespace"): quota for quota in self._list_owned()}
        names = sorted(set(self.view.namespaces) | {ns for ns in owned if ns})
        self.failures.forget(key for key in list(self.failures.errors) if key.split("/", 1)[0] not in names)
        for name in names:
            self._still_leading()
            record = self.view.namespaces.get(name)
            if record is not None and record.terminating:
                self._leave(name)
                continue
            known, wanted, uid = self._wanted(name)
            if not known:
                self.failures.forget([f"{name}/{MIRROR_NAME}"])
                continue
            with self.failures.unit(f"{name}/{MIRROR_NAME}"):
                self._apply(name, owned.get(name) if wanted is None or name in owned else self._get(name),
                            wanted, uid)
        if self.templates is not None:
            policies = {}
            for name, record in list(self.view.namespaces.items()):
                if not record.terminating:
                    policies[name] = (self._template_policy(name, record), record.uid)
            self.templates.resync(policies, self._still_leading)

    def _leave(self, name: str) -> None:
        """A namespace being deleted wants nothing written: its content goes with it."""
        self.failures.forget([f"{name}/{MIRROR_NAME}"])
        if self.templates is not None:
            self.templates.leave(name)

    def _template_policy(self, name: str, record: NamespaceRecord) -> NamespacePolicy:
        """The policy the namespace's templates follow: none wanted where gpu-placement enforces nothing
        (audit mode, a namespace not selected or exempt), as for the ResourceQuota."""
        if self.config.mode == "audit" or not self.config.selects(record.labels) or (
                name in self.config.exempt_namespaces):
            return NamespacePolicy(name, allocation="device-plugin")
        return parse_policy(record, name, self.config)

    def _apply(self, name: str, current: dict[str, Any] | None, wanted: dict[str, str] | None, uid: str) -> None:
        if current is not None and not _ours(current):
            if wanted is not None:
                log.warning("quota mirror: namespace %s has a ResourceQuota %s not managed by gpu-placement; "
                            "left alone, so %s is not mirrored there: rename or remove it", name, MIRROR_NAME,
                            n.ANN_QUOTA)
            return
        if wanted is None:
            if current is not None:
                self._delete(name, current)
            return
        if self._owner is not None and self._owner.ref is None:
            return  # no owner to give it (said once by Owner.read): write nothing the uninstall would miss
        if current is None:
            try:
                self._write("POST", name, self._body(name, wanted, uid, None))
            except ApiError as exc:
                if not namespace_terminating(exc):
                    raise
                log.info("quota mirror: namespace %s is being deleted, so no ResourceQuota is written there (%s)",
                         name, exc.message)
                return
            log.info("quota mirror: created ResourceQuota %s/%s with %s", name, MIRROR_NAME, _text(wanted))
        elif ((current.get("spec") or {}).get("hard") or {}) != wanted or (
                ((current.get("metadata") or {}).get("ownerReferences") or []) != self._owner_refs(name, uid)):
            self._write("PUT", name, self._body(name, wanted, uid, current))
            log.info("quota mirror: updated ResourceQuota %s/%s to %s", name, MIRROR_NAME, _text(wanted))

    def _body(self, name: str, wanted: dict[str, str], uid: str, current: dict[str, Any] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": MIRROR_NAME, "namespace": name, "labels": {MANAGED_BY[0]: MANAGED_BY[1]},
                                "ownerReferences": self._owner_refs(name, uid)}
        spec: dict[str, Any] = {"hard": wanted}
        if current is not None:  # keep what others added (labels, annotations); a lost update is a 409
            old = current.get("metadata") or {}
            meta = {**old, **meta, "labels": {**(old.get("labels") or {}), **meta["labels"]}}
            meta.pop("managedFields", None)
            spec = {**(current.get("spec") or {}), "hard": wanted}
        return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": meta, "spec": spec}

    def _owner_refs(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        if self._owner is not None and self._owner.ref is not None:
            return [self._owner.ref]
        return [{"apiVersion": "v1", "kind": "Namespace", "name": namespace, "uid": uid}] if uid else []

    # -- HTTP ----------------------------------------------------------------------------------
    def _path(self, namespace: str, name: str | None = None) -> str:
        return f"/api/v1/namespaces/{namespace}/resourcequotas" + (f"/{name}" if name else "")

    def _get(self, namespace: str) -> dict[str, Any] | None:
        return get_or_none(self.api, self._path(namespace, MIRROR_NAME), timeout=OBJECT_TIMEOUT)

    def _list_owned(self) -> list[dict[str, Any]]:
        return list(get(self.api, "/api/v1/resourcequotas", timeout=OBJECT_TIMEOUT,
                        query=[("labelSelector", _SELECTOR), ("fieldSelector", f"metadata.name={MIRROR_NAME}")]
                        ).get("items") or [])

    def _write(self, method: str, namespace: str, body: dict[str, Any]) -> None:
        path = self._path(namespace) if method == "POST" else self._path(namespace, MIRROR_NAME)
        with counted(QUOTA_MIRROR_WRITES, _ACTIONS[method]):
            write(self.api, method, path, body=body, timeout=OBJECT_TIMEOUT)
        self.writes += 1

    def _delete(self, namespace: str, current: dict[str, Any]) -> None:
        meta = current.get("metadata") or {}
        options = {"kind": "DeleteOptions", "apiVersion": "v1",
                   "preconditions": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}}
        with counted(QUOTA_MIRROR_WRITES, "delete"):  # ApiNotFound: gone already, what was wanted
            if not write(self.api, "DELETE", self._path(namespace, MIRROR_NAME), body=options, timeout=OBJECT_TIMEOUT,
                         settled=ApiNotFound):
                return
        self.writes += 1
        log.info("quota mirror: deleted ResourceQuota %s/%s (no %s on the namespace)", namespace, MIRROR_NAME,
                 n.ANN_QUOTA)


def _ours(quota: dict[str, Any]) -> bool:
    labels = (quota.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY[0]) == MANAGED_BY[1])


def _text(hard: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in hard.items())
