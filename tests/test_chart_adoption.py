"""The chart's adoption features, rendered by Helm (helm_python): webhook configurations installed
empty with their webhooks in a ConfigMap, namespace opt-in, the conventions of charts in this field
(name overrides, pod labels, security contexts that OpenShift accepts, extra args and env,
NetworkPolicies, certificate lifetimes as values), HTTP probes, a kube-scheduler tag that offline
renders must set, and short NOTES. What the rendered objects do on a real control plane:
tests/e2e/test_0_adoption.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import helm_python
import pytest
import yaml

from gpu_placement.app.cli import build_parser
from tests.support.chart import CHART, NAMESPACE, Case, Doc, Rendered, _render, _webhooks, offline

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm_python.Chart, values: dict[str, Any], release: str = "gpu-placement") -> Rendered:
    return _render(chart, Case("adoption", values, release=release))


def pods(rendered: Rendered) -> list[Doc]:
    return [d["spec"]["template"] for d in rendered.all("Deployment")]


def containers(rendered: Rendered) -> list[Doc]:
    return [c for pod in pods(rendered) for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]]


# -- installed without webhooks --------------------------------------------------------------------


def test_the_webhook_configurations_are_installed_without_webhooks(chart: helm_python.Chart) -> None:
    """Nothing can be refused before a replica answers: the replicas write the webhooks in."""
    rendered = render(chart, {})
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = rendered.one(kind, "gpu-placement")
        assert "webhooks" not in config
    args = build_parser().parse_args(rendered.container("webhook")["args"])
    assert args.webhook_configuration == "gpu-placement" and args.service == "gpu-placement-webhook"
    deployment = rendered.deployment("webhook")
    mounts = {m["mountPath"]: m["name"] for m in rendered.container("webhook")["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    directory, _, file = args.webhooks_file.rpartition("/")
    assert volumes[mounts[directory]]["configMap"]["name"] == "gpu-placement-webhooks"
    assert file in rendered.one("ConfigMap", "gpu-placement-webhooks")["data"]
    # Its RBAC: get and patch of these two by name, and the endpoints of its Service; never create.
    rules = rendered.one("ClusterRole", "gpu-placement-webhook-configurations")["rules"]
    assert rules == [{"apiGroups": ["admissionregistration.k8s.io"],
                      "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
                      "resourceNames": ["gpu-placement"], "verbs": ["get", "patch"]}]
    assert rendered.one("Role", "gpu-placement-webhook-endpoints")["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}]


def test_a_webhook_change_rolls_the_webhook_pods_only(chart: helm_python.Chart) -> None:
    def annotations(values: dict[str, Any]) -> dict[str, dict[str, str]]:
        return {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]
                for d in render(chart, values).all("Deployment")}

    before, after = annotations({}), annotations({"webhook": {"timeoutSeconds": 3}})
    assert before["gpu-placement-webhook"] != after["gpu-placement-webhook"]
    assert before["gpu-placement-scheduler"] == after["gpu-placement-scheduler"]


# -- opt-in ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("selection, expression", [
    ("optIn", {"key": "gpu-placement.io/enabled", "operator": "In", "values": ["true"]}),
    ("optOut", {"key": "gpu-placement.io/enabled", "operator": "NotIn", "values": ["false"]}),
])
def test_namespace_selection_is_enforced_by_every_webhooks_namespace_selector(
        chart: helm_python.Chart, selection: str, expression: Doc) -> None:
    from gpu_placement.base.config import parse_config

    values = {} if selection == "optIn" else {"namespaceSelection": selection}  # optIn is the default
    rendered = render(chart, values)
    hooks = [hook for config in _webhooks(rendered) for hook in config["webhooks"]]
    assert len(hooks) == 4  # mutate; validate pods, their annotation updates, DRA claims
    for hook in hooks:
        assert hook["namespaceSelector"]["matchExpressions"][1] == expression, hook["name"]
    config = parse_config(yaml.safe_load(rendered.config_text()))
    assert config.namespace_selection == selection
    # The service's own reading of the label agrees with the selector (the quota mirror uses it).
    for labels in ({}, {"gpu-placement.io/enabled": "true"}, {"gpu-placement.io/enabled": "false"},
                   {"gpu-placement.io/enabled": "yes"}):
        value = labels.get("gpu-placement.io/enabled")
        selected = value in expression["values"] if expression["operator"] == "In" else \
            value not in expression["values"]
        assert config.selects(labels) == selected, labels


# -- chart conventions -----------------------------------------------------------------------------


def test_name_overrides(chart: helm_python.Chart) -> None:
    named = render(chart, {"nameOverride": "gpus"}, release="prod")
    assert {d["metadata"]["name"] for d in named.all("Deployment")} == {"prod-gpus-webhook", "prod-gpus-scheduler"}
    assert named.deployment("webhook")["metadata"]["labels"]["app.kubernetes.io/name"] == "gpus"
    full = render(chart, {"fullnameOverride": "placement"}, release="prod")
    assert full.one("ValidatingWebhookConfiguration", "placement")
    args = build_parser().parse_args(full.container("webhook")["args"])
    assert (args.webhook_configuration, args.service, args.owner) == (
        "placement", "placement-webhook", "placement")
    full.one("Service", "placement-webhook")
    spec = yaml.safe_load(full.one("ConfigMap", "placement-webhooks")["data"]["webhooks.yaml"])
    assert [h["clientConfig"]["service"]["name"] for hooks in spec.values() for h in hooks] == [
        "placement-webhook"] * 4


def test_pod_labels_never_override_the_selector(chart: helm_python.Chart) -> None:
    rendered = render(chart, {"podLabels": {"team": "platform", "app.kubernetes.io/component": "mine"}})
    for deployment in rendered.all("Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["team"] == "platform"
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize("adapt, fixed", [("auto", True), ("disabled", True), ("force", False)])
def test_security_contexts_leave_the_ids_to_openshift_when_asked(chart: helm_python.Chart, adapt: str,
                                                                 fixed: bool) -> None:
    """auto adapts only where security.openshift.io/v1 is served (not offline: see the e2e test)."""
    rendered = render(chart, {"openshift": {"adaptSecurityContext": adapt}})
    for pod in pods(rendered):
        context = pod["spec"]["securityContext"]
        assert context["runAsNonRoot"] is True and context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert ("runAsUser" in context) == ("runAsGroup" in context) == ("fsGroup" in context) == fixed
        if fixed:
            assert context["runAsUser"] == context["runAsGroup"] == context["fsGroup"] == 65532
    for container in containers(rendered):
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True and context["capabilities"] == {"drop": ["ALL"]}
        assert ("runAsUser" in context) == fixed


def test_security_contexts_are_values(chart: helm_python.Chart) -> None:
    rendered = render(chart, {"podSecurityContext": {"runAsUser": 1001, "supplementalGroups": [5]},
                              "securityContext": {"runAsUser": 1001}})
    assert all(p["spec"]["securityContext"]["runAsUser"] == 1001 for p in pods(rendered))
    assert all(p["spec"]["securityContext"]["supplementalGroups"] == [5] for p in pods(rendered))
    assert all(c["securityContext"]["runAsUser"] == 1001 for c in containers(rendered))


def test_extra_args_and_env(chart: helm_python.Chart) -> None:
    proxy = [{"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"}, {"name": "NO_PROXY", "value": ".svc"}]
    rendered = render(chart, {"extraEnv": proxy, "scheduler": {"extraArgs": ["--kube-api-qps=100"],
                                                               "extender": {"extraArgs": ["--log-level", "debug"]}},
                              "webhook": {"extraArgs": ["--cert-check-interval", "30s"]}})
    assert rendered.container("kube-scheduler")["command"][-1] == "--kube-api-qps=100"
    extender = build_parser().parse_args(rendered.container("extender")["args"])
    assert extender.log_level == "debug"
    webhook = build_parser().parse_args(rendered.container("webhook")["args"])
    assert webhook.cert_check_interval == 30.0
    for name in ("extender", "webhook"):
        env = rendered.container(name).get("env", [])
        assert all(variable in env for variable in proxy), name


@pytest.mark.parametrize("values, extender_ingress", [
    ({}, None),
    ({"scheduler": {"extender": {"listenHost": "0.0.0.0"}}}, None),
    ({"scheduler": {"extender": {"listenHost": "0.0.0.0"}},
      "networkPolicy": {"extenderFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]}}, 8888),
])
def test_network_policies(chart: helm_python.Chart, values: dict[str, Any], extender_ingress: int | None) -> None:
    assert render(chart, values).all("NetworkPolicy") == []
    rendered = render(chart, {**values, "networkPolicy": {"enabled": True, **values.get("networkPolicy", {})}})
    webhook = rendered.one("NetworkPolicy", "gpu-placement-webhook")
    assert webhook["spec"]["podSelector"]["matchLabels"].items() <= (
        rendered.deployment("webhook")["spec"]["template"]["metadata"]["labels"].items())
    assert webhook["spec"]["ingress"] == [{"ports": [{"port": 8443, "protocol": "TCP"}]}]
    scheduler = rendered.one("NetworkPolicy", "gpu-placement-scheduler")
    assert scheduler["spec"]["policyTypes"] == ["Ingress"]
    if extender_ingress is None:
        assert scheduler["spec"]["ingress"] == []
    else:
        [rule] = scheduler["spec"]["ingress"]
        assert rule["ports"] == [{"port": extender_ingress, "protocol": "TCP"}] and rule["from"]


def test_certificate_lifetimes_are_values(chart: helm_python.Chart) -> None:
    from webhook.rotation import RotationSettings

    rendered = render(chart, {"managedCertificates": {"caLifetime": "730d", "renewCaBefore": "90d",
                                                      "servingLifetime": "90d", "renewServingBefore": "10d"}})
    args = build_parser().parse_args(rendered.container("webhook")["args"])
    settings = RotationSettings.from_args(args)
    assert (settings.ca_days, settings.serving_days) == (730, 90)
    assert settings.renew_serving_before.days == 10 and settings.renew_ca_before.days == 90
    default = build_parser().parse_args(render(chart, {}).container("webhook")["args"])
    RotationSettings.from_args(default)  # the defaults are a valid rotation
    cert_manager = render(chart, {"certManager": {"enabled": True}}).container("webhook")["args"]
    assert "--ca-lifetime" not in cert_manager


def test_offline_renders_must_set_the_kube_scheduler_tag(chart: helm_python.Chart) -> None:
    """Helm's built-in Kubernetes version is not the cluster's: `helm template` is told to set it."""
    with pytest.raises(helm_python.HelmRenderError, match=r"set scheduler.image.tag once to your control plane's "):
        chart.render({}, name="gpu-placement", namespace=NAMESPACE)
    rendered = render(chart, {"scheduler": {"image": {"tag": "v1.33.2"}}})
    assert rendered.container("kube-scheduler")["image"] == "registry.k8s.io/kube-scheduler:v1.33.2"


@pytest.mark.parametrize("values, where", [
    ({"nameoverride": "x"}, ""),
    ({"fullnameOverride": "Not_A_Name"}, "/fullnameOverride"),
    ({"namespaceSelection": "optin"}, "/namespaceSelection"),
    ({"podSecurityContext": {"runAsUsr": 1}}, "/podSecurityContext"),
    ({"securityContext": {"readOnlyRootFileSystem": True}}, "/securityContext"),
    ({"openshift": {"adaptSecurityContext": "yes"}}, "/openshift/adaptSecurityContext"),
    ({"extraEnv": [{"name": "HTTPS_PROXY", "vaule": "x"}]}, "/extraEnv/0"),
    ({"networkPolicy": {"enable": True}}, "/networkPolicy"),
    ({"managedCertificates": {"caLifetime": "10y"}}, "/managedCertificates/caLifetime"),
    ({"webhook": {"extraArgs": "--x"}}, "/webhook/extraArgs"),
    ({"scheduler": {"extender": {"healthPort": 10259}}}, "/scheduler/extender/healthPort"),
])
def test_the_schema_rejects_typos_in_the_new_values(chart: helm_python.Chart, values: dict[str, Any],
                                                   where: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as caught:
        chart.render(offline(values), name="gpu-placement", namespace=NAMESPACE)
    assert f"at '{where}" in str(caught.value), str(caught.value)


def test_notes_are_short_and_say_how_to_opt_in(chart: helm_python.Chart) -> None:
    for values, says in (({}, "kubectl label namespace NAMESPACE gpu-placement.io/enabled=true"),
                         ({"namespaceSelection": "optOut"}, "gpu-placement.io/enabled=false"),
                         ({"config": {"mode": "audit"}}, "audit: warnings only, no pod changed or refused")):
        files = chart.render(offline(values), name="gpu-placement", namespace=NAMESPACE)
        notes = next(text for path, text in files.items() if path.endswith("NOTES.txt"))
        lines = notes.strip().splitlines()
        assert len(lines) <= 14 and max(map(len, lines)) <= 120, notes
        assert says in notes
        assert "nvidia.com/mig-" not in notes, "no list of resource names"


def test_audit_mode_never_refuses_even_when_no_replica_answers(chart: helm_python.Chart) -> None:
    """failurePolicy Ignore on every webhook in audit mode, whatever the enforce-mode values say."""
    values = {"webhook": {"mutating": {"failurePolicy": "Fail"}, "validating": {"failurePolicy": "Fail"}}}
    enforce = render(chart, values)
    assert {h["failurePolicy"] for c in _webhooks(enforce) for h in c["webhooks"]} == {"Fail"}
    audit = render(chart, {**values, "config": {"mode": "audit"}})
    assert {h["failurePolicy"] for c in _webhooks(audit) for h in c["webhooks"]} == {"Ignore"}


def test_replicas_spread_only_over_nodes_they_can_run_on(chart: helm_python.Chart) -> None:
    """Found by tests/e2e/test_0_adoption.py: with tainted GPU nodes counted as spreading domains, a
    rollout on a cluster with one untainted node left the second webhook replica Pending."""
    for deployment in render(chart, {}).all("Deployment"):
        for constraint in deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]:
            assert constraint["nodeTaintsPolicy"] == "Honor", deployment["metadata"]["name"]


# benchmarks/footprint_bench.py at 5,000 nodes and 150,000 pods (real control plane, 2026-12-03): MiB resident.
MEASURED_MIB = {"kube-scheduler": 2060, "extender": 186, "webhook": 189}


def _mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


def test_resources_cover_the_measurement_at_5000_nodes_and_150000_pods(chart: helm_python.Chart) -> None:
    rendered = render(chart, {})
    for name, measured in MEASURED_MIB.items():
        resources = rendered.container(name)["resources"]
        assert _mib(resources["requests"]["memory"]) >= 0.95 * measured, name  # what it holds, within 5%
        assert _mib(resources["limits"]["memory"]) >= 1.4 * measured, name
    env = rendered.container("kube-scheduler")["env"]
    assert {"name": "GOMEMLIMIT", "valueFrom": {"resourceFieldRef": {
        "containerName": "kube-scheduler", "resource": "limits.memory"}}} in env
