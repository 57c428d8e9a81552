"""`nodes` and `explain` show DRA devices: per node product, driver, memory and taints (the driver's own
and gpu-placement's), and for a DRA pod which devices its claims could take."""

from __future__ import annotations

from pathlib import Path

import orjson

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.app.cli import main
from gpu_placement.app.explain import explain_pod
from gpu_placement.base.config import Config
from gpu_placement.report.devices import device_rows
from gpu_placement.samples.dra import device_classes, resource_slice
from tests.support.dra import claim_pod, dra_node, template

XID = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]


def objects() -> list[dict]:
    from gpu_placement.samples.cluster import namespace, validator_pod

    return [namespace("ml"), *device_classes(), template("ml", "one-gpu", "gpu.nvidia.com"),
            dra_node("a"), validator_pod("a"), resource_slice("a", 3, taints={2: XID}),
            dra_node("b"), validator_pod("b", ready=False), resource_slice("b", 1)]


def test_device_rows_carry_both_kinds_of_taint() -> None:
    core = core_from_objects(Config(), objects())
    rows = {(r[0], r[1]): r for r in device_rows(core.view, core.config)}
    assert rows[("a", "gpu-0")][3:6] == ["NVIDIA H100 80GB HBM3", "570.124.06", "81559"]
    assert rows[("a", "gpu-0")][7] == "-"
    assert rows[("a", "gpu-2")][7] == "gpu.nvidia.com/xid=79:NoSchedule"
    assert rows[("b", "gpu-0")][7] == "gpu-placement.io/unverified=NotValidated:NoSchedule (gpu-placement)"


def test_explain_lists_the_devices_a_claim_could_take() -> None:
    core = core_from_objects(Config(), objects())
    text = explain_pod(core, claim_pod("ml", "train", "one-gpu"), "ml")
    assert "DRA devices its claims could take" in text
    line = next(line for line in text.splitlines() if line.startswith("a ") and "gpu-0, gpu-1" in line)
    assert "gpu-2: tainted gpu.nvidia.com/xid=79:NoSchedule" in line
    assert not any(line.startswith("b ") for line in text.split("could take")[1].splitlines())  # b fails


def test_nodes_command_prints_the_dra_devices(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    snapshot = tmp_path / "cluster.json"
    snapshot.write_bytes(orjson.dumps({"kind": "List", "items": objects()}))
    assert main(["nodes", "--snapshot", str(snapshot)]) == 0
    out = capsys.readouterr().out
    assert "DRA devices (gpu.nvidia.com)" in out
    assert "NotValidated" in out.split("DRA devices")[0]  # b's verdict in the node table
