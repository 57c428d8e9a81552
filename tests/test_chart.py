"""The Helm chart (charts/gpu-placement), rendered for real by Helm v4 in-process (helm_python).

Every rendered manifest is checked against the Kubernetes OpenAPI schemas (kubernetes-validate,
strict: unknown fields fail), and the parts that must agree with the code are cross-checked against
it: the service config parses with `gpu_placement.base.config.parse_config`, every container's args
parse with the CLI's own parser, the extender verbs and webhook paths are routes the apps serve,
ports and names line up between the scheduler config, containers, Services and RBAC. The webhook
matchConditions are evaluated on sample pods with a small evaluator for the CEL subset they use.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from gpu_placement.base import names as n
from gpu_placement.controllers.quota_mirror import MIRROR_NAME
from tests.support.chart import (
    CASES,
    CHART,
    NAMESPACE,
    ROOT,
    Case,
    Doc,
    Rendered,
    _pod_containers,
    _render,
    _webhooks,
    fullname,
    offline,
)

# Kinds whose schemas are CRDs, not core Kubernetes: skipped by name in the schema check, nothing else.
CRD_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),  # its rules are checked by promtool (test_alerts.py)
}
# The newest Kubernetes the validator ships, and the oldest the chart claims (Chart.yaml kubeVersion).
K8S_VERSIONS = (kubernetes_validate.utils.latest_version(), "1.30")
SERVICE_IMAGE_CONTAINERS = {"extender", "webhook"}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def rendered(request: pytest.FixtureRequest, chart: helm_python.Chart) -> Rendered:
    return _render(chart, request.param)


def _case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def _flag(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} given {args.count(flag)} times in {args}"
    return args[args.index(flag) + 1]


def _port(listen: str) -> int:
    return int(listen.rpartition(":")[2])


def _mounts(deployment: Doc, container: Doc) -> dict[str, Doc]:
    """mountPath -> the pod volume mounted there."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"].get("volumes", [])}
    return {m["mountPath"]: volumes[m["name"]] | {"readOnly": m.get("readOnly", False)}
            for m in container.get("volumeMounts", [])}


def _volume_for(path: str, mounts: dict[str, Doc]) -> Doc:
    matches = [mount for mount in mounts if path.startswith(mount.rstrip("/") + "/")]
    assert matches, f"{path} is in no mounted volume ({sorted(mounts)})"
    return mounts[max(matches, key=len)]


# ---- Helm ---------------------------------------------------------------------------------------


def test_helm_lint_is_clean() -> None:
    for case in CASES:
        report = helm_python.lint(CHART, offline(case.values), strict=True, namespace=case.namespace)
        assert report["errors"] == [], (case.name, report)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert problems == [], (case.name, problems)


def test_chart_metadata() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "gpu-placement"
    assert (CHART / "templates" / "NOTES.txt").is_file()
    assert (CHART / "templates" / "_helpers.tpl").is_file()


@pytest.mark.parametrize("values, where", [
    ({"webhook": {"timeoutSeconds": 30}}, "/webhook/timeoutSeconds"),
    ({"webhook": {"timeoutSeconds": 0}}, "/webhook/timeoutSeconds"),
    ({"config": {"mode": "loud"}}, "/config/mode"),
    ({"webhook": {"validating": {"failurePolicy": "Maybe"}}}, "/webhook/validating/failurePolicy"),
    ({"webhook": {"mutating": {"failurePolicy": "fail"}}}, "/webhook/mutating/failurePolicy"),
    ({"config": {"scoring": {"strategy": "random"}}}, "/config/scoring/strategy"),
    ({"config": {"defaultNamespacePolicy": "maybe"}}, "/config/defaultNamespacePolicy"),
    ({"config": {"scoring": {"weights": {"xidErrors": 11}}}}, "/config/scoring/weights/xidErrors"),
    ({"config": {"schedulerName": "x"}}, "/config"),  # top-level only: one source of truth
    ({"config": {"exemptNamespaces": ["a"]}}, "/config"),
    ({"config": {"colour": "blue"}}, "/config"),
    ({"config": {"ngcReleases": [{"release": 26.07, "cuda": "13.3.1", "source": "x"}]}},
     "/config/ngcReleases/0/release"),
    ({"config": {"ngcReleases": [{"release": "26.07", "cuda": "13.3.1"}]}}, "/config/ngcReleases/0"),
    ({"replicas": 3}, ""),
    ({"schedulerName": "Not A Name"}, "/schedulerName"),
    ({"migResources": ["nvidia.com/gpu"]}, "/migResources/0"),
    ({"gpuResources": []}, "/gpuResources"),
    ({"scheduler": {"extender": {"listenHost": "10.0.0.1"}}}, "/scheduler/extender/listenHost"),
    ({"scheduler": {"extender": {"httpTimeout": "5 seconds"}}}, "/scheduler/extender/httpTimeout"),
    ({"certManager": {"enabled": "yes"}}, "/certManager/enabled"),
    ({"serviceMonitor": {"enabled": 1}}, "/serviceMonitor/enabled"),
])
def test_schema_rejects_bad_values(chart: helm_python.Chart, values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as caught:
        chart.render(offline(values), name="gpu-placement", namespace=NAMESPACE)
    assert f"at '{where}" in str(caught.value), str(caught.value)


def test_schema_covers_every_default_value() -> None:
    """Every key in values.yaml is declared in values.schema.json (which forbids unknown keys)."""
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: Any, node: Doc, path: str) -> None:
        if not isinstance(value, dict):
            return
        props = node.get("properties")
        if props is None:
            assert "additionalProperties" in node, f"{path}: no schema for its keys"
            return
        assert node.get("additionalProperties") is False, f"{path}: unknown keys are not rejected"
        for key, child in value.items():
            assert key in props, f"{path}.{key} is not in values.schema.json"
            walk(child, props[key], f"{path}.{key}")

    walk(values, schema, "")


def test_every_value_is_in_the_docs_table() -> None:
    """docs/deploy.md lists every key of values.yaml (maps the user fills in count as one key)."""
    opaque = {"resources", "nodeSelector", "tolerations", "affinity", "podAnnotations", "labels", "pools",
              "telemetry", "gpuTolerations", "imagePullSecrets", "podSecurityContext", "securityContext"}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    docs = (ROOT / "docs" / "deploy.md").read_text()

    def keys(node: dict[str, Any], prefix: str) -> Iterator[str]:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value and key not in opaque:
                yield from keys(value, path + ".")
            else:
                yield path

    missing = [key for key in keys(values, "") if f"| `{key}` |" not in docs]
    assert missing == [], f"not in the values table of docs/deploy.md: {missing}"
    assert "helm install gpu-placement charts/gpu-placement -n gpu-placement --create-namespace" in docs
    assert "helm rollback gpu-placement <rev>" in docs


