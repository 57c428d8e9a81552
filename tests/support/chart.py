"""The chart and what it ships: its manifests rendered as Helm renders them (offline), its alert rules and
its Grafana dashboard."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-placement"
NAMESPACE = "gpu-placement"
Doc = dict[str, Any]


# Rendered without a cluster, the chart needs kube-scheduler's tag (it cannot ask the cluster's version).
OFFLINE = {"scheduler": {"image": {"tag": "v1.31.4"}}}


def offline(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with OFFLINE under them (theirs win)."""
    def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        return {**base, **{k: merged(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
                           for k, v in over.items()}}
    return merged(OFFLINE, values)


@dataclass(frozen=True)
class Case:
    name: str
    values: dict[str, Any]
    release: str = "gpu-placement"
    namespace: str = NAMESPACE


CASES = [
    Case("default", {}),
    Case("cert-manager", {"certManager": {"enabled": True}}),
    Case("explain-role", {"explainRole": {"create": True, "podsClusterWide": True, "subjects": [
        {"kind": "Group", "name": "ml-developers", "apiGroup": "rbac.authorization.k8s.io"}]}}),
    Case("audit-ignore", {"config": {"mode": "audit"},
                          "webhook": {"mutating": {"failurePolicy": "Ignore"},
                                      "validating": {"failurePolicy": "Ignore"}, "timeoutSeconds": 10}}),
    Case("custom", {
        "schedulerName": "gpu-batch",
        "gpuResources": ["nvidia.com/gpu", "example.com/accelerator"],
        "sharedResource": "nvidia.com/gpu.timesliced",
        "migResources": ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"],
        "extraMigResources": ["nvidia.com/mig-1g.24gb.gfx"],
        "exemptNamespaces": ["kube-system", "gpu-operator", "monitoring"],
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "image": {"repository": "registry.example.com/platform/gpu-placement",
                  "digest": "sha256:" + "ab" * 32},
        "config": {
            "pools": {
                "training": {"nodeSelector": {"pool": "training"},
                             "tolerations": [{"key": "pool", "operator": "Equal", "value": "training",
                                              "effect": "NoSchedule"}]},
                "inference": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
            },
            "gpuTolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                               {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
            "defaultNamespacePolicy": "deny",
            "scoring": {"strategy": "spread", "weights": {"upgradeRequired": 5}},
            "telemetry": {"url": "http://prometheus-operated.monitoring:9090", "refreshSeconds": 10},
            "validator": {"required": False},
            "reservationTTLSeconds": 30,
            "dra": {"taintEffect": "None", "taints": False},
            # quoted figures survive Helm's toYaml as strings (26.10 would otherwise read back as 26.1)
            "ngcReleases": [{"release": "26.10", "cuda": "13.3.10", "source": "a test row, not a release's notes",
                             "forwardCompat": ["580.65"]}],
        },
        "scheduler": {"extender": {"managedResourcesOnly": True}, "percentageOfNodesToScore": 100},
    }, release="gpu", namespace="platform-gpu"),
    Case("exposed-single", {
        "scheduler": {"replicas": 1, "image": {"tag": "v1.31.4"}, "percentageOfNodesToScore": 0,
                      "extender": {"listenHost": "0.0.0.0", "port": 9999, "weight": 2, "httpTimeout": "3s",
                                   "bindAll": True}},
        "webhook": {"replicas": 1, "port": 9443},
        "serviceMonitor": {"enabled": True},
        "config": {"protectGpuNodes": False, "scoring": {"tierSize": 0}},  # every passing node: /prioritize
        "logLevel": "debug",
    }),
]


@dataclass
class Rendered:
    case: Case
    values: dict[str, Any]  # merged with the chart defaults
    docs: list[Doc]

    def all(self, kind: str) -> list[Doc]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Doc:
        found = [d for d in self.all(kind) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
        return found[0]

    def deployment(self, component: str) -> Doc:
        found = [d for d in self.all("Deployment")
                 if d["metadata"]["labels"]["app.kubernetes.io/component"] == component]
        assert len(found) == 1
        return found[0]

    def container(self, name: str) -> Doc:
        found = [c for d in self.all("Deployment") for c in _pod_containers(d) if c["name"] == name]
        assert len(found) == 1, name
        return found[0]

    def config_text(self) -> str:
        cm = self.one("ConfigMap", f"{fullname(self.case)}-config")
        return str(cm["data"]["config.yaml"])

    def scheduler_config(self) -> Doc:
        cm = self.one("ConfigMap", f"{fullname(self.case)}-scheduler")
        return dict(yaml.safe_load(cm["data"]["scheduler-config.yaml"]))


def _pod_containers(deployment: Doc) -> list[Doc]:
    """Init containers (the extender is a native sidecar) and containers."""
    pod = deployment["spec"]["template"]["spec"]
    return [*pod.get("initContainers", []), *pod["containers"]]


def fullname(case: Case) -> str:
    return case.release if "gpu-placement" in case.release else f"{case.release}-gpu-placement"


def _render(chart: helm_python.Chart, case: Case) -> Rendered:
    values = offline(case.values)
    files = chart.render(values, name=case.release, namespace=case.namespace)
    docs = [doc for path, text in sorted(files.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]
    assert any(path.endswith("templates/NOTES.txt") for path in files)
    return Rendered(case, chart.merge_values(values), docs)


def _webhooks(rendered: Rendered) -> tuple[Doc, Doc]:
    """Both configurations as the webhook replicas arm them: the chart installs them empty and its
    webhooks ConfigMap holds the webhooks the service writes in (webhook/registration.py)."""
    from webhook.registration import KINDS

    name = fullname(rendered.case)
    mutating = rendered.one("MutatingWebhookConfiguration", name)
    validating = rendered.one("ValidatingWebhookConfiguration", name)
    spec = yaml.safe_load(rendered.one("ConfigMap", f"{name}-webhooks")["data"]["webhooks.yaml"])
    assert set(spec) == set(KINDS)
    return {**mutating, "webhooks": spec["mutating"]}, {**validating, "webhooks": spec["validating"]}


ENABLED = {"serviceMonitor": {"enabled": True}}


def render(values: dict[str, Any], chart_dir: Path = CHART) -> list[dict[str, Any]]:
    with helm_python.Chart.load(chart_dir) as chart:
        files = chart.render(offline(values), name="gpu-placement", namespace="gpu-placement")
    return [d for path, text in files.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def rule_groups(values: dict[str, Any] = ENABLED) -> list[dict[str, Any]]:
    [rule] = [d for d in render(values) if d["kind"] == "PrometheusRule"]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_groups() for r in g["rules"] if "alert" in r}


def slugs(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,4} (.+)$", markdown, re.MULTILINE)}


DASHBOARD = CHART / "dashboards" / "gpu-placement.json"


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


# What Grafana puts for a variable left at All (its allValue); a chosen value is a regex of the values.
VARIABLES = {"$namespace": ".*", "$pool": ".*"}
