"""`explain`: what the webhook would change and decide for a pod, then every node's verdict and score.

The nodes go through kube-scheduler's own filters first (`kubefilters`: node name, cordon, taints,
node selection, resource counts), as they do in the cluster: the extender is asked only about the nodes
that pass them, so "would go to" names a node kube-scheduler could pick, and the message it would
write into the pod's PodScheduled condition is predicted from both stages' reasons.
"""

from __future__ import annotations

import base64
import copy
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from starlette.applications import Starlette

from gpu_placement.app.assembly import Core
from gpu_placement.base.names import LABEL_REFUSED
from gpu_placement.decide.bypass import Route, new_pod_route, node_name_lines, scheduler_route
from gpu_placement.decide.kubefilters import KubeNodes, Verdict, affinity_matches, fit_error, unmodelled
from gpu_placement.decide.placement import NodeVerdict
from gpu_placement.decide.preemption import explain_preemption
from gpu_placement.decide.requirements import Requirements
from gpu_placement.decide.rules import cuda_rule, node_readiness
from gpu_placement.facts.cudaneed import why_no_cuda
from gpu_placement.report.tables import VERDICT_HEADER, table, verdict_rows
from gpu_placement.web import asgi
from gpu_placement.web.patching import apply_patch

__all__ = ["Admission", "Context", "Explanation", "admission_review", "admit", "as_json", "explain", "explain_json",
           "explain_pod", "render"]


@dataclass(slots=True)
class Admission:
    patch: list[dict[str, Any]]
    pod: dict[str, Any]  # after the patch
    allowed: bool
    message: str
    warnings: list[str]
    called: bool = True  # False: the webhook never sees this pod (exempt, or its namespace not selected)


def admission_review(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "name": meta.get("name") or "", "operation": "CREATE", "object": pod, "dryRun": True,
        "userInfo": {"username": "gpu-placement-explain"}}}


def admit(webhook: Starlette, pod: dict[str, Any], namespace: str) -> Admission:
    """Mutate then validate, as the API server does; dry run, so no quota is reserved."""
    pod = copy.deepcopy(pod)
    pod.setdefault("metadata", {})["namespace"] = namespace
    status, body = asgi.call(webhook, "POST", "/mutate", orjson.dumps(admission_review(pod, namespace)))
    response = orjson.loads(body).get("response", {}) if status == 200 else {}
    patch = orjson.loads(_b64(response["patch"])) if response.get("patch") else []
    mutated = apply_patch(pod, patch)
    status, body = asgi.call(webhook, "POST", "/validate", orjson.dumps(admission_review(mutated, namespace)))
    verdict = orjson.loads(body).get("response", {}) if status == 200 else {}
    return Admission(patch, mutated, bool(verdict.get("allowed")),
                     (verdict.get("status") or {}).get("message", "") or ("" if status == 200 else body.decode()),
                     list(verdict.get("warnings") or []))


def _b64(text: str) -> bytes:
    return base64.b64decode(text)


_FULL_TABLE_UP_TO = 30  # nodes; past this the output groups rejections (`--all` shows every node)
_CANDIDATES = 10
_SCHEDULER_DEFAULT_TOLERATIONS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


@dataclass(slots=True)
class Context:
    """What `explain` knows besides the view: the node objects kube-scheduler filters on, which
    configuration was used, and notes for people (how a live pod went around gpu-placement, what a
    workload's controller does)."""

    nodes: KubeNodes | None = None  # None: kube-scheduler's filters are not applied, and the output says so
    configuration: str | None = None
    workload: str | None = None  # "Deployment team-a/train (spec.template), 4 replicas"
    notes: tuple[str, ...] = ()
    new: bool = False  # a pod about to be created (a file): its route through the cluster is worked out
    namespaces_seen: bool = True  # False: the namespaces could not be listed (403), so a missing one may exist
    namespace: str | None = None  # how the namespace was chosen, when neither the file nor -n named it
    judged_at: str | None = None  # a snapshot judged at the wall clock, when a verdict depends on it


