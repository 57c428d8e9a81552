"""The Grafana dashboard (charts/gpu-placement/dashboards/gpu-placement.json): valid dashboard JSON,
shipped in the chart as the ConfigMap the Grafana sidecar loads, and every panel's query asks for
series a running service really exports (metric names and label matchers), in valid PromQL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from tests.live_metrics import promtool, recorded, scrape_demo_service, selector_problems
from tests.support.chart import CHART, VARIABLES, dashboard, offline

SCHEMA_VERSION = 39  # Grafana 10.4 / 11: pinned, so an import never runs a migration we did not test


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def expressions() -> list[tuple[str, str]]:
    """Each panel's query as Prometheus receives it, the dashboard's variables at All."""
    queries = []
    for panel in panels():
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            queries.append((panel["title"], expr))
    return queries


def test_namespace_and_pool_variables_narrow_the_panels() -> None:
    """The dashboard had only a datasource variable: no way to look at one team or one pool."""
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    for name, metric in (("namespace", "gpu_placement_namespace_quota_limit"),
                         ("pool", "gpu_placement_gpu_allocatable")):
        variable = variables[name]
        assert variable["type"] == "query" and variable["multi"] and variable["includeAll"]
        assert variable["allValue"] == VARIABLES[f"${name}"]
        assert variable["query"]["query"] == f"label_values({metric}, {name})"
    raw = [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]
    for title, expr in raw:
        if "namespace" in expr and "gpu_placement_namespace" in expr:
            assert 'namespace=~"$namespace"' in expr, title
        if "by (pool" in expr:  # every selector, of a metric or of a recording rule (gpu_placement:...)
            assert expr.count('pool=~"$pool"') == expr.count("gpu_placement_") + expr.count("gpu_placement:"), title
    quota = next(expr for title, expr in raw if title == "Quota use by namespace")
    assert quota.count('enforced="true"') == 2  # a quota nothing enforces is not "in use"


def test_dashboard_json_is_a_valid_dashboard() -> None:
    dash = dashboard()
    assert dash["schemaVersion"] == SCHEMA_VERSION
    assert dash["uid"] == "gpu-placement" and dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
    titles = {p["title"] for p in panels()}
    for wanted in ("GPU nodes by verdict", "Free GPU memory by pool", "Quota use by namespace", "Extender latency",
                   "Extender decisions by code", "Webhook denials by reason", "Watch health",
                   "GPU nodes by driver version and rollout state", "XID errors per node-hour by driver version",
                   "Failed GPU pods by driver version (share)", "Launch success (last 7 days)",
                   "Failed launches by cause (per hour)", "Node preparation p50 / p90 by pool (7 days)",
                   "Exclusion latency (7 days)", "Idle GPUs while pods wait, by reason"):
        assert wanted in titles


@pytest.mark.parametrize(("values", "shipped"), [
    ({}, False),
    ({"serviceMonitor": {"enabled": True}}, True),
    ({"serviceMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": False}}, False),
    ({"grafanaDashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "GPU"}}},
     True),
])
def test_chart_ships_the_dashboard_for_the_grafana_sidecar(values: dict[str, Any], shipped: bool) -> None:
    with helm_python.Chart.load(CHART) as chart:
        files = chart.render(offline(values), name="gpu-placement", namespace="gpu-placement")
    docs = [d for path, text in files.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    found = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard")]
    assert len(found) == int(shipped)
    if shipped:
        cm = found[0]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == values.get("grafanaDashboard", {}).get("namespace", "gpu-placement")
        assert json.loads(cm["data"]["gpu-placement.json"]) == dashboard()  # the file, byte for byte in meaning


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> str:
    return scrape_demo_service(tmp_path_factory.mktemp("dashboard"))


def test_every_panel_selects_series_the_service_exports(scraped: str) -> None:
    """Recording rules (`gpu_placement:...`) must be the chart's own, their expressions checked in their place."""
    from tests.support.chart import rule_groups

    assert selector_problems(expressions(), scraped, recorded(rule_groups())) == []


def test_panel_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule's expression (the PromQL parser Prometheus runs)."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:panel_{i}", "expr": expr} for i, (_, expr) in enumerate(expressions())]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