# ---- Kubernetes schemas -------------------------------------------------------------------------


def test_manifests_match_kubernetes_schemas(rendered: Rendered) -> None:
    skipped = []
    for doc in rendered.docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            skipped.append(doc["kind"])
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} (Kubernetes {version}): "
                            f"{exc.message} at {'.'.join(map(str, exc.absolute_path))}")
    expected = ({"Issuer", "Certificate"} if rendered.values["certManager"]["enabled"] else set()) | (
        {"ServiceMonitor", "PrometheusRule"} if rendered.values["serviceMonitor"]["enabled"] else set())
    assert set(skipped) == expected


def test_every_object_is_labelled_and_namespaced(rendered: Rendered) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                      "ValidatingWebhookConfiguration"}
    for doc in rendered.docs:
        meta = doc["metadata"]
        assert meta["labels"]["app.kubernetes.io/instance"] == rendered.case.release
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in meta
            assert meta["name"].startswith(fullname(rendered.case))
        elif meta["name"].endswith("extension-apiserver-authentication-reader"):
            assert meta["namespace"] == "kube-system"
        else:
            assert meta["namespace"] == rendered.case.namespace, (doc["kind"], meta["name"])


# ---- the service config and the CLI ---------------------------------------------------------------


def test_rendered_config_parses_with_the_service(rendered: Rendered) -> None:
    from gpu_placement.base.config import parse_config

    data = yaml.safe_load(rendered.config_text())
    config = parse_config(data)
    v = rendered.values
    assert config.scheduler_name == v["schedulerName"]
    assert list(config.gpu_resources) == v["gpuResources"]
    assert config.shared_resource == v["sharedResource"]
    assert config.exempt_namespaces == {*v["exemptNamespaces"], rendered.case.namespace}
    assert config.mode == v["config"]["mode"]
    assert config.scoring.strategy == v["config"]["scoring"]["strategy"]
    assert config.scoring.tier_size == v["config"]["scoring"]["tierSize"]
    assert set(config.pools) == set(v["config"]["pools"])
    assert [row.release for row in config.ngc_releases] == [row["release"] for row in v["config"]["ngcReleases"]]
    for mig in v["migResources"]:
        assert config.is_gpu_resource(mig)


def test_config_error_is_what_bad_config_raises() -> None:
    from gpu_placement.base.config import ConfigError, parse_config

    with pytest.raises(ConfigError):
        parse_config({"mode": "loud"})


def test_every_container_of_the_service_parses_with_the_cli(rendered: Rendered) -> None:
    from gpu_placement.app.cli import build_parser

    seen = set()
    for deployment in rendered.all("Deployment"):
        for container in _pod_containers(deployment):
            if container["name"] not in SERVICE_IMAGE_CONTAINERS:
                continue
            seen.add(container["name"])
            assert "command" not in container, "the image's ENTRYPOINT is gpu-placement"
            args = build_parser().parse_args(container["args"])
            assert args.command == "serve"
            assert args.components == (container["name"],)
            assert args.kubeconfig is None and args.snapshot is None, "in-cluster API config"
            mounts = _mounts(deployment, container)
            config_volume = _volume_for(args.config, mounts)
            assert config_volume["configMap"]["name"] == f"{fullname(rendered.case)}-config"
            assert args.config.endswith("/config.yaml")
            assert args.log_level == rendered.values["logLevel"]
    assert seen == SERVICE_IMAGE_CONTAINERS


# ---- the scheduler --------------------------------------------------------------------------------


def test_scheduler_configuration(rendered: Rendered) -> None:
    v = rendered.values
    sched = rendered.scheduler_config()
    assert sched["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert sched["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in sched["profiles"]] == [v["schedulerName"]]
    # The stand-ins of claim pods (gpu_placement/decide/dra_quota.py) are on no node: the profile's node fit
    # ignores them.
    [profile] = sched["profiles"]
    assert profile["pluginConfig"] == [{"name": "NodeResourcesFit",
                                        "args": {"ignoredResourceGroups": [n.STANDIN_GROUP]}}]
    election = sched["leaderElection"]
    assert election["leaderElect"] is True
    assert election["resourceName"] == v["schedulerName"]
    assert election["resourceNamespace"] == rendered.case.namespace
    # kube-scheduler decodes its config strictly: an unknown field stops it. Fields of
    # KubeSchedulerConfiguration, LeaderElectionConfiguration and Extender (kubescheduler.config.k8s.io/v1).
    assert set(sched) <= {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
                          "percentageOfNodesToScore", "podInitialBackoffSeconds", "podMaxBackoffSeconds",
                          "profiles", "extenders", "delayCacheUntilActive"}
    assert set(sched["leaderElection"]) <= {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod",
                                            "resourceLock", "resourceName", "resourceNamespace"}
    extender, *binder = sched["extenders"]
    for entry in sched["extenders"]:
        assert set(entry) <= {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
                              "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources",
                              "ignorable"}
        assert entry["urlPrefix"] == extender["urlPrefix"] and entry["ignorable"] is False
    verbs = {key: value for key, value in extender.items() if key.endswith("Verb")}
    bind_all = v["scheduler"]["extender"]["bindAll"] or v["scheduler"]["extender"]["managedResourcesOnly"]
    # /filter answers the best tier (config.scoring.tierSize): kube-scheduler's own plugins choose within it,
    # and /prioritize is asked only when the tier is off (0: every passing node answered).
    tiered = v["config"]["scoring"]["tierSize"] > 0
    assert verbs == {"filterVerb": "filter", "preemptVerb": "preempt", **({"bindVerb": "bind"} if bind_all else {}),
                     **({} if tiered else {"prioritizeVerb": "prioritize"})}
    # Otherwise a second entry, bind only, for the pods that ask for GPU shares (their memory is the
    # extender's alone to account); kube-scheduler's own binder binds the rest.
    assert binder == ([] if bind_all else [{
        "urlPrefix": extender["urlPrefix"], "bindVerb": "bind", "httpTimeout": extender["httpTimeout"],
        "nodeCacheCapable": True, "enableHTTPS": False, "ignorable": False,
        "managedResources": [{"name": v["sharedResource"], "ignoredByScheduler": False}]}])
    assert extender["nodeCacheCapable"] is True
    assert extender["enableHTTPS"] is False
    assert extender["ignorable"] is False
    assert extender.get("weight") == (None if tiered else v["scheduler"]["extender"]["weight"])
    assert extender["httpTimeout"] == v["scheduler"]["extender"]["httpTimeout"]
    managed = [r["name"] for r in extender["managedResources"]]
    # kube-scheduler filters every node before the extender sees them (the default samples big clusters)
    percentage = v["scheduler"]["percentageOfNodesToScore"]
    assert sched.get("percentageOfNodesToScore") == (percentage or None)
    # and the service knows it: /filter tells a sample kube-scheduler cut short by it (extender/sample.py)
    from gpu_placement.base.config import parse_config

    assert parse_config(yaml.safe_load(rendered.config_text())).percentage_of_nodes_to_score == (percentage or 0)
    from gpu_placement.app.cli import build_parser

    args = build_parser().parse_args(rendered.container("extender")["args"])
    if not v["scheduler"]["extender"]["managedResourcesOnly"]:
        # None listed: kube-scheduler sends every pod of the profile (IsInterested, pkg/scheduler/extender.go
        # at v1.37.2), DRA pods whose claims alone ask for a GPU too; nothing can bypass, nothing to warn of.
        assert managed == [] and args.managed_resources is None
        return
    assert managed == [*v["gpuResources"], v["sharedResource"], *v["migResources"], *v["extraMigResources"]]
    # and the extender knows the list, to warn about GPU resources nodes offer beyond it
    assert list(args.managed_resources) == managed
    assert all(r["ignoredByScheduler"] is False for r in extender["managedResources"])


