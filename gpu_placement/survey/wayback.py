"""The way back of one node's migration: what `migrate` changed, each change recorded before it is made.

`DIR/NODE.json`, written by the first step before anything changes and rewritten (whole, atomically)
before each later write:

    {"kind": "MigrationRecord", "version": 2, "node": NAME, "uid": UID, "state": "under way",
     "saved": TIME, "before": {"labels": {...}, "taints": [...], "unschedulable": false},
     "changes": [{"step": "cordon", "what": "unschedulable", "before": false, "after": true, "at": TIME},
                 {"step": "labels", "what": "label", "key": KEY, "before": VALUE, "after": null, "at": TIME},
                 {"step": "plugin", "what": "daemonset", "key": "NS/NAME", "before": AFFINITY, "after": AFFINITY},
                 {"step": "drain", "what": "evicted", "key": "NS/POD", "at": TIME}, ...]}

`state` says whether the migration is under way (from the first write until `--apply` finds it
complete), complete, or undone: the one-node-at-a-time rule reads it, never the node's cordon.
`before` is the node as it was, for a person; `--undo` reads only `changes`, and puts back a key only
while it still holds what the migration wrote (see `undo_plan`).

Files of the first format (before version 2: a bare JSON patch of the whole label map, taint list and
`spec.unschedulable`, which `kubectl patch --patch-file` applied) are still read: they hold no list
of changes, so what the migration changed is worked out from what it can change (see `inferred`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from gpu_placement.base.timestamps import format_time

__all__ = ["COMPLETE", "UNDER_WAY", "UNDONE", "VERSION", "Change", "MigrateError", "Record", "UndoPlan", "ended",
           "inferred", "net", "new_record", "read_record", "undo_plan", "with_change", "write_record"]

VERSION = 2
UNDER_WAY, COMPLETE, UNDONE = "under way", "complete", "undone"
_V1_REMOVABLE = ("nvidia.com/", "feature.node.kubernetes.io/")  # the labels the first format's migrate removed
_OPERANDS = "nvidia.com/gpu.deploy.operands"


class MigrateError(Exception):
    """The migration cannot go on; the message says why and what to do."""


@dataclass(slots=True, frozen=True)
class Change:
    """What one write did to one thing: `what` is "unschedulable", "label" (key: the label) or "daemonset"
    (key: NS/NAME, the values its pod template's affinity); "evicted" (key: NS/POD) is a record only."""

    step: str
    what: str
    before: Any = None
    after: Any = None
    key: str = ""
    at: str = ""

    def json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"step": self.step, "what": self.what}
        if self.key:
            body["key"] = self.key
        if self.what != "evicted":
            body.update(before=self.before, after=self.after)
        return {**body, "at": self.at}


@dataclass(slots=True, frozen=True)
class Record:
    """A node's way back as saved; version 1 is the first format, read only."""

    path: Path
    uid: str
    labels: dict[str, str]  # the node before the migration
    taints: list[dict[str, Any]]
    unschedulable: bool
    version: int = VERSION
    state: str = UNDER_WAY
    node: str = ""
    saved: str = ""
    changes: tuple[Change, ...] = field(default_factory=tuple)
    ended: str = ""  # when it was found complete, or undone

    @property
    def finished(self) -> bool:
        return self.version >= VERSION and self.state in (COMPLETE, UNDONE)

    def json(self) -> dict[str, Any]:
        return {"kind": "MigrationRecord", "version": VERSION, "node": self.node, "uid": self.uid,
                "state": self.state, "saved": self.saved, **({"ended": self.ended} if self.ended else {}),
                "before": {"labels": self.labels, "taints": self.taints, "unschedulable": self.unschedulable},
                "changes": [change.json() for change in self.changes]}


def _now() -> str:
    return format_time(time.time())


def new_record(path: Path, node: Mapping[str, Any]) -> Record:
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    return Record(path, str(meta.get("uid") or ""), dict(meta.get("labels") or {}), list(spec.get("taints") or []),
                  bool(spec.get("unschedulable")), node=str(meta.get("name") or ""), saved=_now())


