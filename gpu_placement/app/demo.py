"""`gpu-placement demo`: the embedded demo cluster, end to end over real HTTP(S) on loopback.

Each sample pod goes through the webhook (`/mutate`, then `/validate`) the way the API server sends
it, is created in the view, then goes through the extender (`/filter`, `/prioritize`, `/bind`) the
way kube-scheduler calls it. The tables say what happened and why.
"""

from __future__ import annotations

import base64
import http.client
import ssl
import sys
import tempfile
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import yaml

from gpu_placement.app.assembly import Core, core_from_objects
from gpu_placement.app.deployed import CONFIG_KEY
from gpu_placement.app.explain import admission_review, admit
from gpu_placement.base.config import Config, parse_config
from gpu_placement.report.alerting import evaluate
from gpu_placement.report.rollout import policy_from_objects, rollout_json, rollout_text
from gpu_placement.report.tables import NODE_HEADER, node_rows, table
from gpu_placement.samples.cluster import (
    HAND_INSTALLED,
    demo_objects,
    demo_pods,
    survey_objects,
    wave_objects,
    with_label_writers,
)
from gpu_placement.survey.report import survey_text
from gpu_placement.survey.run import Survey, run_survey
from gpu_placement.web.patching import apply_patch

__all__ = ["DEMO_CONFIG", "cluster_objects", "demo_config_map", "run_demo", "write_snapshot"]

DEMO_CONFIG: dict[str, Any] = {
    "defaultNamespacePolicy": "deny",  # GPUs only for namespaces the platform team gave a quota
    "pools": {"training": {"nodeSelector": {"pool": "training"},
                           "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "training",
                                            "effect": "NoSchedule"}]},
              "batch": {"nodeSelector": {"pool": "batch"}}},
    # The batch pool's new driver soaks: only canary namespaces' pods go there for an hour.
    "rollout": {"soakMinutes": 60, "soak": "strict"},
}

Post = Callable[[str, str, dict[str, Any]], tuple[int, Any]]


@dataclass(slots=True)
class _Outcome:
    pod: str
    story: str
    decision: str = ""  # allowed / DENIED
    changes: str = ""
    denial: str = ""  # the webhook's message
    needs: str = ""
    placed: str = ""  # node, "Pending" or "default scheduler"
    score: str = ""
    rejected: str = ""  # nodes rejected, counted by reason
    why: str = ""  # for a pending pod: the reason that matters most