@dataclass(slots=True)
class Explanation:
    pod: str  # namespace/name
    admission: Admission
    needs: str
    verdicts: list[NodeVerdict]
    req: Requirements
    holds: str | None = None  # a running pod: what it holds, fixed when it was first seen bound
    cuda_rules: dict[str, str] = field(default_factory=dict)  # passing node -> the CUDA rule that lets it run
    context: Context = field(default_factory=Context)
    scheduler: dict[str, Verdict] = field(default_factory=dict)  # nodes kube-scheduler's own filters keep out
    unmodelled: list[str] = field(default_factory=list)  # what the pod asks of kube-scheduler not checked here
    message: str | None = None  # the PodScheduled message kube-scheduler would write when no node passes
    route: Route | None = None  # a new pod: whether the webhook and the extender see it (None: an existing pod)
    node_lines: list[str] = field(default_factory=list)  # spec.nodeName: what happens on that node
    cuda_note: str | None = None  # why no CUDA requirement was inferred from the images, and what to set
    fragmented: list[str] = field(default_factory=list)  # no node has the room, the verified ones do in pieces
    health: list[str] = field(default_factory=list)  # what its kubelet reports Unhealthy, and which device that is

    @property
    def hypothetical(self) -> bool:
        """The extender never sees this pod: its verdicts are what it would decide if it did."""
        return self.route is not None and not self.route.extender

    @property
    def best(self) -> NodeVerdict | None:
        """The first candidate: highest score, then name (kube-scheduler picks among equals at random)."""
        return min((v for v in self.verdicts if v.passed), key=lambda v: (-v.score, v.node), default=None)

    def counts(self) -> Counter[str]:
        return Counter("pass" if v.passed else v.reason.split(":", 1)[0] for v in self.verdicts)


def explain(core: Core, pod: dict[str, Any], namespace: str | None, existing: bool = False,
            context: Context | None = None) -> Explanation:
    """`existing`: the pod is in the view already (`explain pod/NAME`); it is judged as if it were
    being created, so its own quota count, memory and node do not stand in its way."""
    context = context or Context()
    meta = pod.setdefault("metadata", {})
    namespace = namespace or meta.get("namespace") or "default"
    name = meta.get("name") or meta.get("generateName") or "?"
    key = f"{namespace}/{meta.get('name') or ''}"
    holds = _holds(core.view.held(key))
    health = _health(core, pod, namespace)
    if existing:
        core.view.delete_pod(key)
    route = _route_before(core, pod, namespace, context) if context.new else None
    admission = admit(core.webhook_app(), pod, namespace) if route is None or route.webhook else _unseen(pod, namespace)
    req = core.placement.requirements(admission.pod)
    node_lines: list[str] = []
    if route is not None:
        route = scheduler_route(route, admission.pod, core.config, req.wants_gpu)
        if route.node_name:
            node_lines = _named_node(core, route.node_name)
    created = _as_created(admission.pod, existing or (route is not None and route.node_name is not None))
    rejected: dict[str, Verdict] = {}
    prefilter = None
    if context.nodes is not None:
        filtered = context.nodes.filter(created)
        rejected = {node: verdict for node, verdict in filtered.verdicts.items() if verdict is not None}
        prefilter = filtered.prefilter
        rejected.update(_refused_labels(core, req, created, context.nodes, rejected))
    with core.view.lock:
        sent = [node for node in sorted(core.view.nodes) if node not in rejected]
    verdicts = core.placement.explain(req, sent)
    verdicts += [NodeVerdict(node, False, f"{v.plugin}: {v.text}", 0, v.detail) for node, v in rejected.items()]
    with core.view.lock:  # which CUDA rule lets each passing node run the images, where it is not plain
        rules = {v.node: cuda_rule(core.view.nodes[v.node], req) for v in verdicts if v.passed}
    message = None
    if not any(v.passed for v in verdicts):
        reasons = [rejected[v.node].reasons if v.node in rejected else (v.reason,) for v in verdicts]
        message = fit_error(len(verdicts), reasons, prefilter)
    cuda_note = why_no_cuda(admission.pod.get("spec") or {}, core.config.ngc) if req.wants_gpu and \
        req.cuda is None and req.image_cuda is None and req.error is None else None
    found = Explanation(f"{namespace}/{name}", admission, req.describe(), verdicts, req, holds,
                        {node: rule for node, rule in sorted(rules.items()) if rule}, context, rejected,
                        unmodelled(created.get("spec") or {}), message, route, node_lines, cuda_note)
    found.fragmented = _fragmented(core, found)
    found.health = health
    return found


