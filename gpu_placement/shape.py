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

from collections.abc import Mapping
from typing import Any, NoReturn

from gpu_placement.text import json_type, quoted, shown

__all__ = [
    "ECHO_DEPTH",
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
    return value  # type: ignore[no-any-return]


def opt_obj(value: Any, path: str) -> dict[str, Any]:
    return {} if value is None else obj(value, path)


def opt_list(value: Any, path: str, what: str = "a list") -> list[Any]:
    if value is None:
        return []
    if value.__class__ is not list:
        fail(path, what, value)
    return value  # type: ignore[no-any-return]


def opt_str(value: Any, path: str, limit: int | None = None) -> str:
    if value is None:
        return ""
    if value.__class__ is not str:
        fail(path, "a string", value)
    if limit is not None and len(value) > limit:
        raise ShapeError(path, f"at most {limit} characters", str(len(value)))
    return value  # type: ignore[no-any-return]


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
    return value  # type: ignore[no-any-return]


def objects(value: Any, path: str) -> list[dict[str, Any]]:
    """A list of objects, or None."""
    items = opt_list(value, path, "a list of objects")
    for index, item in enumerate(items):
        if item.__class__ is not dict:
            fail(f"{path}[{index}]", "an object", item)
    return items


def check_depth(value: Any, path: str, limit: int) -> None:
    """No more than `limit` levels of arrays and objects (a scalar is level 0). Iterative: the value
    may be nested deeper than Python's recursion limit."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if item.__class__ is dict else item if item.__class__ is list else None
        if children is None:
            continue
        if depth > limit:
            raise ShapeError(path, f"at most {limit} levels of nesting", "deeper")
        stack.extend((child, depth + 1) for child in children)


# -- the pod --------------------------------------------------------------------------------------

def check_pod(pod: Any, path: str) -> dict[str, Any]:
    """The fields of a `v1.Pod` both edges read: metadata names and annotations, and per container
    the name, image, env, restartPolicy and resources. Returns the pod."""
    pod = obj(pod, path, "a v1.Pod object")
    meta = opt_obj(pod.get("metadata"), f"{path}.metadata")
    for field, limit in (("name", NAME_LIMIT), ("generateName", NAME_LIMIT), ("namespace", LABEL_LIMIT),
                         ("uid", UID_LIMIT)):
        opt_str(meta.get(field), f"{path}.metadata.{field}", limit)
    str_map(meta.get("annotations"), f"{path}.metadata.annotations")
    spec = opt_obj(pod.get("spec"), f"{path}.spec")
    for field in ("containers", "initContainers"):
        where = f"{path}.spec.{field}"
        for index, container in enumerate(objects(spec.get(field), where)):
            _check_container(container, f"{where}[{index}]")
    return pod


def _check_container(container: Mapping[str, Any], path: str) -> None:
    opt_str(container.get("name"), f"{path}.name", LABEL_LIMIT)
    opt_str(container.get("image"), f"{path}.image")
    opt_str(container.get("restartPolicy"), f"{path}.restartPolicy")
    for index, env in enumerate(objects(container.get("env"), f"{path}.env")):
        opt_str(env.get("name"), f"{path}.env[{index}].name")
        opt_str(env.get("value"), f"{path}.env[{index}].value")
    resources = opt_obj(container.get("resources"), f"{path}.resources")
    for section in ("limits", "requests"):
        where = f"{path}.resources.{section}"
        for resource, quantity in opt_obj(resources.get(section), where).items():
            if quantity.__class__ not in (str, int, float):
                fail(key(where, resource), "a quantity (a string or a number)", quantity)


def check_pod_scheduling(pod: Mapping[str, Any], path: str) -> None:
    """What the webhook also reads and patches: owners, scheduler and node names, tolerations, node
    selector and required node affinity. Node selector terms are copied into patches: their depth is
    bounded so the patch always encodes."""
    meta = opt_obj(pod.get("metadata"), f"{path}.metadata")
    for index, owner in enumerate(objects(meta.get("ownerReferences"), f"{path}.metadata.ownerReferences")):
        opt_str(owner.get("kind"), f"{path}.metadata.ownerReferences[{index}].kind")
    spec = opt_obj(pod.get("spec"), f"{path}.spec")
    opt_str(spec.get("schedulerName"), f"{path}.spec.schedulerName", NAME_LIMIT)
    opt_str(spec.get("nodeName"), f"{path}.spec.nodeName", NAME_LIMIT)
    for index, toleration in enumerate(objects(spec.get("tolerations"), f"{path}.spec.tolerations")):
        for field in ("key", "operator", "value", "effect"):
            opt_str(toleration.get(field), f"{path}.spec.tolerations[{index}].{field}")
    str_map(spec.get("nodeSelector"), f"{path}.spec.nodeSelector")
    where = f"{path}.spec.affinity"
    affinity = opt_obj(spec.get("affinity"), where)
    node = opt_obj(affinity.get("nodeAffinity"), f"{where}.nodeAffinity")
    where = f"{where}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = opt_obj(node.get("requiredDuringSchedulingIgnoredDuringExecution"), where)
    for index, term in enumerate(objects(required.get("nodeSelectorTerms"), f"{where}.nodeSelectorTerms")):
        term_path = f"{where}.nodeSelectorTerms[{index}]"
        for field in ("matchExpressions", "matchFields"):
            objects(term.get(field), f"{term_path}.{field}")
        check_depth(term, term_path, _TERM_DEPTH)


# A term sits 7 levels deep in the patch that carries it (list, op, value, nodeAffinity, required,
# terms, term); its own fields need 4 (term, expressions, expression, values).
_TERM_DEPTH = 64