def test_extender_url_is_the_sidecar_listener(rendered: Rendered) -> None:
    from gpu_placement.app.cli import build_parser

    extender = rendered.scheduler_config()["extenders"][0]
    match = re.fullmatch(r"http://127\.0\.0\.1:(\d+)", extender["urlPrefix"])
    assert match, extender["urlPrefix"]
    args = build_parser().parse_args(rendered.container("extender")["args"])
    host, port = args.extender_listen
    assert port == int(match.group(1)) == rendered.values["scheduler"]["extender"]["port"]
    assert host == rendered.values["scheduler"]["extender"]["listenHost"]
    # Same pod: loopback reaches it.
    deployment = rendered.deployment("scheduler")
    names = [c["name"] for c in _pod_containers(deployment)]
    assert names == ["extender", "kube-scheduler"]


def test_scheduler_containers(rendered: Rendered) -> None:
    v = rendered.values["scheduler"]
    deployment = rendered.deployment("scheduler")
    assert deployment["spec"]["replicas"] == v["replicas"]
    container = rendered.container("kube-scheduler")
    repository, _, tag = container["image"].rpartition(":")
    assert repository == "registry.k8s.io/kube-scheduler"
    assert tag == v["image"]["tag"]  # offline the tag is a value (tests/test_chart_adoption.py: else it fails)
    [config_flag] = [a for a in container["command"] if a.startswith("--config=")]
    path = config_flag.split("=", 1)[1]
    volume = _volume_for(path, _mounts(deployment, container))
    assert volume["configMap"]["name"] == f"{fullname(rendered.case)}-scheduler"
    assert path.rsplit("/", 1)[1] in rendered.one("ConfigMap", volume["configMap"]["name"])["data"]
    assert not any(a.startswith("--kubeconfig") for a in container["command"])
    # Extender probes: kubelet's HTTP GETs of /readyz and /healthz on its health listener (all interfaces).
    from gpu_placement.app.cli import build_parser

    extender = rendered.container("extender")
    args = build_parser().parse_args(extender["args"])
    assert args.health_listen == ("0.0.0.0", v["extender"]["healthPort"])
    ports = {p["name"]: p["containerPort"] for p in extender["ports"]}
    assert ports["health"] == v["extender"]["healthPort"]
    for kind, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz"), ("startupProbe", "/readyz")):
        assert extender[kind]["httpGet"] == {"path": path, "port": "health"}, kind
        assert "exec" not in extender[kind]


