"""`gpu-placement nodes`: one line per node saying what most GPU pods get there, and its GPUs used and free.

A node can pass every readiness check and still refuse most pods: under `rollout.soak: strict` a soaking
driver takes canary namespaces' pods only; without the driver-version labels every pod with a CUDA
requirement (any nvidia/cuda or NGC image) is refused as UnknownDriver; a node whose driver upgrade is
due is scored last. The STATE column says so instead of `ready`:

    ready             GPU pods go there
    canary-only       a soaking (or failed) driver under rollout.soak strict: canary namespaces' pods only
    last-choice       a soaking or failed driver under rollout.soak prefer: scored lowest
    upgrade-due       nvidia.com/gpu-driver-upgrade-state=upgrade-required: takes pods, scored lower
    no-driver-labels  pods with a CUDA requirement are refused (UnknownDriver); pods without one run
    <ReasonCode>      refused for every GPU pod (NotValidated, DriverUpgrade, NodeNotReady, ...: docs/rules.md)
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import Any

import orjson

from gpu_placement.base.cuda import format_version
from gpu_placement.decide.dra_fit import DRA, both_ways_on, served_on
from gpu_placement.decide.rules import node_readiness
from gpu_placement.facts.soak import FAILED, SOAKING
from gpu_placement.report.tables import table

__all__ = ["natural", "node_records", "node_state", "run_nodes"]

HEADER = ["NODE", "STATE", "PRODUCT", "GPUS used/alloc", "FREE", "WHY"]
WIDE = ["NODE", "STATE", "PRODUCT", "GPUS used/alloc", "FREE", "DRIVER", "MAX CUDA", "MEM MiB total/free", "WHY"]


def run_nodes(args: argparse.Namespace, cluster: Callable[..., tuple[Any, Any, list[dict[str, Any]]]]) -> int:
    core, access, _ = cluster(args)
    print(f"configuration: {core.config_source}", file=sys.stderr)
    for line in getattr(access, "unseen", ()) or ():
        print(f"could not see: {line}", file=sys.stderr)
    records = node_records(core)
    if args.output == "json":
        print(orjson.dumps({"configuration": core.config_source, "nodes": records},
                           option=orjson.OPT_INDENT_2).decode())
        return 0
    if not records:
        print("no nodes in " + (f"snapshot {args.snapshot}" if args.snapshot else "the cluster"), file=sys.stderr)
        return 0
    wide = args.output == "wide"
    rows = [[r["node"], r["state"], r["product"] or "-", _gpus(r), _free(r),
             *([r["driver"] or "-", r["max_cuda"] or "-",
                f"{r['memory_mib']['total']}/{r['memory_mib']['free']}" if r["memory_mib"]["total"] else "-"]
               if wide else []), r["why"]] for r in records]
    print(table(WIDE if wide else HEADER, rows))
    if core.view.dra.nodes():
        from gpu_placement.report.devices import DEVICE_HEADER, device_rows

        print(f"\nDRA devices ({core.config.dra.driver}), with their taints: the driver's own and gpu-placement's")
        print(table(DEVICE_HEADER, device_rows(core.view, core.config)))
    return 0


def node_records(core: Any) -> list[dict[str, Any]]:
    view = core.view
    records = []
    with view.lock:
        for name in sorted(view.nodes, key=natural):
            facts = view.nodes[name]
            used, _ = view.used(name)
            resources = sorted(facts.capacity.keys() | facts.allocatable.keys())
            gpus = {res: {"used": used.get(res, 0), "allocatable": facts.allocatable.get(res, 0),
                          "capacity": facts.capacity.get(res, 0),
                          "free": max(0, facts.allocatable.get(res, 0) - used.get(res, 0))} for res in resources}
            total = sum(v or 0 for v in (view.capacity_mib.get(res, {}).get(name) for res in resources))
            free = sum(v or 0 for v in (view.free_mib.get(res, {}).get(name) for res in resources))
            state, why = node_state(core, name)
            # Which way each GPU resource is served here (KEP-5004): the device plugin's where the node's
            # allocatable has it, else through DRA where a DeviceClass maps it and the node has its devices.
            served = served_on(view, name, sorted(set(resources) | set(view.dra.extended)))
            # ...and those served from the device plugin although the node also publishes devices of the class
            # mapping them (those devices serve claims and the class's implicit name, not the resource)
            both_ways = sorted(both_ways_on(view, name, sorted(served)))
            dra = {res: way for res, way in served.items() if way == DRA}
            if dra:
                held = len(view.dra.used_on(name))
                for res in dra:
                    gpus.setdefault(res, {"used": held, "allocatable": facts.dra_devices, "capacity": facts.dra_devices,
                                          "free": max(0, facts.dra_devices - held)})
            records.append({"node": name, "state": state, "why": why, "product": facts.product,
                            "pool": facts.pool, "gpus": gpus, "served": served, "both_ways": both_ways,
                            "driver": format_version(facts.driver) if facts.driver else None,
                            "max_cuda": format_version(facts.max_cuda) if facts.max_cuda else None,
                            "memory_mib": {"total": total, "free": free}})
    return records


def node_state(core: Any, name: str) -> tuple[str, str]:
    """What most GPU pods get on the node, and why in a sentence (empty for plain `ready`): the STATE of
    `gpu-placement nodes`, and the state `gpu-placement survey` shows (one decision for both)."""
    view, config = core.view, core.config
    with view.lock:
        facts = view.nodes[name]
        rejection = node_readiness(facts, view.validator_state(name), config)
    if rejection is not None:
        return rejection.code, rejection.message.split(": ", 1)[1]
    if facts.problems:
        return "BadLabel", "; ".join(sorted(facts.problems.values()))
    if not facts.gpu_present and not any(facts.allocatable.values()):
        return "ready", "no GPU: takes no GPU pod"
    soak = core.placement.rollout.soak(facts.name)
    driver = f"driver {format_version(facts.driver)}" if facts.driver else "its driver"
    if soak.state in (SOAKING, FAILED):
        what = "failed its soak" if soak.state == FAILED else "is soaking" + _left(soak, core)
        if config.rollout.soak == "strict":
            return "canary-only", (f"{driver} {what}: only pods of canary namespaces (gpu-placement.io/canary=true) "
                                   "run here (rollout.soak strict); others are refused as DriverSoaking")
        return "last-choice", f"{driver} {what}: scored lowest, so pods go elsewhere first (rollout.soak prefer)"
    if facts.driver is None:
        return "no-driver-labels", ("no nvidia.com/cuda.driver-version labels: pods with a CUDA requirement (any "
                                    "nvidia/cuda or NGC image, gpu-placement.io/cuda) are refused as UnknownDriver")
    if facts.upgrade_state == "upgrade-required":
        return "upgrade-due", (f"nvidia.com/gpu-driver-upgrade-state=upgrade-required: takes pods, scored "
                               f"-{config.scoring.upgrade_required} so nodes not about to be drained go first")
    return "ready", ""


def _left(soak: Any, core: Any) -> str:
    if soak.until is None:
        return ""
    minutes = max(0, int((soak.until - core.placement.rollout.clock()) // 60))
    return f", {minutes}m left"


def _gpus(record: dict[str, Any]) -> str:
    """`1/8 gpu`, and for a resource served through DRA its devices held by claims: `0/2 gpu (DRA)`; a node
    serving it both ways: `1/4 gpu (device plugin; DRA devices too)` (kube-scheduler counts the device plugin's)."""
    served, both = record.get("served") or {}, record.get("both_ways") or ()
    return ", ".join(f"{g['used']}/{g['allocatable']} {_short(res)}" + _way(res, served, both)
                     for res, g in record["gpus"].items()) or "-"


def _way(resource: str, served: dict[str, str], both: Any) -> str:
    if served.get(resource) == DRA:
        return " (DRA)"
    return " (device plugin; DRA devices too)" if resource in both else ""


def _short(resource: str) -> str:
    return resource.removeprefix("nvidia.com/").removeprefix("deviceclass.resource.kubernetes.io/")


def _free(record: dict[str, Any]) -> str:
    return ", ".join(str(g["free"]) for g in record["gpus"].values()) or "-"


def natural(name: str) -> tuple[Any, ...]:
    """h100-single-2 before h100-single-10, as a person sorts."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
