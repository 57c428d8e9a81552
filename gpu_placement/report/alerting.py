"""The chart's alert conditions (charts/gpu-placement/templates/prometheusrule.yaml), evaluated in
process on one scrape of this process's own metrics, for `gpu-placement demo`.

Same metrics, same thresholds as the chart's defaults (a test keeps `DEFAULTS` equal to values.yaml).
Prometheus also waits for each condition to hold for its `for`; one scrape cannot, so each firing says
how long its condition must last. The extender p99 alert needs a rate over two scrapes and is left
out, as are the quota-mirror alert (the mirror needs an API server; the demo has none) and
GpuDriverVersionRegression (it compares averages over an hour; the demo has no telemetry), and the
outcome alerts (GpuLaunchFailuresOnNodes, GpuNodeExclusionSlow, GpuNodePreparationStuck,
GpuIdleFragmented: they read recording rules over hours; the demo prints the outcome table instead).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gpu_placement.base.timestamps import parse_duration  # values.yaml's Prometheus durations: "15m", "500ms"

__all__ = ["DEFAULTS", "Firing", "Thresholds", "evaluate"]

Sample = tuple[str, dict[str, str], float]


@dataclass(slots=True, frozen=True)
class Thresholds:
    """prometheusRule.* of values.yaml, with the durations as written there."""

    node_unusable_for: Mapping[str, str] = field(default_factory=lambda: {
        "NotValidated": "15m", "DriverUpgrade": "1h", "MIGReconfiguring": "30m"})
    pods_waiting_for: str = "15m"
    quota_ratio: float = 0.9
    quota_for: str = "15m"
    view_stale_after: str = "5m"
    telemetry_stale_after: str = "10m"
    certificate_days: int = 7


DEFAULTS = Thresholds()
_NODE_ALERTS = {"NotValidated": "GpuNodeNotValidated", "DriverUpgrade": "GpuNodeDriverUpgradeStuck",
                "MIGReconfiguring": "GpuNodeMIGReconfiguringStuck"}


@dataclass(slots=True, frozen=True)
class Firing:
    alert: str
    subject: str  # what it is about: a node, a reason, a namespace, a listener
    detail: str
    after: str  # how long the condition must hold before Prometheus fires it ("" : at once)


def evaluate(exposition: str, thresholds: Thresholds = DEFAULTS, now: float | None = None) -> list[Firing]:
    now = time.time() if now is None else now
    samples = list(_samples(exposition))

    def series(name: str) -> list[tuple[dict[str, str], float]]:
        return [(labels, value) for sample_name, labels, value in samples if sample_name == name]

    firing: list[Firing] = []
    for labels, _ in series("gpu_placement_gpu_node_unusable_since_timestamp_seconds"):
        reason = labels["reason"]
        if reason in thresholds.node_unusable_for:
            firing.append(Firing(_NODE_ALERTS.get(reason, f"GpuNodeUnusable{reason}"), labels["node"],
                                 f"unusable ({reason})", thresholds.node_unusable_for[reason]))
    waiting = {labels["reason"]: value for labels, value in series("gpu_placement_pods_waiting")}
    for labels, since in series("gpu_placement_pods_waiting_since_timestamp_seconds"):
        reason = labels["reason"]
        waited = now - since
        pods = int(waiting.get(reason, 0))
        after = "" if waited > parse_duration(thresholds.pods_waiting_for) else thresholds.pods_waiting_for
        firing.append(Firing("GpuPodsWaiting", reason, f"{pods} pod{'s' if pods != 1 else ''} rejected on every node",
                             after))
    limits = {(labels["namespace"], labels["resource"]): value
              for labels, value in series("gpu_placement_namespace_quota_limit") if labels.get("enforced") == "true"}
    for labels, used in series("gpu_placement_namespace_quota_used"):
        key = (labels["namespace"], labels["resource"])
        if labels.get("enforced") != "true":
            continue  # the webhook never denies there: nothing to warn about
        if limits.get(key, 0) > 0 and used / limits[key] >= thresholds.quota_ratio:
            firing.append(Firing("GpuNamespaceQuotaNearlyFull", key[0],
                                 f"{used:g} of {limits[key]:g} {key[1]} in use", thresholds.quota_for))
    for labels, value in series("gpu_placement_namespace_policy_problems"):
        if value > 0:
            firing.append(Firing("GpuNamespacePolicyIgnored", labels["namespace"],
                                 f"{labels['problem']}: gpu-placement namespaces says which", "15m"))
    for _, value in series("gpu_placement_source_up"):
        if value == 0:
            firing.append(Firing("GpuPlacementSourceDown", "source", "the API server (or snapshot) is not answering",
                                 "5m"))
    for _, value in series("gpu_placement_cache_age_seconds"):
        if value > parse_duration(thresholds.view_stale_after):
            firing.append(Firing("GpuPlacementViewStale", "view", f"nothing heard for {value:.0f} s", "5m"))
    for _, value in series("gpu_placement_telemetry_last_success_timestamp_seconds"):
        if value > 0 and now - value > parse_duration(thresholds.telemetry_stale_after):
            firing.append(Firing("GpuPlacementTelemetryStale", "telemetry", f"last reading {now - value:.0f} s ago",
                                 "5m"))
    for labels, expiry in series("gpu_placement_certificate_expiry_timestamp_seconds"):
        if expiry - now < thresholds.certificate_days * 86400:
            firing.append(Firing("GpuPlacementCertificateExpiring", labels["listener"],
                                 f"expires in {(expiry - now) / 86400:.1f} days", "1h"))
    return firing


def _samples(exposition: str) -> Iterable[Sample]:
    for family in text_string_to_metric_families(exposition):
        if family.name.startswith("gpu_placement_"):
            for sample in family.samples:
                yield sample.name, sample.labels, sample.value

