"""Reading what kube-scheduler sends: `ExtenderArgs` (the body of /filter and /prioritize) and the
JSON objects of the other verbs, with a message that says what is wrong."""

from __future__ import annotations

from typing import Any

import orjson

from extender.wire import ExtenderArgs
from gpu_placement.web import shape

__all__ = ["ParsedArgs", "WireError", "json_object", "parse_extender_args", "pod_label"]

ParsedArgs = tuple[dict[str, Any], list[str], list[dict[str, Any]] | None]


class WireError(ValueError):
    """The request is not what kube-scheduler sends; the message says what is wrong."""


def json_object(body: bytes, what: str) -> Any:
    """The body's JSON object, typed by the caller as the wire type it should be (extender/wire.py): the
    fields it reads are checked where it reads them."""
    if not body:
        raise WireError(f"empty body: expected a JSON {what}")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"body is not valid JSON ({exc}): expected a JSON {what}") from None
    if not isinstance(value, dict):
        raise WireError(f"body must be a JSON object ({what}), got {type(value).__name__}")
    return value


def parse_extender_args(body: bytes) -> ParsedArgs:
    """(pod, node names, node objects when the request carried `Nodes`). Raises WireError or
    ShapeError (`Pod.spec.containers[0].resources.limits: expected an object, got a string`)."""
    args: ExtenderArgs = json_object(body, "ExtenderArgs")
    pod = _pod(args)
    names = args.get("NodeNames")
    if names is not None:
        shape.opt_list(names, "NodeNames", "a list of node names")
        # Every name a string, in one pass in C: str.join refuses anything else (a fifth of the cost of
        # testing each name's type). The Python loop only finds which name is wrong. Lengths are not
        # checked: a name is echoed at most twice (an unknown node's reason), so an answer never
        # outgrows its request by more than that.
        try:
            "".join(names)
        except TypeError:
            index, wrong = next((i, name) for i, name in enumerate(names) if name.__class__ is not str)
            shape.fail(f"NodeNames[{index}]", "a string", wrong)
        return pod, names, None
    nodes = args.get("Nodes")
    if nodes is None:
        return pod, [], None
    objects = shape.objects(shape.obj(nodes, "Nodes", "a v1.NodeList object").get("items"), "Nodes.items")
    node_names = []
    for index, node in enumerate(objects):
        meta = shape.obj(node.get("metadata"), f"Nodes.items[{index}].metadata")
        node_names.append(shape.name(meta.get("name"), f"Nodes.items[{index}].metadata.name"))
    return pod, node_names, objects


def _pod(args: ExtenderArgs) -> dict[str, Any]:
    pod = args.get("Pod")
    if pod is None:
        raise WireError("ExtenderArgs.Pod is missing: expected the v1.Pod being scheduled")
    shape.check_pod(pod, "Pod")
    return pod


def pod_label(pod: dict[str, Any]) -> str:
    """`namespace/name` of a pod as sent, for log lines."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
