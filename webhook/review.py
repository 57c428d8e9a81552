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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import orjson

from gpu_placement.pods import GpuRequests, effective_gpu_requests
from gpu_placement.quantity import QuantityError
from webhook.quantities import QuantityProblem, to_count
from webhook.text import quoted

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
    "check_pod",
    "denied",
    "encode_review",
    "parse_review",
    "status_body",
    "subject_of",
]

API_VERSION = "admission.k8s.io/v1"


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class Status(TypedDict, total=False):
    """`meta/v1.Status`, as it appears in a response (and as our HTTP error bodies)."""

    kind: str
    apiVersion: str
    metadata: dict[str, Any]
    status: Literal["Success", "Failure"]
    message: str
    reason: str
    code: int


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
    for field in ("namespace", "name", "operation", "subResource"):
        if not isinstance(request.get(field, ""), str):
            raise ReviewError(f"AdmissionReview.request.{field} must be a string, got {_type(request[field])}")
    for field in ("kind", "resource"):
        if not isinstance(request.get(field, {}), dict):
            raise ReviewError(f"AdmissionReview.request.{field} must be an object, got {_type(request[field])}")
    if not isinstance(request.get("dryRun", False), bool):
        raise ReviewError(f"AdmissionReview.request.dryRun must be true or false, got {_short(request['dryRun'])}")
    return request  # type: ignore[return-value]


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
        raise BadPod(f"request.object must be a Pod object, got {_type(obj)}")
    if obj.get("kind", "Pod") != "Pod" or obj.get("apiVersion", "v1") != "v1":
        raise BadPod(f"request.object is {_short(obj.get('apiVersion'))} {_short(obj.get('kind'))}, "
                     "but the review is about a v1 Pod")
    problem = check_pod(obj, is_gpu_resource)
    if problem:
        raise BadPod(f"request.object {problem}")
    try:
        gpus = effective_gpu_requests(obj["spec"], is_gpu_resource)
    except QuantityError as exc:  # check_pod vetted every GPU quantity; kept as a backstop
        raise BadPod(f"request.object asks for a GPU resource in a form that is not a quantity: {exc}") from None
    meta = obj.get("metadata") or {}
    namespace = request.get("namespace") or meta.get("namespace") or "default"
    pod_name = meta.get("name") or request.get("name") or ""
    uid = str(meta.get("uid") or "")
    shown = pod_name or f"{meta.get('generateName') or ''}*"
    # Validating admission runs after the API server generated the name; mutating admission before.
    key = f"{namespace}/{pod_name}" if pod_name else f"{namespace}/ unnamed {uid or request['uid']}"
    return Subject(obj, namespace, shown, key, uid, request.get("dryRun", False) is True, gpus)


def check_pod(pod: Mapping[str, Any], is_gpu_resource: Callable[[str], bool]) -> str | None:
    """The first field the webhook reads that has the wrong shape, as a sentence; None when usable.
    Everything later code touches is checked here, so the rest can index without guessing."""
    meta = pod.get("metadata")
    if not isinstance(meta, dict | None):
        return f"metadata must be an object, got {_type(meta)}"
    meta = meta or {}
    for field in ("name", "generateName", "namespace", "uid"):
        if not isinstance(meta.get(field, ""), str):
            return f"metadata.{field} must be a string, got {_type(meta[field])}"
    annotations = meta.get("annotations")
    if not _str_map(annotations):
        return "metadata.annotations must map strings to strings"
    owners = meta.get("ownerReferences")
    if not _list_of_objects(owners):
        return "metadata.ownerReferences must be a list of objects"
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return "has no spec" if spec is None else f"spec must be an object, got {_type(spec)}"
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        if not _list_of_objects(containers):
            return f"spec.{field} must be a list of containers"
        for index, container in enumerate(containers or ()):
            problem = _check_resources(container.get("resources"), is_gpu_resource)
            if problem:
                return f"spec.{field}[{index}].resources{problem}"
    if not isinstance(spec.get("schedulerName", ""), str | None):
        return f"spec.schedulerName must be a string, got {_type(spec['schedulerName'])}"
    if not isinstance(spec.get("nodeName", ""), str | None):
        return f"spec.nodeName must be a string, got {_type(spec['nodeName'])}"
    if not _list_of_objects(spec.get("tolerations")):
        return "spec.tolerations must be a list of tolerations"
    for index, toleration in enumerate(spec.get("tolerations") or ()):
        for field in ("key", "operator", "value", "effect"):
            if not isinstance(toleration.get(field, ""), str | None):
                return f"spec.tolerations[{index}].{field} must be a string, got {_type(toleration[field])}"
    if not _str_map(spec.get("nodeSelector")):
        return "spec.nodeSelector must map label keys to string values"
    problem = _check_affinity(spec.get("affinity"))
    if problem:
        return f"spec.affinity{problem}"
    return None


def _check_resources(resources: Any, is_gpu_resource: Callable[[str], bool]) -> str | None:
    if resources is None:
        return None
    if not isinstance(resources, dict):
        return f" must be an object, got {_type(resources)}"
    for section in ("requests", "limits"):
        values = resources.get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            return f".{section} must map resource names to quantities, got {_type(values)}"
        for name, value in values.items():
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                return f".{section}[{name}] must be a quantity, got {_type(value)}"
            if is_gpu_resource(name):
                try:
                    to_count(value)  # checked before the core parser sees it: see webhook/quantities.py
                except QuantityProblem as exc:
                    return f".{section}[{name}]: {exc}"
    return None


def _check_affinity(affinity: Any) -> str | None:
    if affinity is None:
        return None
    if not isinstance(affinity, dict):
        return f" must be an object, got {_type(affinity)}"
    node = affinity.get("nodeAffinity")
    if node is None:
        return None
    if not isinstance(node, dict):
        return f".nodeAffinity must be an object, got {_type(node)}"
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    if not isinstance(required, dict):
        return f".nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution must be an object, got {_type(required)}"
    terms = required.get("nodeSelectorTerms")
    if not _list_of_objects(terms):
        return ".nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms must be a list"
    for index, term in enumerate(terms or ()):
        for field in ("matchExpressions", "matchFields"):
            if not _list_of_objects(term.get(field)):
                return (f".nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{index}]"
                        f".{field} must be a list of requirements")
    return None


def _str_map(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and all(isinstance(v, str) for v in value.values()))


def _list_of_objects(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(isinstance(item, dict) for item in value))


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
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    if isinstance(value, str):
        return quoted(value, 80)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value)[:80] if isinstance(value, int | float) else _type(value)


def _gvk(kind: Mapping[str, Any]) -> str:
    group = kind.get("group") or ""
    return f"{group + '/' if group else ''}{kind.get('version') or '?'} {kind.get('kind') or '?'}"
