"""A fake Kubernetes API server for tests, speaking the real wire protocol over TLS.

What the service touches is served the way kube-apiserver serves it, so the real `kubernetes`
client (generated models or `_preload_content=False`) and our own list+watch loop run unchanged:

    core v1                        nodes, namespaces (cluster-scoped); pods, secrets, configmaps,
                                   resourcequotas (stored and validated: spec.hard names and quantities)
    coordination.k8s.io/v1         leases
    policy/v1                      poddisruptionbudgets (stored as given: no disruption controller)
    admissionregistration.k8s.io/v1  mutating- and validatingwebhookconfigurations (cluster-scoped)
    discovery.k8s.io/v1            endpointslices

    GET one / LIST (labelSelector, fieldSelector, limit + continue over a consistent snapshot)
    WATCH (resourceVersion "", "0" or N, allowWatchBookmarks, timeoutSeconds, sendInitialEvents;
          410 "too old resource version" as an ERROR event; selectors decide ADDED/DELETED when an
          object starts or stops matching, as the watch cache does)
    POST (409 AlreadyExists), PUT (409 Conflict on a stale metadata.resourceVersion), PATCH (merge,
    strategic merge treated as merge, JSON patch), DELETE (finalizers honoured), deletecollection,
    pods/binding and the legacy namespaces/{ns}/bindings, pods/eviction (PodDisruptionBudgets checked
    and decremented as kube-apiserver's EvictionREST does: 429 when a budget allows no disruption), the
    status subresource of pods, nodes and namespaces, discovery, /version, /healthz.
    managedFields: label ownership only, on objects stored with managedFields, for Update operations
    (PUT, PATCH, and the test controls given a `manager`): the writer is `?fieldManager`, else the
    User-Agent up to its first `/`; it takes the labels it adds or changes, and removed labels leave
    every manager (structured-merge-diff merge/update.go `Updater.Update`).

Every write bumps one global resourceVersion; errors are `Status` objects with the real reasons and
messages. Writes are checked as kube-apiserver checks them where clients notice: names, label keys and
values (422), ResourceQuota spec.hard, and NamespaceLifecycle (a create in a namespace that does not
exist: 404; in one being deleted: 403 with the `NamespaceTerminating` cause). With
`device_taint_eviction=True` it also plays kube-controller-manager's status write on DeviceTaintRules.
Test code drives it from its own thread: `add`/`update`/`upsert`/`patch`/`patch_labels`/
`delete`/`bind`, `load` (bulk, no events), `compact`, `cut_watches`, `down`/`up`, `delay`,
`fail_next`/`stop_failing`, `requests_log`/`count`/`counts`, `open_watches`/`wait_for_watches`.

RBAC, as far as tests need it: `add_user(token, name, namespaces)` makes a user bound by RoleBindings
to those namespaces only (the `view` role's reads: get/list/watch); every other request of theirs is a
403 with kube-apiserver's own message (apiserver endpoints/handlers/responsewriters forbiddenMessage),
except discovery (system:discovery) and `get` of their own Namespace objects (RBAC reads a namespace's
own name as its namespace). The main token may do everything.

Not modelled: defaulting beyond a pod's Pending phase and a namespace's Active phase and name
label, admission beyond NamespaceLifecycle (so no quota admission; and no quota controller: a
ResourceQuota's status stays as written), garbage collection by ownerReferences, RBAC beyond
`add_user`, managedFields beyond labels, server-side apply, the disruption controller (a budget's
status stays as written, but for what an eviction takes from it),
graceful pod deletion (pods go at once), namespace cleanup of the objects inside, protobuf/CBOR
and gzip (always plain JSON), strategic-merge list semantics (merge keys), LIST
resourceVersionMatch=Exact (served as the current state), and the watch cache's 3 s wait and 504
for a resourceVersion from the future (the watch simply waits for it).
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import gc
import re
import secrets
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import trustme
import uvicorn
import yaml
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

__all__ = ["DEFAULT_NAMESPACES", "RESOURCES", "ApiStatusError", "FakeApiServer", "RequestRecord", "Resource"]

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

Key = tuple[str, str]  # (namespace or "", name): etcd's key order, which lists and continue tokens follow
Obj = dict[str, Any]


# -- resource table --------------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class Resource:
    """One served resource type, as discovery describes it."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    has_status: bool = False  # a status subresource: main-resource writes keep the stored status
    return_deleted: bool = False  # DELETE answers with the object (pods, namespaces), else a Status
    fields: tuple[str, ...] = ()  # fieldSelector labels beyond metadata.name and metadata.namespace
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """How errors name the resource: `pods`, `leases.coordination.k8s.io`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind


_ADMISSION = "admissionregistration.k8s.io"
RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "namespaces", "namespace", "Namespace", False, has_status=True, return_deleted=True,
             fields=("status.phase",), short_names=("ns",)),
    Resource("", "v1", "nodes", "node", "Node", False, has_status=True, fields=("spec.unschedulable",),
             short_names=("no",)),
    Resource("", "v1", "pods", "pod", "Pod", True, has_status=True, return_deleted=True,
             fields=("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                     "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName"),
             short_names=("po",)),
    Resource("", "v1", "secrets", "secret", "Secret", True, fields=("type",)),
    Resource("", "v1", "configmaps", "configmap", "ConfigMap", True, short_names=("cm",)),
    Resource("", "v1", "resourcequotas", "resourcequota", "ResourceQuota", True, has_status=True,
             short_names=("quota",)),
    Resource("coordination.k8s.io", "v1", "leases", "lease", "Lease", True),
    Resource("policy", "v1", "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", True,
             has_status=True, short_names=("pdb",)),
    Resource(_ADMISSION, "v1", "mutatingwebhookconfigurations", "mutatingwebhookconfiguration",
             "MutatingWebhookConfiguration", False),
    Resource(_ADMISSION, "v1", "validatingwebhookconfigurations", "validatingwebhookconfiguration",
             "ValidatingWebhookConfiguration", False),
    Resource("discovery.k8s.io", "v1", "endpointslices", "endpointslice", "EndpointSlice", True),
    # The GPU Operator's CRD, cluster-scoped with a status subresource (config/crd/bases of NVIDIA/gpu-operator).
    Resource("nvidia.com", "v1", "clusterpolicies", "clusterpolicy", "ClusterPolicy", False, has_status=True),
    # Workloads, stored as given (no controllers): `explain KIND/NAME` reads them, `migrate` patches a DaemonSet.
    Resource("apps", "v1", "deployments", "deployment", "Deployment", True, has_status=True, short_names=("deploy",)),
    Resource("apps", "v1", "statefulsets", "statefulset", "StatefulSet", True, has_status=True, short_names=("sts",)),
    Resource("apps", "v1", "daemonsets", "daemonset", "DaemonSet", True, has_status=True, short_names=("ds",)),
    Resource("batch", "v1", "jobs", "job", "Job", True, has_status=True),
    Resource("batch", "v1", "cronjobs", "cronjob", "CronJob", True, has_status=True, short_names=("cj",)),
    # A CRD with pod templates (Kubeflow's training operator), found through discovery.
    Resource("kubeflow.org", "v1", "pytorchjobs", "pytorchjob", "PyTorchJob", True, has_status=True),
    # events.k8s.io/v1 Events (k8s.io/api events/v1), stored as written: gpu_placement/controllers/events.py
    # writes them.
    Resource("events.k8s.io", "v1", "events", "event", "Event", True, short_names=("ev",)),
)
_BY_NAME = {name.lower(): r for r in RESOURCES for name in (r.plural, r.singular, r.kind, *r.short_names)}
_POD = _BY_NAME["pods"]
_NAMESPACE = _BY_NAME["namespaces"]
_PDB = _BY_NAME["poddisruptionbudgets"]
_SUCCESS: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}


def _too_many(cause: str, retry_after: int) -> ApiStatusError:
    """errors.NewTooManyRequests with the budget's cause, as checkAndDecrement builds it."""
    return ApiStatusError(429, "Cannot evict pod as it would violate the pod's disruption budget.",
                          details={"causes": [{"reason": "DisruptionBudget", "message": cause}]},
                          retry_after=retry_after)


def _pdb_selects(budget: Obj, labels: dict[str, str]) -> bool:
    """metav1.LabelSelectorAsSelector: a nil selector selects nothing, an empty one everything."""
    selector = (budget.get("spec") or {}).get("selector")
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        key, op, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        present = key in labels
        if not {"In": present and labels.get(key) in values, "NotIn": not present or labels.get(key) not in values,
                "Exists": present, "DoesNotExist": not present}.get(op, False):
            return False
    return True


def _pod_ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


def _own_labels(new: Obj, old: Obj, manager: str) -> None:
    """Label ownership after an Update by `manager` (see the module docstring); objects stored without
    managedFields are left without them."""
    entries = old["metadata"].get("managedFields")
    if not manager or not isinstance(entries, list):
        return
    before, after = old["metadata"].get("labels") or {}, new["metadata"].get("labels") or {}
    changed = {k for k, v in after.items() if before.get(k) != v}
    removed = set(before) - set(after)
    kept = []
    mine = None
    for entry in _copy(entries):
        meta = (entry.get("fieldsV1") or {}).get("f:metadata") or {}
        labels = meta.get("f:labels")
        if isinstance(labels, dict):
            for key in changed | removed if entry.get("manager") != manager else removed:
                labels.pop(f"f:{key}", None)
            if not labels:  # an empty map would read as owning the whole of metadata.labels
                del meta["f:labels"]
                if not meta:
                    del entry["fieldsV1"]["f:metadata"]
        if entry.get("manager") == manager and entry.get("operation") == "Update" and not entry.get("subresource"):
            mine = entry
        if _has_fields(entry.get("fieldsV1")) or entry is mine:
            kept.append(entry)
    if mine is None:
        mine = {"manager": manager, "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                "fieldsV1": {}}
        kept.append(mine)
    if changed:
        labels = mine.setdefault("fieldsV1", {}).setdefault("f:metadata", {}).setdefault("f:labels", {})
        labels.update({f"f:{key}": {} for key in changed})
    mine["time"] = _now()
    new["metadata"]["managedFields"] = [e for e in kept if _has_fields(e.get("fieldsV1"))]


def _has_fields(fields: Any) -> bool:
    """Whether a fieldsV1 tree still owns a field (an entry that owns nothing is dropped)."""
    return isinstance(fields, dict) and any(not value or _has_fields(value) for value in fields.values())
_DRA = "resource.k8s.io"


def dra_resources(version: str | None, taint_rules: str | None) -> tuple[Resource, ...]:
    """resource.k8s.io as a given Kubernetes serves it: `version` for slices, classes, claims and their
    templates (1.34+: v1); `taint_rules` for DeviceTaintRules (1.37: v1, 1.36: v1beta2, 1.35: v1alpha3)."""
    served: list[Resource] = []
    if version:
        served += [Resource(_DRA, version, "resourceslices", "resourceslice", "ResourceSlice", False,
                            fields=("spec.driver", "spec.nodeName", "spec.pool.name")),
                   Resource(_DRA, version, "deviceclasses", "deviceclass", "DeviceClass", False),
                   Resource(_DRA, version, "resourceclaims", "resourceclaim", "ResourceClaim", True, has_status=True),
                   Resource(_DRA, version, "resourceclaimtemplates", "resourceclaimtemplate", "ResourceClaimTemplate",
                            True)]
    if taint_rules:
        served.append(Resource(_DRA, taint_rules, "devicetaintrules", "devicetaintrule", "DeviceTaintRule", False,
                               has_status=True))
    return tuple(served)
_BOOL_FIELDS = frozenset({"spec.unschedulable", "spec.hostNetwork"})


# -- errors ----------------------------------------------------------------------------------------

_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
            406: "NotAcceptable", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid",
            429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}
