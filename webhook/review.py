"""`admission.k8s.io/v1` AdmissionReview on the wire: typed shapes, strict parsing, encoded answers.

Two kinds of bad input, answered differently, as the API server expects:
- a body that is not an AdmissionReview at all (not JSON, not an object, wrong apiVersion or kind, no
  `request`, no `uid`): `ReviewError`, answered with HTTP 400 and a `v1.Status` JSON body — the same
  shape the API server itself uses for errors, so its log line carries our message;
- a well-formed review whose pod is unusable (object missing, not a Pod, fields of the wrong type):
  `BadPod`, answered with HTTP 200 and `allowed: false`, `status.code: 400`, because only an
  AdmissionReview reply lets the API server show the user why.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict, cast

import orjson

from gpu_placement.base.quantity import QuantityError, QuantityProblem, to_count
from gpu_placement.base.text import json_type, quoted, shown
from gpu_placement.facts.pods import MAX_GPU_COUNT, GpuRequests, effective_gpu_requests
from gpu_placement.kube.api import Status
from gpu_placement.web import shape
from gpu_placement.web.shape import ShapeError

__all__ = [
    "API_VERSION",
    "AdmissionRequest",
    "AdmissionResponse",
    "AdmissionReview",
    "BadPod",
    "GroupVersionKind",
    "GroupVersionResource",
    "ReviewError",
    "Status",
    "Subject",
    "allowed",
    "bad_update",
    "check_pod",
    "denied",
    "encode_review",
    "parse_review",
    "status_body",
    "subject_of",
]
# A pod name as the API server takes it (a DNS subdomain), or a generateName with the "*" messages add.
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?|[a-z0-9][-a-z0-9.]{0,251}\*")

API_VERSION = "admission.k8s.io/v1"


# The parts are optional here: parse_review checks each as an optional string (a review from the API server
# has them all).
class GroupVersionKind(TypedDict, total=False):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict, total=False):
    group: str
    version: str
    resource: str


class AdmissionRequest(TypedDict):
    uid: str
    kind: NotRequired[GroupVersionKind]
    resource: NotRequired[GroupVersionResource]
    subResource: NotRequired[str]
    requestKind: NotRequired[GroupVersionKind]
    requestResource: NotRequired[GroupVersionResource]
    requestSubResource: NotRequired[str]
    name: NotRequired[str]
    namespace: NotRequired[str]
    operation: NotRequired[Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]]
    userInfo: NotRequired[dict[str, Any]]
    object: NotRequired[dict[str, Any] | None]
    oldObject: NotRequired[dict[str, Any] | None]
    dryRun: NotRequired[bool]
    options: NotRequired[dict[str, Any] | None]


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[Status]
    patch: NotRequired[str]  # base64 of the JSON Patch
    patchType: NotRequired[Literal["JSONPatch"]]
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]


class AdmissionReview(TypedDict):
    apiVersion: str
    kind: Literal["AdmissionReview"]
    request: NotRequired[AdmissionRequest]
    response: NotRequired[AdmissionResponse]


class ReviewError(ValueError):
    """The body is not an AdmissionReview; HTTP 400. `problem` labels the bad-request metric."""

    def __init__(self, message: str, problem: str = "malformed") -> None:
        super().__init__(message)
        self.problem = problem


class BadPod(ValueError):
    """A well-formed review whose pod cannot be used: allowed false, code 400."""


def parse_review(body: bytes) -> AdmissionRequest:
    if not body:
        raise ReviewError("empty body: expected a JSON admission.k8s.io/v1 AdmissionReview", "empty")
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ReviewError(f"body is not valid JSON ({exc}): expected an admission.k8s.io/v1 AdmissionReview",
                          "not_json") from None
    if not isinstance(review, dict):
        raise ReviewError(f"body must be a JSON object (an AdmissionReview), got {_type(review)}", "not_object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise ReviewError(f"expected apiVersion {API_VERSION} and kind AdmissionReview, got apiVersion "
                          f"{_short(review.get('apiVersion'))} and kind {_short(review.get('kind'))}: list only "
                          "v1 in the webhook configuration's admissionReviewVersions", "wrong_version")
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError("AdmissionReview has no request object" if request is None else
                          f"AdmissionReview.request must be an object, got {_type(request)}", "no_request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("AdmissionReview.request.uid is missing or not a non-empty string: the answer must "
                          "echo it", "no_uid")
    try:
        _check_request(request)
    except ShapeError as exc:
        raise ReviewError(str(exc)) from None
    return cast(AdmissionRequest, request)  # the fields the webhook reads, checked just above


_GROUPS = (("kind", ("group", "version", "kind")), ("resource", ("group", "version", "resource")))


def _check_request(request: Mapping[str, Any]) -> None:
    """The fields of the request itself (not its pod) that the webhook reads. Every review passes here:
    a field's path is formatted only when it is wrong (the shape functions then raise)."""
    if len(request["uid"]) > shape.UID_LIMIT:  # a non-empty string (parse_review)
        shape.opt_str(request["uid"], "request.uid", shape.UID_LIMIT)
    shape.namespace_name(request.get("namespace"), "request.namespace")  # goes into API paths and cache keys
    name = request.get("name")
    if name is not None and (name.__class__ is not str or len(name) > shape.NAME_LIMIT):
        shape.opt_str(name, "request.name", shape.NAME_LIMIT)
    for field in ("operation", "subResource"):
        value = request.get(field)
        if value is not None and value.__class__ is not str:
            shape.opt_str(value, f"request.{field}")
    for field, parts in _GROUPS:
        gvk = request.get(field)
        if gvk is None:
            continue
        if gvk.__class__ is not dict:
            shape.opt_obj(gvk, f"request.{field}")
        for part in parts:
            value = gvk.get(part)
            if value is not None and (value.__class__ is not str or len(value) > shape.NAME_LIMIT):
                shape.opt_str(value, f"request.{field}.{part}", shape.NAME_LIMIT)
    dry_run = request.get("dryRun", False)
    if dry_run is not True and dry_run is not False:
        shape.fail("request.dryRun", "true or false", request["dryRun"])


