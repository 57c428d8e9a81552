"""`gpu-placement migrate NODE [--apply | --undo]`: read the node's state, print the plan, run it.

Exit status: 0 when the migration is complete (or there is nothing to migrate, or the way back was
applied), 1 when steps remain (a plan, or `--apply` stopped to wait for the cluster or for a person),
2 on bad usage or input, 3 when `--apply` or `--undo` failed at a step (nothing after it was tried).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

import orjson

from gpu_placement.base.config import Config
from gpu_placement.decide.kubefilters import KubeNodes, affinity_matches
from gpu_placement.survey.inventory import OPERANDS_LABEL
from gpu_placement.survey.live import call, list_all
from gpu_placement.survey.migrate import (
    BLOCKED,
    DEVICE_PLUGIN_LABEL,
    DONE,
    MANUAL,
    MigrateError,
    NodeState,
    NotMigratable,
    Step,
    eviction,
    excludes_operator_nodes,
    needed,
    node_path,
    plan,
    refusal,
    remove_labels_patch,
    template_affinity,
    wait_until,
    with_exclusion,
)
from gpu_placement.survey.wayback import (
    COMPLETE,
    UNDONE,
    VERSION,
    Change,
    ended,
    inferred,
    net,
    new_record,
    read_record,
    undo_plan,
    with_change,
    write_record,
)
from gpu_placement.view.fetch import ClusterAccess, FetchError

__all__ = ["FAILED", "apply", "backup_file", "read_live", "read_snapshot", "render_plan", "undo"]

FAILED = 3
FIELD_MANAGER = "gpu-placement-migrate"  # what the node's managedFields name for our writes
_MERGE, _JSON_PATCH = "application/merge-patch+json", "application/json-patch+json"
_HOST_DRIVER = ("The host's own driver stays: the operator's k8s-driver-manager finds it and marks the node "
                "nvidia.com/gpu.deploy.driver=pre-installed, so the node ends managed by the operator with a "
                "pre-installed driver. For the operator's containerized driver, uninstall the host's driver "
                "packages while the node is drained (before the operator step), then reboot it.")


def backup_file(directory: str | Path, node: str) -> Path:
    return Path(directory) / f"{node}.json"


# -- reading -------------------------------------------------------------------------------------
def _daemonset_path(key: str) -> str:
    namespace, name = key.split("/", 1)
    return f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/daemonsets/{quote(name, safe='')}"


def read_live(access: ClusterAccess, name: str, config: Config, path: Path, timeout: float = 600.0) -> NodeState:
    answer = call(access, "GET", node_path(name))
    if answer.status == 404:
        raise NotMigratable(f"node {name} not found (context {access.context}): nothing was changed")
    if not answer.ok:
        raise FetchError(f"GET {node_path(name)} (context {access.context}): {answer.message}", answer.status)
    pods = list_all(access, "/api/v1/pods", "Pod", [("fieldSelector", f"spec.nodeName={name}")])
    budgets = []
    for namespace in sorted({str((p.get("metadata") or {}).get("namespace") or "default") for p in pods}):
        try:
            budgets += list_all(access, f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
                                "PodDisruptionBudget")
        except FetchError as exc:
            if exc.status not in (403, 404):
                raise
    policies = call(access, "GET", "/apis/nvidia.com/v1/clusterpolicies")
    installed = bool(policies.body.get("items")) if policies.ok else (False if policies.status == 404 else None)
    state = NodeState(answer.body, pods, budgets, installed, read_record(path), config, path, timeout=timeout)
    for key in state.plugin_daemonsets():  # the foreign device plugins' DaemonSets (step 5): None when unreadable
        daemonset = call(access, "GET", _daemonset_path(key)) if not key.endswith("/") else None
        state.daemonsets[key] = daemonset.body if daemonset is not None and daemonset.ok else None
    return state


def read_snapshot(objects: Iterable[dict[str, Any]], name: str, config: Config, path: Path,
                  saved: bool = True, timeout: float = 600.0) -> NodeState:
    """The node's state in a snapshot; `saved`: read its way back from `path` (the demo shows a fresh plan)."""
    objects = list(objects)
    node = next((o for o in objects if o.get("kind") == "Node" and (o.get("metadata") or {}).get("name") == name),
                None)
    if node is None:
        raise NotMigratable(f"node {name} is not in the snapshot")
    pods = [o for o in objects if o.get("kind") == "Pod" and (o.get("spec") or {}).get("nodeName") == name]
    budgets = [o for o in objects if o.get("kind") == "PodDisruptionBudget"]
    installed = True if any(o.get("kind") == "ClusterPolicy" for o in objects) else None
    daemonsets = {_object_key(o): o for o in objects if o.get("kind") == "DaemonSet"}
    state = NodeState(node, pods, budgets, installed, read_record(path) if saved else None, config, path,
                      timeout=timeout)
    state.daemonsets = {key: daemonsets.get(key) for key in state.plugin_daemonsets()}
    return state