_MESSAGES = {401: "Unauthorized", 403: "forbidden: the fake API server refuses this request",
             404: "the server could not find the requested resource",
             405: "the server does not allow this method on the requested resource",
             429: "Too many requests, please try again later.",
             500: "Internal error occurred: injected by the fake API server",
             503: "the server is currently unable to handle the request",
             504: "Timeout: request did not complete within requested timeout - context deadline exceeded"}


class ApiStatusError(Exception):
    """An answer that is a `Status` failure; test-control methods raise it too (e.g. add() of an
    existing object: 409 AlreadyExists)."""

    def __init__(self, code: int, message: str | None = None, reason: str | None = None,
                 details: Obj | None = None, retry_after: int | None = None, list_meta: Obj | None = None) -> None:
        self.code = code
        self.reason = reason or _REASONS.get(code, "")
        self.message = message if message is not None else _MESSAGES.get(code, self.reason)
        self.details = details
        self.retry_after = retry_after
        self.list_meta = list_meta or {}
        super().__init__(f"{code} {self.reason}: {self.message}")

    def status(self) -> Obj:
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": self.list_meta, "status": "Failure",
                     "message": self.message, "reason": self.reason}
        details = dict(self.details or {})
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        if details or self.code in (404, 405):
            body["details"] = details
        body["code"] = self.code
        return body


def _not_found(res: Resource, name: str) -> ApiStatusError:
    return ApiStatusError(404, f'{res.qualified} "{name}" not found', details=_details(res, name))


def _conflict(res: Resource, name: str, why: str, qualified: str | None = None) -> ApiStatusError:
    return ApiStatusError(409, f'Operation cannot be fulfilled on {qualified or res.qualified} "{name}": {why}',
                          details=_details(res, name))


def _invalid(res: Resource, name: str, field_path: str, why: str) -> ApiStatusError:
    cause = {"reason": "FieldValueInvalid", "message": why, "field": field_path}
    details: Obj = {"name": name, "kind": res.kind, "causes": [cause]}
    if res.group:
        details["group"] = res.group
    return ApiStatusError(422, f'{res.qualified_kind} "{name}" is invalid: {field_path}: {why}', details=details)


def _details(res: Resource, name: str) -> Obj:
    details: Obj = {"name": name}
    if res.group:
        details["group"] = res.group
    details["kind"] = res.plural
    return details


# -- selectors -------------------------------------------------------------------------------------

Match = Callable[[Obj], bool]
_LABEL_REQ = re.compile(r"""^(?P<not>!)?\s*(?P<key>[A-Za-z0-9][-A-Za-z0-9_./]*)\s*
    (?:(?P<op>==|=|!=|>|<)\s*(?P<value>[-A-Za-z0-9_.]*)|\s+(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?$""",
                        re.VERBOSE)


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses (set-based requirements hold commas)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ')'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("unbalanced '('")
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_label_selector(text: str | None) -> Match | None:
    """labels.Parse: `a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x)`, `a>1`, `a<1`."""
    if not text or not text.strip():
        return None
    tests: list[Callable[[dict[str, str]], bool]] = []
    try:
        requirements = _split_top(text)
    except ValueError as exc:
        raise ApiStatusError(400, f"unable to parse requirement: {exc}") from None
    for requirement in requirements:
        m = _LABEL_REQ.match(requirement)
        if not m or (m["not"] and (m["op"] or m["set"])):
            raise ApiStatusError(400, f"unable to parse requirement: found '{requirement}', expected: "
                                      "key, !key, key=value, key!=value, key in (...), key notin (...)")
        tests.append(_label_test(m))

    def match(obj: Obj) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(test(labels) for test in tests)
    return match