def read_record(path: Path) -> Record | None:
    """The saved way back, or None when there is none; MigrateError when the file is not one of ours."""
    try:
        data = orjson.loads(path.read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise MigrateError(f"{path}: not a saved way back ({exc}); move it away and run the command again") from None
    if isinstance(data, list):  # the first format: a JSON patch
        values = {op.get("path"): op.get("value") for op in data if isinstance(op, dict)}
        uid, labels = values.get("/metadata/uid"), values.get("/metadata/labels")
        if isinstance(uid, str) and isinstance(labels, dict):
            taints = values.get("/spec/taints")
            return Record(path, uid, {str(k): str(v) for k, v in labels.items()},
                          [t for t in taints if isinstance(t, dict)] if isinstance(taints, list) else [],
                          bool(values.get("/spec/unschedulable")),
                          version=1, state=UNDER_WAY, node=path.stem)
    elif isinstance(data, dict) and data.get("kind") == "MigrationRecord" and isinstance(data.get("uid"), str):
        before = found if isinstance(found := data.get("before"), dict) else {}
        labels, taints = before.get("labels"), before.get("taints")
        changes = tuple(Change(str(c.get("step") or ""), str(c.get("what") or ""), c.get("before"), c.get("after"),
                               str(c.get("key") or ""), str(c.get("at") or ""))
                        for c in data.get("changes") or () if isinstance(c, dict))
        state = str(data["state"]) if data.get("state") in (UNDER_WAY, COMPLETE, UNDONE) else UNDER_WAY
        return Record(path, data["uid"], {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict)
                      else {}, [t for t in taints if isinstance(t, dict)] if isinstance(taints, list) else [],
                      bool(before.get("unschedulable")), VERSION, state, str(data.get("node") or path.stem),
                      str(data.get("saved") or ""), changes, str(data.get("ended") or ""))
    raise MigrateError(f"{path}: not a saved way back (neither a MigrationRecord nor a JSON patch with a uid test and "
                       "labels); move it away and run again")


def write_record(record: Record, *, first: bool = False) -> None:
    """Write the record whole: never half written (a temporary file, then a link or a rename, fsynced).
    `first`: the way back is being saved, and must not replace one that exists (it holds the state from
    before the migration) unless that one was undone."""
    path = record.path
    temporary = path.with_suffix(".json.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MigrateError(f"cannot save the way back in {path}: {exc.strerror}; nothing was changed") from None
    created = False
    try:
        with open(temporary, "xb") as handle:  # exclusive: two runs at once cannot both write
            created = True
            handle.write(orjson.dumps(record.json(), option=orjson.OPT_INDENT_2))
            handle.flush()
            os.fsync(handle.fileno())
        if first and (old := read_record(path)) is not None and old.state == UNDONE:
            os.replace(temporary, path)  # a new migration after one put back: its record starts again
        elif first:
            os.link(temporary, path)  # fails when it appeared meanwhile
        else:
            os.replace(temporary, path)
    except FileExistsError:
        raise MigrateError(f"{path} (or {temporary}) exists already: another run is saving it, or one was cut "
                           "short; look at it and remove what is not a complete way back") from None
    except OSError as exc:
        what = "nothing was changed" if first else "the change was not made"
        raise MigrateError(f"cannot save the way back in {path}: {exc.strerror}; {what}") from None
    finally:
        if created:
            temporary.unlink(missing_ok=True)


def with_change(record: Record, change: Change) -> Record:
    """The record with one more change, as a version 2 record (a first-format one is carried over)."""
    return replace(record, version=VERSION, changes=(*record.changes, replace(change, at=change.at or _now())))


def ended(record: Record, state: str) -> Record:
    return replace(record, version=VERSION, state=state, ended=_now())


def inferred(record: Record, node: Mapping[str, Any]) -> tuple[Change, ...]:
    """What a first-format migration changed, worked out from what that migrate could change: it removed
    GPU labels (nvidia.com/*, feature.node.kubernetes.io/*) and operands=false, and cordoned the node; it
    never added a label, changed a value, or wrote a taint. So: such labels saved and gone now, and the
    cordon when the node was schedulable when saved and is cordoned now."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    changes = [Change("labels", "label", value, None, key) for key, value in sorted(record.labels.items())
               if key not in labels and (key.startswith(_V1_REMOVABLE) or key == _OPERANDS)]
    if not record.unschedulable and (node.get("spec") or {}).get("unschedulable"):
        changes.insert(0, Change("cordon", "unschedulable", False, True))
    return tuple(changes)


def net(changes: tuple[Change, ...]) -> list[Change]:
    """One change per thing changed: its value before the first write and after the last (evictions left out)."""
    first: dict[tuple[str, str], Change] = {}
    for change in changes:
        if change.what == "evicted":
            continue
        key = (change.what, change.key)
        first[key] = replace(first[key], after=change.after) if key in first else change
    return [change for change in first.values() if change.before != change.after]


@dataclass(slots=True)
class UndoPlan:
    """What `--undo` does to the node: the changes to put back, and those left because they changed since."""

    back: list[Change] = field(default_factory=list)
    changed_since: list[tuple[Change, Any]] = field(default_factory=list)  # (change, the value now)

    def node_patch(self, node: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A JSON patch putting back the node's changes, guarded by its uid and resourceVersion: a node
        changed or recreated since it was read fails the patch instead of being written over."""
        meta = node.get("metadata") or {}
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
                                     {"op": "test", "path": "/metadata/resourceVersion",
                                      "value": meta.get("resourceVersion")}]
        for change in self.back:
            if change.what == "unschedulable":
                ops.append({"op": "add", "path": "/spec/unschedulable", "value": bool(change.before)})
            elif change.what == "label":
                path = "/metadata/labels/" + change.key.replace("~", "~0").replace("/", "~1")
                ops.append({"op": "remove", "path": path} if change.before is None else
                           {"op": "add", "path": path, "value": change.before})
        return ops if len(ops) > 2 else []


def undo_plan(record: Record, node: Mapping[str, Any], daemonsets: Mapping[str, Any]) -> UndoPlan:
    """Each thing the migration changed is put back when it still holds what the migration wrote; when
    it holds the value from before, there is nothing to do; else someone changed it since, and it is left.
    `daemonsets`: NS/NAME -> the DaemonSet's pod template affinity now (missing: the DaemonSet is gone)."""
    changes = net(record.changes if record.version >= VERSION else inferred(record, node))
    labels = (node.get("metadata") or {}).get("labels") or {}
    plan = UndoPlan()
    for change in changes:
        if change.what == "unschedulable":
            now: Any = bool((node.get("spec") or {}).get("unschedulable"))
        elif change.what == "label":
            now = labels.get(change.key)
        elif change.what == "daemonset":
            if change.key not in daemonsets:
                plan.changed_since.append((change, "gone"))
                continue
            now = daemonsets[change.key]
        else:
            continue
        if now == change.after:
            plan.back.append(change)
        elif now != change.before:
            plan.changed_since.append((change, now))
    return plan
