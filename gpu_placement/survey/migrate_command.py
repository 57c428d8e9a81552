"""`gpu-placement migrate NODE [--apply | --undo]`: read the node's state, print the plan, run it.

Exit status: 0 when the migration is complete (or there is nothing to migrate, or the way back was
applied), 1 when steps remain (a plan, or `--apply` stopped to wait for the cluster or for a person),
2 on bad usage or input, 3 when `--apply` or `--undo` failed at a step (nothing after it was tried).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

import orjson

from gpu_placement.base.config import Config
from gpu_placement.survey.inventory import OPERANDS_LABEL
from gpu_placement.survey.live import call, list_all
from gpu_placement.survey.migrate import (
    BLOCKED,
    DONE,
    MANUAL,
    MigrateError,
    NodeState,
    NotMigratable,
    Step,
    backup_patch,
    eviction,
    needed,
    node_path,
    plan,
    read_backup,
    refusal,
    remove_labels_patch,
    wait_until,
)
from gpu_placement.view.fetch import ClusterAccess, FetchError

__all__ = ["FAILED", "apply", "read_live", "read_snapshot", "render_plan", "undo"]

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
def read_live(access: ClusterAccess, name: str, config: Config, path: Path) -> NodeState:
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
    return NodeState(answer.body, pods, budgets, installed, read_backup(path), config, path)


def read_snapshot(objects: Iterable[dict[str, Any]], name: str, config: Config, path: Path,
                  saved: bool = True) -> NodeState:
    """The node's state in a snapshot; `saved`: read its way back from `path` (the demo shows a fresh plan)."""
    objects = list(objects)
    node = next((o for o in objects if o.get("kind") == "Node" and (o.get("metadata") or {}).get("name") == name),
                None)
    if node is None:
        raise NotMigratable(f"node {name} is not in the snapshot")
    pods = [o for o in objects if o.get("kind") == "Pod" and (o.get("spec") or {}).get("nodeName") == name]
    budgets = [o for o in objects if o.get("kind") == "PodDisruptionBudget"]
    installed = True if any(o.get("kind") == "ClusterPolicy" for o in objects) else None
    return NodeState(node, pods, budgets, installed, read_backup(path) if saved else None, config, path)