def _label_test(m: re.Match[str]) -> Callable[[dict[str, str]], bool]:
    key, op, value = m["key"], m["op"], m["value"]
    if m["set"]:
        values = frozenset(v.strip() for v in m["values"].split(","))
        if m["set"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if op in ("=", "=="):
        return lambda labels: labels.get(key) == value
    if op == "!=":
        return lambda labels: labels.get(key) != value
    if op in (">", "<"):
        try:
            bound = int(value)
        except ValueError:
            raise ApiStatusError(400, f"unable to parse requirement: for '{op}', '{key}' must be an integer, "
                                      f"not '{value}'") from None
        return lambda labels: _compare(labels.get(key), op, bound)
    if m["not"]:
        return lambda labels: key not in labels
    return lambda labels: key in labels


def _compare(value: str | None, op: str, bound: int) -> bool:
    try:
        number = int(value or "")
    except ValueError:
        return False
    return number > bound if op == ">" else number < bound


def parse_field_selector(text: str | None, res: Resource) -> Match | None:
    """fields.ParseSelector with the resource's supported labels; `=`, `==`, `!=`."""
    if not text or not text.strip():
        return None
    tests: list[tuple[str, bool, str]] = []
    for term in _split_escaped(text):
        m = re.match(r"^([^=!]+?)\s*(!=|==|=)\s*(.*)$", term)
        if not m:
            raise ApiStatusError(400, f"invalid selector: '{text}'; can't understand '{term}'")
        name, op, value = m[1].strip(), m[2], _unescape(m[3].strip())
        if name not in ("metadata.name", "metadata.namespace") and name not in res.fields:
            raise ApiStatusError(400, f'field label not supported: {name}')
        tests.append((name, op == "!=", value))

    def match(obj: Obj) -> bool:
        return all((_field(obj, name) == value) != negate for name, negate, value in tests)
    return match


def _split_escaped(text: str) -> list[str]:
    return [t for t in re.split(r"(?<!\\),", text) if t.strip()]


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def _field(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if path in _BOOL_FIELDS:
        return "true" if value else "false"
    return "" if value is None else str(value)


def _both(a: Match | None, b: Match | None) -> Match | None:
    if a is None or b is None:
        return a or b
    return lambda obj: a(obj) and b(obj)


# -- records ---------------------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class RequestRecord:
    """One request as it arrived: `verb` is the Kubernetes verb (get, list, watch, create, update,
    patch, delete, deletecollection), or the lower-cased method for paths that are no resource."""

    method: str
    path: str
    query: dict[str, str]
    verb: str
    client: tuple[str, int] | None = None  # the connection it came on (host, port)


@dataclass(slots=True)
class _Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: Resource
    namespace: str
    obj: Obj
    prev: Obj | None  # the object before a MODIFIED: selectors turn it into ADDED or DELETED


@dataclass(slots=True, eq=False)
class _Watch:
    resource: Resource
    namespace: str | None
    match: Match | None
    cursor: int  # every event up to here has been looked at
    bookmarks: bool
    client: tuple[str, int] | None
    loop: asyncio.AbstractEventLoop
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    pending: bool = False  # a wake-up is already scheduled on the loop
    closed: bool = False
    stalled: bool = False  # half-open: nothing more is sent, not even the end; the client must give up


@dataclass(slots=True)
class _Snapshot:
    """The state a paged list started from, kept so its continue pages are consistent."""

    rv: int
    resource: Resource
    namespace: str | None
    items: list[tuple[Key, Obj]]


@dataclass(slots=True)
class _Failure:
    remaining: int
    error: ApiStatusError
    method: str | None
    path: str | None


@dataclass(slots=True)
class _Target:
    resource: Resource | None  # None: the legacy /namespaces/{ns}/bindings
    namespace: str | None
    name: str | None
    subresource: str | None
    watch_path: bool  # the deprecated /watch/ prefix


@dataclass(slots=True)
class _Serving:
    server: uvicorn.Server
    thread: threading.Thread = field(default_factory=threading.Thread)
    loop: asyncio.AbstractEventLoop | None = None
    stop: asyncio.Event | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


# -- helpers ---------------------------------------------------------------------------------------

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_PAGE_EVENTS = 500  # initial events are written this many to a chunk
_HEALTH = frozenset({"/healthz", "/livez", "/readyz", "/version"})
_PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json",
                "application/json-patch+json")


def _copy(obj: Any) -> Any:
    """A deep copy, JSON-clean: stored objects are never shared with callers."""
    return orjson.loads(orjson.dumps(obj))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _flag(value: str | None) -> bool:
    """apiserver's query bool: anything but absent, "0" or "false" is true."""
    return value is not None and value != "0" and value.lower() != "false"


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = obj["metadata"] = {}
    return meta


def _with_kind(res: Resource, obj: Obj) -> Obj:
    return {"kind": res.kind, "apiVersion": res.api_version, **obj}


def _without_kind(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def _same(a: Obj, b: Obj) -> bool:
    """Equal but for metadata.resourceVersion: such an update is a no-op and keeps the version."""
    strip = ({**o, "metadata": {k: v for k, v in o.get("metadata", {}).items() if k != "resourceVersion"}}
             for o in (a, b))
    return next(strip) == next(strip)


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _encode_continue(rv: int, start: str, snapshot: int | None) -> str:
    token: Obj = {"v": "meta.k8s.io/v1", "rv": rv, "start": start}
    if snapshot is not None:
        token["snap"] = snapshot  # ours: which kept snapshot; clients treat the token as opaque
    return base64.urlsafe_b64encode(orjson.dumps(token)).rstrip(b"=").decode()


def _decode_continue(value: str) -> tuple[int, str, int | None]:
    try:
        token = orjson.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
        if not isinstance(token, dict):
            raise ValueError("not an object")
    except (ValueError, TypeError) as exc:
        raise ApiStatusError(400, f"invalid continue token: continue key is not valid: {exc}") from None
    if token.get("v") != "meta.k8s.io/v1":
        raise ApiStatusError(400, "invalid continue token: continue key is not valid: server does not recognize "
                                  "this encoded version")
    rv, start = token.get("rv"), token.get("start")
    if not isinstance(rv, int) or rv == 0:
        raise ApiStatusError(400, "invalid continue token: continue key is not valid: incorrect encoded start "
                                  "resourceVersion (version meta.k8s.io/v1)")
    if not isinstance(start, str) or not start:
        raise ApiStatusError(400, "invalid continue token: continue key is not valid: encoded start key empty "
                                  "(version meta.k8s.io/v1)")
    snap = token.get("snap")
    return rv, start, snap if isinstance(snap, int) else None


_EXPIRED_CONTINUE = ("The provided continue parameter is too old to display a consistent list result. You can start "
                     "a new list without the continue parameter, or use the continue token in this response to "
                     "retrieve the remainder of the results. Continuing with the provided token results in an "
                     "inconsistent list - objects that were created, modified, or deleted between the time the "
                     "first chunk was returned and now may show up in the list.")


class _StreamResponse(Response):
    """A watch: the ASGI body is driven by the server's watch loop."""

    def __init__(self, run: Callable[[Scope, Receive, Send], Any]) -> None:
        super().__init__(status_code=200)
        self._run = run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._run(scope, receive, send)


# -- the server ------------------------------------------------------------------------------------

class FakeApiServer:
    """See the module docstring. `start()` (or `with`), then point a client at `write_kubeconfig()`
    or take `api_client()`; `stop()` ends every connection and thread.

    Args:
        token: the bearer token every API request must carry (401 otherwise).
        bookmark_interval: seconds between BOOKMARK events on watches that allow them.
        history_limit: watch events kept; a watch from before the window gets 410 Expired.
        namespaces: namespaces that exist from the start, as on a real cluster.
        default_watch_timeout: seconds a watch without timeoutSeconds lasts.
        host, port: where to listen; port 0 picks a free port (kept across down()/up()).
        dra, taint_rules: the resource.k8s.io versions served (`dra_resources`).
        device_taint_eviction: play kube-controller-manager's device-taint-eviction controller, which
            writes an `EvictionInProgress` condition into every DeviceTaintRule's status as soon as the
            rule appears or its spec changes (pkg/controller/devicetainteviction/device_taint_eviction.go
            `maybeUpdateRuleStatus`, v1.37.2): each such write through the API is followed at once by
            that status write, so the resourceVersion the writer was answered with is already stale.
    """

    def __init__(self, token: str | None = None, *, bookmark_interval: float = 1.0, history_limit: int = 10_000,
                 namespaces: Iterable[str] = DEFAULT_NAMESPACES, default_watch_timeout: float = 1800.0,
                 host: str = "127.0.0.1", port: int = 0, dra: str | None = None,
                 taint_rules: str | None = None, device_taint_eviction: bool = False) -> None:
        self.token = token or secrets.token_urlsafe(24)
        # token -> (user name, namespaces it may read, resources it may read cluster-wide)
        self.users: dict[str, tuple[str, frozenset[str], frozenset[str]]] = {}
        self.bookmark_interval = bookmark_interval
        self.history_limit = history_limit
        self.default_watch_timeout = default_watch_timeout
        self.delay = 0.0  # seconds every request waits before it is handled
        self.host = host
        self._port = port
        self.requests_log: list[RequestRecord] = []
        self._lock = threading.RLock()
        self._rv = 1
        self._floor = 1  # events with rv > floor are in the history
        self.resources = RESOURCES + dra_resources(dra, taint_rules)
        self.device_taint_eviction = device_taint_eviction
        self._by_path = {(r.group, r.version, r.plural): r for r in self.resources}
        self._by_name = {name.lower(): r for r in self.resources for name in (r.plural, r.singular, r.kind,
                                                                              *r.short_names)}
        self._objects: dict[Resource, dict[Key, Obj]] = {r: {} for r in self.resources}
        self._keys: dict[Resource, list[Key]] = {r: [] for r in self.resources}
        self._events: list[_Event] = []
        self._event_rvs: list[int] = []
        self._watches: set[_Watch] = set()
        self._snapshots: dict[int, _Snapshot] = {}
        self._snapshot_ids = 0
        self._failures: list[_Failure] = []
        self._serving: _Serving | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="fakeapi-")
        self.ca = trustme.CA()
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1", "localhost").configure_cert(self._ssl)
        self.app = Starlette(routes=[Route("/{path:path}", self._endpoint,
                                           methods=["GET", "POST", "PUT", "PATCH", "DELETE"])])
        self.load({"kind": "Namespace", "metadata": {"name": n}} for n in namespaces)

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("the fake API server is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert_pem.bytes()

    @property
    def is_up(self) -> bool:
        return self._serving is not None

    def start(self) -> FakeApiServer:
        self.up()
        return self

    def stop(self) -> None:
        self.down()
        self._tmp.cleanup()

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def up(self, timeout: float = 10.0) -> None:
        """Listen again (on the same port once one was picked), the stored state unchanged."""
        if self._serving is not None:
            return
        sock = socket.create_server((self.host, self._port), backlog=2048)  # SO_REUSEADDR: same port again
        # No Nagle, as kube-apiserver (Go) has none: create_server's socket has proto 0, so asyncio does not
        # set TCP_NODELAY on accepted connections, and every answer written as headers + body waited ~40 ms
        # for the client's delayed ACK. Accepted sockets inherit the option from the listener on Linux.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._port = int(sock.getsockname()[1])
        config = uvicorn.Config(self.app, lifespan="off", log_config=None, access_log=False, http="httptools",
                                ws="none", timeout_keep_alive=120,
                                ssl_context_factory=lambda _config, _default: self._ssl)
        serving = _Serving(uvicorn.Server(config))
        serving.thread = threading.Thread(target=self._run, args=(serving, sock), daemon=True,
                                          name=f"fakeapi-{self._port}")
        serving.thread.start()
        if not serving.ready.wait(timeout) or not serving.server.started:
            self._finish(serving, timeout)
            raise RuntimeError(f"the fake API server did not start: {serving.error!r}")
        self._serving = serving

    def down(self, timeout: float = 10.0) -> None:
        """Stop listening: every open connection is cut (as when the process dies) and new ones are
        refused until up(). State and history are kept; test-control writes still work."""
        serving, self._serving = self._serving, None
        if serving is not None:
            self._finish(serving, timeout)

    @staticmethod
    def _finish(serving: _Serving, timeout: float) -> None:
        if serving.loop is not None and serving.stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                serving.loop.call_soon_threadsafe(serving.stop.set)
        serving.thread.join(timeout)
        if serving.thread.is_alive():
            raise RuntimeError("the fake API server thread did not stop")

    def _run(self, serving: _Serving, sock: socket.socket) -> None:
        loop = asyncio.new_event_loop()
        serving.loop = loop
        try:
            loop.run_until_complete(self._serve(serving, sock))
        except BaseException as exc:  # uvicorn reports a failed start with SystemExit
            serving.error = exc
        finally:
            serving.ready.set()
            sock.close()
            leftovers = asyncio.all_tasks(loop)
            for task in leftovers:
                task.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self, serving: _Serving, sock: socket.socket) -> None:
        """uvicorn's Server.serve, minus its polling: it checks should_exit every 0.1 s and then sleeps
        0.1 s more on shutdown, which every test's teardown would pay. Here a stop is an event."""
        server = serving.server
        serving.stop = asyncio.Event()
        if not server.config.loaded:
            server.config.load()
        server.lifespan = server.config.lifespan_class(server.config)
        await server.startup(sockets=[sock])
        serving.ready.set()
        if server.should_exit:
            return
        ticks = 0
        while not serving.stop.is_set():
            await server.on_tick(ticks)  # keeps the Date header current
            ticks += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(serving.stop.wait(), 0.1)
        await self._halt(server, None)
        tasks = list(server.server_state.tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=2.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _halt(self, server: uvicorn.Server, clients: set[Any] | None) -> int:
        """Cut the connections of these clients (None: refuse new connections and cut all) without a
        clean end. Their watches are marked closed first: a TLS transport that is aborted but not yet
        told so (connection_lost comes a loop turn later) breaks on the next write."""
        if clients is None:
            for listener in server.servers:
                listener.close()
        with self._lock:
            for watch in self._watches:
                if clients is None or watch.client in clients:
                    watch.closed = True
        cut = 0
        for connection in list(server.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None and (clients is None or getattr(connection, "client", None) in clients):
                transport.abort()
                cut += 1
        return cut

    # -- client configuration ----------------------------------------------------------------------
    def kubeconfig(self) -> Obj:
        ca = base64.b64encode(self.ca_pem).decode()
        return {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "fake", "cluster": {"server": self.url, "certificate-authority-data": ca}}],
            "users": [{"name": "fake", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "default"}}],
            "current-context": "fake",
        }

    def write_kubeconfig(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(yaml.safe_dump(self.kubeconfig(), sort_keys=False))
        return path

    def api_client(self, retries: bool = False) -> kube_client.ApiClient:
        """A real client configured from this server's kubeconfig (close it when done). retries=False, as
        gpu_placement.kube.api.load_api_client sets: urllib3's default would silently retry refused
        connections, and 429/503 answers that carry Retry-After, hiding what a test injects."""
        configuration = kube_client.Configuration()
        path = self.write_kubeconfig(Path(self._tmp.name) / "kubeconfig")
        kube_config.load_kube_config(config_file=str(path), client_configuration=configuration,
                                     persist_config=False)
        if not retries:
            configuration.retries = False
        return kube_client.ApiClient(configuration)

    # -- test controls -----------------------------------------------------------------------------
    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def add(self, obj: Obj, keep_uid: bool = False, keep_created: bool = False) -> Obj:
        """Create as given (no defaulting, namespace need not exist); ADDED. 409 if it exists.
        keep_uid: keep the object's metadata.uid, as the API server stores the uid it gave the object
        before validating admission ran (tests that play the API server's part need it).
        keep_created: keep its metadata.creationTimestamp, for a test that replays history and so plays
        the API server's clock (the real one always stamps its own)."""
        res = self._kind_of(obj)
        obj = _without_kind(_copy(obj))
        with self._lock:
            key = self._key_of(res, obj)
            if key in self._objects[res]:
                raise ApiStatusError(409, f'{res.qualified} "{key[1]}" already exists', details=_details(res, key[1]))
            uid, created = obj["metadata"].get("uid"), obj["metadata"].get("creationTimestamp")
            self._stamp_new(obj)
            if keep_uid and uid:
                obj["metadata"]["uid"] = uid
            if keep_created and created:
                obj["metadata"]["creationTimestamp"] = created
            return _with_kind(res, _copy(self._commit(res, key, obj, "ADDED")))

    def update(self, obj: Obj) -> Obj:
        """Replace as given, keeping uid and creationTimestamp; MODIFIED. 404 if it does not exist."""
        res = self._kind_of(obj)
        obj = _without_kind(_copy(obj))
        with self._lock:
            key = self._key_of(res, obj)
            old = self._objects[res].get(key)
            if old is None:
                raise _not_found(res, key[1])
            self._keep_identity(obj, old)
            return _with_kind(res, _copy(self._commit(res, key, obj, "MODIFIED")))

    def upsert(self, obj: Obj, keep_uid: bool = False, keep_created: bool = False) -> Obj:
        """add() or update(), whichever applies."""
        res = self._kind_of(obj)
        key = self._key_of(res, _without_kind(_copy(obj)))
        with self._lock:
            return self.update(obj) if key in self._objects[res] else self.add(obj, keep_uid, keep_created)

    def patch(self, kind: str, name: str, patch: Obj, namespace: str | None = None, manager: str = "") -> Obj:
        """JSON merge patch (RFC 7386) of a stored object; MODIFIED unless nothing changes. `manager`: the
        writer its label changes are recorded for (see managedFields above)."""
        res = self._resource(kind)
        with self._lock:
            old = self._stored(res, namespace, name)
            new = _without_kind(_merge_patch(_copy(old), _copy(patch)))
            self._keep_identity(new, old)
            _own_labels(new, old, manager)
            return _with_kind(res, _copy(self._commit(res, self._key(res, namespace, name), new, "MODIFIED")))

    def patch_labels(self, kind: str, name: str, labels: dict[str, str | None], namespace: str | None = None,
                     manager: str = "") -> Obj:
        """Set labels; a None value removes that label."""
        return self.patch(kind, name, {"metadata": {"labels": labels}}, namespace, manager)

    def set_annotations(self, kind: str, name: str, annotations: dict[str, str | None],
                        namespace: str | None = None) -> Obj:
        return self.patch(kind, name, {"metadata": {"annotations": annotations}}, namespace)

    def delete(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        """Remove at once (finalizers ignored); DELETED. 404 if it does not exist."""
        res = self._resource(kind)
        with self._lock:
            self._stored(res, namespace, name)
            return _with_kind(res, _copy(self._commit(res, self._key(res, namespace, name), None, "DELETED")))

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        res = self._resource(kind)
        with self._lock:
            obj = self._objects[res].get(self._key(res, namespace, name))
            return None if obj is None else _with_kind(res, _copy(obj))

    def list(self, kind: str, namespace: str | None = None) -> list[Obj]:
        """The stored objects of a kind (one namespace's, or all), in key order, with kind and apiVersion."""
        res = self._resource(kind)
        with self._lock:
            objs = self._objects[res]
            return [_with_kind(res, _copy(objs[k])) for k in self._keys[res] if namespace is None or k[0] == namespace]

    def bind(self, namespace: str, name: str, node: str) -> Obj:
        """What a Binding does: spec.nodeName and PodScheduled; MODIFIED."""
        with self._lock:
            pod = self._bind(namespace, name, node, uid=None)
            return _with_kind(_POD, _copy(pod))

    def load(self, objs: Iterable[Obj], copy: bool = True) -> int:
        """Bulk create or replace without watch events (for big fixtures). Each object still gets its own
        resourceVersion; the watch history is dropped, so a watch from before the load gets 410 and
        relists. copy=False takes ownership of the dicts (faster; do not touch them afterwards)."""
        count, now = 0, _now()
        gc_was_enabled = gc.isenabled()
        gc.disable()  # 150,000 new dicts would set off full collections that walk the whole store, often
        try:
            with self._lock:
                touched: set[Resource] = set()
                for given in objs:
                    res = self._kind_of(given)
                    obj = _copy(given) if copy else given
                    obj.pop("kind", None)
                    obj.pop("apiVersion", None)
                    key = self._key_of(res, obj)
                    store = self._objects[res]
                    old = store.get(key)
                    if old is None:
                        self._stamp_new(obj, now)
                        self._keys[res].append(key)
                        touched.add(res)
                    else:
                        self._keep_identity(obj, old)
                    self._rv += 1
                    obj["metadata"]["resourceVersion"] = str(self._rv)
                    store[key] = obj
                    count += 1
                for res in touched:
                    self._keys[res] = sorted(set(self._keys[res]))
                self._compact_locked()
        finally:
            if gc_was_enabled:
                gc.enable()
        return count

    def compact(self) -> None:
        """Forget the watch history and the list snapshots, as etcd compaction does: watches from an older
        resourceVersion get 410 Expired, and continue tokens from before expire."""
        with self._lock:
            self._compact_locked()

    def cut_watches(self) -> int:
        """Cut every open watch stream mid-stream (no terminating chunk); returns how many."""
        serving = self._serving
        with self._lock:
            watches = list(self._watches)
        if serving is None or serving.loop is None or not watches:
            return 0
        clients = {w.client for w in watches}
        return asyncio.run_coroutine_threadsafe(self._halt(serving.server, clients), serving.loop).result(10)

    def stall_watches(self, kind: str | None = None) -> int:
        """Make the open watches (of that kind) go silent, as over a half-open connection: no events,
        no bookmarks, no end, until the client gives up and closes it. Watches opened later are
        served normally. Returns how many were stalled."""
        res = self._resource(kind) if kind else None
        with self._lock:
            watches = [w for w in self._watches if res is None or w.resource is res]
            for watch in watches:
                watch.stalled = True
                with contextlib.suppress(RuntimeError):
                    watch.loop.call_soon_threadsafe(watch.wake.set)
        return len(watches)

    def fail_next(self, n: int = 1, status: int = 500, *, message: str | None = None, reason: str | None = None,
                  retry_after: int | None = None, method: str | None = None, path: str | None = None) -> None:
        """The next n API requests (those with this method and path prefix, if given) get this error
        Status instead of their answer. 429 and 503 carry Retry-After (default 1 s for 429)."""
        if retry_after is None and status == 429:
            retry_after = 1
        error = ApiStatusError(status, message, reason, retry_after=retry_after)
        with self._lock:
            self._failures.append(_Failure(n, error, method.upper() if method else None, path))

    def stop_failing(self) -> None:
        """Drop every failure fail_next armed and not yet served: a test that must look at a retrying
        client before it succeeds arms more failures than it could ever use, then ends them here."""
        with self._lock:
            self._failures.clear()

    def count(self, verb: str | None = None, path: str | None = None) -> int:
        """Requests seen with this Kubernetes verb (list, watch, get, create, ...) and exact path."""
        with self._lock:
            return sum(1 for r in self.requests_log
                       if (verb is None or r.verb == verb) and (path is None or r.path == path))

    @property
    def counts(self) -> Counter[tuple[str, str]]:
        """(verb, path) -> requests seen."""
        with self._lock:
            return Counter((r.verb, r.path) for r in self.requests_log)

    def clear_log(self) -> None:
        with self._lock:
            self.requests_log.clear()

    def open_watches(self, kind: str | None = None) -> int:
        res = self._resource(kind) if kind else None
        with self._lock:
            return sum(1 for w in self._watches if res is None or w.resource is res)

    def wait_for_watches(self, n: int = 1, kind: str | None = None, timeout: float = 20.0) -> None:
        """Block until at least n watches (of that kind) are open; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while self.open_watches(kind) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.open_watches(kind)} watches open, waited for {n}")
            time.sleep(0.01)

    # -- the store ---------------------------------------------------------------------------------
    def _resource(self, kind: str) -> Resource:
        res = self._by_name.get(kind.lower())
        if res is None:
            raise ValueError(f"the fake API server does not serve {kind!r}")
        return res

    def _kind_of(self, obj: Obj) -> Resource:
        kind = obj.get("kind")
        if not isinstance(kind, str):
            raise ValueError("the object needs a kind")
        res = self._resource(kind)
        if obj.get("apiVersion") not in (None, res.api_version):
            raise ValueError(f"{kind} is served as {res.api_version}, not {obj.get('apiVersion')}")
        return res

    @staticmethod
    def _key(res: Resource, namespace: str | None, name: str) -> Key:
        return ((namespace or "default") if res.namespaced else "", name)

    def _key_of(self, res: Resource, obj: Obj) -> Key:
        meta = _meta(obj)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ValueError("the object needs metadata.name")
            meta["name"] = meta["generateName"] + "".join(secrets.choice(_GENERATE_CHARS) for _ in range(5))
        if res.namespaced:
            meta["namespace"] = meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        return self._key(res, meta.get("namespace"), meta["name"])

    def _stored(self, res: Resource, namespace: str | None, name: str) -> Obj:
        obj = self._objects[res].get(self._key(res, namespace, name))
        if obj is None:
            raise _not_found(res, name)
        return obj

    @staticmethod
    def _stamp_new(obj: Obj, now: str | None = None) -> None:
        meta = obj["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now or _now()
        meta.pop("resourceVersion", None)

    @staticmethod
    def _keep_identity(new: Obj, old: Obj) -> None:
        meta, old_meta = _meta(new), old["metadata"]
        for k in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds"):
            if k in old_meta:
                meta[k] = old_meta[k]
            else:
                meta.pop(k, None)

    def _commit(self, res: Resource, key: Key, new: Obj | None, event_type: str) -> Obj:
        """The one write path (lock held): version, store, key order, history, wake the watches.
        Returns the stored object (the deleted one, at its deletion version, for DELETED)."""
        store = self._objects[res]
        old = store.get(key)
        if new is not None and old is not None and _same(new, old):
            return old  # a no-op update: no new version, no event
        self._rv += 1
        rv = self._rv
        if new is None:
            assert old is not None
            del store[key]
            keys = self._keys[res]
            del keys[bisect.bisect_left(keys, key)]
            obj = {**old, "metadata": {**old["metadata"], "resourceVersion": str(rv)}}
            self._record(_Event(rv, "DELETED", res, key[0], obj, None))
            return obj
        new["metadata"]["resourceVersion"] = str(rv)
        if old is None:
            bisect.insort(self._keys[res], key)
        store[key] = new
        self._record(_Event(rv, "ADDED" if old is None else event_type, res, key[0], new, old))
        return new

    def _record(self, event: _Event) -> None:
        self._events.append(event)
        self._event_rvs.append(event.rv)
        if len(self._events) > self.history_limit * 1.25:  # trim in batches, not on every write
            drop = len(self._events) - self.history_limit
            self._floor = self._event_rvs[drop - 1]
            del self._events[:drop], self._event_rvs[:drop]
        self._wake_all()

    def _compact_locked(self) -> None:
        self._events.clear()
        self._event_rvs.clear()
        self._floor = self._rv
        self._snapshots.clear()
        self._wake_all()

    def _wake_all(self) -> None:
        for watch in self._watches:
            if not watch.pending:
                watch.pending = True
                with contextlib.suppress(RuntimeError):  # its loop is gone: the watch is ending anyway
                    watch.loop.call_soon_threadsafe(watch.wake.set)

    # -- HTTP: entry -------------------------------------------------------------------------------
    async def _endpoint(self, request: Request) -> Response:
        path = request.url.path
        if path.endswith("/") and path != "/":
            path = path.rstrip("/")  # the client asks for /version/; the API server serves both
        target = self._route(path)
        client = (request.client.host, request.client.port) if request.client else None
        record = RequestRecord(request.method, path, dict(request.query_params), self._verb(request, target), client)
        with self._lock:
            self.requests_log.append(record)
        if self.delay > 0:
            await asyncio.sleep(self.delay)
        try:
            if path in _HEALTH:
                return self._health(path)
            # The scheme is case-insensitive, as kube-apiserver reads it (apiserver's bearertoken.go):
            # in-cluster configuration sends "bearer <token>".
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or (token != self.token and token not in self.users):
                raise ApiStatusError(401)
            if token != self.token:
                self._authorize(self.users[token], record.verb, target)
            self._injected(request.method, path)
            return await self._dispatch(request, target)
        except ApiStatusError as exc:
            return self._error(exc)

    def add_user(self, token: str, name: str, namespaces: Iterable[str], cluster: Iterable[str] = ()) -> None:
        """A user RoleBindings give read access (get, list, watch) in `namespaces`, and a ClusterRoleBinding
        the same on the resources named in `cluster` (plural names, e.g. "nodes") everywhere."""
        self.users[token] = (name, frozenset(namespaces), frozenset(cluster))

    def user_kubeconfig(self, path: str | Path, token: str, namespace: str) -> Path:
        """A kubeconfig for a user of `add_user`, its context in `namespace` (as a developer's is)."""
        config = self.kubeconfig()
        config["users"][0]["user"]["token"] = token
        config["contexts"][0]["context"]["namespace"] = namespace
        Path(path).write_text(yaml.safe_dump(config, sort_keys=False))
        return Path(path)

    @staticmethod
    def _authorize(user: tuple[str, frozenset[str], frozenset[str]], verb: str, target: _Target | None) -> None:
        """RBAC for a namespace-bound reader, with kube-apiserver's 403 Status (forbiddenMessage)."""
        name, namespaces, cluster = user
        if target is None or target.resource is None:
            if target is None:
                return  # discovery: system:discovery lets every authenticated user read it
            raise ApiStatusError(403, f'User "{name}" cannot {verb} resource "bindings" in API group "" in the '
                                      f'namespace "{target.namespace}"', details={"kind": "bindings"})
        res = target.resource
        namespace = target.namespace or (target.name if res is _NAMESPACE else None)
        if verb in ("get", "list", "watch") and (res.plural in cluster or (
                namespace in namespaces and (res.namespaced or res is _NAMESPACE))):
            return
        resource = f"{res.plural}/{target.subresource}" if target.subresource else res.plural
        scope = f'in the namespace "{target.namespace}"' if target.namespace else "at the cluster scope"
        what = f'{res.qualified} "{target.name}"' if target.name else res.qualified
        raise ApiStatusError(403, f'{what} is forbidden: User "{name}" cannot {verb} resource "{resource}" in API '
                                  f'group "{res.group}" {scope}',
                             details={"name": target.name or "", "group": res.group, "kind": res.plural})

    def _error(self, exc: ApiStatusError) -> Response:
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
        return Response(orjson.dumps(exc.status()), exc.code, headers=headers, media_type="application/json")

    @staticmethod
    def _json(obj: Any, status: int = 200) -> Response:
        return Response(orjson.dumps(obj), status, media_type="application/json")

    def _injected(self, method: str, path: str) -> None:
        with self._lock:
            for failure in self._failures:
                if failure.remaining > 0 and failure.method in (None, method) and (
                        failure.path is None or path.startswith(failure.path)):
                    failure.remaining -= 1
                    if failure.remaining == 0:
                        self._failures.remove(failure)
                    raise failure.error

    def _health(self, path: str) -> Response:
        if path == "/version":
            return self._json({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "gitCommit": "fake",
                               "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                               "compiler": "gc", "platform": "linux/amd64"})
        return Response(b"ok", media_type="text/plain")

    @staticmethod
    def _verb(request: Request, target: _Target | None) -> str:
        method = request.method
        if target is None:
            return method.lower()
        collection = target.name is None
        if method == "GET":
            if _flag(request.query_params.get("watch")) or target.watch_path:
                return "watch"
            return "list" if collection else "get"
        if method == "DELETE":
            return "deletecollection" if collection else "delete"
        return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())

    def _route(self, path: str) -> _Target | None:
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        watch_path = rest[:1] == ["watch"]
        if watch_path:
            rest = rest[1:]
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and ((group, version, rest[2]) in self._by_path or (
                not group and rest[2] == "bindings")):
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3 or not all(rest):
            return None
        if namespace is not None and rest == ["bindings"]:
            return _Target(None, namespace, None, None, False)
        res = self._by_path.get((group, version, rest[0]))
        if res is None or (namespace is not None and not res.namespaced):
            return None
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if res.namespaced and namespace is None and name is not None:
            return None
        if sub is not None and not ((sub == "status" and res.has_status) or (sub in ("binding", "eviction")
                                                                            and res is _POD)):
            return None
        return _Target(res, namespace, name, sub, watch_path)

    async def _dispatch(self, request: Request, target: _Target | None) -> Response:
        method = request.method
        if target is None:
            return self._discovery(request.url.path)
        if target.resource is None:  # POST /api/v1/namespaces/{ns}/bindings
            if method != "POST":
                raise ApiStatusError(405)
            return self._create_binding(target.namespace or "", None, await self._body(request))
        res, ns, name, sub = target.resource, target.namespace, target.name, target.subresource
        query = request.query_params
        if target.watch_path or (method == "GET" and name is None and _flag(query.get("watch"))):
            if method != "GET" or sub is not None:
                raise ApiStatusError(405)
            return self._watch(res, ns, name, query)
        if method == "GET":
            if sub in ("binding", "eviction"):
                raise ApiStatusError(405)
            return self._json(self._list(res, ns, query)) if name is None else self._json(self._get(res, ns, name))
        if sub == "binding":
            if method != "POST":
                raise ApiStatusError(405)
            return self._create_binding(ns or "", name, await self._body(request))
        if sub == "eviction":
            if method != "POST":
                raise ApiStatusError(405)
            return self._json(self._evict(ns or "default", name or "", await self._body(request)), 201)
        dry_run = bool(query.get("dryRun"))
        if method == "POST" and name is None:
            if res.namespaced and ns is None:
                raise ApiStatusError(405)
            return self._json(self._create(res, ns, await self._body(request), dry_run), 201)
        manager = query.get("fieldManager") or request.headers.get("user-agent", "").split("/", 1)[0]
        if method == "PUT" and name is not None:
            return self._json(self._replace(res, ns, name, sub, await self._body(request), dry_run, manager))
        if method == "PATCH" and name is not None:
            patched = self._patch(res, ns, name, sub, request.headers.get("content-type", ""),
                                  await request.body(), dry_run, manager)
            return self._json(patched)
        if method == "DELETE" and sub is None:
            raw = await request.body()
            options = self._parse(raw) if raw.strip() else {}
            if name is None:
                return self._json(self._delete_collection(res, ns, query, dry_run))
            body, code = self._delete(res, ns, name, options, dry_run)
            return self._json(body, code)
        raise ApiStatusError(405)

    async def _body(self, request: Request) -> Obj:
        body = self._parse(await request.body())
        if not isinstance(body, dict):
            raise ApiStatusError(400, "the body of the request must be a JSON object")
        return body

    @staticmethod
    def _parse(raw: bytes) -> Any:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ApiStatusError(400, f"error decoding the request body: {exc}") from None

    # -- HTTP: reads -------------------------------------------------------------------------------
    def _get(self, res: Resource, ns: str | None, name: str) -> Obj:
        with self._lock:
            return _with_kind(res, self._stored(res, ns, name))

    def _list(self, res: Resource, ns: str | None, query: Any) -> Obj:
        match = _both(parse_label_selector(query.get("labelSelector")),
                      parse_field_selector(query.get("fieldSelector"), res))
        limit = self._int(query.get("limit"), "limit")
        token = query.get("continue")
        rv_param = query.get("resourceVersion") or ""
        if token and rv_param not in ("", "0"):
            raise ApiStatusError(400, "specifying resource version is not allowed when using continue")
        with self._lock:
            if not token and rv_param not in ("", "0") and self._int(rv_param, "resourceVersion") > self._rv:
                raise ApiStatusError(504, f"Too large resource version: {rv_param}, current: {self._rv}",
                                     reason="Timeout", details={"causes": [{"reason": "ResourceVersionTooLarge",
                                                                            "message": "Too large resource version"}],
                                                                "retryAfterSeconds": 1})
            items, rv, start, snapshot = self._page_source(res, ns, token)
            page, next_index, examined_all = self._take(items, start, limit, match)
            meta: Obj = {"resourceVersion": str(rv)}
            if limit and not examined_all:
                if snapshot is None:
                    snapshot = self._keep_snapshot(_Snapshot(rv, res, ns, items))
                last_key = items[next_index - 1][0]
                meta["continue"] = _encode_continue(rv, self._start_of(last_key, res, ns), snapshot)
                if match is None:
                    meta["remainingItemCount"] = len(items) - next_index
            elif snapshot is not None:
                self._snapshots.pop(snapshot, None)  # its last page is out
        return {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta, "items": page}

    def _page_source(self, res: Resource, ns: str | None,
                     token: str | None) -> tuple[list[tuple[Key, Obj]], int, int, int | None]:
        """(items in key order, list version, start index, snapshot id) for a first or continued page."""
        if not token:
            return self._scope(res, ns), self._rv, 0, None
        rv, start, snap_id = _decode_continue(token)
        start_key = self._key_from_start(start, res, ns)
        snapshot = self._snapshots.get(snap_id) if snap_id is not None else None
        if snapshot is not None and snapshot.resource is res and snapshot.namespace == ns and snapshot.rv == rv:
            items = snapshot.items
        elif rv == -1 or rv == self._rv:  # an inconsistent continue, or nothing changed since: live state
            items, snap_id = self._scope(res, ns), None
        else:
            inconsistent = _encode_continue(-1, start, None)
            raise ApiStatusError(410, _EXPIRED_CONTINUE, list_meta={"continue": inconsistent})
        start_index = bisect.bisect_left(items, start_key, key=lambda kv: kv[0])
        return items, (self._rv if rv == -1 else rv), start_index, snap_id

    def _scope(self, res: Resource, ns: str | None) -> list[tuple[Key, Obj]]:
        keys, objs = self._keys[res], self._objects[res]
        if ns is None:
            return [(k, objs[k]) for k in keys]
        lo = bisect.bisect_left(keys, (ns, ""))
        hi = bisect.bisect_left(keys, (ns + "\x00", ""))
        return [(k, objs[k]) for k in keys[lo:hi]]

    @staticmethod
    def _take(items: list[tuple[Key, Obj]], start: int, limit: int,
              match: Match | None) -> tuple[list[Obj], int, bool]:
        """Up to limit matching objects from start: (page, index after the last examined, examined all)."""
        if match is None:
            end = len(items) if not limit else min(len(items), start + limit)
            return [obj for _, obj in items[start:end]], end, end >= len(items)
        page: list[Obj] = []
        index = start
        while index < len(items) and (not limit or len(page) < limit):
            obj = items[index][1]
            index += 1
            if match(obj):
                page.append(obj)
        return page, index, index >= len(items)

    def _keep_snapshot(self, snapshot: _Snapshot) -> int:
        self._snapshot_ids += 1
        self._snapshots[self._snapshot_ids] = snapshot
        while len(self._snapshots) > 16:  # the oldest paged lists expire (410), as on a busy etcd
            del self._snapshots[next(iter(self._snapshots))]
        return self._snapshot_ids

    @staticmethod
    def _start_of(key: Key, res: Resource, ns: str | None) -> str:
        """etcd's key after the list prefix, plus NUL: the next page starts strictly after it."""
        return (f"{key[0]}/{key[1]}" if res.namespaced and ns is None else key[1]) + "\x00"

    @staticmethod
    def _key_from_start(start: str, res: Resource, ns: str | None) -> Key:
        if res.namespaced and ns is None:
            namespace, _, name = start.partition("/")
            return (namespace, name)
        return (ns or "", start)

    @staticmethod
    def _int(value: str | None, name: str) -> int:
        if not value:
            return 0
        try:
            number = int(value)
        except ValueError:
            raise ApiStatusError(400, f"invalid value for {name}: {value!r}") from None
        if number < 0:
            raise ApiStatusError(400, f"{name} must not be negative")
        return number

    # -- HTTP: watch -------------------------------------------------------------------------------
    def _watch(self, res: Resource, ns: str | None, name: str | None, query: Any) -> Response:
        match = _both(parse_label_selector(query.get("labelSelector")),
                      parse_field_selector(query.get("fieldSelector"), res))
        if name is not None:  # the deprecated single-object watch path
            match = _both(match, lambda obj: obj["metadata"].get("name") == name)
        rv_param = query.get("resourceVersion") or ""
        send_initial = query.get("sendInitialEvents")
        initial = _flag(send_initial) if send_initial is not None else rv_param in ("", "0")
        if send_initial is not None and _flag(send_initial) and query.get("resourceVersionMatch") != "NotOlderThan":
            raise ApiStatusError(422, "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: "
                                      "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                                 reason="Invalid")
        start_rv = 0 if rv_param in ("", "0") else self._int(rv_param, "resourceVersion")
        timeout = self._int(query.get("timeoutSeconds"), "timeoutSeconds") or self.default_watch_timeout
        bookmarks = _flag(query.get("allowWatchBookmarks"))
        end_bookmark = bookmarks and send_initial is not None and _flag(send_initial)

        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            loop = asyncio.get_running_loop()
            with self._lock:
                expired = not initial and start_rv and start_rv < self._floor  # NotOlderThan: any newer is fine
                cursor = self._rv if initial or not start_rv else start_rv  # initial events bring it to now
                watch = _Watch(res, ns, match, cursor, bookmarks, scope.get("client"), loop)
                snapshot = [obj for _, obj in self._scope(res, ns) if match is None or match(obj)] if initial else []
                if not expired:
                    self._watches.add(watch)
                floor = self._floor
            try:
                await self._stream(watch, send, receive, snapshot, end_bookmark, timeout,
                                   expired=f"too old resource version: {start_rv} ({floor})" if expired else None)
            finally:
                with self._lock:
                    self._watches.discard(watch)
        return _StreamResponse(run)

    async def _stream(self, watch: _Watch, send: Send, receive: Receive, initial: list[Obj], end_bookmark: bool,
                      timeout: float, expired: str | None) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"cache-control", b"no-cache, private")]})
        listener = asyncio.create_task(self._listen(watch, receive))
        loop = watch.loop
        deadline = loop.time() + timeout
        try:
            if expired:
                await self._send_lines(watch, send, [self._error_line(expired)])
            else:
                await self._run_watch(watch, send, initial, end_bookmark, deadline)
            if not watch.closed and not watch.stalled:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _run_watch(self, watch: _Watch, send: Send, initial: list[Obj], end_bookmark: bool,
                         deadline: float) -> None:
        res, loop = watch.resource, watch.loop
        for i in range(0, len(initial), _PAGE_EVENTS):
            await self._send_lines(watch, send, [self._event_line("ADDED", res, obj)
                                                 for obj in initial[i:i + _PAGE_EVENTS]])
        if end_bookmark:
            await self._send_lines(watch, send, [self._bookmark_line(res, watch.cursor, initial_end=True)])
        next_bookmark = loop.time() + self.bookmark_interval
        while not watch.closed:
            watch.wake.clear()
            if watch.stalled:
                await watch.wake.wait()  # set again by writes and by the client's disconnect
                continue
            events, gone = self._collect(watch)
            if gone:
                await self._send_lines(watch, send, [self._error_line(gone)])
                return
            if events:
                await self._send_lines(watch, send, [self._event_line(t, res, obj) for t, obj in events])
            now = loop.time()
            if watch.closed or now >= deadline:
                return
            if watch.bookmarks and now >= next_bookmark:
                await self._send_lines(watch, send, [self._bookmark_line(res, watch.cursor)])
                next_bookmark = now + self.bookmark_interval
            wait = deadline - now
            if watch.bookmarks:
                wait = min(wait, max(0.0, next_bookmark - now))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watch.wake.wait(), wait)

    @staticmethod
    async def _listen(watch: _Watch, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        watch.closed = True
        watch.wake.set()

    @staticmethod
    async def _send_lines(watch: _Watch, send: Send, lines: list[bytes]) -> None:
        if not watch.closed:
            await send({"type": "http.response.body", "body": b"".join(lines), "more_body": True})

    @staticmethod
    def _event_line(event_type: str, res: Resource, obj: Obj) -> bytes:
        return orjson.dumps({"type": event_type, "object": _with_kind(res, obj)}, option=orjson.OPT_APPEND_NEWLINE)

    @staticmethod
    def _bookmark_line(res: Resource, rv: int, initial_end: bool = False) -> bytes:
        meta: Obj = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return orjson.dumps({"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": res.api_version,
                                                            "metadata": meta}}, option=orjson.OPT_APPEND_NEWLINE)

    @staticmethod
    def _error_line(message: str) -> bytes:
        status = ApiStatusError(410, message, "Expired").status()
        return orjson.dumps({"type": "ERROR", "object": status}, option=orjson.OPT_APPEND_NEWLINE)

    def _collect(self, watch: _Watch) -> tuple[list[tuple[str, Obj]], str | None]:
        """The watch's events since its cursor, as the watch cache converts them for its selectors."""
        with self._lock:
            watch.pending = False
            if watch.cursor < self._floor:
                return [], f"too old resource version: {watch.cursor} ({self._floor})"
            start = bisect.bisect_right(self._event_rvs, watch.cursor)
            out = []
            for event in self._events[start:]:
                if event.resource is watch.resource and (watch.namespace is None or event.namespace == watch.namespace):
                    converted = self._convert(watch.match, event)
                    if converted is not None:
                        out.append(converted)
            watch.cursor = max(watch.cursor, self._rv)
            return out, None

    @staticmethod
    def _convert(match: Match | None, event: _Event) -> tuple[str, Obj] | None:
        if match is None:
            return event.type, event.obj
        now = match(event.obj)
        before = event.prev is not None and match(event.prev)
        if event.type != "MODIFIED" or event.prev is None:
            return (event.type, event.obj) if now else None
        if now:
            return ("MODIFIED" if before else "ADDED"), event.obj
        if before:  # stopped matching: DELETED with the old content at the event's version
            prev = event.prev
            return "DELETED", {**prev, "metadata": {**prev["metadata"], "resourceVersion": str(event.rv)}}
        return None

    # -- HTTP: writes ------------------------------------------------------------------------------
    def _check_body(self, res: Resource, body: Obj) -> Obj:
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if api_version not in (None, "", res.api_version):
            raise ApiStatusError(400, f"the API version in the data ({api_version}) does not match the expected "
                                      f"API version ({res.api_version})")
        if kind not in (None, "", res.kind):
            raise ApiStatusError(400, f"the kind in the data ({kind}) does not match the expected kind ({res.kind})")
        obj = _without_kind(body)
        _meta(obj)
        return obj

    def _create(self, res: Resource, ns: str | None, body: Obj, dry_run: bool) -> Obj:
        obj = self._check_body(res, body)
        meta = obj["metadata"]
        if res.namespaced:
            if meta.get("namespace") not in (None, "", ns):
                raise ApiStatusError(400, "the namespace of the provided object does not match the namespace sent "
                                          "on the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise ApiStatusError(500, "resourceVersion should not be set on objects to be created")
        requested = str(meta.get("name") or "")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(secrets.choice(_GENERATE_CHARS) for _ in range(5))
        self._validate_name(res, meta.get("name") or "")
        _check_labels(res, obj)
        self._prepare_create(res, obj)
        with self._lock:
            if res.namespaced:
                self._check_namespace(res, ns or "", requested)
            key = self._key(res, ns, meta["name"])
            if key in self._objects[res]:
                raise ApiStatusError(409, f'{res.qualified} "{meta["name"]}" already exists',
                                     reason="AlreadyExists", details=_details(res, meta["name"]))
            self._stamp_new(obj)
            if dry_run:
                return _with_kind(res, {**obj, "metadata": {**meta, "resourceVersion": ""}})
            created = self._commit(res, key, obj, "ADDED")
            self._evicting(res, key)  # stores a new dict: `created` stays as the create answered it
            return _with_kind(res, created)

    def _check_namespace(self, res: Resource, ns: str, name: str) -> None:
        """The NamespaceLifecycle admission plugin on a create (k8s.io/apiserver v0.37.2
        pkg/admission/plugin/namespace/lifecycle/admission.go `Admit`): a namespace that does not exist
        is the namespace lookup's own 404; one being deleted refuses new content with a 403 Forbidden
        for the object (`admission.NewForbidden`) and a `NamespaceTerminating` cause."""
        namespace = self._objects[_NAMESPACE].get(("", ns))
        if namespace is None:
            raise _not_found(_NAMESPACE, ns)
        if namespace["metadata"].get("deletionTimestamp"):
            details = _details(res, name)
            details["causes"] = [{"reason": "NamespaceTerminating", "message": f"namespace {ns} is being terminated",
                                  "field": "metadata.namespace"}]
            what = f'{res.qualified} "{name}"' if name else res.qualified
            raise ApiStatusError(403, f"{what} is forbidden: unable to create new content in namespace {ns} because "
                                      "it is being terminated", details=details)

    @staticmethod
    def _validate_name(res: Resource, name: str) -> None:
        if not name:
            raise _invalid(res, name, "metadata.name", "Required value: name or generateName is required")
        pattern, limit, what = ((_LABEL, 63, "a lowercase RFC 1123 label") if res is _NAMESPACE
                                else (_SUBDOMAIN, 253, "a lowercase RFC 1123 subdomain"))
        if len(name) > limit or not pattern.match(name):
            raise _invalid(res, name, "metadata.name",
                           f'Invalid value: "{name}": {what} must consist of lower case alphanumeric characters, '
                           f"'-'{' or ' + repr('.') if pattern is _SUBDOMAIN else ''}, and must start and end with "
                           "an alphanumeric character")

    @staticmethod
    def _prepare_create(res: Resource, obj: Obj) -> None:
        """The bits of each type's create strategy that clients notice."""
        if res is _POD:
            obj["status"] = {"phase": "Pending"}
        elif res is _NAMESPACE:
            name = obj["metadata"]["name"]
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
        elif res.kind == "Secret":
            _secret_data(obj)
        elif res.kind == "ResourceQuota":
            _check_quota(res, obj)

    def _replace(self, res: Resource, ns: str | None, name: str, sub: str | None, body: Obj, dry_run: bool,
                 manager: str = "") -> Obj:
        obj = self._check_body(res, body)
        meta = obj["metadata"]
        if meta.get("name") not in (None, "", name):
            raise ApiStatusError(400, f"the name of the object ({meta.get('name')}) does not match the name on the "
                                      f"URL ({name})")
        if res.namespaced and meta.get("namespace") not in (None, "", ns):
            raise ApiStatusError(400, "the namespace of the provided object does not match the namespace sent on "
                                      "the request")
        with self._lock:
            return self._update_locked(res, ns, name, sub, obj, dry_run, manager)

    def _update_locked(self, res: Resource, ns: str | None, name: str, sub: str | None, obj: Obj,
                       dry_run: bool, manager: str = "") -> Obj:
        old = self._stored(res, ns, name)
        meta, old_meta = obj["metadata"], old["metadata"]
        if meta.get("resourceVersion") and meta["resourceVersion"] != old_meta["resourceVersion"]:
            raise _conflict(res, name, "the object has been modified; please apply your changes to the latest "
                                       "version and try again")
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise _conflict(res, name, f"Precondition failed: UID in precondition: {meta['uid']}, UID in object "
                                       f"meta: {old_meta['uid']}")
        if sub == "status":  # the status subresource changes status only
            obj = {**_copy(old), "status": obj.get("status")}
        elif res.has_status:  # and the main resource everything but status
            obj.pop("status", None)
            if "status" in old:
                obj["status"] = _copy(old["status"])
        if res.kind == "Secret":
            _secret_data(obj)
        elif res.kind == "ResourceQuota" and sub is None:
            _check_quota(res, obj)
        if sub is None:
            _check_labels(res, obj)
        self._keep_identity(obj, old)
        if sub is None:
            _own_labels(obj, old, manager)
        if dry_run:
            return _with_kind(res, obj)
        key = self._key(res, ns, name)
        if old_meta.get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
            return _with_kind(res, self._commit(res, key, None, "DELETED"))  # the last finalizer went
        updated = self._commit(res, key, obj, "MODIFIED")
        if sub is None and updated is not old and updated.get("spec") != old.get("spec"):
            self._evicting(res, key)
        return _with_kind(res, updated)

    def _evicting(self, res: Resource, key: Key) -> None:
        """kube-controller-manager's device-taint-eviction controller (when `device_taint_eviction`) on a
        DeviceTaintRule just created or given a new spec: its status condition, applied at once (lock
        held). The reason is what `maybeUpdateRuleStatus` sets for a rule no pod is evicted by yet; the
        counts in the `None` effect's message are of published devices only (the fake allocates none)."""
        if not self.device_taint_eviction or res.kind != "DeviceTaintRule" or key not in self._objects[res]:
            return
        rule = _copy(self._objects[res][key])
        spec = rule.get("spec") or {}
        effect = (spec.get("taint") or {}).get("effect")
        if effect == "NoExecute":
            reason, message = "NotStarted", ""
        elif effect == "None":
            reason = "NoEffect"
            message = (f"{self._published_devices(spec.get('deviceSelector') or {})} published devices selected. "
                       "0 allocated devices selected. 0 pods would be evicted in 0 different namespaces if the "
                       "effect was NoExecute. This information will not be updated again. Recreate the "
                       "DeviceTaintRule to trigger an update.")
        else:
            reason, message = "OtherEffect", "Eviction only happens for the NoExecute effect."
        rule["status"] = {"conditions": [{"type": "EvictionInProgress", "status": "False", "reason": reason,
                                          "message": message,
                                          "observedGeneration": rule["metadata"].get("generation", 1),
                                          "lastTransitionTime": _now()}]}
        self._commit(res, key, rule, "MODIFIED")

    def _published_devices(self, selector: Obj) -> int:
        slices = self._by_name.get("resourceslices")
        count = 0
        for slice_ in self._objects[slices].values() if slices else ():
            spec = slice_.get("spec") or {}
            if selector.get("driver") not in (None, spec.get("driver")) or selector.get("pool") not in (
                    None, (spec.get("pool") or {}).get("name")):
                continue
            count += sum(1 for d in spec.get("devices") or () if selector.get("device") in (None, d.get("name")))
        return count

    def _patch(self, res: Resource, ns: str | None, name: str, sub: str | None, content_type: str, raw: bytes,
               dry_run: bool, manager: str = "") -> Obj:
        media = content_type.split(";")[0].strip().lower()
        if media not in _PATCH_TYPES:
            raise ApiStatusError(415, f"the body of the request was in an unknown format - accepted media types "
                                      f"include: {', '.join(_PATCH_TYPES)}")
        patch = self._parse(raw)
        with self._lock:
            current = _with_kind(res, _copy(self._stored(res, ns, name)))
            if media == "application/json-patch+json":
                if not isinstance(patch, list):
                    raise ApiStatusError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
                try:
                    patched = jsonpatch.JsonPatch(patch).apply(current)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, TypeError,
                        ValueError) as exc:
                    raise ApiStatusError(422, str(exc) or type(exc).__name__, "Invalid") from None
            else:
                if not isinstance(patch, dict):
                    raise ApiStatusError(400, "the patch must be a JSON object")
                patched = _merge_patch(current, patch)
            if not isinstance(patched, dict):
                raise ApiStatusError(422, "the patched object is not an object", "Invalid")
            obj = self._check_body(res, patched)
            if obj["metadata"].get("name") != name:
                raise ApiStatusError(422, "metadata.name: Invalid value: the name cannot be changed", "Invalid")
            return self._update_locked(res, ns, name, sub, obj, dry_run, manager)

    def _delete(self, res: Resource, ns: str | None, name: str, options: Any, dry_run: bool) -> tuple[Obj, int]:
        with self._lock:
            old = self._stored(res, ns, name)
            pre = options.get("preconditions") or {} if isinstance(options, dict) else {}
            if pre.get("uid") and pre["uid"] != old["metadata"]["uid"]:
                raise _conflict(res, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in object "
                                           f"meta: {old['metadata']['uid']}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"]["resourceVersion"]:
                raise _conflict(res, name, "the ResourceVersion in the precondition does not match ResourceVersion "
                                           "in record. The object might have been modified")
            key = self._key(res, ns, name)
            if old["metadata"].get("finalizers"):  # pending until the finalizers are removed: 202
                if dry_run or old["metadata"].get("deletionTimestamp"):
                    return _with_kind(res, old), 202
                pending = _copy(old)
                pending["metadata"].update({"deletionTimestamp": _now(), "deletionGracePeriodSeconds": 0})
                return _with_kind(res, self._commit(res, key, pending, "MODIFIED")), 202
            gone = old if dry_run else self._commit(res, key, None, "DELETED")
        if res.return_deleted:
            return _with_kind(res, gone), 200
        details = {**_details(res, name), "uid": old["metadata"]["uid"]}
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}, 200

    def _delete_collection(self, res: Resource, ns: str | None, query: Any, dry_run: bool) -> Obj:
        match = _both(parse_label_selector(query.get("labelSelector")),
                      parse_field_selector(query.get("fieldSelector"), res))
        deleted = []
        with self._lock:
            for key, obj in self._scope(res, ns):
                if match is None or match(obj):
                    body, _ = self._delete(res, key[0] or None, key[1], {}, dry_run)
                    deleted.append(_without_kind(body) if body.get("kind") == res.kind else obj)
            rv = self._rv
        return {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": {"resourceVersion": str(rv)},
                "items": deleted}

    # -- HTTP: eviction ----------------------------------------------------------------------------
    def _evict(self, ns: str, name: str, body: Obj) -> Obj:
        """EvictionREST.Create (pkg/registry/core/pod/storage/eviction.go): a terminal, Pending or deleting
        pod goes without a budget check (canIgnorePDB); otherwise the one PodDisruptionBudget of its
        namespace whose selector matches it (two: 500) must allow a disruption (checkAndDecrement: 429
        while status.observedGeneration < metadata.generation or disruptionsAllowed is 0, 403 below 0),
        and gives one up, the pod named in status.disruptedPods; an unready pod is let go when the
        budget's unhealthyPodEvictionPolicy is AlwaysAllow or currentHealthy >= desiredHealthy > 0."""
        if body.get("kind") not in (None, "", "Eviction"):
            raise ApiStatusError(400, f"not a Eviction object: {body.get('kind')}")
        if (body.get("metadata") or {}).get("name") != name:
            raise ApiStatusError(400, "name in URL does not match name in Eviction object")
        with self._lock:
            pod = self._stored(_POD, ns, name)
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
                self._commit(_POD, self._key(_POD, ns, name), None, "DELETED")
                return _SUCCESS
            labels = pod["metadata"].get("labels") or {}
            budgets = [b for key, b in self._scope(_PDB, ns) if _pdb_selects(b, labels)]
            if len(budgets) > 1:
                raise ApiStatusError(500, "This pod has more than one PodDisruptionBudget, which the eviction "
                                          "subresource does not support.")
            if budgets:
                self._disrupt(budgets[0], name, _pod_ready(pod))
            self._commit(_POD, self._key(_POD, ns, name), None, "DELETED")
        return _SUCCESS

    def _disrupt(self, budget: Obj, pod: str, ready: bool) -> None:
        meta, spec, status = budget["metadata"], budget.get("spec") or {}, budget.get("status") or {}
        if not ready and (spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow" or (
                status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0) > 0)):
            return  # an unready pod that does not count towards the budget
        pdb = meta["name"]
        if status.get("observedGeneration", 0) < meta.get("generation", 0):
            raise _too_many(f"The disruption budget {pdb} is still being processed by the server.", 10)
        allowed = status.get("disruptionsAllowed", 0)
        if allowed < 0:
            raise ApiStatusError(403, f'poddisruptionbudgets.policy "{pdb}" is forbidden: pdb disruptions allowed is '
                                      "negative", details={"causes": [{"reason": "DisruptionBudget", "message": (
                                          f"The disruption budget {pdb} does not allow evicting pods currently: pdb "
                                          "disruptions allowed is negative")}]})
        if allowed == 0:
            healthy, desired = status.get("currentHealthy", 0), status.get("desiredHealthy", 0)
            why = (f"The disruption budget {pdb} needs {desired} healthy pods and has {healthy} currently"
                   if healthy <= desired else f"The disruption budget {pdb} does not allow evicting pods currently")
            raise _too_many(why, 0)
        new = _copy(budget)
        new_status = new.setdefault("status", {})
        new_status["disruptionsAllowed"] = allowed - 1
        new_status.setdefault("disruptedPods", {})[pod] = _now()
        self._commit(_PDB, (meta["namespace"], pdb), new, "MODIFIED")

    # -- HTTP: binding -----------------------------------------------------------------------------
    def _create_binding(self, ns: str, name: str | None, body: Obj) -> Response:
        meta = body.get("metadata") or {}
        target = body.get("target") or {}
        if body.get("kind") not in (None, "", "Binding"):
            raise ApiStatusError(400, f"the kind in the data ({body.get('kind')}) does not match Binding")
        if meta.get("namespace") not in (None, "", ns):
            raise ApiStatusError(400, "the namespace of the provided object does not match the namespace sent on the "
                                      "request")
        pod_name = name or meta.get("name") or ""
        if name is not None and meta.get("name") not in (None, "", name):
            raise ApiStatusError(400, "name in URL does not match name in Binding object")
        if not target.get("name"):
            raise _invalid(_POD, pod_name, "target.name", "Required value")
        if target.get("kind") not in (None, "", "Node"):
            raise ApiStatusError(400, "must be a Node: binding target kind is not Node")
        with self._lock:
            self._bind(ns, pod_name, target["name"], meta.get("uid") or None, meta.get("annotations"))
        return self._json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
                          201)

    def _bind(self, ns: str, name: str, node: str, uid: str | None, annotations: Obj | None = None) -> Obj:
        """BindingREST.assignPod: the pod must exist, match the UID, and not be bound or deleted."""
        pod = self._stored(_POD, ns, name)
        meta = pod["metadata"]
        if uid and uid != meta.get("uid"):
            raise _conflict(_POD, name, f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                                        f"{meta.get('uid')}", qualified="pods/binding")
        if meta.get("deletionTimestamp"):
            raise _conflict(_POD, name, f"pod {name} is being deleted, cannot be assigned to a host",
                            qualified="pods/binding")
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to:
            raise _conflict(_POD, name, f'pod {name} is already assigned to node "{bound_to}"',
                            qualified="pods/binding")
        new = _copy(pod)
        new.setdefault("spec", {})["nodeName"] = node
        if annotations:
            new["metadata"].setdefault("annotations", {}).update(annotations)
        status = new.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        status["conditions"] = [*conditions, {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                              "lastTransitionTime": _now()}]
        return self._commit(_POD, self._key(_POD, ns, name), new, "MODIFIED")

    # -- HTTP: discovery ---------------------------------------------------------------------------
    def _discovery(self, path: str) -> Response:
        parts = path.strip("/").split("/")
        groups = sorted({r.group for r in self.resources if r.group})
        if parts == ["api"]:
            return self._json({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}]})
        if parts == ["apis"]:
            return self._json({"kind": "APIGroupList", "apiVersion": "v1",
                               "groups": [self._group(g) for g in groups]})
        if parts[0] == "apis" and len(parts) == 2 and parts[1] in groups:
            return self._json({"kind": "APIGroup", "apiVersion": "v1", **self._group(parts[1])})
        group_version = "v1" if parts == ["api", "v1"] else "/".join(parts[1:3]) if len(parts) == 3 else None
        served = [r for r in self.resources if r.api_version == group_version]
        if parts[0] in ("api", "apis") and served:
            return self._json({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
                               "resources": [entry for r in served for entry in self._resource_entries(r)]})
        raise ApiStatusError(404)

    def _group(self, group: str) -> Obj:
        order = ("v1", "v1beta2", "v1beta1", "v1alpha3")
        names = sorted({r.version for r in self.resources if r.group == group}, key=lambda v: order.index(v)
                       if v in order else len(order))
        versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in names]
        return {"name": group, "versions": versions, "preferredVersion": versions[0]}

    @staticmethod
    def _resource_entries(res: Resource) -> Iterator[Obj]:
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        entry: Obj = {"name": res.plural, "singularName": res.singular, "namespaced": res.namespaced,
                      "kind": res.kind, "verbs": verbs}
        if res.short_names:
            entry["shortNames"] = list(res.short_names)
        yield entry
        if res.has_status:
            yield {"name": f"{res.plural}/status", "singularName": "", "namespaced": res.namespaced,
                   "kind": res.kind, "verbs": ["get", "patch", "update"]}
        if res is _POD:
            yield {"name": "pods/binding", "singularName": "", "namespaced": True, "kind": "Binding",
                   "verbs": ["create"]}