def test_scheduler_rbac(rendered: Rendered) -> None:
    name = fullname(rendered.case)
    sa = f"{name}-scheduler"
    ns = rendered.case.namespace
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
             for b in rendered.all("ClusterRoleBinding") + rendered.all("RoleBinding") if b["subjects"] == subject}
    assert ("ClusterRole", "system:kube-scheduler", None) in bound
    assert ("ClusterRole", "system:volume-scheduler", None) in bound
    assert ("Role", "extension-apiserver-authentication-reader", "kube-system") in bound
    assert ("ClusterRole", f"{name}-extender", None) in bound
    assert ("Role", f"{sa}-leader-election", ns) in bound
    lease_rules = rendered.one("Role", f"{sa}-leader-election")["rules"]
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]} in lease_rules
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "resourceNames": [rendered.scheduler_config()["leaderElection"]["resourceName"]],
            "verbs": ["get", "update"]} in lease_rules
    extender_rules = rendered.one("ClusterRole", f"{name}-extender")["rules"]
    assert extender_rules == [
        {"apiGroups": [""], "resources": ["nodes", "pods", "namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["list", "watch"]},  # /preempt
        {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
        DRA_READ,
    ] or extender_rules == [
        {"apiGroups": [""], "resources": ["nodes", "pods", "namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
    ]
    assert rendered.deployment("scheduler")["spec"]["template"]["spec"]["serviceAccountName"] == sa


def test_scheduler_pdb_only_with_a_standby(rendered: Rendered) -> None:
    pdbs = [p for p in rendered.all("PodDisruptionBudget") if p["metadata"]["name"].endswith("-scheduler")]
    assert len(pdbs) == (1 if rendered.values["scheduler"]["replicas"] > 1 else 0)


# ---- the webhook ----------------------------------------------------------------------------------


def test_webhook_configurations(rendered: Rendered) -> None:
    v = rendered.values["webhook"]
    service = rendered.one("Service", f"{fullname(rendered.case)}-webhook")
    for config, path, policy in zip(_webhooks(rendered), ("/mutate", "/validate"),
                                    (v["mutating"]["failurePolicy"], v["validating"]["failurePolicy"]),
                                    strict=True):
        hook = config["webhooks"][0]
        assert hook["clientConfig"]["service"] == {"name": service["metadata"]["name"],
                                                   "namespace": rendered.case.namespace, "path": path, "port": 443}
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["timeoutSeconds"] == v["timeoutSeconds"] <= 10
        assert hook["failurePolicy"] == policy
        assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                  "resources": ["pods"], "scope": "Namespaced"}]
        assert hook["matchConditions"], "only pods that matter are sent"
    mutating, validating = _webhooks(rendered)
    assert mutating["webhooks"][0]["reinvocationPolicy"] == "IfNeeded"
    assert "reinvocationPolicy" not in validating["webhooks"][0]
    assert len(mutating["webhooks"]) == 1
    # The second validating webhook: pod UPDATEs that change a gpu-placement.io/* annotation.
    create, update, claims = validating["webhooks"]
    assert claims["name"] == "validate-claims.gpu-placement.io"  # tests/test_dra_claims_validate.py
    assert update["name"] == "validate-annotations.gpu-placement.io" != create["name"]
    assert update["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                                "resources": ["pods", "pods/status"], "scope": "Namespaced"}]
    for key in ("clientConfig", "failurePolicy", "timeoutSeconds", "sideEffects", "admissionReviewVersions",
                "matchPolicy", "namespaceSelector"):
        assert update[key] == create[key], key


def test_webhook_paths_are_the_routes_the_apps_serve(rendered: Rendered, tmp_path: Path) -> None:
    """The chart's extender verbs and webhook paths against the apps built by the code, from the
    rendered config."""
    from gpu_placement.app.assembly import core_from_snapshot
    from gpu_placement.base.config import parse_config

    snapshot = tmp_path / "empty.yaml"
    snapshot.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    core = core_from_snapshot(parse_config(yaml.safe_load(rendered.config_text())), snapshot)
    try:
        extender_routes = {r.path: r.methods for r in core.extender_app(1 << 20).routes}
        webhook_routes = {r.path: r.methods for r in core.webhook_app().routes}
    finally:
        core.stop()
    for extender in rendered.scheduler_config()["extenders"]:
        for key in ("filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb"):
            if key in extender:
                assert "POST" in (extender_routes[f"/{extender[key]}"] or set())
    for config in _webhooks(rendered):
        assert "POST" in (webhook_routes[config["webhooks"][0]["clientConfig"]["service"]["path"]] or set())
    for ops in ("/healthz", "/readyz", "/metrics"):
        assert ops in extender_routes and ops in webhook_routes


def test_webhook_service_reaches_the_listener(rendered: Rendered) -> None:
    from gpu_placement.app.cli import build_parser

    container = rendered.container("webhook")
    args = build_parser().parse_args(container["args"])
    host, port = args.webhook_listen
    assert host == "0.0.0.0"
    service = rendered.one("Service", f"{fullname(rendered.case)}-webhook")
    [service_port] = service["spec"]["ports"]
    assert service_port["port"] == 443
    assert service_port["targetPort"] == port == rendered.values["webhook"]["port"]
    assert [p["containerPort"] for p in container["ports"]] == [port]
    pod_labels = rendered.deployment("webhook")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    scheduler_labels = rendered.deployment("scheduler")["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= scheduler_labels.items()
    for kind, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        probe = container[kind]["httpGet"]
        assert (probe["path"], probe["scheme"], probe["port"]) == (path, "HTTPS", "https")


def test_exempt_namespaces_match_the_config(rendered: Rendered) -> None:
    config = yaml.safe_load(rendered.config_text())
    expected = {*rendered.values["exemptNamespaces"], rendered.case.namespace}
    assert set(config["exemptNamespaces"]) == expected
    for hook in (h for webhook_config in _webhooks(rendered) for h in webhook_config["webhooks"]):
        exempt = hook["namespaceSelector"]["matchExpressions"][0]
        assert exempt == {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                          "values": sorted(expected, key=config["exemptNamespaces"].index)}


def test_managed_resources_cover_every_gpu_resource_of_the_config(rendered: Rendered) -> None:
    config = yaml.safe_load(rendered.config_text())
    extender = rendered.scheduler_config()["extenders"][0]
    managed = {r["name"] for r in extender["managedResources"]}
    if not managed:  # every pod of the profile is sent
        assert not rendered.values["scheduler"]["extender"]["managedResourcesOnly"]
        return
    assert {*config["gpuResources"], config["sharedResource"]} <= managed
    assert all(r.startswith("nvidia.com/mig-") for r in managed - {*config["gpuResources"], config["sharedResource"]})


def test_webhook_certificates(rendered: Rendered) -> None:
    from gpu_placement.app.cli import build_parser

    name = fullname(rendered.case)
    ns = rendered.case.namespace
    service = f"{name}-webhook"
    cert_manager = rendered.values["certManager"]["enabled"]
    # Separate Secrets, so switching certManager.enabled never meets the other source's Secret.
    secret = f"{name}-webhook-cert-manager-tls" if cert_manager else f"{name}-webhook-tls"
    deployment = rendered.deployment("webhook")
    container = rendered.container("webhook")
    args = build_parser().parse_args(container["args"])
    mounts = _mounts(deployment, container)
    if cert_manager:
        assert not args.manage_certs
        for path in (args.tls_cert, args.tls_key):
            volume = _volume_for(path, mounts)
            assert volume["secret"]["secretName"] == secret and volume["readOnly"]
        assert (args.tls_cert, args.tls_key) == ("/certs/tls.crt", "/certs/tls.key")
        issuers = {i["metadata"]["name"]: i["spec"] for i in rendered.all("Issuer")}
        certs = {c["metadata"]["name"]: c["spec"] for c in rendered.all("Certificate")}
        serving = certs[f"{name}-webhook"]
        assert serving["secretName"] == secret
        assert serving["dnsNames"] == [service, f"{service}.{ns}", f"{service}.{ns}.svc",
                                       f"{service}.{ns}.svc.cluster.local"]
        ca_issuer = issuers[serving["issuerRef"]["name"]]
        ca_cert = next(c for c in certs.values() if c["secretName"] == ca_issuer["ca"]["secretName"])
        assert ca_cert["isCA"] is True
        assert issuers[ca_cert["issuerRef"]["name"]] == {"selfSigned": {}}
        for config in _webhooks(rendered):
            assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{ns}/{name}-webhook"
        assert not [r for r in rendered.all("Role") if r["metadata"]["name"].endswith("-certs")]
        return
    assert args.manage_certs and args.tls_cert is None
    assert (args.cert_secret, args.service, args.namespace) == (secret, service, ns)
    assert args.webhook_configuration == name
    for config in _webhooks(rendered):
        assert config["metadata"]["name"] == args.webhook_configuration
        assert "cert-manager.io/inject-ca-from" not in config["metadata"]["annotations"]
    cert_dir = _volume_for(args.cert_dir + "/tls.crt", mounts)
    assert "emptyDir" in cert_dir and not cert_dir["readOnly"], "the root filesystem is read-only"
    assert args.cert_dir == "/tmp/certs"
    assert not rendered.all("Certificate")
    # RBAC: the Secret and Lease by name where the verb allows it, both webhook configurations by name.
    rules = rendered.one("Role", f"{name}-webhook-certs")["rules"]
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret],
            "verbs": ["get", "update", "patch"]} in rules
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]} in rules
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [f"{secret}-lock"],
            "verbs": ["get", "update"]} in rules
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]} in rules
    assert all("resourceNames" in r or r["verbs"] == ["create"] for r in rules)


