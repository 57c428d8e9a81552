"""`gpu-placement migrate NODE`: one node from hand-installed drivers (or hand-set labels) to the GPU
Operator's managed stack, planned and checked step by step, applied with `--apply`.

Every step's state is read from the cluster each time, never from a local record: rerunning the
command says which steps are done and what the next one waits for. The one local thing is the way
back, written before anything changes: `<dir>/<node>.json`, a JSON patch that puts the node's labels,
taints and schedulable state back as they were, guarded by a `test` of the node's uid so it never
lands on another node of that name. `kubectl patch node NODE --type json --patch-file FILE` applies it,
as does `gpu-placement migrate NODE --undo`.

The steps, in order (`save` comes first so that nothing changes without a way back; it reads only):
1. save      the node's labels, taints and spec.unschedulable to the file
2. cordon    kubectl cordon
3. drain     kubectl drain: evictions, which the API server refuses with 429 while a
             PodDisruptionBudget allows no disruption (pkg/registry/core/pod/storage/eviction.go);
             DaemonSet pods stay, pods without a controller are refused (kubectl pkg/drain/filters.go)
4. labels    remove the GPU labels people wrote (managedFields: gpu_placement/survey/labels.py)
5. plugin    keep a hand-installed device plugin off the node (a person's step, when one runs there)
6. operator  remove nvidia.com/gpu.deploy.operands=false; the operator then sets
             nvidia.com/gpu.present=true from NFD's PCI label and its gpu.deploy.* labels, and its
             DaemonSets start there (NVIDIA/gpu-operator controllers/state_manager.go)
7. validator wait until the operator's validator pod on the node is Ready
8. uncordon  kubectl uncordon (left cordoned when it was cordoned before the migration)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.facts.budgets import budget_from_json
from gpu_placement.survey.inventory import NFD_NVIDIA_PCI, OPERANDS_LABEL, gpu_signs, is_device_plugin, is_operand
from gpu_placement.survey.labels import label_writers

__all__ = ["Backup", "MigrateError", "NodeState", "NotMigratable", "Step", "backup_patch", "plan", "preconditions",
           "read_backup", "refusal"]

DONE, NEXT, WAITING, BLOCKED, PENDING, MANUAL = "done", "next", "waiting", "blocked", "pending", "manual"
_MIRROR = "kubernetes.io/config.mirror"
_TERMINAL = ("Succeeded", "Failed")


class MigrateError(Exception):
    """The migration cannot go on; the message says why and what to do."""


class NotMigratable(MigrateError):
    """Not a node to migrate (none of that name, or no GPU): bad input, nothing read further or changed."""


@dataclass(slots=True, frozen=True)
class Backup:
    """The way back, as saved: the node's uid, labels, taints and whether it was cordoned."""

    path: Path
    uid: str
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    unschedulable: bool


@dataclass(slots=True)
class NodeState:
    """What the plan reads: the Node, the pods bound to it, the budgets of their namespaces, whether the
    GPU Operator is installed (None: unknown), the saved way back."""

    node: dict[str, Any]
    pods: list[dict[str, Any]]
    budgets: list[dict[str, Any]]
    operator_installed: bool | None
    backup: Backup | None
    config: Config
    backup_path: Path = field(default_factory=Path)

    @property
    def name(self) -> str:
        return str((self.node.get("metadata") or {}).get("name") or "")

    @property
    def uid(self) -> str:
        return str((self.node.get("metadata") or {}).get("uid") or "")

    @property
    def labels(self) -> dict[str, str]:
        return dict((self.node.get("metadata") or {}).get("labels") or {})

    @property
    def cordoned(self) -> bool:
        return bool((self.node.get("spec") or {}).get("unschedulable"))

    def hand_labels(self) -> dict[str, str]:
        return label_writers(self.node).by_hand(self.labels)

    def evictable(self) -> list[dict[str, Any]]:
        """The pods `kubectl drain --ignore-daemonsets --delete-emptydir-data` evicts (or waits for)."""
        return [pod for pod in self.pods if _evictable(pod)]

    def operands(self) -> list[str]:
        return sorted(_key(pod) for pod in self.pods if _running(pod) and is_operand(pod, self.config))

    def validator(self) -> dict[str, Any] | None:
        validator = self.config.validator
        found = [pod for pod in self.pods if (_meta(pod).get("namespace") or "default") == validator.namespace
                 and validator.selector.matches(_meta(pod).get("labels") or {}) and _running(pod)]
        return found[0] if found else None

    def plugin_owner(self) -> tuple[str, str]:
        """(namespace, DaemonSet) of the first foreign device plugin pod, for the command."""
        for pod in self.pods:
            if _running(pod) and is_device_plugin(pod, self.config):
                owner = _controller(pod) or {}
                return str(_meta(pod).get("namespace") or "default"), str(owner.get("name") or "NAME")
        return "NS", "NAME"

    def foreign_plugins(self) -> list[str]:
        return sorted(_key(pod) for pod in self.pods if _running(pod) and is_device_plugin(pod, self.config))


