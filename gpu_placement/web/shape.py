"""The shape of what kube-scheduler and the API server send, checked once, at the edge.

Both edges read untrusted JSON: the extender a `v1.Pod` inside `ExtenderArgs`, the webhook one inside
an AdmissionReview. Everything later code reads is checked here first, so the rest can index without
guessing, and a wrong shape is a 400 that names the field, never a 500 from deep inside:

    Pod.spec.containers[0].resources.limits: expected an object, got a string
    request.object.metadata.name: expected at most 253 characters, got 1048576

Only the fields the service reads are checked (a dict lookup or two each; no Pod schema), plus
bounds on the strings it keeps or repeats: names (Kubernetes' own limits), and the depth of anything
it echoes back (orjson encodes at most 254 levels).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NoReturn

from gpu_placement.base.text import json_type, quoted, shown

__all__ = [
    "ECHO_DEPTH",
    "EXTENDER_MAX_BODY",
    "LABEL_LIMIT",
    "NAME_LIMIT",
    "UID_LIMIT",
    "ShapeError",
    "check_depth",
    "check_pod",
    "check_pod_scheduling",
    "fail",
    "key",
    "name",
    "namespace_name",
    "obj",
    "objects",
    "opt_list",
    "opt_obj",
    "opt_str",
    "str_map",
]

NAME_LIMIT = 253  # a DNS subdomain: pod and node names (k8s.io/apimachinery validation)
LABEL_LIMIT = 63  # a DNS label: namespaces and container names
UID_LIMIT = 128  # UIDs are 36-character UUIDs; room for anything a test or a proxy writes
ECHO_DEPTH = 254  # orjson refuses to encode deeper, so deeper is never echoed back
# The largest extender request read by default (serve --extender-max-body-bytes): ExtenderArgs in the Nodes
# form (extenders that are not nodeCacheCapable) carries every Node object asked about.
EXTENDER_MAX_BODY = 64 * 2**20
# A namespace name as the API server allows it: a DNS-1123 label (apimachinery v0.37.2
# pkg/api/validation/generic.go: ValidateNamespaceName = NameIsDNSLabel; pkg/util/validation/validation.go:
# IsDNS1123Label, dns1123LabelFmt, at most DNS1123LabelMaxLength = 63).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NAMESPACE = ("a namespace name (at most 63 lowercase letters, digits and '-', starting and ending with a letter "
              "or digit, as the API server names namespaces)")


class ShapeError(ValueError):
    """A field of the wrong shape: `path: expected X, got Y`. The path names the field as the sender wrote it."""

    def __init__(self, path: str, expected: str, got: str) -> None:
        super().__init__(f"{path}: expected {expected}, got {got}")
        self.path = path


def fail(path: str, expected: str, value: Any) -> NoReturn:
    got = json_type(value)
    if value.__class__ in (str, int, float):  # a scalar is shown too, cut: `got a string "yes"`
        got = f"{got} {shown(value, 40)}"
    raise ShapeError(path, expected, got)


def key(path: str, name: str) -> str:
    """`path[name]`, the name cut and quoted when it is long or odd: map keys are untrusted text too."""
    plain = len(name) <= 100 and name.isascii() and name.isprintable() and "]" not in name
    return f"{path}[{name if plain else quoted(name, 60)}]"


# -- primitives: each returns the value (None as empty) or raises ShapeError ------------------------

def obj(value: Any, path: str, what: str = "an object") -> dict[str, Any]:
    if value.__class__ is not dict:
        fail(path, what, value)
    return value


def opt_obj(value: Any, path: str) -> dict[str, Any]:
    return {} if value is None else obj(value, path)


def opt_list(value: Any, path: str, what: str = "a list") -> list[Any]:
    if value is None:
        return []
    if value.__class__ is not list:
        fail(path, what, value)
    return value


def opt_str(value: Any, path: str, limit: int | None = None) -> str:
    if value is None:
        return ""
    if value.__class__ is not str:
        fail(path, "a string", value)
    if limit is not None and len(value) > limit:
        raise ShapeError(path, f"at most {limit} characters", str(len(value)))
    return value


def namespace_name(value: Any, path: str) -> str:
    """A namespace name, or None/"" (a cluster-scoped object has none). The webhook puts it into API
    paths and keys its caches by it: anything else (`../x`, `a?watch=true`) is refused here."""
    if value.__class__ is str and value in _NAMESPACES_SEEN:  # every review names one: checked once each
        return value
    text = opt_str(value, path)
    if not text:
        return ""
    if len(text) > LABEL_LIMIT:
        raise ShapeError(path, _NAMESPACE, f"{len(text)} characters")
    if _DNS_LABEL.fullmatch(text) is None:
        fail(path, _NAMESPACE, text)
    if len(_NAMESPACES_SEEN) < _NAMESPACES_KEPT:
        _NAMESPACES_SEEN.add(text)
    return text


# Namespace names namespace_name passed, kept up to a bound (a caller may send any number of names).
_NAMESPACES_SEEN: set[str] = set()
_NAMESPACES_KEPT = 10_000


def name(value: Any, path: str, limit: int = NAME_LIMIT) -> str:
    """A required, non-empty name of at most `limit` characters."""
    if value.__class__ is not str or not value:
        fail(path, "a non-empty name", value)
    return opt_str(value, path, limit)


def str_map(value: Any, path: str) -> dict[str, str]:
    """A map of strings to strings (labels, annotations, nodeSelector), or None."""
    if value is None:
        return {}
    for k, v in obj(value, path).items():
        if v.__class__ is not str:
            fail(key(path, k), "a string", v)
    strings: dict[str, str] = value  # every value checked above
    return strings


def objects(value: Any, path: str) -> list[dict[str, Any]]:
    """A list of objects, or None."""
    items = opt_list(value, path, "a list of objects")
    for index, item in enumerate(items):
        if item.__class__ is not dict:
            fail(f"{path}[{index}]", "an object", item)
    return items


def check_depth(value: Any, path: str, limit: int) -> None:
    """No more than `limit` levels of arrays and objects (the value itself is level 1). Iterative: the
    value may be nested deeper than Python's recursion limit."""
    if _too_deep(value, limit):
        raise ShapeError(path, f"at most {limit} levels of nesting", "deeper")