def test_webhook_rbac_reads_the_view(rendered: Rendered) -> None:
    name = fullname(rendered.case)
    writes = rendered.values["config"]["dra"]["taints"]
    taints = [{"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"],
               "verbs": ["get", "list", "create", "update", "delete"]}] if writes else []
    assert rendered.one("ClusterRole", f"{name}-webhook")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes", "pods", "namespaces"], "verbs": ["get", "list", "watch"]},
        NODE_PATCH, DRA_READ, DRA_TEMPLATES, EVENTS, *taints]
    assert rendered.deployment("webhook")["spec"]["template"]["spec"]["serviceAccountName"] == f"{name}-webhook"


# gpu_placement/controllers/settled_drivers.py: gpu-placement.io/settled-driver on Nodes, by one replica.
NODE_PATCH = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}


def test_webhook_settled_drivers_lease(rendered: Rendered) -> None:
    from gpu_placement.app.cli import build_parser

    name, ns = fullname(rendered.case), rendered.case.namespace
    args = build_parser().parse_args(rendered.container("webhook")["args"])
    assert args.drivers_lease == f"{name}-drivers"
    role = rendered.one("Role", f"{name}-webhook-drivers-lease")
    assert role["metadata"]["namespace"] == ns
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [args.drivers_lease],
         "verbs": ["get", "update"]}]
    binding = rendered.one("RoleBinding", f"{name}-webhook-drivers-lease")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{name}-webhook", "namespace": ns}]


def test_webhook_launch_fences_lease(rendered: Rendered) -> None:
    """gpu_placement/controllers/launch_fences.py: gpu-placement.io/launch-fence on Nodes, by the holder of
    its own Lease (the node patch is the settled drivers' rule)."""
    from gpu_placement.app.cli import build_parser

    name, ns = fullname(rendered.case), rendered.case.namespace
    args = build_parser().parse_args(rendered.container("webhook")["args"])
    assert args.fences_lease == f"{name}-launch-fences"
    role = rendered.one("Role", f"{name}-webhook-launch-fences-lease")
    assert role["metadata"]["namespace"] == ns
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [args.fences_lease],
         "verbs": ["get", "update"]}]
    binding = rendered.one("RoleBinding", f"{name}-webhook-launch-fences-lease")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{name}-webhook", "namespace": ns}]


# gpu_placement/controllers/events.py: create an Event, patch a series' count; and the writer's own Lease.
EVENTS = {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}


def test_webhook_events_lease(rendered: Rendered) -> None:
    from gpu_placement.app.cli import build_parser

    name = fullname(rendered.case)
    args = build_parser().parse_args(rendered.container("webhook")["args"])
    assert args.events is True and args.events_lease == f"{name}-events"
    assert rendered.one("Role", f"{name}-webhook-events-lease")["rules"][1] == {
        "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [f"{name}-events"],
        "verbs": ["get", "update"]}


def test_webhook_quota_mirror_rbac_and_args(rendered: Rendered) -> None:
    """The mirror runs whatever the certificate mode (its own Lease), in audit mode too (where it
    deletes what it kept), and may do only what it does: ResourceQuotas, and its one Lease. Its
    quotas are owned by the ValidatingWebhookConfiguration, so helm uninstall takes them."""
    from gpu_placement.app.cli import build_parser

    name, ns = fullname(rendered.case), rendered.case.namespace
    args = build_parser().parse_args(rendered.container("webhook")["args"])
    roles = {r["metadata"]["name"]: r for r in rendered.all("Role") + rendered.all("ClusterRole")}
    assert args.quota_mirror is True and args.namespace == ns
    assert args.quota_lease == f"{name}-quota-mirror"
    assert args.owner == name == _webhooks(rendered)[1]["metadata"]["name"]
    assert roles[f"{name}-webhook-quotas"]["rules"] == [  # every verb RBAC can limit by name is limited to ours
        {"apiGroups": [""], "resources": ["resourcequotas"], "resourceNames": [MIRROR_NAME],
         "verbs": ["get", "list", "watch", "update", "delete"]},
        {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["create"]}]
    lease_role = roles[f"{name}-webhook-quota-lease"]
    assert lease_role["metadata"]["namespace"] == ns
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [args.quota_lease],
         "verbs": ["get", "update"]}]
    bindings = {b["metadata"]["name"]: b for b in rendered.all("RoleBinding") + rendered.all("ClusterRoleBinding")}
    for binding in (f"{name}-webhook-quotas", f"{name}-webhook-quota-lease"):
        assert bindings[binding]["roleRef"]["name"] == binding
        assert bindings[binding]["subjects"] == [{"kind": "ServiceAccount", "name": f"{name}-webhook",
                                                  "namespace": ns}]