@dataclass(slots=True)
class Step:
    key: str
    title: str
    command: str
    state: str = PENDING
    detail: str = ""
    automatic: bool = True  # --apply does it (else a person does, then reruns)

    def json(self) -> dict[str, Any]:
        return {"step": self.key, "title": self.title, "command": self.command, "state": self.state,
                "detail": self.detail, "automatic": self.automatic}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _key(pod: Mapping[str, Any]) -> str:
    return f"{_meta(pod).get('namespace') or 'default'}/{_meta(pod).get('name')}"


def _running(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in _TERMINAL


def _controller(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((o for o in _meta(pod).get("ownerReferences") or () if isinstance(o, dict) and o.get("controller")),
                None)


def _evictable(pod: Mapping[str, Any]) -> bool:
    owner = _controller(pod)
    return _running(pod) and not (owner and owner.get("kind") == "DaemonSet") and \
        _MIRROR not in (_meta(pod).get("annotations") or {})


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or () if isinstance(c, dict))


# -- the way back --------------------------------------------------------------------------------
def backup_patch(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that puts this node's labels, taints and schedulable state back: the same file
    `kubectl get node NODE -o json | jq '[{op:"test",path:"/metadata/uid",value:.metadata.uid},
    {op:"add",path:"/metadata/labels",value:.metadata.labels},{op:"add",path:"/spec/taints",
    value:(.spec.taints // [])},{op:"add",path:"/spec/unschedulable",value:(.spec.unschedulable // false)}]'`
    writes. `add` replaces a member that exists and creates one that does not (RFC 6902 4.1)."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    return [{"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
            {"op": "add", "path": "/metadata/labels", "value": dict(meta.get("labels") or {})},
            {"op": "add", "path": "/spec/taints", "value": list(spec.get("taints") or [])},
            {"op": "add", "path": "/spec/unschedulable", "value": bool(spec.get("unschedulable"))}]


def read_backup(path: Path) -> Backup | None:
    """The saved way back, or None when there is none; MigrateError when the file is not one of ours."""
    try:
        ops = orjson.loads(path.read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise MigrateError(f"{path}: not a saved way back ({exc}); move it away and run the command again") from None
    values = {op.get("path"): op.get("value") for op in ops if isinstance(op, dict)} if isinstance(ops, list) else {}
    if not isinstance(values.get("/metadata/uid"), str) or not isinstance(values.get("/metadata/labels"), dict):
        raise MigrateError(f"{path}: not a saved way back (no uid test and labels); move it away and run again")
    return Backup(path, values["/metadata/uid"], dict(values["/metadata/labels"]),
                  list(values.get("/spec/taints") or []), bool(values.get("/spec/unschedulable")))


# -- the plan ------------------------------------------------------------------------------------
def _label_command(node: str, keys: Sequence[str]) -> str:
    return f"kubectl label node {node} " + " ".join(f"{key}-" for key in keys)


def refusal(state: NodeState) -> str | None:
    """Why this node is no node to migrate at all (it has no GPU), or None. A GPU node is one with any of
    `gpu_signs`: NFD's NVIDIA PCI label, an NVIDIA GPU label, a GPU resource in its capacity."""
    if gpu_signs(state.node, state.config):
        return None
    saved = (f"; a way back of it is saved in {state.backup_path}: gpu-placement migrate {state.name} --undo puts "
             "back what was changed") if state.backup is not None else "; nothing was changed"
    return (f"{state.name} has no GPU: no NVIDIA PCI device labelled by NFD ({NFD_NVIDIA_PCI[0]}), no NVIDIA GPU "
            f"label ({n.GPU_PRESENT}, {n.GPU_COUNT}, {n.GPU_PRODUCT}) and no GPU resource in its capacity, so "
            f"there is nothing to migrate{saved} (is it the node you meant? kubectl get nodes -L "
            f"{n.GPU_PRESENT},{n.GPU_PRODUCT} lists the GPU nodes)")


def preconditions(state: NodeState) -> list[str]:
    """What must hold before the migration's first change, each a sentence; checked before anything is
    written, so that a migration that would stop half way (the node cordoned and drained, then waiting for
    an operator that is not there) does not start."""
    problems = []
    if state.operator_installed is False:
        problems.append("the GPU Operator is not installed (no ClusterPolicy): install it first (helm install "
                        "gpu-operator nvidia/gpu-operator -n gpu-operator --create-namespace; with the host's driver "
                        "kept, set driver.enabled=false)")
    labels = state.labels
    # The operator deploys on a node only where NFD's PCI label says NVIDIA: needed unless its pods already run
    # there and stay (operands not disabled, its nvidia.com/gpu.present not among the labels to remove).
    stays = bool(state.operands()) and labels.get(OPERANDS_LABEL) != "false" and n.GPU_PRESENT not in \
        state.hand_labels()
    if not stays and not any(labels.get(key) == "true" for key in NFD_NVIDIA_PCI):
        problems.append(f"NFD has not labelled the node {NFD_NVIDIA_PCI[0]}=true, which the GPU Operator needs "
                        "before it deploys anything there: run nfd-worker on it (the operator's nfd.enabled, or your "
                        "own Node Feature Discovery), then run this again")
    return problems


def plan(state: NodeState) -> list[Step]:
    """Every step with its state as the cluster shows it now; the first not done says what it waits for."""
    name, config = state.name, state.config
    backup = state.backup if state.backup is not None and state.backup.uid == state.uid else None
    hand = state.hand_labels()
    operands = state.operands()
    disabled = state.labels.get(OPERANDS_LABEL) == "false"
    validator = state.validator()
    foreign = state.foreign_plugins()
    was_cordoned = backup.unschedulable if backup is not None else False
    managed = bool(operands) and not disabled
    validated = validator is not None and _ready(validator)
    complete = backup is not None and managed and validated and not hand and not foreign and (
        not state.cordoned or was_cordoned)
    path = state.backup_path
    steps = [
        Step("save", "save the node's labels, taints and schedulable state (the way back)",
             f"kubectl get node {name} -o json | jq '[{{op:\"test\",path:\"/metadata/uid\",value:.metadata.uid}},"
             f"{{op:\"add\",path:\"/metadata/labels\",value:.metadata.labels}},{{op:\"add\",path:\"/spec/taints\","
             f"value:(.spec.taints // [])}},{{op:\"add\",path:\"/spec/unschedulable\",value:(.spec.unschedulable "
             f"// false)}}]' > {path}", DONE if backup else PENDING,
             f"saved in {path}" if backup else ""),
        Step("cordon", "no new pods", f"kubectl cordon {name}", DONE if state.cordoned or complete else PENDING),
        _drain_step(state, complete),
        Step("labels", "remove the GPU labels set by hand", _label_command(name, sorted(hand)) if hand
             else "(none to remove)", PENDING if hand else DONE,
             f"{len(hand)} labels last written by {', '.join(sorted(set(hand.values())))}: {', '.join(sorted(hand))}"
             if hand else "no GPU label on the node was written by hand"),
    ]
    owner = state.plugin_owner()
    steps.append(Step("plugin", "keep a hand-installed device plugin off the node",
                      f"kubectl -n {owner[0]} patch daemonset {owner[1]} --type json -p '{_NOT_WITH_OPERATOR}'"
                      if foreign else "(none runs there)", PENDING if foreign else DONE,
                      f"{', '.join(foreign)} runs there: with the operator's device plugin beside it, two plugins "
                      "register the same GPUs. Give its DaemonSet an affinity that leaves out nodes where the "
                      "operator deploys its own (this one for all nodes, once; check the DaemonSet has no affinity it "
                      "would replace), then rerun" if foreign else "no device plugin but the operator's runs there",
                      automatic=False))
    steps += [
        Step("operator", "let the GPU Operator take the node",
             f"kubectl label node {name} {OPERANDS_LABEL}-" if disabled else
             f"(nothing to do: wait for the operator's pods; kubectl -n {config.validator.namespace} get pods -o wide "
             f"--field-selector spec.nodeName={name})", DONE if managed else PENDING,
             f"its pods on the node: {', '.join(operands)}" if managed else _operator_wait(state, disabled)),
        Step("validator", "wait for the operator's validator to pass on the node",
             f"kubectl -n {config.validator.namespace} wait pod -l {config.validator.selector.text} --field-selector "
             f"spec.nodeName={name} --for=condition=Ready --timeout=15m", DONE if validated else PENDING,
             f"{_key(validator)} is Ready" if validated else
             (f"{_key(validator)} is not Ready yet (kubectl -n {config.validator.namespace} logs "
              f"{_meta(validator).get('name')} --all-containers shows which check runs)" if validator else
              "no validator pod on the node yet: the operator's DaemonSet starts one once the node has "
              "nvidia.com/gpu.deploy.operator-validator=true")),
        Step("uncordon", "GPU pods may come", f"kubectl uncordon {name}",
             DONE if complete else PENDING,
             "left cordoned: it was cordoned before the migration (the saved state)" if complete and state.cordoned
             else ""),
    ]
    problems = preconditions(state) if backup is None else []
    if problems:  # nothing is written, not even the way back, until they hold
        steps[0].state = BLOCKED
        steps[0].detail = "cannot start, nothing is changed: " + "; ".join(problems)
    _mark_next(steps)
    return steps


# A DaemonSet affinity that leaves out the nodes where the GPU Operator deploys its own device plugin.
_NOT_WITH_OPERATOR = orjson.dumps([{"op": "add", "path": "/spec/template/spec/affinity", "value": {"nodeAffinity": {
    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "nvidia.com/gpu.deploy.device-plugin", "operator": "NotIn", "values": ["true"]}]}]}}}}]).decode()


