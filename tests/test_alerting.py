"""The demo's in-process alert evaluation (gpu_placement/report/alerting.py): the chart's defaults, the
chart's alert names, and the lines the demo prints."""

from __future__ import annotations

import io
from pathlib import Path

import yaml

from gpu_placement.app.demo import run_demo
from gpu_placement.report.alerting import DEFAULTS, Firing, evaluate
from tests.support.chart import alerts

ROOT = Path(__file__).resolve().parent.parent
NOW = 1_800_000_000.0


def test_thresholds_are_the_charts_defaults() -> None:
    values = yaml.safe_load((ROOT / "charts" / "gpu-placement" / "values.yaml").read_text())["prometheusRule"]
    assert dict(DEFAULTS.node_unusable_for) == values["nodeUnusableFor"]
    assert (DEFAULTS.pods_waiting_for, DEFAULTS.quota_ratio, DEFAULTS.quota_for, DEFAULTS.view_stale_after,
            DEFAULTS.telemetry_stale_after, DEFAULTS.certificate_days) == (
        values["podsWaitingFor"], values["quotaRatio"], values["quotaFor"], values["viewStaleAfter"],
        values["telemetryStaleAfter"], values["certificateDays"])


EXPOSITION = f"""
gpu_placement_gpu_node_unusable_since_timestamp_seconds{{node="gpu-1",reason="NotValidated"}} {NOW - 60}
gpu_placement_gpu_node_unusable_since_timestamp_seconds{{node="gpu-2",reason="NodeNotReady"}} {NOW - 60}
gpu_placement_pods_waiting{{reason="InsufficientGPU"}} 3
gpu_placement_pods_waiting_since_timestamp_seconds{{reason="InsufficientGPU"}} {NOW - 3600}
gpu_placement_namespace_quota_limit{{namespace="a",resource="nvidia.com/gpu",enforced="true"}} 10
gpu_placement_namespace_quota_used{{namespace="a",resource="nvidia.com/gpu",enforced="true"}} 9
gpu_placement_namespace_quota_limit{{namespace="b",resource="nvidia.com/gpu",enforced="true"}} 10
gpu_placement_namespace_quota_used{{namespace="b",resource="nvidia.com/gpu",enforced="true"}} 8
gpu_placement_namespace_quota_limit{{namespace="c",resource="nvidia.com/gpu",enforced="true"}} 0
gpu_placement_namespace_quota_used{{namespace="c",resource="nvidia.com/gpu",enforced="true"}} 0
gpu_placement_namespace_quota_limit{{namespace="d",resource="nvidia.com/gpu",enforced="false"}} 10
gpu_placement_namespace_quota_used{{namespace="d",resource="nvidia.com/gpu",enforced="false"}} 10
gpu_placement_namespace_policy_problems{{namespace="typo1",problem="unread_annotation"}} 1
gpu_placement_source_up 1
gpu_placement_cache_age_seconds 400
gpu_placement_telemetry_last_success_timestamp_seconds 0
gpu_placement_certificate_expiry_timestamp_seconds{{listener="webhook"}} {NOW + 3 * 86400}
gpu_placement_certificate_expiry_timestamp_seconds{{listener="extender"}} {NOW + 30 * 86400}
"""


def test_conditions_as_the_rules_state_them() -> None:
    firing = evaluate(EXPOSITION, now=NOW)
    assert firing == [
        Firing("GpuNodeNotValidated", "gpu-1", "unusable (NotValidated)", "15m"),  # NodeNotReady: no rule
        Firing("GpuPodsWaiting", "InsufficientGPU", "3 pods rejected on every node", ""),  # waited 1h already
        Firing("GpuNamespaceQuotaNearlyFull", "a", "9 of 10 nvidia.com/gpu in use", "15m"),  # d: not enforced
        Firing("GpuNamespacePolicyIgnored", "typo1", "unread_annotation: gpu-placement namespaces says which", "15m"),
        Firing("GpuPlacementViewStale", "view", "nothing heard for 400 s", "5m"),
        Firing("GpuPlacementCertificateExpiring", "webhook", "expires in 3.0 days", "1h"),
    ]
    assert {f.alert for f in firing} <= set(alerts())  # the chart's names


def test_demo_prints_where_the_metrics_are_and_what_would_fire() -> None:
    out = io.StringIO()
    assert run_demo(out=out) == 0
    text = out.getvalue()
    assert "metrics at /metrics on both" in text.splitlines()[0]
    section = text[text.index("ALERTS"):]
    lines = {line.split()[0]: line for line in section.splitlines()[2:] if line.startswith("Gpu")}
    not_validated = [line.split()[1:3] for line in section.splitlines() if line.startswith("GpuNodeNotValidated ")]
    assert not_validated == [["h100-not-validated", "unusable"], ["h100-train-hand", "unusable"]]  # no validator
    assert "h100-upgrading" in lines["GpuNodeDriverUpgradeStuck"]
    assert "h100-mig-pending" in lines["GpuNodeMIGReconfiguringStuck"]
    waiting = [line.split()[1] for line in section.splitlines() if line.startswith("GpuPodsWaiting")]
    assert waiting == ["InsufficientGPUMemory", "SharingMismatch"]  # one line per reason
    assert "GpuPlacementSourceDown" not in lines and "GpuPlacementViewStale" not in lines
