"""The survey's findings: each a stable code, the nodes and workloads it concerns, what was seen, and
the fix in one sentence. One function per code; docs/survey.md says what to do about each, and
tests/test_survey_findings.py holds a test per code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.base.cuda import driver_table, format_version, parse_version
from gpu_placement.base.timestamps import parse_time
from gpu_placement.decide.bypass import Webhook, bypass_reasons
from gpu_placement.decide.kubefilters import KubeNode, affinity_matches, tolerates
from gpu_placement.decide.requirements import Requirements
from gpu_placement.decide.rules import DRIVER_TOO_OLD, driver_fit
from gpu_placement.facts.nodes import NodeFacts
from gpu_placement.facts.soak import DONE
from gpu_placement.survey.inventory import NO_POOL, UNMANAGED, NodeSurvey
from gpu_placement.survey.workloads import Workload, workload_of

__all__ = ["CODES", "Context", "Finding", "find_all"]

UNMANAGED_NODE = "UnmanagedNode"
HAND_SET_LABELS = "HandSetLabels"
GPUS_NOT_PUBLISHED = "GpusNotPublished"
DRIVER_SKEW = "DriverSkew"
DRIVER_TOO_OLD_FOR_WORKLOADS = "DriverTooOldForWorkloads"
OPERATOR_POD_RESTARTS = "OperatorPodRestarts"
UNTAINTED_GPU_NODE = "UntaintedGpuNode"
UNTOLERATED_TAINT = "UntoleratedTaint"
SELECTOR_MATCHES_NO_GPU_NODE = "SelectorMatchesNoGpuNode"
BYPASSED_GPU_PLACEMENT = "BypassedGpuPlacement"
GPU_USE_WITHOUT_QUOTA = "GpuUseWithoutQuota"
CODES = (UNMANAGED_NODE, HAND_SET_LABELS, GPUS_NOT_PUBLISHED, DRIVER_SKEW, DRIVER_TOO_OLD_FOR_WORKLOADS,
         OPERATOR_POD_RESTARTS, UNTAINTED_GPU_NODE, UNTOLERATED_TAINT, SELECTOR_MATCHES_NO_GPU_NODE,
         BYPASSED_GPU_PLACEMENT, GPU_USE_WITHOUT_QUOTA)

RESTART_WINDOW_SECONDS = 86400.0  # a restart older than a day is history, not a node that keeps failing
_CONDITION_TAINTS = "node.kubernetes.io/"  # not-ready, unreachable, unschedulable, pressure: the node's state
_SHOWN = 8  # names listed in a sentence before "and N more"


@dataclass(slots=True, frozen=True)
class Finding:
    code: str
    what: str  # what was seen, with the figures
    fix: str  # one sentence
    nodes: tuple[str, ...] = ()
    workloads: tuple[str, ...] = ()  # NS/KIND/NAME
    labels: tuple[str, ...] = ()  # the label keys it is about, all of them (HandSetLabels)

    def json(self) -> dict[str, Any]:
        return {"code": self.code, "nodes": list(self.nodes), "workloads": list(self.workloads), "fix": self.fix,
                "what": self.what, "labels": list(self.labels)}


@dataclass(slots=True)
class Context:
    """What every check reads."""

    config: Config
    nodes: dict[str, NodeSurvey]  # GPU nodes
    facts: dict[str, NodeFacts]
    kube_nodes: dict[str, KubeNode]  # every node, as kube-scheduler's filters see it
    workloads: list[Workload]
    requirements: Callable[[dict[str, Any]], Requirements]
    pods: list[dict[str, Any]]  # every pod
    namespaces: dict[str, dict[str, Any]]
    quotas: list[dict[str, Any]]  # ResourceQuota objects
    deployed: bool  # gpu-placement runs in the cluster: pods that went around it are findings
    webhook: Webhook | None = None
    now: float = field(default_factory=time.time)


def find_all(ctx: Context) -> list[Finding]:
    found: list[Finding] = []
    for check in _CHECKS:
        found.extend(check(ctx))
    return found


def _verb(items: tuple[str, ...] | list[str], one: str, many: str) -> str:
    return one if len(items) == 1 else many


def _names(items: Iterable[str]) -> str:
    items = list(items)
    shown = ", ".join(items[:_SHOWN])
    return shown + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


# -- nodes ---------------------------------------------------------------------------------------
def _unmanaged(ctx: Context) -> list[Finding]:
    nodes = [node for node in ctx.nodes.values() if node.management == UNMANAGED and node.publishes]
    if not nodes:
        return []
    parts = []
    for node in nodes:
        how = f"{node.gpus}x {node.product}, driver {node.driver or 'unknown'}, published by {node.allocation}"
        if node.hand_labels:
            how += f", {len(node.hand_labels)} GPU labels set by {_writers(node)}"
        parts.append(f"{node.name} ({how})")
    return [Finding(UNMANAGED_NODE, f"GPUs allocatable with no GPU Operator component on the node: {'; '.join(parts)}",
                    "Move them to the managed stack one node at a time: gpu-placement migrate NODE shows the steps "
                    "and where the node stands, and --apply runs them after saving the node's labels and taints.",
                    tuple(node.name for node in nodes))]


def _writers(node: NodeSurvey) -> str:
    return ", ".join(sorted({writer for writers in node.hand_labels.values() for writer in writers.split(", ")}))


_INLINE_KEYS = 8  # a removal command with more label keys (or nodes) than this is printed by jq, not inline
_HAND_COMMAND = ("gpu-placement survey -o json | jq -r '.findings[] | select(.code == \"HandSetLabels\") | "
                 "\"kubectl label node \\(.nodes | join(\" \")) \\(.labels | map(. + \"-\") | join(\" \"))\"'")


def _hand_labels(ctx: Context) -> list[Finding]:
    """Managed nodes with GPU labels last written by people, one finding per (label set, writers): a pool
    labelled by the same hand once is one finding, however many nodes it has."""
    groups: dict[tuple[tuple[str, ...], str], list[str]] = {}
    for node in ctx.nodes.values():
        if node.management == UNMANAGED or not node.hand_labels:
            continue
        groups.setdefault((tuple(sorted(node.hand_labels)), _writers(node)), []).append(node.name)
    found = []
    for (labels, writers), nodes in sorted(groups.items(), key=lambda item: item[1]):
        if len(labels) <= _INLINE_KEYS and len(nodes) <= _SHOWN:
            command = f"kubectl label node {' '.join(nodes)} {' '.join(k + '-' for k in labels)}"
        else:
            command = f"the command for each group of nodes is printed by {_HAND_COMMAND} (with this survey's flags)"
        these = _verb(nodes, "its", "their")
        found.append(Finding(
            HAND_SET_LABELS,
            f"{_names(nodes)} {_verb(nodes, 'is', 'are')} managed by the GPU Operator, but {len(labels)} of {these} "
            f"GPU labels were last written by {writers}, not by GPU Feature Discovery (through nfd-master) or the "
            f"operator: {_names(labels)}; they stay as set when the GPUs or the driver change",
            f"Remove them so that GPU Feature Discovery and the operator publish them again ({command}); or run "
            "gpu-placement migrate NODE --apply, which saves the way back, then cordons and drains the node (its pods "
            "move elsewhere) before it removes them, and uncordons it once the operator's validator passes.",
            tuple(nodes), labels=labels))
    return found


def _not_published(ctx: Context) -> list[Finding]:
    by_management: dict[str, list[NodeSurvey]] = {}
    for node in ctx.nodes.values():
        if not node.publishes:
            by_management.setdefault(node.management, []).append(node)
    found = []
    for management, nodes in sorted(by_management.items()):
        names = tuple(node.name for node in nodes)
        if management == UNMANAGED:
            fix = ("No device plugin publishes them: migrate the node to the GPU Operator (gpu-placement migrate "
                   "NODE), which runs its device plugin there once the driver validates.")
        else:
            fix = (f"The operator's device plugin has not registered them: kubectl -n {ctx.config.validator.namespace} "
                   "get pods -o wide --field-selector spec.nodeName=NODE shows which operand is not Ready, and the "
                   "validator's failing init container says why (driver, toolkit or CUDA validation).")
        found.append(Finding(GPUS_NOT_PUBLISHED, "GPUs are present (nvidia.com/gpu.present or NFD's NVIDIA PCI "
                             "label) but no GPU resource is allocatable and no DRA driver publishes devices on "
                             f"{_names(names)} ({management})", fix, names))
    return found


def _driver_skew(ctx: Context) -> list[Finding]:
    """Settled nodes (rollout state done) of one pool on different drivers; nodes without a pool are
    compared per GPU product. Nodes the upgrade controller is moving, or soaking, are a rollout."""
    groups: dict[str, list[NodeSurvey]] = {}
    for node in ctx.nodes.values():
        if node.driver and node.rollout == DONE:
            key = f"pool {node.pool}" if node.pool != NO_POOL else f"{node.product} nodes without a pool"
            groups.setdefault(key, []).append(node)
    found = []
    for group, nodes in sorted(groups.items()):
        versions: dict[str, list[str]] = {}
        for node in nodes:
            versions.setdefault(node.driver or "", []).append(node.name)
        if len(versions) < 2:
            continue
        ranked = sorted(versions, key=parse_version, reverse=True)
        seen = "; ".join(f"{version} on {_names(versions[version])}" for version in ranked)
        unmanaged = [node.name for node in nodes if node.management == UNMANAGED]
        extra = (f" {_names(unmanaged)} {'is' if len(unmanaged) == 1 else 'are'} not managed by the GPU Operator: "
                 "gpu-placement migrate NODE brings each under it first.") if unmanaged else ""
        found.append(Finding(
            DRIVER_SKEW, f"{group} runs {len(versions)} driver versions with no rollout under way: {seen}",
            f"Bring the pool to one driver (the GPU Operator's ClusterPolicy spec.driver.version, rolled out by its "
            f"upgrade controller node by node); until then pods land on {ranked[-1]} or {ranked[0]} by chance.{extra}",
            tuple(sorted(node.name for node in nodes))))
    return found


def _driver_too_old(ctx: Context) -> list[Finding]:
    """Nodes a GPU workload can be placed on (its selection, its GPU resources) whose driver cannot run
    what the workload's images and annotations need, as the placement rules read them."""
    by_nodes: dict[tuple[tuple[str, ...], str], list[str]] = {}
    by_running: dict[str, list[str]] = {}  # workload -> too-old nodes its pods run on now
    # Workloads repeat a few selections and needs, nodes a few drivers: each verdict is worked out once.
    too_old_for: dict[tuple[bytes, Requirements], list[str]] = {}
    for workload in ctx.workloads:
        pod = workload.pod or {}
        req = ctx.requirements(pod)
        if req.error is not None or not (req.image_cuda or req.cuda or req.min_driver):
            continue
        spec = pod.get("spec") or {}
        selection = orjson.dumps([spec.get("nodeSelector"), spec.get("affinity")], option=orjson.OPT_SORT_KEYS)
        too_old = too_old_for.get((selection, req))
        if too_old is None:
            too_old = too_old_for[(selection, req)] = _too_old(ctx, _candidates(ctx, pod, req), req)
        if too_old:
            running = sorted({str((p.get("spec") or {}).get("nodeName")) for p in workload.pods
                              if (p.get("spec") or {}).get("nodeName") in too_old})
            for name in running:
                by_running.setdefault(workload.ref, []).append(name)
            need = req.image_cuda.describe() if req.image_cuda else (
                f"CUDA >= {format_version(req.cuda)} ({req.cuda_source})" if req.cuda else
                f"driver >= {format_version(req.min_driver)} ({n.ANN_MIN_DRIVER})" if req.min_driver else "")
            by_nodes.setdefault((tuple(too_old), need), []).append(workload.ref)
    found = []
    for (nodes, need), workloads in sorted(by_nodes.items()):
        on: dict[str, list[str]] = {}  # each driver with its nodes: which node runs which, never by position
        for name in nodes:
            on.setdefault(f"{ctx.nodes[name].driver or 'unknown'} (CUDA {ctx.nodes[name].max_cuda or '?'})",
                          []).append(name)
        drivers = next(iter(on)) if len(on) == 1 else "; ".join(
            f"{driver} on {_names(names)}" for driver, names in sorted(on.items(), key=lambda i: _version(i[0])))
        wanted = _driver_for(need)
        running = [f"{ref} runs on {', '.join(by_running[ref])} now" for ref in workloads if ref in by_running]
        now = f"; {'; '.join(running)} (placed before gpu-placement judged it: its CUDA calls may fail)" \
            if running else ""
        found.append(Finding(
            DRIVER_TOO_OLD_FOR_WORKLOADS,
            f"{_names(workloads)} {_verb(workloads, 'needs', 'need')} {need}; {_names(nodes)} "
            f"{_verb(nodes, 'is', 'are')} in their node selection and {_verb(nodes, 'offers', 'offer')} their GPU "
            f"resources, but {_verb(nodes, 'runs', 'run')} driver "
            f"{drivers}: gpu-placement keeps their pods off (DriverTooOld), so that capacity is lost to "
            f"them{now}",
            f"Upgrade the driver on these nodes{wanted}, or select them out of these workloads' node selection.",
            nodes, tuple(workloads)))
    return found


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(parse_version(text.split(" ", 1)[0]))
    except ValueError:
        return ()