def _too_deep(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        cls = item.__class__
        if cls is dict:
            children: Any = item.values()
        elif cls is list:
            children = item
        else:
            continue
        if depth > limit:
            return True
        for child in children:
            if child.__class__ is dict or child.__class__ is list:
                stack.append((child, depth + 1))
    return False


# -- the pod --------------------------------------------------------------------------------------
# The webhook checks every review and the extender every /filter: paths are formatted only when a
# field is wrong, and the common case is a dict lookup and a class comparison per field.

def _strings(parent: Mapping[str, Any], fields: tuple[str, ...], path: str, limit: int | None = None,
             within: str = "") -> None:
    """Each of `fields` in `parent` (at `path` + `within`: joined only to say what is wrong) absent, null or a
    string (of at most `limit` characters)."""
    for field in fields:
        value = parent.get(field)
        if value is not None and (value.__class__ is not str or (limit is not None and len(value) > limit)):
            opt_str(value, f"{path}{within}.{field}", limit)


def _objects(value: Any) -> bool:
    """`objects` would pass it: None, or a list of objects."""
    return value is None or (value.__class__ is list and all(item.__class__ is dict for item in value))


def check_pod(value: Any, path: str) -> dict[str, Any]:
    """The fields of a `v1.Pod` both edges read: metadata names and annotations, per container the
    name, image, env, restartPolicy and resources, and the names in `spec.resourceClaims` (DRA).
    Returns the pod."""
    pod = obj(value, path, "a v1.Pod object")
    meta = pod.get("metadata")
    if meta is not None:
        if meta.__class__ is not dict:
            obj(meta, f"{path}.metadata")
        _strings(meta, ("name", "generateName"), path, NAME_LIMIT, ".metadata")
        _strings(meta, ("namespace",), path, LABEL_LIMIT, ".metadata")
        _strings(meta, ("uid",), path, UID_LIMIT, ".metadata")
        annotations = meta.get("annotations")
        if annotations is not None and (annotations.__class__ is not dict or
                                        not set(map(type, annotations.values())) <= _STR):
            str_map(annotations, f"{path}.metadata.annotations")
    spec = pod.get("spec")
    if spec is None:
        return pod
    if spec.__class__ is not dict:
        obj(spec, f"{path}.spec")
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        if containers is None:
            continue
        if containers.__class__ is not list:
            fail(f"{path}.spec.{field}", "a list of objects", containers)
        for index, container in enumerate(containers):
            if container.__class__ is not dict:
                fail(f"{path}.spec.{field}[{index}]", "an object", container)
            _check_container(container, path, field, index)
    claims = spec.get("resourceClaims")
    if claims is not None:  # which claims and templates the pod names: read and patched in `dra` namespaces
        for index, entry in enumerate(objects(claims, f"{path}.spec.resourceClaims")):
            _strings(entry, ("name", "resourceClaimName", "resourceClaimTemplateName"),
                     f"{path}.spec.resourceClaims[{index}]", NAME_LIMIT)
    return pod


def _check_container(container: Mapping[str, Any], pod_path: str, field: str, index: int) -> None:
    def where() -> str:
        return f"{pod_path}.spec.{field}[{index}]"

    if container.get("name").__class__ is not str or len(container["name"]) > LABEL_LIMIT:
        opt_str(container.get("name"), f"{where()}.name", LABEL_LIMIT)
    for name in ("image", "restartPolicy"):
        value = container.get(name)
        if value is not None and value.__class__ is not str:
            fail(f"{where()}.{name}", "a string", value)
    env = container.get("env")
    if env is not None:
        for number, item in enumerate(objects(env, f"{where()}.env") if env.__class__ is not list else env):
            if item.__class__ is not dict:
                fail(f"{where()}.env[{number}]", "an object", item)
            if item.get("name").__class__ not in _OPT_STR or item.get("value").__class__ not in _OPT_STR:
                for name in ("name", "value"):
                    value = item.get(name)
                    if value is not None and value.__class__ is not str:
                        fail(f"{where()}.env[{number}].{name}", "a string", value)
    resources = container.get("resources")
    if resources is None:
        return
    if resources.__class__ is not dict:
        fail(f"{where()}.resources", "an object", resources)
    for section in ("limits", "requests"):
        values = resources.get(section)
        if values is None:
            continue
        if values.__class__ is not dict:
            fail(f"{where()}.resources.{section}", "an object", values)
        if not set(map(type, values.values())) <= _QUANTITY:
            for resource, quantity in values.items():
                if quantity.__class__ not in _QUANTITY:
                    fail(key(f"{where()}.resources.{section}", resource), "a quantity (a string or a number)",
                         quantity)


def check_pod_scheduling(pod: Mapping[str, Any], path: str) -> None:
    """What the webhook also reads and patches, on a pod `check_pod` passed: owners, scheduler and
    node names, tolerations, node selector and required node affinity. Node selector terms are
    copied into patches: their depth is bounded so the patch always encodes."""
    meta = pod.get("metadata") or {}
    owners = meta.get("ownerReferences")
    if owners is not None:
        if not _objects(owners):
            objects(owners, f"{path}.metadata.ownerReferences")
        for index, owner in enumerate(owners):
            if owner.get("kind").__class__ not in _OPT_STR:
                _strings(owner, ("kind",), path, within=f".metadata.ownerReferences[{index}]")
    spec = pod.get("spec") or {}
    _strings(spec, ("schedulerName", "nodeName"), path, NAME_LIMIT, ".spec")
    tolerations = spec.get("tolerations")
    if tolerations is not None:
        if not _objects(tolerations):
            objects(tolerations, f"{path}.spec.tolerations")
        for index, toleration in enumerate(tolerations):
            if not set(map(type, toleration.values())) <= _TOLERATION:  # tolerationSeconds is a number
                _strings(toleration, ("key", "operator", "value", "effect"), f"{path}.spec.tolerations[{index}]")
    selector = spec.get("nodeSelector")
    if selector is not None and (selector.__class__ is not dict or not set(map(type, selector.values())) <= _STR):
        str_map(selector, f"{path}.spec.nodeSelector")
    affinity = spec.get("affinity")
    if affinity is None:
        return
    # Every GPU pod /mutate shapes carries one (gpu-placement.io/refused, config refusedNodeLabel): paths are
    # joined only for a field that is wrong.
    if affinity.__class__ is not dict:
        obj(affinity, f"{path}.spec.affinity")
    node = affinity.get("nodeAffinity")
    if node is None:
        return
    if node.__class__ is not dict:
        obj(node, f"{path}.spec.affinity.nodeAffinity")
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return
    if required.__class__ is not dict:
        obj(required, f"{path}{_REQUIRED}")
    terms = required.get("nodeSelectorTerms")
    if not _objects(terms):
        objects(terms, f"{path}{_REQUIRED}.nodeSelectorTerms")
    for index, term in enumerate(terms or ()):
        for field in ("matchExpressions", "matchFields"):
            if not _objects(term.get(field)):
                objects(term.get(field), f"{path}{_REQUIRED}.nodeSelectorTerms[{index}].{field}")
        if _too_deep(term, _TERM_DEPTH):
            check_depth(term, f"{path}{_REQUIRED}.nodeSelectorTerms[{index}]", _TERM_DEPTH)


_STR = {str}
_REQUIRED = ".spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"  # a path's middle
_OPT_STR = frozenset({str, type(None)})
_QUANTITY = {str, int, float}
_TOLERATION = {str, int, type(None)}
# A term sits 7 levels deep in the patch that carries it (list, op, value, nodeAffinity, required,
# terms, term); its own fields need 4 (term, expressions, expression, values). Far below orjson's 254.
_TERM_DEPTH = 64