def _drain_step(state: NodeState, complete: bool) -> Step:
    name = state.name
    step = Step("drain", "evict its pods, honouring PodDisruptionBudgets",
                f"kubectl drain {name} --ignore-daemonsets --delete-emptydir-data --timeout=15m")
    if complete:
        step.state = DONE
        return step
    pods = state.evictable()
    if state.cordoned and not pods:
        step.state, step.detail = DONE, "no pod left to evict (DaemonSet pods stay)"
        return step
    budgets = [budget_from_json(obj) for obj in state.budgets]
    notes, blocked = [], []
    for pod in pods:
        meta = _meta(pod)
        if meta.get("deletionTimestamp"):
            notes.append(f"{_key(pod)} terminating")
        elif _controller(pod) is None:
            blocked.append(f"{_key(pod)} declares no controller: evicted, it is gone for good, so kubectl drain "
                           "refuses it without --force; move or delete it yourself")
        else:
            budget = next((b for b in budgets if b.selects(str(meta.get("namespace") or "default"),
                                                           meta.get("labels") or {})), None)
            held = f" (PodDisruptionBudget {budget.key}: {budget.allowed} disruptions allowed now)" if budget else ""
            notes.append(f"{_key(pod)}{held}")
    step.detail = "; ".join(blocked) if blocked else (f"{len(pods)} pods to evict: {', '.join(notes)}" if pods else
                                                      "no pod to evict (DaemonSet pods stay)")
    step.state = BLOCKED if blocked else PENDING
    return step