def _too_old(ctx: Context, names: list[str], req: Requirements) -> list[str]:
    """Of these nodes, those whose driver cannot give what `req` needs (one verdict per kind of driver)."""
    verdicts: dict[tuple[Any, ...], bool] = {}
    found = []
    for name in names:
        facts = ctx.facts[name]
        key = (facts.driver, facts.max_cuda, facts.compute, facts.product)
        if key not in verdicts:
            rejection = driver_fit(facts, req)
            verdicts[key] = rejection is not None and rejection.code == DRIVER_TOO_OLD
        if verdicts[key]:
            found.append(name)
    return found


def _driver_for(need: str) -> str:
    """`to 550.54.14 or later` for a need that names a CUDA version, else ""."""
    marker = "CUDA >= "
    if marker not in need:
        return ""
    text = need.split(marker, 1)[1].split(" ", 1)[0]
    try:
        floor = driver_table().min_driver(parse_version(text))
    except ValueError:
        return ""
    return f" to {format_version(floor)} or later (CUDA {text})" if floor else ""


def _candidates(ctx: Context, pod: Mapping[str, Any], req: Requirements) -> list[str]:
    """GPU nodes the workload's node selection admits and that offer its GPU resources (or DRA devices)."""
    spec = pod.get("spec") or {}
    found = []
    for name in sorted(ctx.nodes):
        facts = ctx.facts.get(name)
        kube = ctx.kube_nodes.get(name)
        if facts is None or kube is None or not affinity_matches(spec, kube):
            continue
        offers = all(facts.capacity.get(res, 0) > 0 or res in req.dra_resources for res, _ in req.gpus)
        if (req.gpus and offers) or (req.claims and facts.dra_devices):
            found.append(name)
    return found