def _refused_labels(core: Core, req: Requirements, pod: dict[str, Any], nodes: KubeNodes,
                    rejected: dict[str, Verdict]) -> dict[str, Verdict]:
    """The nodes kube-scheduler's NodeAffinity keeps out only for the label gpu-placement.io/refused (the pod
    requires it absent: config.refusedNodeLabel), their figures saying so with gpu-placement's own reason for
    the node now: kube-scheduler's message reads "didn't match Pod's node affinity/selector" for them."""
    spec = pod.get("spec") or {}
    labelled = {name: nodes.nodes[name] for name, verdict in rejected.items() if verdict.plugin == "NodeAffinity"
                and LABEL_REFUSED in nodes.nodes[name].labels}
    labelled = {name: node for name, node in labelled.items() if affinity_matches(spec, replace(
        node, labels={k: v for k, v in node.labels.items() if k != LABEL_REFUSED}))}
    if not labelled:
        return {}
    own = {v.node: v.reason for v in core.placement.explain(req, sorted(labelled))}
    lagging = "none now (it passes the node); the label goes with its next patch"
    return {name: replace(rejected[name], detail=f"{LABEL_REFUSED}={node.labels[LABEL_REFUSED]}, gpu-placement's "
                          f"reason: {own.get(name) or lagging}") for name, node in labelled.items()}


def _health(core: Core, pod: dict[str, Any], namespace: str) -> list[str]:
    """The devices the pod's kubelet reports Unhealthy (allocatedResourcesStatus, KEP-4680), found as the
    DeviceTaintRule controller finds them."""
    if not (pod.get("spec") or {}).get("nodeName") or not (pod.get("status") or {}).get("containerStatuses"):
        return []
    placed = copy.deepcopy(pod)
    placed.setdefault("metadata", {}).setdefault("namespace", namespace)
    record = core.ingest.pod(placed)
    with core.view.lock:
        return core.view.reported(record)


def _route_before(core: Core, pod: dict[str, Any], namespace: str, context: Context) -> Route:
    """Whether the webhook sees a pod about to be created in `namespace` (bypass.new_pod_route)."""
    with core.view.lock:
        record = core.view.namespaces.get(namespace)
    # A snapshot without any Namespace (kubectl get nodes,pods -o json) says nothing about namespaces.
    seen = context.namespaces_seen and bool(core.view.namespaces)
    labels = record.labels if record is not None else (None if seen else {})
    placed = copy.deepcopy(pod)
    placed.setdefault("metadata", {})["namespace"] = namespace
    return new_pod_route(placed, core.config, core.placement.requirements(placed).wants_gpu, namespace, labels)


def _unseen(pod: dict[str, Any], namespace: str) -> Admission:
    """The webhook never sees the pod: it is created as written."""
    pod = copy.deepcopy(pod)
    pod.setdefault("metadata", {})["namespace"] = namespace
    return Admission([], pod, True, "", [], called=False)


def _named_node(core: Core, node: str) -> list[str]:
    with core.view.lock:
        facts = core.view.nodes.get(node)
        rejection = node_readiness(facts, core.view.validator_state(node), core.config) if facts else None
    verdict = "ready" if rejection is None else rejection.message
    return node_name_lines(node, facts is not None, verdict)