def _object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


# -- printing ------------------------------------------------------------------------------------
def render_plan(state: NodeState, steps: list[Step], output: str = "text") -> str:
    complete = all(step.state == DONE for step in steps)
    backup = state.backup_path
    record = state.record
    way_back = f"gpu-placement migrate {state.name} --undo --backup-dir {backup.parent}"
    notes = [] if complete else [_HOST_DRIVER]
    if output == "json":
        return orjson.dumps({"node": state.name, "complete": complete, "steps": [s.json() for s in steps],
                             "wayBack": {"file": str(backup), "saved": record is not None,
                                         "state": record.state if record is not None else None,
                                         "changes": len(record.changes) if record is not None else 0,
                                         "gpuPlacement": way_back},
                             "notes": notes}, option=orjson.OPT_INDENT_2).decode()
    head = "complete" if complete else next(f"next: {s.key} ({s.state})" for s in steps if s.state != DONE)
    lines = [f"migrate {state.name} to the GPU Operator's managed stack: {head}",
             f"way back: {way_back}   (puts back the {len(record.changes)} changes recorded in {backup}, and "
             "nothing else)" if record is not None
             else "way back: not saved yet (the first step saves it; --apply saves it before anything else)", ""]
    for number, step in enumerate(steps, 1):
        lines.append(f"{number}. [{step.state}] {step.key}: {step.title}")
        lines.append(f"     $ {step.command}")
        if step.detail:
            lines.append(f"     {step.detail}")
    lines += ["", *(f"note: {note}" for note in notes)]
    return "\n".join(lines).rstrip()


# -- applying ------------------------------------------------------------------------------------
def _write(access: ClusterAccess, method: str, path: str, body: Any, content_type: str) -> tuple[int, str]:
    answer = call(access, method, path, query=[("fieldManager", FIELD_MANAGER)], body=body, content_type=content_type)
    return answer.status, answer.message


def _unfinished_elsewhere(access: ClusterAccess, directory: Path, name: str, config: Config
                          ) -> list[tuple[str, str]]:
    """Other nodes whose migration is under way, by their way back in `directory`: one node at a time.
    A record says so itself (under way from its first write until --apply finds the migration complete,
    or --undo puts it back); a node recreated since (another uid) or gone has nothing under way. A file
    of the first format says nothing of the kind: its node counts while it is cordoned, was not when
    saved, and the migration's own steps (labels, plugin, operator, validator) are not all done, so that
    a node migrated long ago and cordoned now for maintenance holds nothing back."""
    found = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        other = path.stem
        if other == name:
            continue
        record = read_record(path)
        if record is None or record.finished:
            continue
        answer = call(access, "GET", node_path(other))
        node = answer.body if answer.ok else {}
        if (node.get("metadata") or {}).get("uid") != record.uid:
            continue
        if record.version >= VERSION:
            found.append((other, f"recorded under way in {path} since {record.saved or 'its first step'}"))
        elif (node.get("spec") or {}).get("unschedulable") and not record.unschedulable and not _work_done(
                plan(read_live(access, other, config, path))):
            found.append((other, f"cordoned since its way back was saved in {path}, and not migrated yet"))
    return found


def _work_done(steps: list[Step]) -> bool:
    return all(step.state == DONE for step in steps if step.key in ("labels", "plugin", "operator", "validator"))


