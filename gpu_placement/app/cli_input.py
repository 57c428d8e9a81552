"""What the command line reads from people, checked before anything uses it: a pod or workload file (or
`-`, standard input), as JSON, YAML, multi-document YAML (`helm template` output) or a `kind: List`
(`kubectl get -o json`); and `KIND/NAME` of an object in the cluster or the snapshot.

Every problem is a `UsageError`: one line naming the file, the field and the fix, exit status 2. The
pods inside are checked with the webhook's own edge checks (`gpu_placement.web.shape`), so a field of the
wrong shape is named here instead of failing deep inside `explain`; the most common YAML slip, an
unquoted number as an annotation value (`gpu-placement.io/cuda: 12.4` is the float 12.4), gets the fix.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import yaml

from gpu_placement.base.errors import UsageError
from gpu_placement.base.text import shown
from gpu_placement.facts.workloads import PodTemplate, WorkloadError, pods_of
from gpu_placement.web.shape import ShapeError, check_pod, check_pod_scheduling

__all__ = ["STDIN", "check_template", "read_objects", "split_kind_name", "templates_in"]

STDIN = "-"
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MAX_INPUT = 64 * 2**20  # a pod file is kilobytes; `helm template` of a big chart a few megabytes
# Objects a multi-document file may hold beside workloads: read for what they say, never explained.
_CONTEXT_KINDS = frozenset({"Namespace"})


def read_objects(path: str) -> list[dict[str, Any]]:
    """The Kubernetes objects in a file or on standard input, Lists flattened, in document order."""
    raw = _read(path)
    where = "standard input" if path == STDIN else path
    try:
        if raw.lstrip()[:1] in (b"{", b"["):
            docs = [orjson.loads(raw)]
        else:
            docs = [doc for doc in yaml.load_all(raw, Loader=_Loader) if doc is not None]
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"{where}: not valid JSON: {exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{where}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise UsageError(f"{where}: nested too deeply to be a Kubernetes object") from None
    objects = list(_flatten(docs, where))
    if not objects:
        raise UsageError(f"{where}: no Kubernetes object in it (an empty file?)")
    return objects


def _read(path: str) -> bytes:
    if path == STDIN:
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("-: reads the pod from standard input; pipe one in, e.g. kubectl get pod NAME -o yaml | "
                             "gpu-placement explain -")
        raw = sys.stdin.buffer.read(_MAX_INPUT + 1)
    else:
        file = Path(path)
        if file.is_dir():
            raise UsageError(f"{path}: is a folder; give one file (or - for standard input)")
        try:
            with file.open("rb") as handle:
                raw = handle.read(_MAX_INPUT + 1)
        except OSError as exc:
            hint = "" if "/" not in path or file.exists() else (
                "; to explain an object in the cluster, write KIND/NAME, e.g. pod/NAME, deploy/NAME or job/NAME")
            raise UsageError(f"{path}: cannot read: {exc.strerror or exc}{hint}") from None
    if len(raw) > _MAX_INPUT:
        raise UsageError(f"{path}: larger than {_MAX_INPUT // 2**20} MiB; give the one workload to explain")
    return raw


def _flatten(docs: list[Any], where: str) -> Iterator[dict[str, Any]]:
    for doc in docs:
        if isinstance(doc, list):  # a JSON array of objects
            yield from _flatten(doc, where)
            continue
        if not isinstance(doc, dict):
            raise UsageError(f"{where}: expected a Kubernetes object, found {shown(doc, 40)}")
        kind = str(doc.get("kind") or "")
        if kind == "List" or (kind.endswith("List") and "items" in doc):
            items = doc.get("items")
            if not isinstance(items, list):
                raise UsageError(f"{where}: {kind} has no items list")
            item_kind = kind.removesuffix("List") if kind != "List" else ""
            yield from _flatten([{**item, "kind": item_kind} if isinstance(item, dict) and item_kind
                                 and "kind" not in item else item for item in items], where)
            continue
        yield doc


def templates_in(objects: list[dict[str, Any]], where: str) -> tuple[list[PodTemplate], list[dict[str, Any]]]:
    """The pod templates of every workload among `objects`, each checked, and the Namespaces given
    beside them (explain judges the pods in those namespaces as they are written there). Other
    objects (Services, ConfigMaps, ...) in a multi-document file are skipped."""
    templates: list[PodTemplate] = []
    namespaces = [o for o in objects if o.get("kind") in _CONTEXT_KINDS]
    skipped: list[str] = []
    for obj in objects:
        if obj.get("kind") in _CONTEXT_KINDS:
            continue
        try:
            found = pods_of(obj)
        except WorkloadError as exc:
            if len(objects) == 1:
                raise UsageError(f"{where}: {exc}") from None
            skipped.append(str(obj.get("kind") or "?"))
            continue
        except (AttributeError, TypeError) as exc:  # a template's metadata of the wrong shape
            raise UsageError(f"{where}: {obj.get('kind') or 'an object'} is not a workload Kubernetes would "
                             f"accept ({exc})") from None
        for template in found:
            check_template(template, where)
        templates += found
    if not templates:
        kinds = ", ".join(sorted(set(skipped))) or "none"
        raise UsageError(f"{where}: no Pod or workload with a pod template among its {len(objects)} objects "
                         f"(kinds: {kinds})")
    return templates, namespaces


def check_template(template: PodTemplate, where: str) -> None:
    """The fields explain reads, checked as the webhook checks them at its edge."""
    try:
        check_pod(template.pod, "Pod")
        check_pod_scheduling(template.pod, "Pod")
        for field in ("nodeSelector", "tolerations", "affinity"):
            value = (template.pod.get("spec") or {}).get(field)
            if value is not None and not isinstance(value, dict | list):
                raise ShapeError(f"Pod.spec.{field}", "an object" if field != "tolerations" else "a list", shown(value))
    except ShapeError as exc:
        raise UsageError(f"{where}: {_in_template(str(exc), template)}{_yaml_hint(exc, template.pod)}") from None


def _in_template(message: str, template: PodTemplate) -> str:
    """`Pod.spec...` as the user wrote it: inside the workload's template, the template's own path."""
    if template.where.startswith("Pod "):
        return message
    kind, _, rest = template.where.partition(" ")
    path = rest.rpartition("(")[2].rstrip(")")
    return message.replace("Pod.", f"{kind}.{path}.", 1) if path else message


def _yaml_hint(exc: ShapeError, pod: dict[str, Any]) -> str:
    """An unquoted number or boolean where a string belongs: YAML read it as one."""
    if "expected a string" not in str(exc) or not any(word in str(exc) for word in ("a number", "true", "false")):
        return ""
    return " (YAML reads an unquoted 12.4, 1 or true as a number or a boolean: quote the value, e.g. \"12.4\")"


def split_kind_name(text: str) -> tuple[str, str] | None:
    """`deploy/train` -> ("deploy", "train"); None for a path to a file (it exists, or has no single `/`)."""
    if text == STDIN or Path(text).exists():
        return None
    kind, sep, name = text.partition("/")
    if not sep or not kind or not name or "/" in name or kind.startswith(".") or "\\" in text:
        return None
    return kind, name
