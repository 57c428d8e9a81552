"""Apply an RFC 6902 JSON Patch to a document: what the API server does with the webhook's patch.

`explain` and `demo` use it to show the pod as it will be stored. Only the operations our webhook
emits are needed (add, replace, remove, test); move and copy are refused.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["PatchError", "apply_patch"]


class PatchError(ValueError):
    pass


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _walk(doc: Any, path: str) -> tuple[Any, str]:
    if not path.startswith("/"):
        raise PatchError(f"path {path!r} must start with /")
    tokens = [_unescape(t) for t in path[1:].split("/")]
    parent = doc
    for token in tokens[:-1]:
        try:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        except (KeyError, IndexError, ValueError) as exc:
            raise PatchError(f"path {path!r}: {token!r} does not exist") from exc
    return parent, tokens[-1]


def apply_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, path = op.get("op"), str(op.get("path", ""))
        parent, key = _walk(doc, path)
        if kind == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if key == "-" else int(key), copy.deepcopy(op["value"]))
            else:
                parent[key] = copy.deepcopy(op["value"])
        elif kind == "replace":
            if isinstance(parent, list):
                parent[int(key)] = copy.deepcopy(op["value"])
            elif key not in parent:
                raise PatchError(f"replace {path!r}: nothing there")
            else:
                parent[key] = copy.deepcopy(op["value"])
        elif kind == "remove":
            try:
                del parent[int(key) if isinstance(parent, list) else key]
            except (KeyError, IndexError) as exc:
                raise PatchError(f"remove {path!r}: nothing there") from exc
        elif kind == "test":
            if (parent[int(key)] if isinstance(parent, list) else parent.get(key)) != op.get("value"):
                raise PatchError(f"test {path!r} failed")
        else:
            raise PatchError(f"operation {kind!r} is not supported")
    return doc
