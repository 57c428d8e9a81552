"""A snapshot records no time: `explain --snapshot` judges it at the wall clock, and says so when a verdict
depends on it (the wave 5 trial: the demo said `h100-batch-3 ... soaking 25m` at 16:00, and explain on a copy
made then passed the node with score 10 at 16:27, nothing in the output saying the answer depends on when
you ask). The demo cluster's batch pool has two nodes soaking a new driver (strict soak)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gpu_placement.app.cli import main
from gpu_placement.base.timestamps import parse_time

STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
MINUTE = r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"
JUDGED = (rf"judged at: {MINUTE}, the wall clock \(a snapshot records no time; its newest timestamp is {MINUTE}\), "
          r"and these verdicts depend on it: driver soaks end by the clock ")


def shifted(value: Any, seconds: float) -> Any:
    """Every timestamp in a snapshot moved by `seconds`: the same snapshot, taken that much earlier."""
    if isinstance(value, dict):
        return {key: shifted(item, seconds) for key, item in value.items()}
    if isinstance(value, list):
        return [shifted(item, seconds) for item in value]
    if isinstance(value, str) and STAMP.fullmatch(value):
        at = parse_time(value)
        assert at is not None
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at + seconds))
    return value


def explain(tmp_path: Path, capsys: pytest.CaptureFixture[str], snapshot: Path) -> list[str]:
    pod = tmp_path / "train.yaml"
    pod.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "t", "namespace": "batch"},
                                   "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                                            "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}))
    main(["explain", str(pod), "--snapshot", str(snapshot)])
    return capsys.readouterr().out.splitlines()


def verdict(lines: list[str], node: str) -> str:
    return next(line.split()[1] for line in lines if line.startswith(f"{node} "))


def test_a_snapshot_is_judged_at_the_wall_clock_and_says_so(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = tmp_path / "cluster.json"
    assert main(["demo", "--write-snapshot", str(snapshot)]) == 0
    lines = explain(tmp_path, capsys, snapshot)
    assert re.fullmatch(rf"{JUDGED}\(h100-batch-2 soaking until {MINUTE}; h100-batch-3 soaking until {MINUTE}\)",
                        lines[2]), lines[2]
    assert verdict(lines, "h100-batch-3") == "DriverSoaking"

    # The same snapshot, taken 90 minutes ago: both soaks have ended since, so the nodes pass, and it says why.
    later = tmp_path / "earlier.json"
    later.write_text(orjson.dumps(shifted(orjson.loads(snapshot.read_bytes()), -90 * 60)).decode())
    lines = explain(tmp_path, capsys, later)
    assert re.fullmatch(rf"{JUDGED}\(h100-batch-2's soak ended {MINUTE}; h100-batch-3's soak ended {MINUTE}\)",
                        lines[2]), lines[2]
    assert verdict(lines, "h100-batch-3") == "pass"

    # Two days later, the soaks ended long before the snapshot's newest timestamp: nothing depends on the clock.
    old = tmp_path / "old.json"
    snapshot_objects = orjson.loads(snapshot.read_bytes())
    for item in snapshot_objects["items"]:
        if item["kind"] == "Pod" and item["metadata"]["name"].startswith("nvidia-driver-daemonset"):
            item["status"] = shifted(item["status"], -2 * 86400)
    old.write_text(orjson.dumps(snapshot_objects).decode())
    lines = explain(tmp_path, capsys, old)
    assert not any(line.startswith("judged at:") for line in lines)
    assert verdict(lines, "h100-batch-3") == "pass"
