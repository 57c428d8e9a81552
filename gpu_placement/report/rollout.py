"""`gpu-placement rollout`: driver versions with their nodes by state, soak left, XID rate and
failed GPU pods per version, canary namespaces, and what the GPU Operator's next wave would take.

The next wave is the upgrade controller's own arithmetic (NVIDIA/k8s-operator-libs,
`GetUpgradesAvailable` in pkg/upgrade/common_manager.go) on the ClusterPolicy's
`spec.driver.upgradePolicy` (`maxParallelUpgrades`, `maxUnavailable`) and the nodes'
`nvidia.com/gpu-driver-upgrade-state` labels: nodes in flight (failed ones included) take
parallel slots, cordoned or NotReady nodes take unavailable ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import orjson

from gpu_placement.base import names as n
from gpu_placement.decide.rollout import Rollout, releases
from gpu_placement.facts.soak import FAILED, IN_PROGRESS, SOAKING, STATES, UPGRADING
from gpu_placement.report.tables import table

__all__ = ["ClusterPolicy", "fetch_policy", "next_wave", "policy_from_objects", "rollout_json", "rollout_text",
           "run_rollout"]

ClusterPolicy = Mapping[str, Any]
CLUSTER_POLICIES = "/apis/nvidia.com/v1/clusterpolicies"


def next_wave(rollout: Rollout, policy: ClusterPolicy | None, policy_problem: str = "") -> dict[str, Any]:
    """How many `upgrade-required` nodes the upgrade controller starts next, and why that many."""
    view = rollout.view
    with view.lock:
        labels = {name: facts.upgrade_state for name, facts in view.nodes.items() if facts.upgrade_state}
        unavailable = sum(1 for name in labels if not view.nodes[name].ready or view.nodes[name].unschedulable)
    pending = sum(1 for state in labels.values() if state == n.UPGRADE_REQUIRED)
    if policy is None:
        return {"nodes": None, "pending": pending, "why": f"unknown: {policy_problem or 'no ClusterPolicy read'}"}
    driver = (policy.get("spec") or {}).get("driver") or {}
    upgrade = driver.get("upgradePolicy") or {}
    name = (policy.get("metadata") or {}).get("name", "?")
    if driver.get("useNvidiaDriverCRD"):
        return {"nodes": None, "pending": pending, "why": f"unknown: ClusterPolicy {name} hands drivers to "
                                                          "NVIDIADriver objects, each with its own upgradePolicy"}
    if not upgrade.get("autoUpgrade"):
        return {"nodes": 0, "pending": pending, "why": f"ClusterPolicy {name}: driver.upgradePolicy.autoUpgrade "
                                                       "is off: no waves; a driver pod changes when it is deleted"}
    total = len(labels)
    in_flight = sum(1 for state in labels.values() if state not in (n.UPGRADE_DONE, n.UPGRADE_REQUIRED))
    parallel = upgrade.get("maxParallelUpgrades", 1)
    raw_unavailable = upgrade.get("maxUnavailable")
    max_unavailable = _scaled(raw_unavailable, total) if raw_unavailable is not None else total
    unavailable += sum(1 for state in labels.values() if state == "cordon-required")
    available = pending if parallel == 0 else parallel - in_flight
    available = min(available, max_unavailable)
    if unavailable >= max_unavailable:
        available = 0
    elif max_unavailable < total and unavailable + available > max_unavailable:
        available = max_unavailable - unavailable
    take = max(0, min(available, pending))
    why = (f"ClusterPolicy {name}: maxParallelUpgrades {parallel or 'unlimited'} with {in_flight} in flight; "
           f"maxUnavailable {raw_unavailable if raw_unavailable is not None else 'all'} of {total} = "
           f"{max_unavailable} with {unavailable} unavailable; {pending} waiting (upgrade-required)")
    return {"nodes": take, "pending": pending, "why": why, "target": driver.get("version")}


def _scaled(value: Any, total: int) -> int:
    """intstr.GetScaledValueFromIntOrPercent(value, total, roundUp=true)."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(total * float(value[:-1]) / 100)
    return int(value)


