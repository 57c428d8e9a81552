"""The chart's DRA parts: config.dra reaches the service, the webhook replicas elect the taint writer
with their own Lease and may touch DeviceTaintRules only when they write them, and the scheduler
profile sends every pod to the extender unless the layout before DRA is asked for."""

from __future__ import annotations

from collections.abc import Iterator

import helm_python
import pytest
import yaml

from gpu_placement.app.cli import build_parser
from gpu_placement.base.config import parse_config
from tests.support.chart import CASES, CHART, Rendered, _render, fullname


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def drawn(request: pytest.FixtureRequest) -> Iterator[Rendered]:
    with helm_python.Chart.load(CHART) as loaded:
        yield _render(loaded, request.param)


def test_config_dra_reaches_the_service(drawn: Rendered) -> None:
    config = parse_config(yaml.safe_load(drawn.config_text()))
    values = drawn.values["config"]["dra"]
    assert (config.dra.driver, list(config.dra.device_classes), config.dra.taint_effect, config.dra.taints) == (
        values["driver"], values["deviceClasses"], values["taintEffect"], values["taints"])


def test_the_taint_writer_has_its_own_lease_and_nothing_more(drawn: Rendered) -> None:
    name, ns = fullname(drawn.case), drawn.case.namespace
    args = build_parser().parse_args(drawn.container("webhook")["args"])
    assert args.dra_lease == f"{name}-dra"
    roles = {r["metadata"]["name"]: r for r in drawn.all("Role")}
    if not drawn.values["config"]["dra"]["taints"]:
        assert f"{name}-webhook-dra-lease" not in roles
        return
    role = roles[f"{name}-webhook-dra-lease"]
    assert role["metadata"]["namespace"] == ns
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [args.dra_lease],
         "verbs": ["get", "update"]}]
    bindings = {b["metadata"]["name"]: b for b in drawn.all("RoleBinding")}
    assert bindings[f"{name}-webhook-dra-lease"]["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{name}-webhook", "namespace": ns}]


def test_cases_cover_both_layouts() -> None:
    layouts = {bool((c.values.get("scheduler") or {}).get("extender", {}).get("managedResourcesOnly")) for c in CASES}
    assert layouts == {True, False}
