"""`gpu-placement explain`: what to explain (a file, standard input, or KIND/NAME in the cluster or the
snapshot), each kind of pod in it explained, a workload added up, and the exit status a CI gate reads.

Exit status (docs/explain.md, and `explain --help`):
    0  every pod would be admitted and has a node (or the webhook never sees it, and nothing refuses it)
    2  bad usage or bad input
    3  refused: the webhook denies a pod, the quota denies some of a workload's pods, or the API server
       refuses the create (its namespace does not exist)
    4  admitted, but no node can take it now, or spec.nodeName names a node that does not exist
    5  spec.nodeName puts it, unchecked, on a node gpu-placement keeps GPU pods off
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import orjson

from gpu_placement.app.cli_input import read_objects, split_kind_name, templates_in
from gpu_placement.base.errors import UsageError
from gpu_placement.facts.workloads import PodTemplate, WorkloadError, pods_of

__all__ = ["EXIT_CODES", "EXIT_DENIED", "EXIT_NO_NODE", "EXIT_OK", "EXIT_UNVERIFIED", "run_explain"]

EXIT_OK, EXIT_DENIED, EXIT_NO_NODE, EXIT_UNVERIFIED = 0, 3, 4, 5
EXIT_CODES = ("exit status: 0 admitted and placed (or bypassing gpu-placement unrefused); 2 bad usage or input; "
              "3 refused (webhook denial, quota, or a namespace that does not exist); 4 admitted but no node can "
              "take it now, or spec.nodeName names no node; 5 spec.nodeName puts it on a node gpu-placement keeps "
              "GPU pods off")

Cluster = Callable[..., tuple[Any, Any, list[dict[str, Any]]]]


def run_explain(args: argparse.Namespace, cluster: Cluster) -> int:
    from gpu_placement.app.explain import Context, as_json, explain, render
    from gpu_placement.decide.kubefilters import KubeNodes

    kind_name = split_kind_name(args.pod_file)
    given: list[dict[str, Any]] = []
    own: str | None = None
    if kind_name is None:
        objects_in = read_objects(args.pod_file)
        where = "standard input" if args.pod_file == "-" else args.pod_file
        templates, given = templates_in(objects_in, where)
        own = _require_namespace(args.namespace, templates, where)
    core, access, objects = cluster(args, given, namespace=args.namespace or own)
    notes: tuple[str, ...] = ()
    existing, leave_out = False, None
    if kind_name is not None:
        kind, name = kind_name
        namespace = args.namespace or (access.namespace if access else "default")
        obj = _find(args, access, objects, kind, name, namespace)
        if obj.get("kind") == "Pod":
            templates, existing, leave_out = [PodTemplate(f"Pod {namespace}/{name}", obj)], True, f"{namespace}/{name}"
            notes = tuple(_bypassed(core, access, obj))
        else:
            try:
                templates = pods_of(obj)
            except WorkloadError as exc:
                raise UsageError(f"{kind}/{name}: {exc}") from None
            from gpu_placement.app.cli_input import check_template

            for template in templates:
                check_template(template, f"{kind}/{name}")
    seen = getattr(access, "namespaces_seen", True) if access is not None else True
    judged_at = _clock_note(core, objects) if access is None else None
    found = []
    for template in templates:
        workload = None if template.where.startswith("Pod ") else template.where + (
            f", {template.replicas} {'replica' if template.replicas == 1 else 'replicas'}"
            if template.replicas is not None else "") + (f"; {template.note}" if template.note else "")
        namespace, chosen = _namespace(args, access, template)
        context = Context(KubeNodes.from_objects(objects, leave_out), core.config_source, workload, notes,
                          new=not existing, namespaces_seen=seen, namespace=chosen, judged_at=judged_at)
        found.append(explain(core, template.pod, namespace, existing, context))
    summary = _summary(core, templates, found)
    unseen = list(getattr(access, "unseen", ()) or ()) if access is not None else []
    if args.output == "json":
        answers = [as_json(f) for f in found]
        answer: dict[str, Any] = answers[0] if len(answers) == 1 else {
            "workload": templates[0].where.split(" (")[0], "pods": answers}
        if summary is not None:
            answer["summary"] = {"lines": summary.lines, "denied_pods": summary.denied_pods,
                                 "waiting_pods": summary.waiting_pods}
        answer["could_not_see"] = unseen
        answer["exit_status"] = _status(found, summary)
        print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    else:
        texts = [render(core, f, show_all=args.show_all) for f in found]
        out = ("\n\n" + "=" * 100 + "\n\n").join(texts)
        if summary is not None:
            out += "\n\n" + "\n".join(summary.lines)
        if unseen:
            out += "\n\n" + "\n".join(f"could not see: {line}" for line in unseen)
        print(out)
    return _status(found, summary)


def _require_namespace(given: str | None, templates: list[PodTemplate], where: str) -> str | None:
    """kubectl's rule for `-n` with a file (k8s.io/cli-runtime pkg/resource/visitor.go RequireNamespace, which
    `kubectl create` and `apply` use when --namespace is given): an object that names another namespace is
    refused, with kubectl's own sentence. Without -n, each object keeps its own. Returns the first one named."""
    named = [ns for t in templates if (ns := (t.pod.get("metadata") or {}).get("namespace"))]
    for namespace in named:
        if given and namespace != given:
            raise UsageError(f"{where}: the namespace from the provided object \"{namespace}\" does not match the "
                             f"namespace \"{given}\". You must pass '--namespace={namespace}' to perform this "
                             "operation.")
    return named[0] if named else None


