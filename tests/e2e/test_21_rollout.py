"""Scenario 21: a driver wave on the real control plane (docs/rollouts.md).

Two GPU nodes run the old driver. One is upgraded the way the GPU Operator's upgrade controller and
the kubelet do it, through the API: its upgrade-state label moves on, its driver pod is replaced
by one of the new version that turns Ready, GFD relabels it. With `rollout.soak: strict` the new
driver then soaks: a canary namespace's pods go there, ordinary pods are kept on the old driver or
wait with `DriverSoaking`. The extender is restarted mid-soak and still soaks the node (the time is
the driver pod's Ready transition, read back from the API server); `gpu-placement rollout` reads
the same state from the cluster; when the soak is over, the waiting pod lands on the new driver.
The webhook's leader records each node's settled driver on the Node (through the chart's RBAC), the
new one only once its soak is over; then a reinstall of that same driver does not soak again.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpu_placement.samples.cluster import driver_labels, driver_pod
from tests.e2e.cluster import wait_for
from tests.e2e.conftest import E2E
from tests.e2e.deploy import GPU_PLACEMENT, wait_ready

Obj = dict[str, Any]
OLD = ("535.129.03", "12.2")  # the published H100 x8 label set's driver
NEW = ("580.105.08", "13.0")  # a version no other scenario's nodes run
SOAK_MINUTES = 1.5
CUDA13 = "nvcr.io/nvidia/cuda:13.0.0-runtime-ubuntu24.04"
DAY = 86400.0


def use_config(e2e: E2E, values: Obj) -> None:
    """`helm upgrade` with these values; the scheduler pod's extender restarted on the new config."""
    e2e.upgrade(values)
    [cm] = [d for d in e2e.docs if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {})]
    scheduler = e2e.scheduler
    assert scheduler is not None
    (scheduler.volumes["config"] / "config.yaml").write_text(cm["data"]["config.yaml"])
    restart_extender(e2e)


def restart_extender(e2e: E2E) -> None:
    scheduler = e2e.scheduler
    assert scheduler is not None
    scheduler.stop("extender")
    wait_ready(scheduler.start("extender"), f"{e2e.extender_url()}/readyz")


def put_driver_pod(e2e: E2E, node: str, version: str, ready_at: float | None) -> None:
    """The driver DaemonSet's pod on `node`, as the DaemonSet controller creates it and the kubelet
    reports it (Ready since `ready_at`, None: still installing)."""
    pod = driver_pod(node, version, ready_at)
    status = pod.pop("status")
    for key in ("uid", "creationTimestamp", "ownerReferences"):  # no such DaemonSet here: the GC would delete it
        pod["metadata"].pop(key, None)
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]
    path = f"/api/v1/namespaces/gpu-operator/pods/{pod['metadata']['name']}"
    if e2e.api.http.get(path).status_code == 404:
        response = e2e.api.create("/api/v1/namespaces/gpu-operator/pods", pod)
        assert response.status_code == 201, response.text
    for container in status["containerStatuses"]:
        container.update(imageID="", started=ready_at is not None,
                         state={"running": {"startedAt": status["startTime"]}})
    e2e.api.merge_patch(f"{path}/status", {"status": status})


def label(e2e: E2E, node: str, labels: dict[str, str | None], unschedulable: bool | None = None) -> None:
    body: Obj = {"metadata": {"labels": labels}}
    if unschedulable is not None:
        body["spec"] = {"unschedulable": unschedulable}
    e2e.api.merge_patch(f"/api/v1/nodes/{node}", body)