@dataclass(slots=True, frozen=True)
class Subject:
    """What a review is about, once we know it is a pod being created."""

    pod: dict[str, Any]
    namespace: str  # request.namespace: the pod may not carry one yet
    name: str  # for messages: name, else generateName + "*"
    key: str  # namespace/name as the view will know it; a uid-based stand-in when there is no name yet
    uid: str
    dry_run: bool
    gpus: GpuRequests  # Kubernetes' effective GPU request of the pod, by resource as written


def subject_of(request: AdmissionRequest, is_gpu_resource: Callable[[str], bool]) -> Subject | None:
    """The pod being created, or None when the review is about something else (another resource, a
    subresource such as pods/binding, an operation other than CREATE). Raises BadPod."""
    kind: Mapping[str, Any] = request.get("kind") or {}
    resource: Mapping[str, Any] = request.get("resource") or {}
    obj = request.get("object")
    says_pod_kind = kind.get("kind") == "Pod" and not kind.get("group")
    says_pods = resource.get("resource") == "pods" and not resource.get("group")
    if not kind and not resource:  # not what the API server sends, but the object may still say
        says_pod_kind = isinstance(obj, dict) and obj.get("kind") == "Pod"
    if not (says_pod_kind or says_pods):
        return None
    if request.get("subResource"):
        return None
    if request.get("operation", "CREATE") != "CREATE":
        return None
    if kind and not says_pod_kind:
        raise BadPod(f"request.kind is {_gvk(kind)} but request.resource is pods: expected kind Pod")
    if resource and not says_pods:
        raise BadPod(f"request.kind is Pod but request.resource is {_short(resource.get('resource'))}: "
                     "expected pods")
    if obj is None:
        raise BadPod("request.object is missing: a pod CREATE carries the pod")
    if not isinstance(obj, dict):
        raise BadPod(f"request.object: expected a v1.Pod object, got {_type(obj)}")
    if obj.get("kind", "Pod") != "Pod" or obj.get("apiVersion", "v1") != "v1":
        raise BadPod(f"request.object is {_short(obj.get('apiVersion'))} {_short(obj.get('kind'))}, "
                     "but the review is about a v1 Pod")
    problem, asks = _checked(obj, is_gpu_resource, "request.object")
    if problem:
        raise BadPod(problem)
    try:  # a pod naming no GPU resource (most pods) asks for none
        gpus = effective_gpu_requests(obj["spec"], is_gpu_resource) if asks else ()
    except QuantityError as exc:  # check_pod vetted every GPU quantity; kept as a backstop
        raise BadPod(f"request.object asks for a GPU resource in a form that is not a quantity: {exc}") from None
    for asked, count in gpus:
        if count > MAX_GPU_COUNT:  # each container within the bound, the pod's total not
            raise BadPod(f"request.object asks for {asked} in total: {_too_many(count)}")
    meta = obj.get("metadata") or {}
    namespace = request.get("namespace") or meta.get("namespace") or "default"
    if not request.get("namespace"):  # the object's own: checked as request.namespace is (parse_review)
        try:
            shape.namespace_name(namespace, "request.object.metadata.namespace")
        except ShapeError as exc:
            raise BadPod(str(exc)) from None
    pod_name = meta.get("name") or request.get("name") or ""
    uid = str(meta.get("uid") or "")
    shown = pod_name or f"{meta.get('generateName') or ''}*"
    if not _POD_NAME.fullmatch(shown):  # not a name the API server takes: a forged review's, shown escaped
        shown = quoted(shown, 80)
    # Validating admission runs after the API server generated the name; mutating admission before.
    key = f"{namespace}/{pod_name}" if pod_name else f"{namespace}/ unnamed {uid or request['uid']}"
    return Subject(obj, namespace, shown, key, uid, request.get("dryRun", False) is True, gpus)