# -- printing ------------------------------------------------------------------------------------
def render_plan(state: NodeState, steps: list[Step], output: str = "text") -> str:
    complete = all(step.state == DONE for step in steps)
    backup = state.backup_path
    way_back = f"kubectl patch node {state.name} --type json --patch-file {backup}"
    notes = [] if complete else [_HOST_DRIVER]
    if output == "json":
        return orjson.dumps({"node": state.name, "complete": complete, "steps": [s.json() for s in steps],
                             "wayBack": {"file": str(backup), "saved": state.backup is not None, "kubectl": way_back,
                                         "gpuPlacement": f"gpu-placement migrate {state.name} --undo"},
                             "notes": notes}, option=orjson.OPT_INDENT_2).decode()
    head = "complete" if complete else next(f"next: {s.key} ({s.state})" for s in steps if s.state != DONE)
    lines = [f"migrate {state.name} to the GPU Operator's managed stack: {head}",
             f"way back: {way_back}   (or: gpu-placement migrate {state.name} --undo)" if state.backup is not None
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


def _unfinished_elsewhere(access: ClusterAccess, directory: Path, name: str) -> list[str]:
    """Other nodes with a saved way back in `directory` that are cordoned now and were not when saved: a
    migration under way. One node at a time."""
    found = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        other = path.stem
        if other == name:
            continue
        backup = read_backup(path)
        answer = call(access, "GET", node_path(other))
        node = answer.body if answer.ok else {}
        if backup is not None and (node.get("metadata") or {}).get("uid") == backup.uid and \
                (node.get("spec") or {}).get("unschedulable") and not backup.unschedulable:
            found.append(other)
    return found


def apply(access: ClusterAccess, name: str, config: Config, directory: Path, timeout: float, out: TextIO,
          interval: float = 1.0) -> int:
    """Run the plan's steps in order, each after reading the node again; stop at the first that fails, at
    a step a person must take, or at one that waits longer than `timeout` seconds."""
    path = backup_file(directory, name)
    why_not = refusal(read_live(access, name, config, path))
    if why_not:
        raise NotMigratable(why_not)
    busy = _unfinished_elsewhere(access, directory, name)
    if busy:
        raise MigrateError(f"the migration of {', '.join(busy)} is not finished (cordoned since its way back was "
                           f"saved in {directory}): one node at a time; finish it, or undo it "
                           f"(gpu-placement migrate {busy[0]} --undo --backup-dir {directory})")
    last: tuple[str, str] | None = None
    for _ in range(32):  # eight steps, each read again after it ran: bounded
        state = read_live(access, name, config, path)
        if last is None and (why := needed(state)):
            print(why, file=out)
            return 0
        steps = plan(state)
        step = next((s for s in steps if s.state != DONE), None)
        if step is None:
            print(f"{name}: migration complete; way back: kubectl patch node {name} --type json --patch-file {path}",
                  file=out)
            return 0
        if (step.key, step.state) == last:
            raise MigrateError(f"step {step.key} did not take effect: {step.detail or step.title}")
        if step.state == BLOCKED:
            raise MigrateError(f"{step.key}: {step.detail}")
        if step.state == MANUAL:
            print(f"{step.key}: a step for a person: {step.detail}\n  $ {step.command}", file=out)
            return 1
        if step.key != "save" and (state.backup is None or state.backup.uid != state.uid):
            raise MigrateError(f"no saved way back for {name} in {path}: nothing is changed without one")
        waited = _run(access, state, step, timeout, interval, out)
        if waited:
            print(f"{step.key}: waiting: {waited} (rerun the command to go on)", file=out)
            return 1
        last = (step.key, step.state)
    raise MigrateError("too many steps: the node keeps changing under the migration")


def _run(access: ClusterAccess, state: NodeState, step: Step, timeout: float, interval: float, out: TextIO) -> str:
    """One step; returns what it still waits for ("" when done), raises MigrateError when it failed."""
    name = state.name
    path = node_path(name)

    def reread() -> NodeState:
        return read_live(access, name, state.config, state.backup_path)

    if step.key == "save":
        _save(state)
        print(f"save: the way back is in {state.backup_path}", file=out)
        return ""
    if step.key in ("cordon", "uncordon"):
        _expect(step, _write(access, "PATCH", path, {"spec": {"unschedulable": step.key == "cordon"}}, _MERGE))
        print(f"{step.key}: {name} {'cordoned' if step.key == 'cordon' else 'uncordoned'}", file=out)
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
            print(f"drain: evicted {key}", file=out)
        if not wait_until(lambda: not reread().evictable(), timeout, interval):
            return f"{len(reread().evictable())} pods still terminating on {name}"
        return ""
    if step.key == "labels":
        hand = sorted(state.hand_labels())
        _expect(step, _write(access, "PATCH", path, remove_labels_patch(state.labels, hand), _JSON_PATCH))
        print(f"labels: removed {', '.join(hand)}", file=out)
        return ""
    if step.key == "operator":
        if state.operator_installed is False:  # checked first: operands=false stays until the operator is there
            return next(s.detail for s in plan(state) if s.key == "operator")
        if state.labels.get(OPERANDS_LABEL) == "false":
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


def _validated(state: NodeState) -> bool:
    pod = state.validator()
    return pod is not None and any(c.get("type") == "Ready" and c.get("status") == "True"
                                   for c in (pod.get("status") or {}).get("conditions") or ())


def _expect(step: Step, answer: tuple[int, str]) -> None:
    status, message = answer
    if status >= 300:
        raise MigrateError(f"{step.key}: the API server refused: HTTP {status}: {message}")


def _save(state: NodeState) -> None:
    """Write the way back; never over one that exists (it holds the state from before the migration)."""
    path = state.backup_path
    if state.backup is not None and state.backup.uid != state.uid:
        raise MigrateError(f"{path} holds the way back of another node object named {state.name} (uid "
                           f"{state.backup.uid}; this one is {state.uid}): move it away first")
    temporary = path.with_suffix(".json.tmp")
    created = False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MigrateError(f"cannot save the way back in {path}: {exc.strerror}; nothing was changed") from None
    try:
        with open(temporary, "xb") as handle:  # exclusive: two runs at once cannot both write
            created = True
            handle.write(orjson.dumps(backup_patch(state.node), option=orjson.OPT_INDENT_2))
            handle.flush()
            os.fsync(handle.fileno())
        os.link(temporary, path)  # complete or absent, never half written; fails when it appeared meanwhile
    except FileExistsError:
        raise MigrateError(f"{path} (or {temporary}) exists already: another run is saving it, or one was cut "
                           "short; look at it and remove what is not a complete way back") from None
    except OSError as exc:
        raise MigrateError(f"cannot save the way back in {path}: {exc.strerror}; nothing was changed") from None
    finally:
        if created:
            temporary.unlink(missing_ok=True)


def undo(access: ClusterAccess, name: str, directory: Path, out: TextIO) -> int:
    """Put the node's labels, taints and schedulable state back as saved (one JSON patch)."""
    path = backup_file(directory, name)
    if read_backup(path) is None:
        raise MigrateError(f"no saved way back for {name} in {path}")
    ops = orjson.loads(path.read_bytes())
    status, message = _write(access, "PATCH", node_path(name), ops, _JSON_PATCH)
    if status == 404:
        raise MigrateError(f"node {name} not found (context {access.context})")
    if status == 422:
        raise MigrateError(f"the way back in {path} was not applied: {message} (its uid test guards against a node "
                           "recreated under the same name)")
    if status >= 300:
        raise MigrateError(f"the way back was not applied: HTTP {status}: {message}")
    print(f"{name}: labels, taints and schedulable state put back from {path} (evicted pods are not brought back: "
          "their controllers place them again)", file=out)
    return 0