def _namespace(args: argparse.Namespace, access: Any, template: PodTemplate) -> tuple[str, str | None]:
    """Where the pod of a file is created, as kubectl create -f decides: the object's own namespace, else
    -n, else the kubeconfig context's (its namespace, or default). A snapshot has no context: default.
    With a sentence saying so when neither the file nor -n chose it."""
    own = (template.pod.get("metadata") or {}).get("namespace")
    if own or args.namespace:
        return own or args.namespace, None
    if access is not None:
        return access.namespace, (f"{access.namespace}, context {access.context}'s (the file names none and -n is "
                                  "not given, so kubectl create -f would create it there)")
    return "default", ("default (the file names none and -n is not given; a snapshot has no kubeconfig context, so "
                       "default, as kubectl with a context without a namespace; -n NS to judge it elsewhere)")


def _clock_note(core: Any, objects: list[dict[str, Any]]) -> str | None:
    """A snapshot records no time: explain judges it at the wall clock. When a verdict depends on the
    clock, the moment and why are said; None when nothing does. What depends on it: a node soaking a new
    driver now (its soak ends by the clock), or one that was soaking at the snapshot's newest timestamp
    and is no more (its rollout state then, worked out by a second tracker on that clock, differs)."""
    import time

    from gpu_placement.decide.rollout import Rollout
    from gpu_placement.facts.soak import SOAKING

    newest = _newest_timestamp(objects)
    now = time.time()
    rollout = core.placement.rollout
    rollout.expire()
    with core.view.lock:
        states = dict(rollout.states)
    then = dict(Rollout(core.view, core.config, clock=lambda: newest).states) if newest is not None else {}
    timed = []
    for node in sorted({*states, *then}):
        current, before = states.get(node), then.get(node)
        if current is not None and current.state == SOAKING and current.until is not None:
            timed.append(f"{node} soaking until {_minute(current.until)}")
        elif before is not None and before.state == SOAKING and before.until is not None:
            timed.append(f"{node}'s soak ended {_minute(before.until)}")
    if not timed:
        return None
    if len(timed) > _TIMED_SHOWN:
        timed[_TIMED_SHOWN:] = [f"and {len(timed) - _TIMED_SHOWN} more nodes"]
    after = f"its newest timestamp is {_minute(newest)}" if newest is not None else "it has no timestamp"
    return (f"{_minute(now)}, the wall clock (a snapshot records no time; {after}), and these verdicts depend on "
            f"it: driver soaks end by the clock ({'; '.join(timed)})")


_TIMED_SHOWN = 5