def _restarts(ctx: Context) -> list[Finding]:
    """The operator's driver and validator pods that restarted in the last day, or wait in CrashLoopBackOff."""
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for pod in ctx.pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (meta.get("namespace") or "default") != ctx.config.validator.namespace or not spec.get("nodeName"):
            continue
        labels = meta.get("labels") or {}
        if ctx.config.rollout.driver_selector.matches(labels) or labels.get("app") == "nvidia-driver-daemonset":
            component = "driver"
        elif ctx.config.validator.selector.matches(labels):
            component = "validator"
        else:
            continue
        restarted = _recent_restarts(pod, ctx.now)
        if restarted:
            nodes, pods = groups.setdefault(component, ([], []))
            nodes.append(spec["nodeName"])
            pods.append(f"{meta.get('namespace')}/Pod/{meta.get('name')} ({restarted})")
    found = []
    for component, (nodes, pods) in sorted(groups.items()):
        if component == "driver":
            fix = ("Read why the driver container stops (kubectl -n NS logs POD -c nvidia-driver-ctr --previous): most "
                   "often a driver already installed on the host, no kernel headers for the node's kernel, or Secure "
                   "Boot; the node takes no GPU pods until its validator is Ready again.")
        else:
            fix = ("Read the failing check (kubectl -n NS logs POD -c <init container> --previous: driver-validation, "
                   "toolkit-validation, cuda-validation, plugin-validation): the validator restarts while a check "
                   "fails, and the node takes no GPU pods until it passes.")
        found.append(Finding(OPERATOR_POD_RESTARTS, f"GPU Operator {component} pods restarting: {_names(pods)}", fix,
                             tuple(sorted(set(nodes))), tuple(p.split(" (", 1)[0] for p in pods)))
    return found