def _as_created(pod: dict[str, Any], existing: bool) -> dict[str, Any]:
    """The pod as kube-scheduler gets it: the API server's DefaultTolerationSeconds admission adds
    tolerations of the not-ready and unreachable NoExecute taints to a new pod; an existing pod has
    them already, and its node is forgotten (it is judged as if created again)."""
    pod = copy.deepcopy(pod)
    spec = pod.setdefault("spec", {})
    if existing:
        spec.pop("nodeName", None)
        return pod
    tolerations = spec.setdefault("tolerations", [])
    for taint in _SCHEDULER_DEFAULT_TOLERATIONS:
        if not any(isinstance(t, dict) and t.get("key") in (taint, None, "")
                   and t.get("effect") in ("NoExecute", None, "")
                   for t in tolerations):  # the plugin's own test (plugin/pkg/admission/defaulttolerationseconds)
            tolerations.append({"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
    return pod


def _holds(held: Any) -> str | None:
    if held is None:
        return None
    node, items, frozen = held  # already running: what it holds was fixed when it was first seen bound
    what = ", ".join(f"{units}x {resource}" + (f" = {mib} MiB" if mib is not None else "")
                     for resource, units, mib in items)
    ask = f"{frozen.ask} from the {frozen.source}" if frozen.ask is not None else frozen.source
    return (f"holds {what} on {node}, fixed when first seen bound ({ask}); later annotation or namespace-default "
            "edits do not change it")


def explain_pod(core: Core, pod: dict[str, Any], namespace: str | None, show_all: bool = False,
                examples: int = 3, existing: bool = False, context: Context | None = None) -> str:
    """For people: on a big cluster, counts by verdict, the best candidates, and a few examples per
    rejection with their own figures; every node with `show_all` (or on a small cluster)."""
    return render(core, explain(core, pod, namespace, existing, context), show_all, examples)


def render(core: Core, found: Explanation, show_all: bool = False, examples: int = 3) -> str:
    """`explain_pod`'s text for an explanation already made."""
    admission = found.admission
    lines = [f"pod {found.pod}", *_about(found.context, found.route), "", "webhook:"]
    if not admission.called:
        lines.append("  never called: the pod is created as written (see above)")
    elif admission.patch:
        for op in admission.patch:
            value = f" = {orjson.dumps(op['value']).decode()}" if "value" in op else ""
            lines.append(f"  {op['op']:<8} {op['path']}{value}")
    else:
        lines.append("  no change")
    if admission.called:
        lines.append(f"  {'allowed' if admission.allowed else 'DENIED'}" +
                     (f": {admission.message}" if admission.message else ""))
    lines += [f"  warning: {w}" for w in admission.warnings]
    if found.health:  # the launch outcomes count it as device_unhealthy; the device is tainted alone
        lines += ["", "devices reported Unhealthy by its kubelet (status.containerStatuses[].allocatedResourcesStatus; "
                      "gpu-placement keeps them out with a DeviceTaintRule, DeviceUnhealthy):",
                  *(f"  {line}" for line in found.health)]
    head = "extender (hypothetical: it never sees this pod; what it would decide if it did)" if found.hypothetical \
        else "extender"
    lines += ["", *_scheduler_lines(found), "", f"{head}: needs {found.needs}"]
    if found.cuda_note:
        lines.append(f"  {found.cuda_note}")
    if found.holds:
        lines.append(f"  {found.holds}")
    best = found.best
    lines.append(f"  would go to {best.node} (score {best.score}){_if_sent(found)}" if best
                 else "  no node can take it")
    if found.message:
        lines.append(f"  kube-scheduler would report: {found.message}")
    lines += [f"  {sentence}" for sentence in found.fragmented]
    counts = found.counts()
    lines.append(f"  {len(found.verdicts)} nodes: " + ", ".join(f"{n} {what}" for what, n in counts.most_common()))
    if show_all or len(found.verdicts) <= _FULL_TABLE_UP_TO:
        lines += [f"  {node}: {rule}" for node, rule in found.cuda_rules.items()]
        lines += ["", table(VERDICT_HEADER, verdict_rows(found.verdicts))]
        return "\n".join(lines + _devices(core, found, admission.pod) + _preemption(core, found, admission.pod))
    passing = [v for v in found.verdicts if v.passed]
    if passing:
        top = sorted(passing, key=lambda v: (-v.score, v.node))[:_CANDIDATES]
        lines += [f"  {v.node}: {found.cuda_rules[v.node]}" for v in top if v.node in found.cuda_rules]
        lines += ["", f"candidates, best first ({len(top)} of {len(passing)}; --all for every node):",
                  table(["NODE", "SCORE", "FIGURES"], [[v.node, str(v.score), v.detail] for v in top])]
    groups: dict[str, list[NodeVerdict]] = {}
    for verdict in found.verdicts:
        if not verdict.passed:
            groups.setdefault(verdict.reason, []).append(verdict)
    if groups:
        lines += ["", f"rejected, by reason ({examples} examples each, with their own figures; --all for every "
                      "node):"]
        for reason, members in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
            lines.append(f"  {len(members):>6}  {reason}")
            shown = sorted(members, key=lambda v: v.node)[:examples]
            for verdict in shown:
                lines.append(f"          {verdict.node}" + (f"  [{verdict.detail}]" if verdict.detail else ""))
            if len(members) > len(shown):
                lines.append(f"          ... and {len(members) - len(shown)} more")
    return "\n".join(lines + _devices(core, found, admission.pod) + _preemption(core, found, admission.pod))


def _devices(core: Core, found: Explanation, pod: dict[str, Any]) -> list[str]:
    """A DRA pod: the devices its claims could take on the nodes that pass (the best candidates)."""
    if not found.req.claims:
        return []
    from gpu_placement.report.devices import CANDIDATE_HEADER, candidate_rows

    passing = [v.node for v in sorted((v for v in found.verdicts if v.passed), key=lambda v: (-v.score, v.node))]
    namespace = found.pod.split("/", 1)[0]
    rows = candidate_rows(core.view, core.config, found.req, namespace, pod.get("spec") or {},
                          passing[:_CANDIDATES])
    lines = ["", f"DRA devices its claims could take ({core.config.dra.driver}; the scheduler's allocator picks):",
             table(CANDIDATE_HEADER, rows)] if rows else []
    return lines + _policy_claims(core, namespace, pod, passing[:_CANDIDATES])


def _policy_claims(core: Core, namespace: str, pod: dict[str, Any], nodes: list[str]) -> list[str]:
    """The claims a `dra` namespace's templates give the pod (docs/dra.md), and the devices on the best
    nodes that pass their selectors, read the way the allocator reads them (Template.matches)."""
    from gpu_placement.decide.claims import wanted_templates
    from gpu_placement.facts.policy import parse_policy

    with core.view.lock:
        record = core.view.namespaces.get(namespace)
        profiles, shares = core.view.dra.mig_profiles(), core.view.dra.shares_memory()
    policy = parse_policy(record, namespace, core.config)
    if policy.mode(core.config) != "dra" or not policy.shapes_ok:
        return []
    templates = {t.name: t for t in wanted_templates(policy, profiles, core.config, shares)}
    claims = [(str(entry.get("name")), templates[template])
              for entry in (pod.get("spec") or {}).get("resourceClaims") or ()
              if isinstance(entry, dict) and isinstance(template := entry.get("resourceClaimTemplateName"), str)
              and template in templates]
    if not claims:
        return []
    lines = ["", f"claims from namespace {namespace}'s templates (gpu-placement.io/allocation=dra):"]
    rows = []
    for template in {t.name: t for _, t in claims}.values():
        names = ", ".join(name for name, t in claims if t is template)
        share = f" (a share: {template.share} of its memory)" if template.share else ""
        lines.append(f"  {names}: {template.name}, 1 device of {template.device_class} each{share}")
        lines += [f"    where {selector}" for selector in template.selectors]
        for index, (alternative, selectors) in enumerate(template.alternatives):
            lines.append(f"    {'first' if index == 0 else 'else'} {alternative}: "
                         f"{next((s for s in selectors if 'productName' in s), '')}")
        kind = "mig" if template.level.kind == "mig" else "gpu"
        with core.view.lock:
            for node in nodes:
                used = core.view.dra.used_on(node)
                why = {d.name: (template.matches(d, kind) or ("held by a claim" if used.get(d.name) else None))
                       for d in core.view.dra.devices_on(node)}
                rows.append([template.name, node, ", ".join(d for d, w in why.items() if w is None) or "none",
                             "; ".join(f"{d}: {w}" for d, w in why.items() if w is not None) or "-"])
    return [*lines, "", table(["TEMPLATE", "NODE", "DEVICES THAT MATCH", "WHY NOT THE OTHERS"], rows)]


def _about(context: Context, route: Route | None) -> list[str]:
    lines = []
    if context.namespace:
        lines.append(f"namespace: {context.namespace}")
    if context.workload:
        lines.append(f"workload: {context.workload}")
    if context.configuration:
        lines.append(f"configuration: {context.configuration}")
    if context.judged_at:
        lines.append(f"judged at: {context.judged_at}")
    lines += [f"  bypassed gpu-placement: {note}" for note in context.notes]
    if route is not None:
        if route.refused:
            lines.append(f"  refused: {route.refused}")
        lines += [f"  bypasses gpu-placement: {note}" for note in route.notes if note != route.refused]
    return lines


def _if_sent(found: Explanation) -> str:
    if found.route is not None and found.route.node_name:
        return ", were spec.nodeName left out"
    return ", were the pod sent to gpu-placement" if found.hypothetical else ""


def _scheduler_lines(found: Explanation) -> list[str]:
    """What kube-scheduler decides before it asks the extender."""
    if found.route is not None and found.route.node_name:
        return [f"kube-scheduler: never sees this pod (spec.nodeName is {found.route.node_name})",
                *(f"  {line}" for line in found.node_lines),
                "  below: what the schedulers would decide were spec.nodeName left out", *_filter_lines(found)]
    return _filter_lines(found)


def _filter_lines(found: Explanation) -> list[str]:
    refused = [] if found.admission.allowed else [
        "  the API server refuses the pod (DENIED above), so no scheduler ever sees it; below is what would happen "
        "once admitted as it stands"]
    if found.context.nodes is None:
        return ["kube-scheduler: its own filters (node selection, taints, cordon, resource counts) were not checked: "
                "no node objects; every node is taken to pass them", *refused]
    kept = Counter(v.plugin for v in found.scheduler.values())
    total = len(found.verdicts)
    line = (f"kube-scheduler: {total - len(found.scheduler)} of {total} nodes pass its own filters and go to the "
            "extender")
    if kept:
        line += "; it keeps " + ", ".join(f"{n} for {plugin}" for plugin, n in kept.most_common())
    lines = [line, *refused]
    if found.hypothetical and not (found.route and found.route.node_name):
        scheduler = (found.admission.pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
        passing = total - len(found.scheduler)
        through = sorted(v.node for v in found.verdicts if v.node not in found.scheduler)
        lines.append(f"  {scheduler} asks no extender: it places the pod on " + (
            f"{through[0]}, unchecked by gpu-placement" if passing == 1 else
            f"one of these {passing} nodes, unchecked by gpu-placement" if passing else
            "no node, so the pod stays Pending (the message below is real)"))
    if found.unmodelled:
        lines.append(f"  not checked here, also decided by kube-scheduler: {'; '.join(found.unmodelled)}")
    return lines


def explain_json(core: Core, pod: dict[str, Any], namespace: str | None, existing: bool = False,
                 context: Context | None = None) -> dict[str, Any]:
    """For scripts: everything, every node."""
    return as_json(explain(core, pod, namespace, existing, context))


def as_json(found: Explanation) -> dict[str, Any]:
    """`explain_json`'s answer for an explanation already made."""
    admission = found.admission
    best = found.best
    return {"pod": found.pod, "namespace_chosen": found.context.namespace, "workload": found.context.workload,
            "configuration": found.context.configuration, "judged_at": found.context.judged_at,
            "bypassed": list(found.context.notes),
            "route": None if found.route is None else {
                "webhook": found.route.webhook, "extender": found.route.extender, "node_name": found.route.node_name,
                "refused": found.route.refused, "notes": list(found.route.notes), "node": found.node_lines},
            "webhook": {"called": admission.called, "patch": admission.patch, "allowed": admission.allowed,
                        "message": admission.message, "warnings": admission.warnings},
            "kube_scheduler": {"checked": found.context.nodes is not None, "message": found.message,
                               "not_checked": found.unmodelled},
            "needs": found.needs, "cuda_note": found.cuda_note, "holds": found.holds,
            "hypothetical": found.hypothetical, "fragmented": found.fragmented,
            "best": {"node": best.node, "score": best.score} if best else None,
            "counts": dict(found.counts()),
            "nodes": [{"node": v.node, "verdict": "pass" if v.passed else v.reason.split(":", 1)[0],
                       "stage": "kube-scheduler" if v.node in found.scheduler else "extender",
                       "score": v.score, "reason": v.reason, "figures": v.detail,
                       "cuda_rule": found.cuda_rules.get(v.node, "")}
                      for v in sorted(found.verdicts, key=lambda v: (not v.passed, -v.score, v.node))]}


def _fragmented(core: Core, found: Explanation) -> list[str]:
    """No node takes it for lack of free units, yet the verified nodes have them in total: say so."""
    if found.best is not None or "InsufficientGPU" not in found.counts() or core.outcomes is None:
        return []
    from gpu_placement.outcomes.idle import idle_sentence

    core.outcomes.prime()
    with core.view.lock:
        verified = core.outcomes.verified()
    return [sentence for resource, count in found.req.gpus
            if (sentence := idle_sentence(core.view, resource, count, verified))]


def _preemption(core: Core, found: Explanation, pod: dict[str, Any]) -> list[str]:
    """Preemption is tried on nodes whose failure it could fix: not those kube-scheduler keeps out for
    an unresolvable reason (selection, taints, cordon), which it never considers."""
    names = [v.node for v in found.verdicts if v.node not in found.scheduler
             or found.scheduler[v.node].plugin == "NodeResourcesFit"]
    rows = explain_preemption(core.placement, found.req, pod, names)
    if not rows:
        return []
    spec = pod.get("spec") or {}
    head = f"preemption (priority {spec.get('priority', 0)}" + (
        f", class {spec['priorityClassName']}" if spec.get("priorityClassName") else "") + "):"
    if "priority" not in spec and spec.get("priorityClassName"):
        head += " spec.priority is unset in this file; the API server sets it from the class, as 0 here"
    return ["", head, table(["NODE", "PREEMPTION", "WOULD EVICT / WHY NOT"], rows)]