def test_webhook_availability(rendered: Rendered) -> None:
    v = rendered.values["webhook"]
    deployment = rendered.deployment("webhook")
    assert deployment["spec"]["replicas"] == v["replicas"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdbs = [p for p in rendered.all("PodDisruptionBudget") if p["metadata"]["name"].endswith("-webhook")]
    if v["replicas"] < 2:
        assert pdbs == [], "minAvailable 1 with one replica would block node drains"
        return
    [pdb] = pdbs
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert any(c["topologyKey"] == "kubernetes.io/hostname" and c["whenUnsatisfiable"] == "DoNotSchedule"
               for c in spread)


# ---- security ------------------------------------------------------------------------------------


def test_pods_are_locked_down(rendered: Rendered) -> None:
    accounts = {sa["metadata"]["name"]: sa for sa in rendered.all("ServiceAccount")}
    assert len(accounts) == 2, "separate ServiceAccounts for scheduler and webhook"
    for deployment in rendered.all("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is True, "both pods talk to the API server"
        assert accounts[pod["serviceAccountName"]]["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "hostNetwork" not in pod and "hostPID" not in pod
        for container in _pod_containers(deployment):
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert container["resources"]["requests"] and container["resources"]["limits"]
            assert "livenessProbe" in container and "readinessProbe" in container
            for mount in container.get("volumeMounts", []):
                volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
                assert mount.get("readOnly") or "emptyDir" in volume, (container["name"], mount)


def test_pods_roll_when_the_config_changes(chart: helm_python.Chart) -> None:
    def annotations(values: dict[str, Any]) -> dict[str, dict[str, str]]:
        docs = _render(chart, Case("x", values)).all("Deployment")
        return {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"] for d in docs}

    before = annotations({})
    after = annotations({"config": {"scoring": {"strategy": "spread"}}})
    for name in before:
        assert before[name]["checksum/config"] != after[name]["checksum/config"]


def test_image(rendered: Rendered) -> None:
    image = rendered.values["image"]
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    expected = (f"{image['repository']}@{image['digest']}" if image["digest"]
                else f"{image['repository']}:{image['tag'] or app_version}")
    for name in SERVICE_IMAGE_CONTAINERS:
        assert rendered.container(name)["image"] == expected


# ---- metrics --------------------------------------------------------------------------------------


def test_service_monitor(rendered: Rendered) -> None:
    monitors = rendered.all("ServiceMonitor")
    if not rendered.values["serviceMonitor"]["enabled"]:
        assert monitors == []
        return
    [monitor] = monitors
    spec = monitor["spec"]
    for key, value in rendered.values["serviceMonitor"]["labels"].items():
        assert monitor["metadata"]["labels"][key] == value
    selected = [s for s in rendered.all("Service")
                if spec["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    ports = {p["name"] for s in selected for p in s["spec"]["ports"]}
    endpoints = {e["port"]: e for e in spec["endpoints"]}
    assert set(endpoints) <= ports
    assert endpoints["https"]["path"] == "/metrics" and endpoints["https"]["scheme"] == "https"
    webhook_container = rendered.container("webhook")
    secrets = {v["secret"]["secretName"] for v in rendered.deployment("webhook")["spec"]["template"]["spec"]["volumes"]
               if "secret" in v} or {_flag(webhook_container["args"], "--cert-secret")}
    assert {endpoints["https"]["tlsConfig"]["ca"]["secret"]["name"]} == secrets
    exposed = rendered.values["scheduler"]["extender"]["listenHost"] != "127.0.0.1"
    assert ("extender" in endpoints) == exposed
    if exposed:
        assert endpoints["extender"]["path"] == "/metrics"


# ---- matchConditions: the CEL, evaluated on sample pods ------------------------------------------


class CelError(Exception):
    """What CEL raises too: a field read that is not there, or an unsupported construct."""


_TOKEN = re.compile(r"\s*(?:(\|\||&&|==|!=|[!().,\[\]])|('(?:[^'\\]|\\.)*')|([A-Za-z_][A-Za-z0-9_]*))")


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            raise CelError(f"cannot read {text[pos:pos + 20]!r}")
        out.append(match.group(0).strip())
        pos = match.end()
    return out


class _Cel:
    """A parser and evaluator for the CEL the chart's matchConditions use: ||, &&, !, ==, !=, in,
    field selection, map indexing (m[k]), string and list literals, has(), .exists() on lists and maps,
    .startsWith().
    Like CEL, selecting a field that is absent is an error, so a missing has() guard fails here."""

    def __init__(self, text: str) -> None:
        self.tokens, self.pos = _tokens(text), 0
        self.ast = self.parse_or()
        if self.pos != len(self.tokens):
            raise CelError(f"unexpected {self.tokens[self.pos]!r}")

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise CelError(f"expected {expected!r}, found {token!r}")
        self.pos += 1
        return token

    def parse_or(self) -> Any:
        node = self.parse_and()
        while self.peek() == "||":
            self.take()
            node = ("||", node, self.parse_and())
        return node

    def parse_and(self) -> Any:
        node = self.parse_unary()
        while self.peek() == "&&":
            self.take()
            node = ("&&", node, self.parse_unary())
        return node

    def parse_unary(self) -> Any:
        if self.peek() == "!":
            self.take()
            return ("!", self.parse_unary())
        node = self.parse_member()
        if self.peek() in ("==", "!=", "in"):
            op = self.take()
            node = (op, node, self.parse_member())
        return node

    def parse_member(self) -> Any:
        node = self.parse_primary()
        while self.peek() in (".", "["):
            if self.take() == "[":
                node = ("index", node, self.parse_or())
                self.take("]")
                continue
            field = self.take()
            if self.peek() == "(":
                self.take()
                args = [self.parse_or()]
                while self.peek() == ",":
                    self.take()
                    args.append(self.parse_or())
                self.take(")")
                node = ("call", field, node, args)
            else:
                node = ("select", node, field)
        return node

    def parse_primary(self) -> Any:
        token = self.take()
        if token == "(":
            node = self.parse_or()
            self.take(")")
            return node
        if token == "[":
            items = [] if self.peek() == "]" else [self.parse_or()]
            while self.peek() == ",":
                self.take()
                items.append(self.parse_or())
            self.take("]")
            return ("list", items)
        if token.startswith("'"):
            return ("str", token[1:-1])
        if token == "has":
            self.take("(")
            arg = self.parse_member()
            self.take(")")
            if arg[0] != "select":
                raise CelError("has() takes a field selection")
            return ("has", arg)
        return ("ident", token)

    def eval(self, node: Any, env: dict[str, Any]) -> Any:
        op = node[0]
        if op == "||":
            return self.truth(node[1], env) or self.truth(node[2], env)
        if op == "&&":
            return self.truth(node[1], env) and self.truth(node[2], env)
        if op == "!":
            return not self.truth(node[1], env)
        if op in ("==", "!="):
            left, right = self.eval(node[1], env), self.eval(node[2], env)
            return (left == right) == (op == "==")
        if op == "in":
            return self.eval(node[1], env) in self.eval(node[2], env)
        if op == "str":
            return node[1]
        if op == "list":
            return [self.eval(item, env) for item in node[1]]
        if op == "ident":
            if node[1] not in env:
                raise CelError(f"undeclared reference {node[1]}")
            return env[node[1]]
        if op == "select":
            target = self.eval(node[1], env)
            if not isinstance(target, dict) or node[2] not in target:
                raise CelError(f"no such key: {node[2]}")
            return target[node[2]]
        if op == "index":
            target, key = self.eval(node[1], env), self.eval(node[2], env)
            if not isinstance(target, dict) or key not in target:
                raise CelError(f"no such key: {key}")
            return target[key]
        if op == "has":
            target = self.eval(node[1][1], env)
            if not isinstance(target, dict):
                raise CelError("has() on a non-object")
            return node[1][2] in target
        if op == "call":
            _, name, target_node, args = node
            target = self.eval(target_node, env)
            if name == "startsWith":
                return str(target).startswith(self.eval(args[0], env))
            if name == "exists":
                if args[0][0] != "ident":
                    raise CelError("exists() needs a variable")
                items = list(target) if isinstance(target, dict | list) else None
                if items is None:
                    raise CelError("exists() on a non-collection")
                return any(self.truth(args[1], {**env, args[0][1]: item}) for item in items)
            raise CelError(f"unsupported function {name}")
        raise CelError(f"unsupported {op}")

    def truth(self, node: Any, env: dict[str, Any]) -> bool:
        value = self.eval(node, env)
        if not isinstance(value, bool):
            raise CelError(f"no such overload: {value!r} is not a bool")
        return value

    def __call__(self, pod: Doc, old: Doc | None = None) -> bool:
        """`object`, and `oldObject` for an UPDATE (absent on CREATE: a reference to it is an error)."""
        return self.truth(self.ast, {"object": pod} if old is None else {"object": pod, "oldObject": old})


def _pod(*containers: Doc, init: list[Doc] | None = None, tolerations: list[Doc] | None = None,
         owner: str | None = None) -> Doc:
    spec: Doc = {"containers": list(containers) or [{"name": "main", "image": "busybox"}]}
    if init is not None:
        spec["initContainers"] = init
    if tolerations is not None:
        spec["tolerations"] = tolerations
    meta: Doc = {"generateName": "p-"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": "o", "uid": "u"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _asks(kind: str, resource: str) -> Doc:
    return {"name": "c", "image": "cuda", "resources": {kind: {"cpu": "1", resource: "1"}}}


CPU = {"name": "c", "image": "app", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}
DRA_READ = {"apiGroups": ["resource.k8s.io"], "verbs": ["get", "list", "watch"],
            "resources": ["resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates"]}
DRA_TEMPLATES = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"],
                 "verbs": ["create", "delete"]}
EMPTY_RESOURCES = {"name": "c", "image": "app", "resources": {}}

# (description, pod, sent to /mutate with protectGpuNodes, sent to /validate)
SAMPLE_PODS: list[tuple[str, Callable[[Rendered], Doc], bool, bool]] = [
    ("plain pod", lambda r: _pod(), False, False),
    ("cpu requests only", lambda r: _pod(CPU, EMPTY_RESOURCES), False, False),
    ("gpu request", lambda r: _pod(_asks("requests", "nvidia.com/gpu")), True, True),
    ("gpu limit only", lambda r: _pod(CPU, _asks("limits", "nvidia.com/gpu")), True, True),
    ("shared resource", lambda r: _pod(_asks("requests", r.values["sharedResource"])), True, True),
    ("mig by prefix", lambda r: _pod(_asks("limits", "nvidia.com/mig-2g.20gb")), True, True),
    ("every configured resource", lambda r: _pod(*[_asks("requests", x) for x in r.values["gpuResources"]]),
     True, True),
    ("gpu in init container", lambda r: _pod(CPU, init=[_asks("requests", "nvidia.com/gpu")]), True, True),
    ("cpu init container", lambda r: _pod(CPU, init=[CPU, EMPTY_RESOURCES]), False, False),
    ("gpu-like name", lambda r: _pod(_asks("requests", "nvidia.com/gpux")), False, False),
    ("tolerates the gpu taint", lambda r: _pod(CPU, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]),
     True, False),
    ("bare Exists", lambda r: _pod(tolerations=[{"operator": "Exists"}]), True, False),
    ("Exists with empty key", lambda r: _pod(tolerations=[{"key": "", "operator": "Exists"}]), True, False),
    ("other taint", lambda r: _pod(tolerations=[{"key": "database", "operator": "Equal", "value": "db"},
                                                {"operator": "Equal", "value": "x"}]), False, False),
    ("DaemonSet tolerating everything", lambda r: _pod(tolerations=[{"operator": "Exists"}], owner="DaemonSet"),
     False, False),
    ("ReplicaSet tolerating everything", lambda r: _pod(tolerations=[{"operator": "Exists"}], owner="ReplicaSet"),
     True, False),
    ("DaemonSet asking for a gpu", lambda r: _pod(_asks("requests", "nvidia.com/gpu"), owner="DaemonSet"),
     True, True),
    # DRAExtendedResource: every DeviceClass answers to deviceclass.resource.kubernetes.io/<class>; for a
    # configured GPU class that is a GPU pod (kube-scheduler allocates a device of the class), else not.
    ("the implicit name of a GPU class", lambda r: _pod(_asks("limits", "deviceclass.resource.kubernetes.io/"
                                                                     "gpu.nvidia.com")), True, True),
    ("the implicit name of another class", lambda r: _pod(_asks("limits", "deviceclass.resource.kubernetes.io/"
                                                                         "nic.example.com")), False, False),
    # DRA: the class is in the claim, which the CEL cannot read: /mutate sees any pod with claims and
    # routes those that ask for a GPU class; /validate counts their devices in `dra` namespaces.
    ("ResourceClaims", lambda r: {**_pod(CPU), "spec": {**_pod(CPU)["spec"], "resourceClaims": [
        {"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}}, True, True),
]


def test_match_conditions_send_only_pods_that_matter(rendered: Rendered) -> None:
    mutating, validating = _webhooks(rendered)
    [mutate] = [_Cel(c["expression"]) for c in mutating["webhooks"][0]["matchConditions"]]
    [validate] = [_Cel(c["expression"]) for c in validating["webhooks"][0]["matchConditions"]]
    protect = rendered.values["config"]["protectGpuNodes"]
    for description, make, to_mutate, to_validate in SAMPLE_PODS:
        pod = make(rendered)
        gpu = to_validate or bool(pod["spec"].get("resourceClaims"))
        assert mutate(pod) == (to_mutate if protect else gpu), f"/mutate, {description}"
        assert validate(pod) == to_validate, f"/validate, {description}"


def test_match_conditions_agree_with_the_code(rendered: Rendered) -> None:
    """On every sample pod, the CEL sends exactly the pods the service's own rules act on: GPU pods
    (effective GPU requests) to both, and taint-tolerating non-DaemonSet pods to /mutate."""
    from gpu_placement.base.config import parse_config
    from gpu_placement.facts.pods import effective_gpu_requests
    from webhook.patches import tolerates_gpu_taint

    config = parse_config(yaml.safe_load(rendered.config_text()))
    mutating, validating = _webhooks(rendered)
    [mutate] = [_Cel(c["expression"]) for c in mutating["webhooks"][0]["matchConditions"]]
    [validate] = [_Cel(c["expression"]) for c in validating["webhooks"][0]["matchConditions"]]
    for description, make, _, _ in SAMPLE_PODS:
        pod = make(rendered)
        gpu = bool(effective_gpu_requests(pod["spec"], config.is_gpu_resource))
        daemonset = any(o["kind"] == "DaemonSet" for o in pod["metadata"].get("ownerReferences", []))
        protect = config.protect_gpu_nodes and not daemonset and tolerates_gpu_taint(pod["spec"], config)
        claims = bool(pod["spec"].get("resourceClaims"))  # /mutate reads their classes (Admission._claims)
        assert validate(pod) == (gpu or claims), description
        assert mutate(pod) == (gpu or protect or claims), description


def test_match_conditions_honour_custom_tolerations() -> None:
    """A key from config.gpuTolerations counts as the GPU taint too (custom case: `dedicated`)."""
    case = _case("custom")
    with helm_python.Chart.load(CHART) as loaded:
        mutating, _ = _webhooks(_render(loaded, case))
    [mutate] = [_Cel(c["expression"]) for c in mutating["webhooks"][0]["matchConditions"]]
    assert mutate(_pod(tolerations=[{"key": "dedicated", "operator": "Equal", "value": "gpu"}]))
    assert mutate(_pod(_asks("requests", "example.com/accelerator")))


def test_cel_evaluator_catches_unguarded_fields() -> None:
    """The evaluator is as strict as CEL: this is what makes the has() guards above meaningful."""
    with pytest.raises(CelError):
        _Cel("object.spec.initContainers.exists(c, c.name == 'x')")(_pod())
    with pytest.raises(CelError):
        _Cel("object.spec.containers.exists(c, c.resources.limits.exists(r, r == 'x'))")(_pod(CPU))
    assert _Cel("has(object.spec.initContainers) && object.spec.initContainers.exists(c, c.name == 'x')")(
        _pod(init=[{"name": "x"}]))


# ---- issue 8: the scheduler sees every node, every MIG profile, and starts after the extender ------

# MIG profiles NVIDIA publishes (mig-parted's default config, deployments/systemd/config-default.yaml),
# as the device plugin advertises them (`+me` becomes `.me`).
PUBLISHED_MIG = {
    "A30-24GB": ["1g.6gb", "1g.6gb.me", "2g.12gb", "2g.12gb.me", "4g.24gb"],
    "A100-40GB": ["1g.5gb", "1g.5gb.me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "A100-80GB, H100-80GB": ["1g.10gb", "1g.10gb.me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100 NVL": ["1g.12gb", "1g.12gb.me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
    "H100-96GB": ["1g.12gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"],
    "H200-141GB": ["1g.18gb", "1g.18gb.me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    "B200": ["1g.23gb", "1g.23gb.me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"],
}


def test_default_managed_resources_cover_every_published_mig_profile(chart: helm_python.Chart) -> None:
    default = _render(chart, Case("before-dra", {"scheduler": {"extender": {"managedResourcesOnly": True}}}))
    [extender] = default.scheduler_config()["extenders"]  # managedResourcesOnly: one entry, the binder too
    managed = {r["name"] for r in extender["managedResources"]}
    for gpu, profiles in PUBLISHED_MIG.items():
        missing = [p for p in profiles if f"nvidia.com/mig-{p}" not in managed]
        assert not missing, f"{gpu}: {missing}"
    assert {"nvidia.com/gpu", "nvidia.com/gpu.shared"} <= managed


def test_extra_mig_resources_extend_the_defaults(chart: helm_python.Chart) -> None:
    extra = _render(chart, Case("extra", {"extraMigResources": ["nvidia.com/mig-1g.24gb.gfx"],
                                          "scheduler": {"extender": {"managedResourcesOnly": True}}}))
    [extender] = extra.scheduler_config()["extenders"]  # managedResourcesOnly: one entry, the binder too
    managed = [r["name"] for r in extender["managedResources"]]
    assert managed[-1] == "nvidia.com/mig-1g.24gb.gfx" and "nvidia.com/mig-7g.180gb" in managed


def test_extender_is_a_native_sidecar_that_starts_first(rendered: Rendered) -> None:
    pod = rendered.deployment("scheduler")["spec"]["template"]["spec"]
    [sidecar] = pod["initContainers"]
    assert sidecar["name"] == "extender" and sidecar["restartPolicy"] == "Always"
    # kubelet starts the next container once a sidecar's startup probe passes: the view is listed
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["startupProbe"]["periodSeconds"] * sidecar["startupProbe"]["failureThreshold"] >= 300
    assert [c["name"] for c in pod["containers"]] == ["kube-scheduler"]


def _annotated(annotations: dict[str, str] | None, labels: dict[str, str] | None = None) -> Doc:
    pod = _pod(_asks("requests", "nvidia.com/gpu"))
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    if labels is not None:
        pod["metadata"]["labels"] = labels
    return pod


ADMITTED = {"gpu-placement.io/admitted": '{"resources":{"nvidia.com/gpu":1}}', "team": "a"}
# (description, old pod, new pod, sent to the UPDATE webhook)
SAMPLE_UPDATES: list[tuple[str, Doc, Doc, bool]] = [
    ("nothing changes", _annotated(ADMITTED), _annotated(ADMITTED), False),
    ("a label changes", _annotated(ADMITTED), _annotated(ADMITTED, {"x": "1"}), False),
    ("another annotation changes", _annotated(ADMITTED), _annotated({**ADMITTED, "team": "b"}), False),
    ("another annotation added to a pod without any", _annotated(None), _annotated({"team": "b"}), False),
    ("all annotations removed from a pod without ours", _annotated({"team": "a"}), _annotated(None), False),
    ("gpu-memory added", _annotated(ADMITTED), _annotated({**ADMITTED, "gpu-placement.io/gpu-memory": "1Gi"}),
     True),
    ("gpu-memory added to a pod without annotations", _annotated(None),
     _annotated({"gpu-placement.io/gpu-memory": "1Gi"}), True),
    ("admitted rewritten", _annotated(ADMITTED), _annotated({**ADMITTED, "gpu-placement.io/admitted": "{}"}), True),
    ("admitted removed", _annotated(ADMITTED), _annotated({"team": "a"}), True),
    ("all annotations removed", _annotated(ADMITTED), _annotated(None), True),
    ("sharing set to the same value", _annotated({"gpu-placement.io/sharing": "shared"}),
     _annotated({"gpu-placement.io/sharing": "shared", "team": "a"}), False),
]


def test_update_match_conditions_send_only_changes_to_our_annotations(rendered: Rendered) -> None:
    """The UPDATE webhook's CEL sends exactly the updates the service denies, so ordinary pod updates
    (status, labels, other annotations) never reach it."""
    from webhook.admission import _changed_annotations

    _, validating = _webhooks(rendered)
    [update] = [_Cel(c["expression"]) for c in validating["webhooks"][1]["matchConditions"]]
    for description, old, new, sent in SAMPLE_UPDATES:
        assert update(new, old) == sent, description
        assert bool(_changed_annotations(old, new)) == sent, description
    with pytest.raises(CelError):  # no oldObject (a CREATE): why its rule lists UPDATE only
        update(_annotated(ADMITTED))