def run_demo(config: Config | None = None, out: Any = None) -> int:
    from gpu_placement.web.certs import ensure_self_signed
    from gpu_placement.web.serving import ServerThread
    from gpu_placement.web.tls import ReloadingTLS, make_server

    out = out or sys.stdout
    config = config or parse_config(DEMO_CONFIG)
    objects = cluster_objects()
    core = core_from_objects(config, objects)
    labels = {o["metadata"]["name"]: o["metadata"].get("labels") or {} for o in objects if o["kind"] == "Node"}
    with tempfile.TemporaryDirectory(prefix="gpu-placement-demo-") as certs:
        bundle = ensure_self_signed(certs, "gpu-placement-webhook", "gpu-placement", ("127.0.0.1", "localhost"))
        extender = ServerThread(make_server(core.extender_app(), "127.0.0.1", 0))
        webhook = ServerThread(make_server(core.webhook_app(), "127.0.0.1", 0,
                                           tls=ReloadingTLS(str(bundle.cert), str(bundle.key))))
        with extender, webhook:
            trust = ssl.create_default_context(cafile=str(bundle.ca_cert))
            ports = {"extender": extender.port, "webhook": webhook.port}

            def post(component: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
                port = ports[component]
                conn: http.client.HTTPConnection = (
                    http.client.HTTPSConnection("localhost", port, context=trust, timeout=10)
                    if component == "webhook" else http.client.HTTPConnection("127.0.0.1", port, timeout=10))
                try:
                    conn.request("POST", path, orjson.dumps(body), {"Content-Type": "application/json"})
                    response = conn.getresponse()
                    return response.status, orjson.loads(response.read())
                finally:
                    conn.close()

            print(f"gpu-placement demo: {len(core.view.nodes)} nodes, {len(core.view.namespaces)} namespaces; "
                  f"webhook https://localhost:{webhook.port} (TLS, self-signed CA), extender "
                  f"http://127.0.0.1:{extender.port}; metrics at /metrics on both while the demo runs\n", file=out)
            print("NODES (what the GPU Operator publishes, as gpu-placement reads it)", file=out)
            print(table(NODE_HEADER, node_rows(core.view)), file=out)
            outcomes = [_one(core, post, labels, story, pod) for story, pod in demo_pods()]
            scraped = _get(f"http://127.0.0.1:{extender.port}/metrics")
        survey = _survey(core, objects)
    _print(outcomes, out)
    _print_rollout(core, objects, out)
    _print_alerts(scraped, out)
    _print_survey(survey, out, core, objects)
    _print_outcomes(out)  # the demo ends with the outcome table
    return 0


def cluster_objects() -> list[dict[str, Any]]:
    """The demo cluster as its API server would hold it: every node with the managedFields its labels'
    writers leave (the survey reads who set them)."""
    objects = demo_objects() + wave_objects() + survey_objects()
    return [with_label_writers(o) if o["kind"] == "Node" and "managedFields" not in o["metadata"] else o
            for o in objects]


def _survey(core: Core, objects: list[dict[str, Any]]) -> Survey:
    """The survey of the cluster as it stood before the demo's pods came (gpu-placement is deployed)."""
    webhook = core.webhook_app()
    survey = run_survey(core, objects, deployed=True, admit=lambda pod, namespace: admit(webhook, pod, namespace).pod)
    survey.configuration = "the demo's (gpu-placement demo --write-snapshot writes it as the chart's ConfigMap)"
    return survey


def _print_survey(survey: Survey, out: Any, core: Core, objects: list[dict[str, Any]]) -> None:
    print("\nSURVEY (gpu-placement survey: the fleet and what to fix, before anything changes; -o html draws it; "
          "docs/survey.md)", file=out)
    print(survey_text(survey), file=out)
    from pathlib import Path

    from gpu_placement.survey.migrate import plan
    from gpu_placement.survey.migrate_command import read_snapshot, render_plan

    state = read_snapshot(objects, HAND_INSTALLED, core.config, Path("gpu-placement-migrate", f"{HAND_INSTALLED}.json"),
                          saved=False)
    print(f"\nMIGRATION PLAN (gpu-placement migrate {HAND_INSTALLED}: rerun it to see where the node stands; "
          "--apply runs the steps, saving the way back first)", file=out)
    print(render_plan(state, plan(state)), file=out)


def _print_outcomes(out: Any) -> None:
    """The table `gpu-placement report` prints from Prometheus, for a day of the demo's history."""
    import math
    import time

    from gpu_placement.outcomes.demo import table

    print("\nOUTCOMES (gpu-placement report, for a day of launches and node changes replayed through the same "
          "counting as the service's; docs/outcomes.md. In a cluster: gpu-placement report --prometheus URL)",
          file=out)
    print(table(math.floor(time.time() / 86400) * 86400 - 86400), file=out)  # yesterday, from midnight UTC


def _print_rollout(core: Core, objects: list[dict[str, Any]], out: Any) -> None:
    """The batch pool's driver wave, as `gpu-placement rollout` prints it."""
    policy, problem = policy_from_objects(objects)
    print("\nDRIVER ROLLOUT (gpu-placement rollout: a wave of 580.126.09 soaking on canaries; "
          "docs/rollouts.md)", file=out)
    print(rollout_text(rollout_json(core.placement.rollout, policy, problem)), file=out)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _print_alerts(scraped: str, out: Any) -> None:
    """One line per alert of the chart's PrometheusRule whose condition holds on this demo's metrics."""
    firing = evaluate(scraped)
    print("\nALERTS (the chart's PrometheusRule on the demo's own /metrics, default thresholds; Prometheus "
          "fires each once its condition has lasted the time shown)", file=out)
    print(table(["ALERT", "ABOUT", "CONDITION", "FIRES AFTER"],
                [[f.alert, f.subject, f.detail, f.after or "now"] for f in firing]) if firing else "  none", file=out)
    print("Metrics, dashboard and alerts in a cluster: docs/operations.md (Metrics reference, Alerts); "
          "the chart ships them with --set serviceMonitor.enabled=true", file=out)


def demo_config_map() -> dict[str, Any]:
    """The demo's configuration as the chart deploys one: a ConfigMap `explain` and `nodes` find by label."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "gpu-placement-config", "namespace": "gpu-placement",
                         "labels": {"app.kubernetes.io/name": "gpu-placement",
                                    "app.kubernetes.io/part-of": "gpu-placement"}},
            "data": {CONFIG_KEY: yaml.safe_dump(DEMO_CONFIG, sort_keys=False)}}


def write_snapshot(path: str) -> int:
    """The demo cluster as `kubectl get nodes,pods,namespaces,configmaps -A -o json` would print it,
    with the demo's configuration as the chart's ConfigMap, so `explain` and `nodes` judge with it."""
    with open(path, "wb") as out:
        out.write(orjson.dumps({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
                                "items": [*cluster_objects(), demo_config_map()]},
                               option=orjson.OPT_INDENT_2))
    print(f"wrote the demo cluster to {path}", file=sys.stderr)
    return 0


# Reasons that say something about this pod rather than about a broken node: the ones to show first.
_POD_SPECIFIC = ("InsufficientGPUMemory", "InsufficientGPU", "DriverTooOld", "ComputeCapability", "ProductMismatch",
                 "SharingMismatch", "UnknownDriver", "UnknownGPUMemory", "BadAnnotation")


def _one(core: Core, post: Post, labels: dict[str, dict[str, str]], story: str, pod: dict[str, Any]) -> _Outcome:
    meta = pod["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    outcome = _Outcome(f"{namespace}/{name}", story)
    status, review = post("webhook", "/mutate?timeout=10s", _review(pod, namespace))
    response = review.get("response", {}) if status == 200 else {}
    patch = orjson.loads(base64.b64decode(response["patch"])) if response.get("patch") else []
    pod = apply_patch(pod, patch)
    outcome.changes = _changes(patch)
    status, review = post("webhook", "/validate?timeout=10s", _review(pod, namespace))
    verdict = review.get("response", {}) if status == 200 else {"status": {"message": str(review)}}
    if not verdict.get("allowed"):
        # The API server stores nothing of a denied pod: /mutate's patch (with its `admitted` annotation) is dropped.
        outcome.decision, outcome.denial = "DENIED", (verdict.get("status") or {}).get("message", "")
        outcome.changes = "- (denied: the pod is not created)"
        return outcome
    outcome.decision = "allowed" + "".join(f" (warning: {w})" for w in verdict.get("warnings") or ())
    # The API server stores the pod; the view hears of it as a watch would tell it.
    pod.setdefault("status", {})["phase"] = "Pending"
    core.ingest.event(core.view, "pods", "ADDED", pod)
    req = core.placement.requirements(pod)
    outcome.needs = req.describe()
    if not req.wants_gpu:  # kube-scheduler calls the extender only for pods with a managed resource
        outcome.placed = "(default scheduler)"
        outcome.needs = "no GPU: kube-scheduler does not call the extender for it"
        return outcome
    names = [node for node in sorted(core.view.nodes) if _selected(labels.get(node, {}), pod)]
    args = {"Pod": pod, "Nodes": None, "NodeNames": names}
    _, result = post("extender", "/filter", args)
    passed = result.get("NodeNames") or []
    rejected = {**result.get("FailedNodes", {}), **result.get("FailedAndUnresolvableNodes", {})}
    counts = Counter(reason.split(":", 1)[0] for reason in rejected.values())
    skipped = len(core.view.nodes) - len(names)
    outcome.rejected = ", ".join([f"{count} {code}" for code, count in sorted(counts.items(), key=_most_first)] +
                                 ([f"{skipped} outside its node selector"] if skipped else []))
    if not passed:
        outcome.placed = "Pending"
        ranked = sorted(rejected.items(), key=lambda item: (_rank(item[1]), item[0]))
        node, reason = ranked[0] if ranked else ("", "no node matches its node selector")
        preempt = " (FailedNodes: preemption may help)" if node in result.get("FailedNodes", {}) else ""
        outcome.why = reason + preempt
        return outcome
    _, answer = post("extender", "/prioritize", {**args, "NodeNames": passed})
    # As kube-scheduler reads it: the scores less the lowest, a node left out (the lowest) at 0
    shifted = dict.fromkeys(passed, 0) | {hp["Host"]: hp["Score"] for hp in answer}
    best = max(shifted, key=lambda host: (shifted[host], host))
    scores = dict(core.placement.scores(req, passed))  # for people: before the shift (and before this bind)
    _, bound = post("extender", "/bind", {"PodName": name, "PodNamespace": namespace,
                                          "PodUID": meta.get("uid", ""), "Node": best})
    outcome.placed = best if not bound.get("Error") else f"bind failed: {bound['Error']}"
    others = ", ".join(f"{host} {score}" for host, score in sorted(scores.items(), key=lambda item: -item[1])
                       if host != best)
    outcome.score = f"{scores[best]}/10" + (f" (others: {others})" if others else "")
    return outcome


def _rank(reason: str) -> int:
    code = reason.split(":", 1)[0]
    return _POD_SPECIFIC.index(code) if code in _POD_SPECIFIC else len(_POD_SPECIFIC)


def _review(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    review = admission_review(pod, namespace)
    review["request"]["dryRun"] = False
    return review


def _selected(node_labels: dict[str, str], pod: dict[str, Any]) -> bool:
    """kube-scheduler's own node-selector and node-affinity filters (the parts the webhook sets), so the
    extender is asked about the nodes kube-scheduler would send it."""
    spec = pod.get("spec") or {}
    if any(node_labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(all(_matches(node_labels, e) for e in t.get("matchExpressions") or ()) for t in terms)


def _matches(node_labels: dict[str, str], expression: dict[str, Any]) -> bool:
    value, values = node_labels.get(expression.get("key", "")), expression.get("values") or []
    return {"In": value in values, "NotIn": value not in values, "Exists": value is not None,
            "DoesNotExist": value is None}.get(expression.get("operator", ""), True)


def _changes(patch: list[dict[str, Any]]) -> str:
    """The patch in a few words: resources rewritten, fields set, annotations written."""
    if not patch:
        return "none"
    parts: list[str] = []
    removed = [op["path"] for op in patch if op["op"] == "remove" and "/resources/" in op["path"]]
    added = [op["path"] for op in patch if op["op"] == "add" and "/resources/" in op["path"]]
    for old, new in dict.fromkeys(zip((_leaf(p) for p in removed), (_leaf(p) for p in added), strict=False)):
        parts.append(f"{old} -> {new}")
    for op in patch:
        path = op["path"]
        if "/resources/" in path:
            continue
        field = path.split("/")[2] if path.startswith("/spec/") else (
            "annotation " + _leaf(path) if "/annotations" in path else path.strip("/"))
        parts.append(field.removeprefix("annotation gpu-placement.io/"))
    return ", ".join(dict.fromkeys(parts))


def _leaf(path: str) -> str:
    return path.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~")


def _print(outcomes: list[_Outcome], out: Any) -> None:
    print("\nADMISSION (webhook: /mutate, then /validate, as the API server calls them)", file=out)
    print(table(["POD", "STORY", "DECISION", "PATCHED"],
                [[o.pod, o.story, o.decision, o.changes] for o in outcomes]), file=out)
    for o in outcomes:
        if o.denial:
            print(f"  denied {o.pod}: {o.denial}", file=out)
    print("\nSCHEDULING (extender: /filter, /prioritize, /bind, as kube-scheduler calls them)", file=out)
    admitted = [o for o in outcomes if o.placed]
    print(table(["POD", "PLACED ON", "SCORE", "OTHER NODES REJECTED"],
                [[o.pod, o.placed, o.score or "-", o.rejected or "-"] for o in admitted]), file=out)
    for o in admitted:
        if o.why:
            print(f"  {o.pod} waits: {o.why}", file=out)
    print("\nWHAT EACH ADMITTED POD NEEDED (pod annotation, namespace default, or inferred from its image)", file=out)
    print(table(["POD", "NEEDS"], [[o.pod, o.needs] for o in admitted]), file=out)
    print("\nTry it on a pod of yours: gpu-placement demo --write-snapshot cluster.json; "
          "gpu-placement explain POD.yaml --snapshot cluster.json", file=out)


def _most_first(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]  # ties by code: the same line whatever order the answer came in
