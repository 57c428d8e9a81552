"""Scenario 22: `explain` holds to what the real kube-scheduler does on the same cluster.

Nodes that kube-scheduler's own filters keep out (a cordoned one, one with a taint the pod does not
tolerate, one whose GPU a bound pod holds, and for a pod with a selector no node matches, all of
them), one gpu-placement refuses (validator not Ready: labelled gpu-placement.io/refused, so kube-scheduler's
NodeAffinity keeps it out and explain gives the reason), and one that fits. `explain` is run as a
platform engineer runs it, against the live API server through a kubeconfig, with the chart's
deployed configuration; then the same pod is created and the chart's kube-scheduler decides:
  - where a node fits, explain names it as the only candidate, and kube-scheduler binds the pod there;
  - where none does, explain's predicted message is the PodScheduled message kube-scheduler writes
    (its part before " preemption: ...", which explain does not predict).
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gpu_placement.app.cli import main
from tests.e2e.cluster import ADMIN_TOKEN, retrying_503, wait_for
from tests.e2e.conftest import E2E

GROUP = "s13"


@pytest.fixture(scope="module")
def cluster(e2e: E2E, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    e2e.nodes(GROUP, [("fit", "h100", {}), ("cordoned", "h100", {}), ("tainted", "h100", {}),
                      ("full", "h100", {}), ("unvalidated", "h100", {"validator_ready": False})])
    # After the lifecycle controller lifted its not-ready taints: a cordon and a taint of our own.
    e2e.api.merge_patch(f"/api/v1/nodes/{GROUP}-cordoned", {"spec": {"unschedulable": True}})
    tainted = e2e.api.get(f"/api/v1/nodes/{GROUP}-tainted")
    taints = [*tainted["spec"].get("taints", []), {"key": "dedicated", "value": "research", "effect": "NoSchedule"}]
    e2e.api.merge_patch(f"/api/v1/nodes/{GROUP}-tainted", {"spec": {"taints": taints}})
    # config.refusedNodeLabel: the unvalidated node carries its code and GPU pods require it absent
    e2e.wait_refused({f"{GROUP}-unvalidated": "NotValidated", f"{GROUP}-fit": None, f"{GROUP}-full": None})
    ns = e2e.namespace("explain", {"gpu-placement.io/quota": "nvidia.com/gpu=8"})
    # The full node's one GPU, held by a pod bound there.
    hog = _pod(ns, "hog")
    hog["spec"]["nodeSelector"]["kubernetes.io/hostname"] = f"{GROUP}-full"
    assert retrying_503(lambda: e2e.api.create(f"/api/v1/namespaces/{ns}/pods", hog)).status_code == 201
    assert e2e.wait_bound(ns, "hog") == f"{GROUP}-full"
    kubeconfig = e2e.api.kubeconfig(tmp_path_factory.mktemp("explain") / "admin.kubeconfig", ADMIN_TOKEN, "e2e-admin")
    return kubeconfig, ns


def _pod(ns: str, name: str, **annotations: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations},
            "spec": {"nodeSelector": {"e2e-group": GROUP}, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"},
                                                   "requests": {"cpu": "100m", "memory": "128Mi"}}}]}}


def _explain(kubeconfig: Path, pod: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
             ) -> dict[str, Any]:
    file = tmp_path / f"{pod['metadata']['name']}.json"
    file.write_text(json.dumps(pod))
    capsys.readouterr()
    status = main(["explain", str(file), "--kubeconfig", str(kubeconfig), "-o", "json"])
    answer = dict(json.loads(capsys.readouterr().out))
    assert status == answer["exit_status"] == (4 if answer["best"] is None else 0)  # docs/explain.md, exit status
    return answer


def _scheduler_message(e2e: E2E, ns: str, name: str, expected: str) -> str:
    """kube-scheduler's PodScheduled message without its preemption part, once it equals `expected` (it
    retries an unschedulable pod as the cluster changes; the last message is what a user reads)."""
    seen: list[str] = []

    def settled() -> bool:
        for cond in e2e.pod(ns, name).get("status", {}).get("conditions", []):
            if cond["type"] == "PodScheduled" and cond["status"] == "False":
                seen[:] = [cond["message"].split(" preemption: ", 1)[0]]
        return bool(seen) and seen[0] == expected
    with contextlib.suppress(TimeoutError):
        wait_for(f"pod {ns}/{name}'s PodScheduled message", settled, timeout=45, interval=0.5)
    return seen[0] if seen else "(no PodScheduled=False condition)"


def test_where_one_node_fits_explain_and_kube_scheduler_pick_it(e2e: E2E, cluster: tuple[Path, str],
                                                               tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig, ns = cluster
    pod = _pod(ns, "fits")
    answer = _explain(kubeconfig, pod, tmp_path, capsys)
    assert answer["configuration"].startswith("ConfigMap gpu-placement/"), answer["configuration"]
    ours = {row["node"]: row for row in answer["nodes"] if row["node"].startswith(f"{GROUP}-")}
    assert ours[f"{GROUP}-cordoned"]["reason"] == "NodeUnschedulable: node(s) were unschedulable"
    assert ours[f"{GROUP}-tainted"]["reason"] == "TaintToleration: node(s) had untolerated taint(s)"
    assert ours[f"{GROUP}-full"]["reason"] == "NodeResourcesFit: Insufficient nvidia.com/gpu"
    assert ours[f"{GROUP}-unvalidated"]["reason"] == "NodeAffinity: node(s) didn't match Pod's node affinity/selector"
    assert ours[f"{GROUP}-unvalidated"]["figures"].startswith(
        "gpu-placement.io/refused=NotValidated, gpu-placement's reason: NotValidated: "), ours[f"{GROUP}-unvalidated"]
    assert [row["node"] for row in answer["nodes"] if row["verdict"] == "pass"] == [f"{GROUP}-fit"]
    assert answer["best"]["node"] == f"{GROUP}-fit"
    assert retrying_503(lambda: e2e.api.create(f"/api/v1/namespaces/{ns}/pods", pod)).status_code == 201
    assert e2e.wait_bound(ns, "fits") == f"{GROUP}-fit"


@pytest.mark.parametrize(("name", "change"), [
    # The case: a selector no node has. kube-scheduler keeps every node; explain used to name one.
    ("no-pool", lambda pod: pod["spec"]["nodeSelector"].update({"pool": "training"})),
    # Every stage has its say: kube-scheduler's filters, then the extender on the rest.
    ("no-driver", lambda pod: pod["metadata"]["annotations"].update({"gpu-placement.io/min-driver": "999.0"})),
])
def test_where_no_node_fits_explain_predicts_the_pods_message(e2e: E2E, cluster: tuple[Path, str], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str], name: str,
                                                             change: Any) -> None:
    kubeconfig, ns = cluster
    pod = copy.deepcopy(_pod(ns, name))
    change(pod)
    retrying_503(lambda: e2e.api.create(f"/api/v1/namespaces/{ns}/pods", pod)).raise_for_status()
    e2e.scheduled_condition(ns, name)  # kube-scheduler has tried once
    answer = _explain(kubeconfig, pod, tmp_path, capsys)
    assert answer["best"] is None
    predicted = answer["kube_scheduler"]["message"]
    actual = _scheduler_message(e2e, ns, name, predicted)
    print(f"\n{name}:\n  explain:        {predicted}\n  kube-scheduler: {actual}")
    assert actual == predicted
    assert e2e.pod(ns, name)["spec"].get("nodeName") is None