def apply(access: ClusterAccess, name: str, config: Config, directory: Path, timeout: float, out: TextIO,
          interval: float = 1.0) -> int:
    """Run the plan's steps in order, each after reading the node again; stop at the first that fails, at
    a step a person must take, or at one that waits longer than `timeout` seconds. Every check that can
    stop it comes before its first write (the node has GPUs, no other migration is under way, the plan's
    preconditions: plan() blocks the save step on them)."""
    path = backup_file(directory, name)
    why_not = refusal(read_live(access, name, config, path, timeout))
    if why_not:
        raise NotMigratable(why_not)
    busy = _unfinished_elsewhere(access, directory, name, config)
    if busy:
        first, why = busy[0]
        others = f" (and of {', '.join(other for other, _ in busy[1:])})" if busy[1:] else ""
        raise MigrateError(f"the migration of {first} is not finished ({why}){others}: one node at a time; finish "
                           f"it (gpu-placement migrate {first} --apply --backup-dir {directory}), or undo it "
                           f"(gpu-placement migrate {first} --undo --backup-dir {directory}); nothing was changed")
    last: tuple[str, str] | None = None
    for _ in range(32):  # eight steps, each read again after it ran: bounded
        state = read_live(access, name, config, path, timeout)
        if last is None and (nothing := needed(state)):  # not `why`: the busy node's, above
            print(nothing, file=out)
            return 0
        steps = plan(state)
        step = next((s for s in steps if s.state != DONE), None)
        if step is None:
            record = state.record
            if record is not None and record.state != COMPLETE:
                write_record(ended(record, COMPLETE))
            print(f"{name}: migration complete; way back: gpu-placement migrate {name} --undo --backup-dir "
                  f"{directory}", file=out)
            return 0
        if (step.key, step.state) == last:
            raise MigrateError(f"step {step.key} did not take effect: {step.detail or step.title}")
        if step.state == BLOCKED:
            raise MigrateError(f"{step.key}: {step.detail}")
        if step.state == MANUAL:
            print(f"{step.key}: a step for a person: {step.detail}\n  $ {step.command}", file=out)
            return 1
        if step.key != "save" and state.record is None:
            raise MigrateError(f"no saved way back for {name} in {path}: nothing is changed without one")
        waited = _run(access, state, step, timeout, interval, out)
        if waited:
            print(f"{step.key}: waiting: {waited} (rerun the command to go on)", file=out)
            return 1
        last = (step.key, step.state)
    raise MigrateError("too many steps: the node keeps changing under the migration")


def _record(state: NodeState, *changes: Change) -> None:
    """Write the changes into the way back before they are made (so that --undo knows every one made)."""
    record = state.record
    if record is None:  # pragma: no cover - apply() checks there is one first
        raise MigrateError(f"no saved way back for {state.name}: nothing is changed without one")
    for change in changes:
        record = with_change(record, change)
    write_record(record)
    state.backup = record


def _run(access: ClusterAccess, state: NodeState, step: Step, timeout: float, interval: float, out: TextIO) -> str:
    """One step; returns what it still waits for ("" when done), raises MigrateError when it failed."""
    name = state.name
    path = node_path(name)

    def reread() -> NodeState:
        return read_live(access, name, state.config, state.backup_path, timeout)

    if step.key == "save":
        _save(state)
        print(f"save: the way back is in {state.backup_path}", file=out)
        return ""
    if step.key in ("cordon", "uncordon"):
        cordon = step.key == "cordon"
        _record(state, Change(step.key, "unschedulable", not cordon, cordon))
        _expect(step, _write(access, "PATCH", path, {"spec": {"unschedulable": cordon}}, _MERGE))
        print(f"{step.key}: {name} {'cordoned' if cordon else 'uncordoned'}", file=out)
        return ""
    if step.key == "drain":
        for pod in state.evictable():
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            where, body = eviction(pod)
            status, message = _write(access, "POST", where, body, "application/json")
            key = f"{body['metadata']['namespace']}/{body['metadata']['name']}"
            if status == 429:
                raise MigrateError(f"drain: the eviction of {key} was refused: {message}; rerun once the budget "
                                   f"allows (kubectl -n {body['metadata']['namespace']} get pdb)")
            if status >= 300 and status != 404:
                raise MigrateError(f"drain: the eviction of {key} failed: HTTP {status}: {message}")
            _record(state, Change("drain", "evicted", key=key))
            print(f"drain: evicted {key}", file=out)
        if not wait_until(lambda: not reread().evictable(), timeout, interval):
            return f"{len(reread().evictable())} pods still terminating on {name}"
        return ""
    if step.key == "labels":
        hand = sorted(state.hand_labels())
        _record(state, *(Change("labels", "label", state.labels[key], None, key) for key in hand))
        _expect(step, _write(access, "PATCH", path, remove_labels_patch(state.labels, hand), _JSON_PATCH))
        print(f"labels: removed {', '.join(hand)}", file=out)
        return ""
    if step.key == "plugin":
        return _plugin(access, state, step, timeout, interval, out)
    if step.key == "operator":
        if state.operator_installed is False:  # checked first: operands=false stays until the operator is there
            return next(s.detail for s in plan(state) if s.key == "operator")
        if state.labels.get(OPERANDS_LABEL) == "false":
            _record(state, Change("operator", "label", "false", None, OPERANDS_LABEL))
            _expect(step, _write(access, "PATCH", path, remove_labels_patch(state.labels, [OPERANDS_LABEL]),
                                 _JSON_PATCH))
            print(f"operator: removed {OPERANDS_LABEL}=false", file=out)
        if not wait_until(lambda: bool(reread().operands()), timeout, interval):
            return next(s.detail for s in plan(reread()) if s.key == "operator")
        return ""
    if step.key == "validator":
        if not wait_until(lambda: _validated(reread()), timeout, interval):
            return next(s.detail for s in plan(reread()) if s.key == "validator")
        return ""
    raise MigrateError(f"{step.key}: no automatic action")  # pragma: no cover - plan() names only these