def settled(e2e: E2E, node: str) -> str | None:
    """The node's gpu-placement.io/settled-driver, as the webhook's leader wrote it."""
    annotations = e2e.api.get(f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {}
    return annotations.get("gpu-placement.io/settled-driver")


def extender_filter(e2e: E2E, namespace: str, name: str, nodes: list[str]) -> Obj:
    """The extender's own /filter answer for a pod as the API server holds it, asked the way
    kube-scheduler asks (NodeNames: nodeCacheCapable)."""
    response = httpx.post(f"{e2e.extender_url()}/filter", json={"Pod": e2e.pod(namespace, name), "NodeNames": nodes},
                          timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def rollout_report(e2e: E2E, tmp: Path) -> Obj:
    """`gpu-placement rollout -o json` against the cluster, with the configuration it finds deployed there."""
    kubeconfig = e2e.api.kubeconfig(tmp / "admin.kubeconfig", e2e.api.token, "e2e-admin")
    result = subprocess.run([GPU_PLACEMENT, "rollout", "--kubeconfig", str(kubeconfig), "-o", "json"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    report = dict(json.loads(result.stdout))
    assert report["configuration"].startswith("ConfigMap gpu-placement/"), report["configuration"]
    assert report["soak"] == {"minutes": SOAK_MINUTES, "policy": "strict"}
    return report


# The soak itself lasts 1.5 minutes, and pytest-timeout counts the session's fixtures on the test that
# starts or ends them (the control plane's start and stop when this file runs alone): 120 s is too little.
@pytest.mark.timeout(420)
def test_a_new_driver_soaks_on_canaries_across_a_restart_then_takes_everyone(e2e: E2E, tmp_path: Path) -> None:
    use_config(e2e, {"config": {"rollout": {"soak": "strict", "soakMinutes": SOAK_MINUTES}}})
    try:
        _wave(e2e, tmp_path)
    finally:
        use_config(e2e, {})


def _wave(e2e: E2E, tmp_path: Path) -> None:
    group = "s21"
    old, upgraded = e2e.nodes(group, [("old", "h100x8", {}), ("upgraded", "h100x8", {})])
    for node in (old, upgraded):
        put_driver_pod(e2e, node, OLD[0], time.time() - 40 * DAY)
    team = e2e.namespace("rollout")
    canary = e2e.namespace("canary", {"gpu-placement.io/canary": "true"})
    wait_for("the settled drivers recorded", lambda: settled(e2e, old) == settled(e2e, upgraded) == OLD[0],
             timeout=60)

    # The upgrade controller: cordon, then replace the driver pod (OnDelete DaemonSet).
    label(e2e, upgraded, {"nvidia.com/gpu-driver-upgrade-state": "pod-restart-required"}, unschedulable=True)
    assert e2e.api.delete(f"/api/v1/namespaces/gpu-operator/pods/nvidia-driver-daemonset-{upgraded}",
                          grace=0).status_code == 200
    put_driver_pod(e2e, upgraded, NEW[0], None)  # installing
    put_driver_pod(e2e, upgraded, NEW[0], time.time())  # the new driver is loaded: Ready now
    label(e2e, upgraded, {**driver_labels(*NEW), "nvidia.com/gpu-driver-upgrade-state": "uncordon-required"})
    label(e2e, upgraded, {"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}, unschedulable=False)
    soak_ends = time.time() + SOAK_MINUTES * 60
    e2e.kubelets.wait_schedulable([upgraded])
    time.sleep(1.0)  # the extender's watch

    # A canary pod takes the new driver; an ordinary one stays on the old; one that needs CUDA 13 waits.
    assert e2e.gpu_pod(canary, "canary-1", group).status_code == 201
    assert e2e.wait_bound(canary, "canary-1") == upgraded
    assert e2e.gpu_pod(team, "ordinary", group).status_code == 201
    assert e2e.wait_bound(team, "ordinary") == old
    assert e2e.gpu_pod(team, "cuda13", group, image=CUDA13).status_code == 201
    message = e2e.scheduled_condition(team, "cuda13")["message"]
    assert (f"1 DriverSoaking: driver {NEW[0]} is new on the node and is soaking: only pods of namespaces annotated "
            'gpu-placement.io/canary="true" run on it') in message, message
    assert "1 DriverTooOld" in message and upgraded not in message, message

    # A restart of the service: the soak is read back from the driver pod, not remembered. (At least
    # 10 s into the soak, so that a soak counted from the restart would visibly end later.)
    time.sleep(max(0.0, soak_ends - SOAK_MINUTES * 60 + 10 - time.time()))
    restart_extender(e2e)
    assert time.time() < soak_ends - 15, "the scenario ran too slowly to test the restart within the soak"
    assert e2e.gpu_pod(team, "cuda13-after-restart", group, image=CUDA13).status_code == 201
    assert "1 DriverSoaking: " in e2e.scheduled_condition(team, "cuda13-after-restart")["message"]
    assert e2e.gpu_pod(canary, "canary-2", group).status_code == 201
    assert e2e.wait_bound(canary, "canary-2") == upgraded
    report = rollout_report(e2e, tmp_path)
    nodes = {n["node"]: n for n in report["nodes"]}
    assert nodes[upgraded]["state"] == "soaking" and nodes[upgraded]["version"] == NEW[0]
    assert 0 < nodes[upgraded]["soakLeftSeconds"] <= SOAK_MINUTES * 60
    assert nodes[old]["state"] == "done" and canary in report["canaryNamespaces"]
    assert report["nextWave"]["why"].startswith("unknown: no ClusterPolicy CRD")  # the operator is not installed

    # The soak ends on the clock, at the time the driver pod's Ready transition gives, not one soak
    # after the restart: the restarted extender passes the node as soon as that time is past.
    time.sleep(max(0.0, soak_ends - time.time()) + 2.0)
    assert extender_filter(e2e, team, "cuda13", [old, upgraded])["NodeNames"] == [upgraded]
    # kube-scheduler retries pods an extender rejected on the next cluster event (or within 5
    # minutes): a pod bound elsewhere is one.
    assert e2e.gpu_pod(canary, "nudge", group).status_code == 201
    assert e2e.wait_bound(team, "cuda13", timeout=60) == upgraded
    assert e2e.wait_bound(team, "cuda13-after-restart", timeout=60) == upgraded
    final = {n["node"]: n["state"] for n in rollout_report(e2e, tmp_path)["nodes"]}
    assert final[upgraded] == "done", final

    # Settled now: recorded. A reinstall of the same driver (kubectl delete pod, an operator upgrade
    # that rolls the DaemonSet) is no change: no soak, an ordinary pod needing CUDA 13 goes there.
    wait_for("the new driver recorded once settled", lambda: settled(e2e, upgraded) == NEW[0], timeout=60)
    assert e2e.api.delete(f"/api/v1/namespaces/gpu-operator/pods/nvidia-driver-daemonset-{upgraded}",
                          grace=0).status_code == 200
    put_driver_pod(e2e, upgraded, NEW[0], None)
    put_driver_pod(e2e, upgraded, NEW[0], time.time())
    after = {n["node"]: n for n in rollout_report(e2e, tmp_path)["nodes"]}
    assert after[upgraded]["state"] == "done" and after[upgraded]["driverReadySince"] > time.time() - 60, after
    assert e2e.gpu_pod(team, "after-reinstall", group, image=CUDA13).status_code == 201
    assert e2e.wait_bound(team, "after-reinstall", timeout=60) == upgraded
    wait_for("nothing left pending", lambda: all(p["spec"].get("nodeName") for p in e2e.api.get(
        f"/api/v1/namespaces/{team}/pods")["items"]), timeout=30)
