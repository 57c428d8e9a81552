"""`gpu-placement migrate NODE`: one node from hand-installed drivers (or hand-set labels) to the GPU
Operator's managed stack, planned and checked step by step, applied with `--apply`.

Every step's state is read from the cluster each time, never from a local record: rerunning the
command says which steps are done and what the next one waits for. The one local thing is the way
back, `<dir>/<node>.json` (gpu_placement/survey/wayback.py): written before anything changes, it then
records each change before it is made (what was there, what the migration wrote) and whether the
migration is under way, complete or undone. `gpu-placement migrate NODE --undo` puts back what the
migration changed and nothing else.

The steps, in order (`save` comes first so that nothing changes without a way back; it reads only):
1. save      the node's labels, taints and spec.unschedulable to the file
2. cordon    kubectl cordon
3. drain     kubectl drain: evictions, which the API server refuses with 429 while a
             PodDisruptionBudget allows no disruption (pkg/registry/core/pod/storage/eviction.go);
             DaemonSet pods stay, pods without a controller are refused (kubectl pkg/drain/filters.go)
4. labels    remove the GPU labels people wrote (managedFields: gpu_placement/survey/labels.py)
5. plugin    keep a hand-installed device plugin off the node: an affinity on its DaemonSet leaving out
             nodes where the operator deploys its own (a person's step when the DaemonSet cannot be read)
6. operator  remove nvidia.com/gpu.deploy.operands=false; the operator then sets
             nvidia.com/gpu.present=true from NFD's PCI label and its gpu.deploy.* labels, and its
             DaemonSets start there (NVIDIA/gpu-operator controllers/state_manager.go)
7. validator wait until the operator's validator pod on the node is Ready
8. uncordon  kubectl uncordon (left cordoned when it was cordoned before the migration)
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.facts.budgets import budget_from_json
from gpu_placement.survey.inventory import NFD_NVIDIA_PCI, OPERANDS_LABEL, gpu_signs, is_device_plugin, is_operand
from gpu_placement.survey.labels import label_writers
from gpu_placement.survey.wayback import COMPLETE, UNDONE, VERSION, MigrateError, Record, inferred

__all__ = ["DEVICE_PLUGIN_LABEL", "MigrateError", "NodeState", "NotMigratable", "Step", "backup_patch", "eviction",
           "excludes_operator_nodes", "needed", "node_path", "plan", "preconditions", "refusal", "remove_labels_patch",
           "template_affinity", "wait_until", "with_exclusion"]

DONE, NEXT, WAITING, BLOCKED, PENDING, MANUAL = "done", "next", "waiting", "blocked", "pending", "manual"
_MIRROR = "kubernetes.io/config.mirror"
_TERMINAL = ("Succeeded", "Failed")


DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"  # where the GPU Operator deploys its device plugin


class NotMigratable(MigrateError):
    """Not a node to migrate (none of that name, or no GPU): bad input, nothing read further or changed."""


@dataclass(slots=True)
class NodeState:
    """What the plan reads: the Node, the pods bound to it, the budgets of their namespaces, whether the
    GPU Operator is installed (None: unknown), the saved way back, and the DaemonSets of the foreign
    device plugins on the node (NS/NAME -> the object; None: it could not be read)."""

    node: dict[str, Any]
    pods: list[dict[str, Any]]
    budgets: list[dict[str, Any]]
    operator_installed: bool | None
    backup: Record | None
    config: Config
    backup_path: Path = field(default_factory=Path)
    daemonsets: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    timeout: float = 600.0  # --timeout: what the kubectl commands shown wait

    @property
    def record(self) -> Record | None:
        """The way back of this migration: saved for this node object, and not put back already. A
        first-format one comes with the changes worked out (wayback.inferred), so that what is recorded
        next adds to them."""
        backup = self.backup
        if backup is None or backup.uid != self.uid or backup.state == UNDONE:
            return None
        return backup if backup.version >= VERSION else replace(backup, version=VERSION,
                                                                changes=inferred(backup, self.node))

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

    def foreign_plugins(self) -> list[str]:
        return sorted(_key(pod) for pod in self.pods if _running(pod) and is_device_plugin(pod, self.config))

    def plugin_daemonsets(self) -> dict[str, list[str]]:
        """NS/NAME of the DaemonSet behind each foreign device plugin pod (NS/NAME with "" as the name when
        no DaemonSet controls it) -> those pods."""
        found: dict[str, list[str]] = {}
        for pod in self.pods:
            if _running(pod) and is_device_plugin(pod, self.config):
                owner = _controller(pod) or {}
                name = str(owner.get("name") or "") if owner.get("kind") == "DaemonSet" else ""
                found.setdefault(f"{_meta(pod).get('namespace') or 'default'}/{name}", []).append(_key(pod))
        return found


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
    """The first format of the way back (wayback.py reads it still), and what the save step's command
    shows for a person saving by hand: the JSON patch of this node's labels, taints and schedulable
    state, the same file
    `kubectl get node NODE -o json | jq '[{op:"test",path:"/metadata/uid",value:.metadata.uid},
    {op:"add",path:"/metadata/labels",value:.metadata.labels},{op:"add",path:"/spec/taints",
    value:(.spec.taints // [])},{op:"add",path:"/spec/unschedulable",value:(.spec.unschedulable // false)}]'`
    writes. `add` replaces a member that exists and creates one that does not (RFC 6902 4.1)."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    return [{"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
            {"op": "add", "path": "/metadata/labels", "value": dict(meta.get("labels") or {})},
            {"op": "add", "path": "/spec/taints", "value": list(spec.get("taints") or [])},
            {"op": "add", "path": "/spec/unschedulable", "value": bool(spec.get("unschedulable"))}]


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
    backup = state.record
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
    steps.append(_plugin_step(state))
    steps += [
        Step("operator", "let the GPU Operator take the node",
             f"kubectl label node {name} {OPERANDS_LABEL}-" if disabled else
             f"(nothing to do: wait for the operator's pods; kubectl -n {config.validator.namespace} get pods -o wide "
             f"--field-selector spec.nodeName={name})", DONE if managed else PENDING,
             f"its pods on the node: {', '.join(operands)}" if managed else _operator_wait(state, disabled)),
        Step("validator", "wait for the operator's validator to pass on the node",
             f"kubectl -n {config.validator.namespace} wait pod -l {config.validator.selector.text} --field-selector "
             f"spec.nodeName={name} --for=condition=Ready --timeout={_duration(state.timeout)}",
             DONE if validated else PENDING,
             f"{_key(validator)} is Ready" if validated and validator is not None else
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


# The expression that leaves out the nodes where the GPU Operator deploys its own device plugin.
_EXCLUDE = {"key": DEVICE_PLUGIN_LABEL, "operator": "NotIn", "values": ["true"]}


def _excludes(expression: Any) -> bool:
    return isinstance(expression, dict) and expression.get("key") == DEVICE_PLUGIN_LABEL and (
        expression.get("operator") == "DoesNotExist" or
        (expression.get("operator") == "NotIn" and "true" in (expression.get("values") or ())))


def _terms(affinity: Any) -> list[Any]:
    required = (((affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
                or {}) if isinstance(affinity, dict) else {}
    return list(required.get("nodeSelectorTerms") or ())


def excludes_operator_nodes(affinity: Any) -> bool:
    """Whether a pod template's affinity keeps its pods off every node labelled device-plugin=true: each of
    its required terms (ORed) leaves them out."""
    terms = _terms(affinity)
    return bool(terms) and all(isinstance(t, dict) and any(_excludes(e) for e in t.get("matchExpressions") or ())
                               for t in terms)


def with_exclusion(affinity: Any) -> dict[str, Any]:
    """The affinity with the exclusion added to each required term (so it is ANDed with what each term
    selects), or one term of it alone; everything else in it kept."""
    new = copy.deepcopy(affinity) if isinstance(affinity, dict) else {}
    required = new.setdefault("nodeAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = [t for t in _terms(new) if isinstance(t, dict)] or [{}]
    required["nodeSelectorTerms"] = [
        t if any(_excludes(e) for e in t.get("matchExpressions") or ()) else
        {**t, "matchExpressions": [*(t.get("matchExpressions") or ()), dict(_EXCLUDE)]} for t in terms]
    return new


def template_affinity(daemonset: Mapping[str, Any]) -> Any:
    return (((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}).get("affinity")


def _plugin_step(state: NodeState) -> Step:
    """A device plugin not of the operator on the node: its DaemonSet gets an affinity leaving out the nodes
    where the operator deploys its own, so that its pod leaves when the operator takes the node (after the
    operator step: until then the node has no nvidia.com/gpu.deploy.device-plugin=true) and never comes back."""
    title = "keep a hand-installed device plugin off the node"
    plugins = state.plugin_daemonsets()
    if not plugins:
        return Step("plugin", title, "(none runs there)", DONE, "no device plugin but the operator's runs there")
    for key, pods in sorted(plugins.items()):
        namespace, daemonset = key.split("/", 1)
        obj = state.daemonsets.get(key) if daemonset else None
        why = (f"{', '.join(pods)} runs there: with the operator's device plugin beside it, two plugins register the "
               "same GPUs")
        if obj is None:  # a person's step: no DaemonSet behind it, or one this user may not read
            patch = orjson.dumps([{"op": "add", "path": "/spec/template/spec/affinity", "value": with_exclusion(None)}])
            what = (f"{why}. Give its DaemonSet an affinity that leaves out nodes where the operator deploys its own "
                    "(this one for all nodes, once; check the DaemonSet has no affinity it would replace), then rerun"
                    if daemonset else f"{why}, and no DaemonSet controls it: delete it, then rerun")
            return Step("plugin", title, f"kubectl -n {namespace} patch daemonset {daemonset or 'NAME'} --type json "
                        f"-p '{patch.decode()}'" if daemonset else f"kubectl -n {namespace} delete pod "
                        f"{pods[0].split('/', 1)[1]}", PENDING, what, automatic=False)
        affinity = template_affinity(obj)
        if not excludes_operator_nodes(affinity):
            patch = orjson.dumps([{"op": "add", "path": "/spec/template/spec/affinity",
                                   "value": with_exclusion(affinity)}])
            return Step("plugin", title, f"kubectl -n {namespace} patch daemonset {daemonset} --type json -p "
                        f"'{patch.decode()}'", PENDING,
                        f"{why}. Its DaemonSet gets an affinity that leaves out the nodes where the operator deploys "
                        f"its own ({DEVICE_PLUGIN_LABEL}=true), added to each term of any affinity it has: its pod "
                        "leaves this node when the operator takes it, and stays on the others (a change of its pod "
                        "template: a RollingUpdate DaemonSet restarts them once)")
        if state.labels.get(DEVICE_PLUGIN_LABEL) == "true":
            return Step("plugin", title, f"kubectl -n {namespace} wait pod/{pods[0].split('/', 1)[1]} --for=delete "
                        f"--timeout={_duration(state.timeout)}", PENDING,
                        f"affinity in place on daemonset {key}, waiting for its pod to leave: the DaemonSet "
                        f"controller deletes {', '.join(pods)} now that the operator deploys its own plugin here")
    return Step("plugin", title, "(nothing to do now)", DONE,
                f"affinity in place on daemonset {', '.join(sorted(plugins))}: {', '.join(state.foreign_plugins())} "
                f"leaves the node when the operator labels it {DEVICE_PLUGIN_LABEL}=true (after the operator step)")


def _drain_step(state: NodeState, complete: bool) -> Step:
    name = state.name
    step = Step("drain", "evict its pods, honouring PodDisruptionBudgets",
                f"kubectl drain {name} --ignore-daemonsets --delete-emptydir-data --timeout={_duration(state.timeout)}")
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
    evicted = f"{len(notes)} {'pod' if len(notes) == 1 else 'pods'} to evict: {', '.join(notes)}" if notes else ""
    if blocked:
        step.detail = "; ".join(blocked) + (f"; then {evicted}" if evicted else "")
    else:
        step.detail = evicted or "no pod to evict (DaemonSet pods stay)"
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


def _duration(seconds: float) -> str:
    """A Go duration as kubectl reads it: 10m, 1h, 90s."""
    whole = max(1, round(seconds))
    return f"{whole // 3600}h" if whole % 3600 == 0 else f"{whole // 60}m" if whole % 60 == 0 else f"{whole}s"


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
    record = state.record
    if record is not None and record.state == COMPLETE:
        return (f"{state.name}: migration complete (recorded in {record.path}, {record.ended or 'at its end'}); "
                f"the way back: gpu-placement migrate {state.name} --undo --backup-dir {record.path.parent}")
    if record is not None or state.labels.get(OPERANDS_LABEL) == "false" or state.hand_labels():
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