def check_pod(pod: Mapping[str, Any], is_gpu_resource: Callable[[str], bool], path: str = "request.object"
              ) -> str | None:
    """The first field the webhook reads that has the wrong shape, as a sentence naming its path
    (`request.object.spec.containers[0].resources.limits: expected an object, got a string`); None when
    usable. Everything later code touches is checked here, so the rest can index without guessing."""
    return _checked(pod, is_gpu_resource, path)[0]


def _checked(pod: Mapping[str, Any], is_gpu_resource: Callable[[str], bool], path: str) -> tuple[str | None, bool]:
    """check_pod's answer, and whether the pod names a GPU resource at all (in any container's requests
    or limits): when it names none, its effective GPU request is empty."""
    try:
        shape.check_pod(pod, path)
        spec: Any = pod.get("spec")
        if spec.__class__ is not dict:
            shape.obj(spec, f"{path}.spec", "an object (a pod has a spec)")
        shape.check_pod_scheduling(pod, path)
    except ShapeError as exc:
        return str(exc), False
    asks = False
    for field in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(field) or ()):
            resources = container.get("resources")
            if not resources:
                continue
            for section in ("requests", "limits"):
                for name, value in (resources.get(section) or {}).items():
                    if is_gpu_resource(name):
                        asks = True
                        try:
                            # checked before the core parser: see gpu_placement/base/quantity.py
                            count = to_count(value)
                            problem = _too_many(count) if count > MAX_GPU_COUNT else None
                        except QuantityProblem as exc:
                            problem = str(exc)
                        if problem:
                            where = shape.key(f"{path}.spec.{field}[{index}].resources.{section}", name)
                            return f"{where}: {problem}", True
    return None, asks


def bad_update(new: Any, old: Any) -> str | None:
    """What is wrong with the two versions of a pod an UPDATE review carries (their metadata and
    annotations are compared, webhook/admission.py), as a sentence naming the field; None when usable."""
    if not isinstance(new, dict) or not isinstance(old, dict):
        return "a pod UPDATE carries the pod in request.object and request.oldObject"
    try:
        shape.check_pod(new, "request.object")
        shape.check_pod(old, "request.oldObject")
    except ShapeError as exc:
        return str(exc)
    return None


def _too_many(count: int) -> str:
    shown = str(count) if count < 10**30 else f"{str(count)[:30]}... ({len(str(count))} digits)"
    return (f"{shown} devices is more than any node has (at most {MAX_GPU_COUNT} of one resource for one pod); "
            "ask for what one node can give")


# -- answers ---------------------------------------------------------------------------------------

def allowed(uid: str, patch: list[dict[str, Any]] | None = None, warnings: list[str] | None = None
            ) -> AdmissionResponse:
    response: AdmissionResponse = {"uid": uid, "allowed": True}
    if patch:  # an empty patch is left out: the API server then changes nothing
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    if warnings:
        response["warnings"] = warnings
    return response


def denied(uid: str, message: str, code: int = 403, reason: str = "Forbidden") -> AdmissionResponse:
    return {"uid": uid, "allowed": False,
            "status": {"status": "Failure", "message": message, "reason": reason, "code": code}}


def encode_review(response: AdmissionResponse) -> bytes:
    review: AdmissionReview = {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
    return orjson.dumps(review)


def status_body(code: int, reason: str, message: str) -> Status:
    """The HTTP error body: a `v1.Status`, which is what API server clients parse for errors."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def _type(value: Any) -> str:
    return json_type(value)


def _short(value: Any) -> str:
    return shown(value, 80)


def _gvk(kind: Mapping[str, Any]) -> str:
    group = kind.get("group") or ""
    return f"{group + '/' if group else ''}{kind.get('version') or '?'} {kind.get('kind') or '?'}"