def _secret_data(obj: Obj) -> None:
    """stringData is write-only: merged into data, base64-encoded, as the API server does."""
    string_data = obj.pop("stringData", None) or {}
    if string_data:
        data = obj.setdefault("data", {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
    obj.setdefault("type", "Opaque")


_QUANTITY = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_STANDARD_QUOTA = frozenset({"pods", "services", "replicationcontrollers", "resourcequotas", "secrets", "configmaps",
                             "persistentvolumeclaims", "services.nodeports", "services.loadbalancers", "cpu",
                             "memory", "ephemeral-storage", "requests.cpu", "requests.memory",
                             "requests.ephemeral-storage", "requests.storage", "limits.cpu", "limits.memory",
                             "limits.ephemeral-storage"})


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_VALUE_RULE = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                     "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
                     "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")


def _check_labels(res: Resource, obj: Obj) -> None:
    """ValidateObjectMeta's label rules, which kube-apiserver applies to every object it stores
    (apimachinery v0.37.2 pkg/apis/meta/v1/validation ValidateLabels; api/validate/content IsLabelValue):
    a key is a qualified name, a value at most 63 characters of the label alphabet. And its annotations'
    size: keys and values at most 256 KiB in all (pkg/api/validation/objectmeta.go TotalAnnotationSizeLimitB)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    name = obj["metadata"].get("name") or ""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if sum(len(str(k)) + len(str(v)) for k, v in annotations.items()) > 256 * 1024:
        raise _invalid(res, name, "metadata.annotations", "Too long: may not be more than 262144 bytes")
    for key, value in labels.items() if isinstance(labels, dict) else ():
        prefix, _, part = str(key).rpartition("/")
        if not _QUALIFIED.match(str(key)) or len(part) > 63 or len(prefix) > 253:
            raise _invalid(res, name, "metadata.labels", f'Invalid value: "{key}": name part must consist of '
                           "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
                           "character, at most 63 characters, with an optional DNS subdomain prefix and '/'")
        if not isinstance(value, str):
            raise ApiStatusError(400, f"json: cannot unmarshal {type(value).__name__} into Go struct field "
                                      "ObjectMeta.metadata.labels of type string")
        if len(value) > 63:
            raise _invalid(res, name, "metadata.labels", f'Invalid value: "{value}": must be no more than 63 '
                                                         "characters")
        if not _LABEL_VALUE.match(value):
            raise _invalid(res, name, "metadata.labels", f'Invalid value: "{value}": {_LABEL_VALUE_RULE}')


def _check_quota(res: Resource, obj: Obj) -> None:
    """ValidateResourceQuota's checks on spec.hard: a name without a slash must be a standard quota
    resource (requests.nvidia.com/gpu has one, so it only has to be a qualified name), and every value
    a non-negative quantity."""
    name = obj["metadata"].get("name") or ""
    hard = (obj.get("spec") or {}).get("hard") or {}
    if not isinstance(hard, dict):
        raise _invalid(res, name, "spec.hard", "Invalid value: must be a map of resource names to quantities")
    for key, value in hard.items():
        where = f"spec.hard[{key}]"
        if not _QUALIFIED.match(key) or ("/" not in key and key not in _STANDARD_QUOTA
                                         and not key.startswith(("count/", "hugepages-", "requests.hugepages-"))):
            raise _invalid(res, name, where, f'Invalid value: "{key}": must be a standard resource for quota')
        if not isinstance(value, str | int) or not _QUANTITY.match(str(value)):
            raise _invalid(res, name, where, f'Invalid value: "{value}": must be a quantity')
        if str(value).startswith("-"):
            raise _invalid(res, name, where, f'Invalid value: "{value}": must be greater than or equal to 0')
