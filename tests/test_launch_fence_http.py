"""The launch fence where a user meets it: kube-scheduler's /filter over HTTP on loopback, and
`gpu-placement explain` on a cluster snapshot (docs/rules.md, LaunchFailures)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpu_placement.app.cli import main
from gpu_placement.samples.cluster import make_pod, namespace, validator_pod
from tests.support.extender import Extender
from tests.support.fence import failed, node

GPU = "nvidia.com/gpu"
FENCED = ("LaunchFailures: 2 nvidia.com/gpu pods in a row failed to start on the node for the node's reasons "
          "(device_plugin: the kubelet's device manager could not allocate the GPUs, UnexpectedAdmissionError) since ")


def cluster(now: float) -> list[dict[str, Any]]:
    """Two validated nodes; on gpu-1 two GPU pods refused by the device plugin a few seconds ago."""
    return [namespace("team"), namespace("gpu-operator"), node("gpu-1"), validator_pod("gpu-1"), node("gpu-2"),
            validator_pod("gpu-2"), failed("a", now - 30), failed("b", now - 20)]


def test_filter_refuses_the_fenced_node_with_its_reason() -> None:
    extender = Extender(cluster(time.time()))
    try:
        answer = extender.filter(make_pod("team", "next", gpus={GPU: 1}), ["gpu-1", "gpu-2"])
        assert answer["NodeNames"] == ["gpu-2"]
        assert answer["FailedNodes"] == {}
        assert answer["FailedAndUnresolvableNodes"]["gpu-1"].startswith(FENCED)  # preemption cannot fix it
        # a pod without a GPU is not the fence's business
        assert extender.filter(make_pod("team", "cpu-only"), ["gpu-1", "gpu-2"])["NodeNames"] == ["gpu-1", "gpu-2"]
    finally:
        extender.close()


def test_explain_names_the_fence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = tmp_path / "cluster.json"
    waiting = make_pod("team", "waiting", gpus={GPU: 1})
    snapshot.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": [*cluster(time.time()), waiting]}))
    assert main(["explain", "pod/waiting", "-n", "team", "--snapshot", str(snapshot), "--all"]) == 0
    out = capsys.readouterr().out
    assert "would go to gpu-2" in out and "2 nodes: 1 LaunchFailures, 1 pass" in out
    row = next(line for line in out.splitlines() if line.startswith("gpu-1 "))
    assert row.split()[1] == "LaunchFailures" and FENCED.removeprefix("LaunchFailures: ") in row