def _recent_restarts(pod: Mapping[str, Any], now: float) -> str:
    status = pod.get("status") or {}
    total, last, crashing = 0, None, False
    for container in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]:
        if not isinstance(container, dict):
            continue
        count = container.get("restartCount")
        total += count if isinstance(count, int) and count > 0 else 0
        finished = parse_time(((container.get("lastState") or {}).get("terminated") or {}).get("finishedAt"))
        last = finished if finished is not None and (last is None or finished > last) else last
        crashing = crashing or ((container.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
    if crashing:
        return f"{total} restarts, in CrashLoopBackOff"
    if total and (last is None or now - last < RESTART_WINDOW_SECONDS):
        return f"{total} restarts" + (f", the last {int((now - last) // 60)} minutes ago" if last is not None else "")
    return ""


# -- taints and selection --------------------------------------------------------------------------
def _blocking_taints(kube: KubeNode) -> list[Mapping[str, Any]]:
    return [t for t in kube.taints if t.get("effect") in n.BLOCKING_EFFECTS and not str(t.get("key", "")).startswith(
        _CONDITION_TAINTS)]


def _untainted(ctx: Context) -> list[Finding]:
    """GPU nodes that publish GPUs with no taint keeping other pods off: every CPU pod may land there."""
    nodes = [name for name, node in ctx.nodes.items() if node.publishes and name in ctx.kube_nodes
             and not _blocking_taints(ctx.kube_nodes[name])]
    if not nodes:
        return []
    untainted = set(nodes)
    cpu = sorted({_ref(pod) for pod in ctx.pods if (pod.get("spec") or {}).get("nodeName") in untainted
                  and _runs(pod) and not ctx.requirements(pod).wants_gpu and not _daemon(pod)
                  and (pod.get("metadata") or {}).get("namespace") != ctx.config.validator.namespace})
    toleration = ctx.config.gpu_tolerations[0] if ctx.config.gpu_tolerations else {"key": n.GPU_RESOURCE}
    key = toleration.get("key") or n.GPU_RESOURCE
    effect = toleration.get("effect") or "NoSchedule"
    value = "" if toleration.get("operator") == "Exists" or not toleration.get("value") else toleration["value"]
    taint = f"{key}={value}:{effect}" if value else f"{key}:{effect}"
    running = f"; CPU workloads there now: {_names(cpu)}" if cpu else ""
    return [Finding(UNTAINTED_GPU_NODE, f"{_names(nodes)} {_verb(nodes, 'publishes', 'publish')} GPUs but "
                    f"{_verb(nodes, 'carries', 'carry')} no NoSchedule or NoExecute taint, so any CPU pod may take the "
                    f"CPU and memory the GPUs' pods need{running}",
                    f"Taint them (kubectl taint node NODE {taint}): gpu-placement gives GPU pods the matching "
                    "toleration (gpuTolerations); CPU pods already there stay until they are moved.",
                    tuple(nodes), tuple(cpu))]


def _untolerated(ctx: Context) -> list[Finding]:
    """Taints on GPU nodes that neither the configuration (gpuTolerations, pools) nor any GPU workload
    tolerates: those nodes take no GPU pod."""
    tolerations = [*ctx.config.gpu_tolerations, *(t for pool in ctx.config.pools.values() for t in pool.tolerations)]
    for workload in ctx.workloads:
        tolerations.extend(t for t in ((workload.pod or {}).get("spec") or {}).get("tolerations") or ()
                           if isinstance(t, dict))
    by_taint: dict[str, list[str]] = {}
    for name in ctx.nodes:
        kube = ctx.kube_nodes.get(name)
        for taint in _blocking_taints(kube) if kube is not None else ():
            if not any(tolerates(t, taint) for t in tolerations):
                value = f"={taint['value']}" if taint.get("value") else ""
                by_taint.setdefault(f"{taint.get('key')}{value}:{taint.get('effect')}", []).append(name)
    return [Finding(UNTOLERATED_TAINT, f"taint {taint} on {_names(nodes)}: no GPU workload and no toleration of the "
                    "configuration (gpuTolerations, pools) tolerates it, so these GPUs take no pod",
                    f"If it was left behind (maintenance, a test), remove it: kubectl taint node NODE "
                    f"{taint.split('=', 1)[0].split(':', 1)[0]}-; if it is meant, add its toleration to the pool in "
                    "gpu-placement's configuration (pools.NAME.tolerations).", tuple(nodes))
            for taint, nodes in sorted(by_taint.items())]


def _selects_nothing(ctx: Context) -> list[Finding]:
    found = []
    gpu_nodes = [ctx.kube_nodes[name] for name in sorted(ctx.nodes) if name in ctx.kube_nodes]
    for workload in ctx.workloads:
        spec = (workload.pod or {}).get("spec") or {}
        if spec.get("nodeName") or any(affinity_matches(spec, node) for node in gpu_nodes):
            continue
        selection = _selection(spec)
        have = _values(spec, gpu_nodes)
        found.append(Finding(
            SELECTOR_MATCHES_NO_GPU_NODE,
            f"{workload.ref} asks for a GPU, but its node selection ({selection}) matches none of the "
            f"{len(gpu_nodes)} GPU nodes{have}; its pods stay Pending",
            "Change the selection to labels the GPU nodes have (kubectl get nodes -L KEY shows them), or label the "
            "nodes it means.", (), (workload.ref,)))
    return found


def _selection(spec: Mapping[str, Any]) -> str:
    parts = [f"nodeSelector {k}={v}" for k, v in sorted((spec.get("nodeSelector") or {}).items())]
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or ():
        exprs = [f"{e.get('key')} {e.get('operator')} {','.join(map(str, e.get('values') or ()))}".strip()
                 for e in [*(term.get("matchExpressions") or ()), *(term.get("matchFields") or ())]]
        parts.append("affinity " + " & ".join(exprs))
    return "; ".join(parts) or "none"


def _values(spec: Mapping[str, Any], nodes: list[KubeNode]) -> str:
    """What the GPU nodes have for the selector's keys that no GPU node matches: the mismatch at a glance."""
    selector = spec.get("nodeSelector") or {}
    keys = sorted(k for k, v in selector.items() if not any(node.labels.get(k) == v for node in nodes))
    shown = []
    for key in keys[:3]:
        values = sorted({node.labels[key] for node in nodes if key in node.labels})
        shown.append(f"GPU nodes have {key}: {', '.join(values[:5]) + (' ...' if len(values) > 5 else '')}"
                     if values else f"no GPU node has {key}")
    return f" ({'; '.join(shown)})" if shown else ""


# -- gpu-placement's own reach ---------------------------------------------------------------------
def _bypassed(ctx: Context) -> list[Finding]:
    if not ctx.deployed:
        return []
    by_reason: dict[str, list[str]] = {}
    for workload in ctx.workloads:
        for pod in workload.pods:
            namespace = (pod.get("metadata") or {}).get("namespace") or "default"
            labels = ((ctx.namespaces.get(namespace) or {}).get("metadata") or {}).get("labels") or {}
            reasons = bypass_reasons(pod, ctx.config, True, ctx.webhook, labels)
            if reasons:
                by_reason.setdefault(_bypass_kind(reasons[0]), []).append(workload.ref)
                break
    fixes = {
        "exempt": "Move GPU workloads out of exempt namespaces (exemptNamespaces), which the webhook never sees.",
        "opted out": f"Opt the namespaces in (kubectl label namespace NS {n.LABEL_ENABLED}=true, or remove the "
                     "false), then recreate the pods (kubectl rollout restart) so the webhook admits them.",
        "scheduler": f"Remove their schedulerName or set it to {ctx.config.scheduler_name}, then recreate the pods: "
                     "the webhook keeps any scheduler a pod names but default-scheduler.",
        "not admitted": "Recreate the pods (kubectl rollout restart, or delete them) now that the webhook answers, so "
                        "it admits them and gpu-placement's extender places them.",
    }
    return [Finding(BYPASSED_GPU_PLACEMENT, f"GPU pods that went around gpu-placement ({kind}): "
                    f"{_names(sorted(set(refs)))}", fixes[kind], (), tuple(sorted(set(refs))))
            for kind, refs in sorted(by_reason.items())]


def _bypass_kind(reason: str) -> str:
    if "is exempt" in reason:
        return "exempt"
    if "opted" in reason:
        return "opted out"
    if reason.startswith("its schedulerName"):
        return "scheduler"
    return "not admitted"


def _no_quota(ctx: Context) -> list[Finding]:
    limited = {str((q.get("metadata") or {}).get("namespace") or "default") for q in ctx.quotas
               if any(_gpu_quota_key(key, ctx.config) for key in ((q.get("spec") or {}).get("hard") or {}))}
    use: dict[str, dict[str, int]] = {}
    refs: dict[str, list[str]] = {}
    for workload in ctx.workloads:
        for pod in workload.pods:
            for resource, count in ctx.requirements(pod).gpus:
                use.setdefault(workload.namespace, {}).setdefault(resource, 0)
                use[workload.namespace][resource] += count
            refs.setdefault(workload.namespace, []).append(workload.ref)
    found = []
    for namespace in sorted(use):
        annotations = ((ctx.namespaces.get(namespace) or {}).get("metadata") or {}).get("annotations") or {}
        if namespace in limited or n.ANN_QUOTA in annotations:
            continue
        used = ",".join(f"{res}={count}" for res, count in sorted(use[namespace].items()))
        found.append(Finding(
            GPU_USE_WITHOUT_QUOTA, f"namespace {namespace} uses {used.replace(',', ', ')} with no GPU quota "
            f"({n.ANN_QUOTA} or a ResourceQuota on GPU resources): nothing stops it taking every GPU",
            f"Give it a quota at least as large as what it uses now: kubectl annotate namespace {namespace} "
            f"{n.ANN_QUOTA}={used} (gpu-placement mirrors it into a ResourceQuota the API server enforces).",
            (), tuple(sorted(set(refs[namespace])))))
    return found


def _gpu_quota_key(key: str, config: Config) -> bool:
    resource = key.removeprefix("requests.").removeprefix("limits.")
    return config.is_gpu_resource(resource) or key.endswith(".deviceclass.resource.k8s.io/devices")


# -- pods ------------------------------------------------------------------------------------------
def _ref(pod: Mapping[str, Any]) -> str:
    kind, name = workload_of(pod)
    return f"{(pod.get('metadata') or {}).get('namespace') or 'default'}/{kind}/{name}"


def _runs(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _daemon(pod: Mapping[str, Any]) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in (pod.get("metadata") or {}).get("ownerReferences") or ()
               if isinstance(o, dict))


_CHECKS: tuple[Callable[[Context], list[Finding]], ...] = (
    _unmanaged, _hand_labels, _not_published, _driver_skew, _driver_too_old, _restarts, _untainted, _untolerated,
    _selects_nothing, _bypassed, _no_quota)