def _plugin(access: ClusterAccess, state: NodeState, step: Step, timeout: float, interval: float, out: TextIO) -> str:
    """Give the first foreign device plugin's DaemonSet the affinity that leaves out the operator's nodes
    (recorded first, written with a test of the resourceVersion read: a DaemonSet changed meanwhile fails);
    once it is in place and the operator deploys its own plugin here, wait for the old pod to leave."""
    for key in sorted(state.plugin_daemonsets()):
        daemonset = state.daemonsets.get(key)
        if daemonset is None:
            continue
        affinity = template_affinity(daemonset)
        if excludes_operator_nodes(affinity):
            continue
        new = with_exclusion(affinity)
        _record(state, Change("plugin", "daemonset", affinity, new, key))
        meta = daemonset.get("metadata") or {}
        ops = [{"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
               {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")},
               {"op": "add", "path": "/spec/template/spec/affinity", "value": new}]
        _expect(step, _write(access, "PATCH", _daemonset_path(key), ops, _JSON_PATCH))
        print(f"plugin: daemonset {key} no longer runs on nodes where the GPU Operator deploys its own device plugin "
              f"({DEVICE_PLUGIN_LABEL}=true): its pod leaves {state.name} when the operator takes it", file=out)
        return ""
    if not wait_until(lambda: not read_live(access, state.name, state.config, state.backup_path,
                                            timeout).foreign_plugins(), timeout, interval):
        return step.detail
    return ""


def _validated(state: NodeState) -> bool:
    pod = state.validator()
    return pod is not None and any(c.get("type") == "Ready" and c.get("status") == "True"
                                   for c in (pod.get("status") or {}).get("conditions") or ())


def _expect(step: Step, answer: tuple[int, str]) -> None:
    status, message = answer
    if status >= 300:
        raise MigrateError(f"{step.key}: the API server refused: HTTP {status}: {message}")


def _save(state: NodeState) -> None:
    """Write the way back; never over one that exists (it holds the state from before the migration),
    unless it was put back already (undone)."""
    path = state.backup_path
    if state.backup is not None and state.backup.uid != state.uid and state.backup.state != UNDONE:
        raise MigrateError(f"{path} holds the way back of another node object named {state.name} (uid "
                           f"{state.backup.uid}; this one is {state.uid}): move it away first")
    write_record(new_record(path, state.node), first=True)


# -- the way back --------------------------------------------------------------------------------
def undo(access: ClusterAccess, name: str, directory: Path, out: TextIO) -> int:
    """Put back what the migration changed, and only that: each label and the schedulable state it wrote,
    and the affinity it gave a device plugin's DaemonSet, where each still holds what the migration wrote
    (one JSON patch of the node, guarded by its uid and resourceVersion). What changed since is left, and
    said; so are labels and taints others added."""
    path = backup_file(directory, name)
    record = read_record(path)
    if record is None:
        raise MigrateError(f"no saved way back for {name} in {path}")
    if record.state == UNDONE:
        print(f"{name}: the way back in {path} was put back already ({record.ended}): nothing to do", file=out)
        return 0
    answer = call(access, "GET", node_path(name))
    if answer.status == 404:
        raise MigrateError(f"node {name} not found (context {access.context})")
    if not answer.ok:
        raise MigrateError(f"the way back was not applied: GET {node_path(name)}: HTTP {answer.status}: "
                           f"{answer.message}")
    node = answer.body
    if (node.get("metadata") or {}).get("uid") != record.uid:
        raise MigrateError(f"the way back in {path} is of another node object named {name} (uid {record.uid}; this "
                           f"one is {(node.get('metadata') or {}).get('uid')}, created since): not applied")
    if record.version < VERSION:  # the first format: what it changed, worked out (and kept in the rewritten file)
        record = replace(record, version=VERSION, changes=inferred(record, node))
    daemonsets: dict[str, Any] = {}
    for change in record.changes:
        if change.what == "daemonset" and change.key not in daemonsets:
            found = call(access, "GET", _daemonset_path(change.key))
            if found.ok:
                daemonsets[change.key] = found.body
    steps = undo_plan(record, node, {key: template_affinity(obj) for key, obj in daemonsets.items()})
    ops = steps.node_patch(node)
    if ops:
        status, message = _write(access, "PATCH", node_path(name), ops, _JSON_PATCH)
        if status >= 300:
            raise MigrateError(f"the way back in {path} was not applied: HTTP {status}: {message} (the node changed "
                               "while it was read, or was recreated: run --undo again)")
    lines = [_undone(change) for change in steps.back if change.what != "daemonset"]
    failed = False
    for change in (c for c in steps.back if c.what == "daemonset"):
        line, done = _undo_daemonset(access, name, change, daemonsets[change.key])
        lines.append(line)
        failed = failed or not done
    if not failed:  # else it stays as it was, so that --undo again tries what failed
        write_record(ended(record, UNDONE))
    print(f"{name}: put back what the migration changed, as recorded in {path}:", file=out)
    nothing = "nothing: the migration had changed nothing yet" if not net(record.changes) else \
        "nothing: nothing the migration changed holds what it wrote any more"
    for line in lines or [nothing]:
        print(f"  {line}", file=out)
    for change, now in steps.changed_since:
        print(f"  left as it is, changed since the migration wrote it: {_what(change)} (the migration "
              f"{_wrote(change)}; now {_value(now)})", file=out)
    evicted = [c.key for c in record.changes if c.what == "evicted"]
    print("  not touched: labels and taints others wrote since (GPU Feature Discovery, the GPU Operator, the node "
          "lifecycle controller, an autoscaler)" + (f"; pods it evicted are not brought back ({len(evicted)}: "
                                                    f"{', '.join(evicted[:8])}{' ...' if len(evicted) > 8 else ''}), "
                                                    "their controllers place them again" if evicted else ""), file=out)
    return FAILED if failed else 0


def _what(change: Change) -> str:
    return {"unschedulable": "spec.unschedulable", "label": f"label {change.key}",
            "daemonset": f"daemonset {change.key}'s affinity"}.get(change.what, change.what)


def _value(value: Any) -> str:
    return "absent" if value is None else value if isinstance(value, str) else orjson.dumps(value).decode()


def _wrote(change: Change) -> str:
    if change.what == "label":
        return "removed it" if change.after is None else f"set {change.after}"
    return f"set {_value(change.after)}"


def _undone(change: Change) -> str:
    if change.what == "unschedulable":
        return "uncordoned (the migration cordoned it)" if not change.before else "cordoned again"
    if change.before is None:
        return f"label {change.key} removed"
    return f"label {change.key}={change.before}"


def _undo_daemonset(access: ClusterAccess, name: str, change: Change, daemonset: Mapping[str, Any]
                    ) -> tuple[str, bool]:
    """Take the affinity off the DaemonSet (back to what it was) unless that would send its pods to a node
    where the operator runs its own device plugin: there the affinity is what keeps two plugins apart, and
    on nodes the operator does not manage it changes nothing. The line to print, and whether it is settled."""
    spec = dict(((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {})
    if change.before is None:
        spec.pop("affinity", None)
    else:
        spec["affinity"] = change.before
    operator_nodes = list_all(access, "/api/v1/nodes", "Node", [("labelSelector", f"{DEVICE_PLUGIN_LABEL}=true")])
    kube = KubeNodes.from_objects(operator_nodes).nodes
    reached = sorted(node for node, obj in kube.items() if node != name and affinity_matches(spec, obj))
    if reached:
        return (f"daemonset {change.key}: affinity kept: without it, its pods would run beside the operator's device "
                f"plugin on {', '.join(reached[:8])}{' ...' if len(reached) > 8 else ''} "
                f"({DEVICE_PLUGIN_LABEL}=true); on nodes the operator does not manage it changes nothing"), True
    meta = daemonset.get("metadata") or {}
    back = {"op": "remove", "path": "/spec/template/spec/affinity"} if change.before is None else \
        {"op": "add", "path": "/spec/template/spec/affinity", "value": change.before}
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")}, back]
    status, message = _write(access, "PATCH", _daemonset_path(change.key), ops, _JSON_PATCH)
    if status >= 300:
        return f"daemonset {change.key}: affinity not put back: HTTP {status}: {message}; run --undo again", False
    return f"daemonset {change.key}: affinity as before the migration", True
