"""Scenario 24: a node that looks fine and fails every GPU pod is fenced from its pods' launches, and lifted
when the GPU Operator revalidates it (docs/rules.md, LaunchFailures).

Two validated one-GPU nodes. This test plays the kubelet of the first: two GPU pods bound there fail as
the kubelet reports a device plugin that cannot allocate (phase Failed, `UnexpectedAdmissionError`).
Then, on the real control plane with the chart's processes:
  - `explain` (against the live API server, the chart's configuration) refuses the node with
    `LaunchFailures`, naming the cause and since when; the chart's kube-scheduler sends the next pod to
    the other node; the webhook replica holding the fences' Lease writes the fence on the Node
    (`gpu-placement.io/launch-fence`) and a Warning Event `GpuLaunchFenced` on it;
  - the failed pods deleted (as a Job controller would), the fence stays: it is in the Node;
  - a new validator pod on the node turns Ready (the operator revalidated it): the fence lifts,
    `explain` passes the node again, and a Normal Event `GpuLaunchFenceLifted` says why.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_placement.app.cli import main
from gpu_placement.base.timestamps import format_time
from tests.e2e.cluster import ADMIN_TOKEN, retrying_503, wait_for
from tests.e2e.conftest import E2E, gpu_pod_manifest

GROUP = "s24"
SICK, WELL = f"{GROUP}-sick", f"{GROUP}-well"
FENCE = "gpu-placement.io/launch-fence"
FENCED = ("LaunchFailures: 2 nvidia.com/gpu pods in a row failed to start on the node for the node's reasons "
          "(device_plugin: the kubelet's device manager could not allocate the GPUs, UnexpectedAdmissionError) "
          "since ")
REJECTED = ("Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = device GPU-5c1f unhealthy, "
            "which is unexpected")


def _explain(kubeconfig: Path, pod: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
             ) -> dict[str, Any]:
    file = tmp_path / f"{pod['metadata']['name']}.json"
    file.write_text(json.dumps(pod))
    capsys.readouterr()
    main(["explain", str(file), "--kubeconfig", str(kubeconfig), "-o", "json"])
    answer: dict[str, Any] = json.loads(capsys.readouterr().out)
    return {row["node"]: row for row in answer["nodes"] if row["node"].startswith(f"{GROUP}-")}


def _node_events(e2e: E2E, reason: str) -> list[dict[str, Any]]:
    items = e2e.api.get("/apis/events.k8s.io/v1/namespaces/default/events")["items"]
    return [e for e in items if e.get("reason") == reason and e.get("regarding", {}).get("name") == SICK]


def _fence(e2e: E2E) -> dict[str, Any] | None:
    value = (e2e.api.get(f"/api/v1/nodes/{SICK}")["metadata"].get("annotations") or {}).get(FENCE)
    return json.loads(value) if value else None


@pytest.mark.timeout(300)
def test_a_node_failing_its_gpu_pods_is_fenced_then_lifted_by_revalidation(
        e2e: E2E, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    e2e.nodes(GROUP, [("sick", "h100", {}), ("well", "h100", {})])
    ns = e2e.namespace("fence")
    e2e.kubelets.elsewhere.add(ns)  # this test is the kubelet of its pods
    kubeconfig = e2e.api.kubeconfig(tmp_path / "admin.kubeconfig", ADMIN_TOKEN, "e2e-admin")
    time.sleep(2)  # the failures come after the validators turned Ready (a revalidation lifts what came before)
    first = time.time() - 1
    for i, name in enumerate(("fails-1", "fails-2")):
        pod = gpu_pod_manifest(ns, name, GROUP)
        pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] = SICK
        assert retrying_503(lambda p=pod: e2e.api.create(f"/api/v1/namespaces/{ns}/pods", p)).status_code == 201
        assert e2e.wait_bound(ns, name) == SICK
        # the kubelet's admission: the device plugin's Allocate failed (Kubelet.rejectPod); its GPU is free again
        e2e.api.merge_patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {
            "phase": "Failed", "reason": "UnexpectedAdmissionError", "message": REJECTED,
            "startTime": format_time(first + i)}})

    waiting = gpu_pod_manifest(ns, "next", GROUP)
    rows = wait_for("explain refusing the node LaunchFailures", lambda: (
        found if (found := _explain(kubeconfig, waiting, tmp_path, capsys))[SICK]["verdict"] == "LaunchFailures"
        else None), timeout=60, interval=1)
    assert rows[SICK]["reason"].startswith(FENCED + format_time(first)), rows[SICK]["reason"]
    assert rows[WELL]["verdict"] == "pass"
    assert retrying_503(lambda: e2e.api.create(f"/api/v1/namespaces/{ns}/pods", waiting)).status_code == 201
    assert e2e.wait_bound(ns, "next") == WELL

    written = wait_for("the fence on the Node", lambda: _fence(e2e), timeout=60, interval=0.5)
    assert written["resources"]["nvidia.com/gpu"]["count"] == 2
    assert written["resources"]["nvidia.com/gpu"]["since"] == format_time(first)
    warning = wait_for("the GpuLaunchFenced Event", lambda: _node_events(e2e, "GpuLaunchFenced"), timeout=60,
                       interval=0.5)
    assert warning[0]["type"] == "Warning" and FENCED.split(": ", 1)[1][:40] in warning[0]["note"]

    for name in ("fails-1", "fails-2"):  # deleted, as a Job controller deletes its failed pods
        e2e.api.delete(f"/api/v1/namespaces/{ns}/pods/{name}", grace=0)
    time.sleep(2)  # the watch brings the deletions in; the fence stays: it is in the Node (the probe opens 2
    # minutes after the last failure: this runs well before)
    assert _explain(kubeconfig, gpu_pod_manifest(ns, "again", GROUP), tmp_path, capsys)[SICK]["verdict"] == \
        "LaunchFailures"

    # The GPU Operator revalidates the node: a new validator pod, Ready now.
    validator = f"nvidia-operator-validator-{SICK}"
    e2e.api.delete(f"/api/v1/namespaces/gpu-operator/pods/{validator}", grace=0)
    wait_for("the old validator gone", lambda: e2e.api.http.get(
        f"/api/v1/namespaces/gpu-operator/pods/{validator}").status_code == 404, timeout=30, interval=0.2)
    e2e.kubelets.add_validator(SICK)
    rows = wait_for("explain passing the node again", lambda: (
        found if (found := _explain(kubeconfig, gpu_pod_manifest(ns, "later", GROUP), tmp_path, capsys)
                  )[SICK]["verdict"] == "pass" else None), timeout=60, interval=1)
    assert rows[WELL]["verdict"] in ("pass", "NodeResourcesFit")  # its one GPU is held by `next`
    lifted = wait_for("the GpuLaunchFenceLifted Event", lambda: _node_events(e2e, "GpuLaunchFenceLifted"),
                      timeout=60, interval=0.5)
    assert lifted[0]["type"] == "Normal" and "revalidated" in lifted[0]["note"]
    cleared = wait_for("the lift recorded on the Node", lambda: (
        fence if (fence := _fence(e2e)) and "count" not in fence["resources"]["nvidia.com/gpu"] else None),
        timeout=60, interval=0.5)
    assert set(cleared["resources"]["nvidia.com/gpu"]) == {"clear"}
    e2e.api.delete(f"/api/v1/namespaces/{ns}/pods/next", grace=0)