def _newest_timestamp(objects: list[dict[str, Any]]) -> float | None:
    """The latest of the times the API server and kubelets write into objects: no earlier than when the
    snapshot was taken, usually a node heartbeat a minute or two before."""
    from gpu_placement.base.timestamps import parse_time

    found: list[float] = []
    for obj in objects:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        stamps = [meta.get("creationTimestamp"), status.get("startTime"),
                  *((f or {}).get("time") for f in meta.get("managedFields") or ()),
                  *(c.get(key) for c in status.get("conditions") or () if isinstance(c, dict)
                    for key in ("lastHeartbeatTime", "lastTransitionTime", "lastProbeTime"))]
        found += [at for stamp in stamps if (at := parse_time(stamp)) is not None]
    return max(found, default=None)


def _minute(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _summary(core: Any, templates: list[PodTemplate], found: list[Any]) -> Any:
    from gpu_placement.app.workload_summary import summarize

    return summarize(core, templates, found)


def _status(found: list[Any], summary: Any) -> int:
    """The worst outcome among the pods: refused before placed."""
    if any(f.route is not None and f.route.refused for f in found) or any(
            f.admission.called and not f.admission.allowed for f in found) or (summary and summary.denied_pods):
        return EXIT_DENIED
    for f in found:
        if f.route is not None and f.route.node_name:
            if f.node_lines and f.node_lines[0].startswith("no node named"):
                return EXIT_NO_NODE
            if f.req.wants_gpu and f.node_lines and "keeps GPU pods off it" in f.node_lines[0]:
                return EXIT_UNVERIFIED
            continue
        if not f.req.wants_gpu:
            continue
        if f.best is None and not f.hypothetical:
            return EXIT_NO_NODE
        if f.hypothetical and f.context.nodes is not None and len(f.scheduler) == len(f.verdicts):
            return EXIT_NO_NODE  # another scheduler, but kube-scheduler's own filters leave it no node
    return EXIT_OK


def _find(args: argparse.Namespace, access: Any, objects: list[dict[str, Any]], kind: str, name: str,
          namespace: str) -> dict[str, Any]:
    from gpu_placement.app.lookup import find_in_cluster, find_in_objects, resolve_builtin

    if access is None:
        from gpu_placement.view.snapshot import read_objects as snapshot_objects

        if (builtin := resolve_builtin(kind)) is not None and builtin.kind == "Pod":
            pods = [o for o in objects if o.get("kind") == "Pod"]
            try:
                return find_in_objects(pods, kind, name, namespace, args.snapshot)
            except UsageError:
                raise UsageError(f"pod {namespace}/{name} is not in {args.snapshot}") from None
        return find_in_objects(snapshot_objects(args.snapshot), kind, name, namespace, args.snapshot)
    return find_in_cluster(access, kind, name, namespace)


def _bypassed(core: Any, access: Any, pod: dict[str, Any]) -> list[str]:
    """How a pod that exists went around gpu-placement, if it did."""
    from gpu_placement.base.names import REGISTERED_ANNOTATION
    from gpu_placement.decide.bypass import Webhook, bypass_reasons

    webhook = None
    if access is not None:
        from gpu_placement.view.fetch import FetchError, fetch_labelled

        try:
            found = fetch_labelled(access, "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                                   "app.kubernetes.io/part-of=gpu-placement", "MutatingWebhookConfiguration")
        except FetchError:
            found = None  # not allowed to read them: the sentence says the reason is unknown
        if found is not None:
            first = found[0] if found else {}
            meta = first.get("metadata") or {}
            hooks = first.get("webhooks") or []
            registered = str((meta.get("annotations") or {}).get(REGISTERED_ANNOTATION) or "").split(" ")[0] or None
            webhook = Webhook(meta.get("name"), meta.get("creationTimestamp"), (hooks or [{}])[0].get("failurePolicy"),
                              len(hooks) if found else None, registered)
    asks_gpu = core.placement.requirements(pod).wants_gpu
    record = core.view.namespaces.get((pod.get("metadata") or {}).get("namespace") or "default")
    return bypass_reasons(pod, core.config, asks_gpu, webhook, record.labels if record is not None else None)