def _operator_wait(state: NodeState, disabled: bool) -> str:
    labels = state.labels
    if state.operator_installed is False:
        kept = f"; {OPERANDS_LABEL}=false stays on the node until it is" if disabled else ""
        return ("the GPU Operator is not installed (no ClusterPolicy): install it first (helm install gpu-operator "
                "nvidia/gpu-operator -n gpu-operator --create-namespace); with the host's driver kept, set "
                "driver.enabled=false" + kept)
    if disabled:
        return f"{OPERANDS_LABEL}=false keeps every operand of the GPU Operator off the node"
    if not any(labels.get(key) == "true" for key in NFD_NVIDIA_PCI):
        return (f"NFD has not labelled the node {NFD_NVIDIA_PCI[0]}=true, which the operator looks for: is nfd-worker "
                "running on it?")
    if labels.get("nvidia.com/gpu.present") != "true":
        return "the GPU Operator has not set nvidia.com/gpu.present=true yet (is the operator running?)"
    return ("no operand of the GPU Operator runs on the node yet: its DaemonSets start once it carries "
            "nvidia.com/gpu.deploy.<component>=true")


def _mark_next(steps: list[Step]) -> None:
    first = next((step for step in steps if step.state != DONE), None)
    if first is None:
        return
    if first.state == PENDING:
        first.state = NEXT if first.automatic else MANUAL
    for step in steps:
        if step is not first and step.state == BLOCKED:
            step.state = PENDING


def needed(state: NodeState) -> str | None:
    """Why the node needs no migration, or None when it does."""
    if state.backup is not None or state.labels.get(OPERANDS_LABEL) == "false" or state.hand_labels():
        return None
    if state.operands():
        return (f"{state.name} is managed by the GPU Operator (its pods: {', '.join(state.operands())}) and none of "
                "its GPU labels was set by hand: nothing to migrate")
    return None


# -- applying ------------------------------------------------------------------------------------
Write = Callable[[str, str, Any, str], tuple[int, str]]  # (method, path, body, content type) -> (status, message)


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{quote(name, safe='')}"


def eviction(pod: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The eviction of a pod: POST pods/NAME/eviction with a policy/v1 Eviction, as kubectl drain sends it."""
    meta = _meta(pod)
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    return (f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/eviction",
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}})


def remove_labels_patch(labels: Mapping[str, str], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Each label tested for the value the plan saw, then removed: a label changed meanwhile fails the patch."""
    ops: list[dict[str, Any]] = []
    for key in keys:
        path = "/metadata/labels/" + key.replace("~", "~0").replace("/", "~1")
        ops += [{"op": "test", "path": path, "value": labels[key]}, {"op": "remove", "path": path}]
    return ops


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 1.0) -> bool:
    """Poll `check` until it holds or `timeout` seconds pass (bounded: at most timeout/interval + 1 reads)."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