def rollout_json(rollout: Rollout, policy: ClusterPolicy | None, policy_problem: str = "",
                 now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    figures = rollout.figures()
    ranks = releases(figures)
    config = rollout.config.rollout
    versions = []
    for version, f in figures.items():
        versions.append({"version": version, "release": ranks[version], "nodes": f.nodes,
                         "states": {state: f.states.get(state, 0) for state in STATES},
                         "gpuPods": f.gpu_pods, "failedGpuPods": f.failed_pods,
                         "xidPerNodeHour": rollout.xid_per_node_hour(f)})
    nodes = []
    with rollout.view.lock:
        for name in sorted(rollout.states):
            soak = rollout.states[name]
            facts = rollout.view.nodes.get(name)
            if facts is None or not (facts.gpu_present or any(facts.capacity.values())):
                continue
            nodes.append({"node": name, "version": soak.version, "state": soak.state,
                          "soakLeftSeconds": max(0.0, soak.until - now) if soak.until is not None else None,
                          "driverReadySince": soak.since, "why": soak.why,
                          "upgradeState": facts.upgrade_state})
    return {"soak": {"minutes": config.soak_minutes, "policy": config.soak},
            "versions": versions, "nodes": nodes, "canaryNamespaces": rollout.canary_namespaces(),
            "nextWave": next_wave(rollout, policy, policy_problem)}


def rollout_text(report: Mapping[str, Any]) -> str:
    soak = report["soak"]
    lines = [f"Driver soak: {soak['minutes']:g} minutes, {soak['policy']} (rollout.soakMinutes, rollout.soak)", ""]
    rows = []
    for v in report["versions"]:
        states = v["states"]
        rate = v["xidPerNodeHour"]
        failed_share = f" ({v['failedGpuPods'] / v['gpuPods']:.0%})" if v["gpuPods"] else ""
        rows.append([v["version"], v["release"], str(v["nodes"]), *(str(states[s]) for s in STATES),
                     str(v["gpuPods"]), f"{v['failedGpuPods']}{failed_share}",
                     "-" if rate is None else f"{rate:.2f}"])
    lines.append(table(["DRIVER", "RELEASE", "NODES", *(s.upper() for s in STATES), "GPU PODS", "FAILED",
                        "XID/NODE-HOUR"], rows) if rows else "no GPU nodes")
    wave = [node for node in report["nodes"] if node["state"] != "done"]
    if wave:
        lines += ["", table(["NODE", "DRIVER", "STATE", "SOAK LEFT", "WHY"],
                            [[node["node"], node["version"] or "-", node["state"], _left(node["soakLeftSeconds"]),
                              _why(node)] for node in wave])]
    canaries = report["canaryNamespaces"]
    lines += ["", f"Canary namespaces ({n.ANN_CANARY}=\"true\"): {', '.join(canaries) if canaries else 'none'}"]
    wave_info = report["nextWave"]
    takes = "unknown" if wave_info["nodes"] is None else f"{wave_info['nodes']} of {wave_info['pending']} waiting"
    target = f", to driver {wave_info['target']}" if wave_info.get("target") else ""
    lines.append(f"Next wave: {takes}{target} ({wave_info['why']})")
    return "\n".join(lines)


def _left(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes = math.ceil(seconds / 60)
    return f"{minutes}m" if minutes < 120 else f"{minutes // 60}h{minutes % 60:02d}m"


def _why(node: Mapping[str, Any]) -> str:
    if node["state"] == SOAKING:  # why: the driver it ran before, when recorded
        return "; ".join(filter(None, (node["why"], "canary namespaces first until the soak ends")))
    return node["why"] or _state_note(node)


def _state_note(node: Mapping[str, Any]) -> str:
    if node["state"] == UPGRADING and node["upgradeState"] in IN_PROGRESS:
        return f"{n.DRIVER_UPGRADE_STATE}={node['upgradeState']}"
    if node["state"] == FAILED:
        return "failed its soak"
    return f"{n.DRIVER_UPGRADE_STATE}={node['upgradeState']}" if node["upgradeState"] else ""


def policy_from_objects(objects: list[dict[str, Any]]) -> tuple[ClusterPolicy | None, str]:
    """The ClusterPolicy of a snapshot, when it holds one."""
    policies = [o for o in objects if o.get("kind") == "ClusterPolicy"]
    if not policies:
        return None, "the snapshot holds no ClusterPolicy (add: kubectl get clusterpolicies -o json)"
    return policies[0], ""


def fetch_policy(access: Any) -> tuple[ClusterPolicy | None, str]:
    """The cluster's ClusterPolicy (the GPU Operator keeps one), or None and why not."""
    import urllib3

    from gpu_placement.kube import api as kube

    try:
        items = kube.get(access.api, CLUSTER_POLICIES, timeout=kube.LIST_TIMEOUT).get("items") or []
    except urllib3.exceptions.HTTPError as exc:
        return None, f"GET {CLUSTER_POLICIES}: the API server did not answer ({' '.join(str(exc).split())[:120]})"
    except kube.ApiNotFound:
        return None, "no ClusterPolicy CRD (nvidia.com/v1): is the GPU Operator installed?"
    except kube.ApiForbidden:
        return None, "not allowed to read clusterpolicies.nvidia.com (kubectl auth can-i list clusterpolicies)"
    except kube.ApiError as error:
        return None, f"GET {CLUSTER_POLICIES}: {error}"
    return (items[0], "") if items else (None, "no ClusterPolicy in the cluster")



def run_rollout(core: Any, access: Any, objects: list[dict[str, Any]], prometheus: str | None, output: str) -> str:
    """The command's output for a core read from `access` (live) or a snapshot's `objects`; XID
    figures from Prometheus when a URL is given or configured (one reading, as the service's
    refresher takes it)."""
    from dataclasses import replace

    from gpu_placement.view.telemetry import TelemetrySource

    policy, problem = fetch_policy(access) if access is not None else policy_from_objects(objects)
    url = prometheus or core.config.telemetry.url
    telemetry: dict[str, Any] = {"url": url, "error": None}
    if url:
        source = TelemetrySource(core.view, replace(core.config.telemetry, url=url))
        source.refresh()
        telemetry["error"] = source.last_error
    report = {**rollout_json(core.placement.rollout, policy, problem), "telemetry": telemetry,
              "configuration": getattr(core, "config_source", "")}
    if output == "json":
        return orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
    text = rollout_text(report) + f"\nConfiguration: {report['configuration']}"
    if not url:
        text += "\nXID/NODE-HOUR: no telemetry (set telemetry.url in --config, or --prometheus URL)"
    elif telemetry["error"]:
        text += f"\nXID/NODE-HOUR: Prometheus at {url} failed: {telemetry['error']}"
    return text
