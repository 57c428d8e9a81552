"""`gpu-placement migrate NODE`: the demo's hand-installed node moved to the GPU Operator step by step
against the fake API server, which evicts as kube-apiserver does (429 while a PodDisruptionBudget allows
no disruption) and records who wrote each label (managedFields). The test plays the parts no command
plays: the disruption controller, a person, and the GPU Operator."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpu_placement.app.cli import main
from gpu_placement.samples.cluster import (
    HAND_INSTALLED,
    HAND_LABELLED,
    cluster_policy,
    make_node,
    make_pod,
    namespace,
    survey_objects,
    validator_pod,
    with_label_writers,
)
from gpu_placement.survey.labels import label_writers
from tests.fakeapi import FakeApiServer

NODE = HAND_INSTALLED
Capture = pytest.CaptureFixture[str]


def _owned(pod: dict[str, Any], kind: str, owner: str) -> dict[str, Any]:
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind, "name": owner, "controller": True}]
    return pod


def _budget(name: str, ns: str, app: str, allowed: int) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}}


def _cluster(fake: FakeApiServer, operator: bool = True) -> dict[str, Any]:
    """The hand-installed node with its device plugin (a DaemonSet from NVIDIA's chart), a web cache behind a
    budget that allows no disruption, and a notebook without one; the GPU Operator installed (a ClusterPolicy)."""
    fake.load([namespace("gpu-operator"), namespace("web"), namespace("team-a"),
               *([cluster_policy()] if operator else [])])
    objects = [o for o in survey_objects() if o["kind"] in ("Node", "Pod", "DaemonSet")]
    node = next(o for o in objects if o["metadata"]["name"] == NODE)
    fake.load([o for o in objects if o["kind"] == "Pod" and o["spec"].get("nodeName") == NODE])
    fake.load([o for o in objects if o["kind"] == "DaemonSet"])
    stored = fake.add(node)
    fake.add(_owned(make_pod("team-a", "notebook-0", node=NODE, labels={"app": "notebook"}), "StatefulSet",
                    "notebook"))
    fake.add(_budget("cache", "web", "cache", 0))
    return stored


def _run(capsys: Capture, *args: str) -> tuple[int, str]:
    code = main(["migrate", NODE, *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _states(capsys: Capture, kubeconfig: Path, backups: Path) -> dict[str, str]:
    code, out = _run(capsys, "--kubeconfig", str(kubeconfig), "--backup-dir", str(backups), "-o", "json")
    plan = orjson.loads(out)
    assert code == (0 if plan["complete"] else 1)
    return {step["step"]: step["state"] for step in plan["steps"]}


def _take_the_node(fake: FakeApiServer) -> None:
    """What the GPU Operator does once operands=false is gone: gpu.present from NFD's PCI label, its deploy
    labels, and its DaemonSets' pods (the validator not Ready yet)."""
    fake.patch_labels("Node", NODE, {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.driver": "true",
                                     "nvidia.com/gpu.deploy.device-plugin": "true",
                                     "nvidia.com/gpu.deploy.operator-validator": "true"}, manager="gpu-operator")
    fake.patch_labels("Node", NODE, {"nvidia.com/gpu.deploy.driver": "pre-installed"}, manager="driver-manager")
    validator = make_pod("gpu-operator", f"nvidia-operator-validator-{NODE}", node=NODE,
                         labels={"app": "nvidia-operator-validator"})
    validator["status"] = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
    fake.add(_owned(validator, "DaemonSet", "nvidia-operator-validator"))
    fake.add(_owned(make_pod("gpu-operator", f"nvidia-device-plugin-daemonset-{NODE}", node=NODE,
                             labels={"app": "nvidia-device-plugin-daemonset"}), "DaemonSet",
                    "nvidia-device-plugin-daemonset"))


def _affinity(fake: FakeApiServer) -> Any:
    return fake.get("DaemonSet", "nvidia-device-plugin-daemonset", "kube-system")["spec"]["template"]["spec"].get(
        "affinity")


def test_the_hand_installed_node_step_by_step(fake_api: FakeApiServer, tmp_path: Path, capsys: Capture) -> None:
    original = _cluster(fake_api)
    chart_affinity = _affinity(fake_api)
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    backups = tmp_path / "migrate"
    live = ["--kubeconfig", str(kubeconfig), "--backup-dir", str(backups)]

    # The plan, before anything: every step, the first one next, nothing changed.
    code, out = _run(capsys, *live)
    assert code == 1
    assert "1. [next] save:" in out and "way back: not saved yet" in out
    assert f"$ kubectl cordon {NODE}" in out and f"$ kubectl drain {NODE} --ignore-daemonsets" in out
    assert "16 labels last written by kubectl-label" in out
    assert "(PodDisruptionBudget web/cache: 0 disruptions allowed now)" in out
    assert f"$ kubectl label node {NODE} nvidia.com/gpu.deploy.operands-" in out
    assert "$ kubectl -n kube-system patch daemonset nvidia-device-plugin-daemonset --type json" in out
    assert _states(capsys, kubeconfig, backups) == {
        "save": "next", "cordon": "pending", "drain": "pending", "labels": "pending", "plugin": "pending",
        "operator": "pending", "validator": "pending", "uncordon": "pending"}
    assert not backups.exists() and not fake_api.get("Node", NODE)["spec"].get("unschedulable")

    # --apply: the way back is saved first, the node cordoned, the notebook evicted; the cache's budget
    # allows no disruption, so the API server answers 429 and the command stops there.
    code, out = _run(capsys, *live, "--apply", "--timeout", "1s")
    assert code == 3, out
    assert "save: the way back is in" in out and f"cordon: {NODE} cordoned" in out
    assert "drain: evicted team-a/notebook-0" in out
    assert ("the eviction of web/cache-5d8f7b9c4-x2x7q was refused: Cannot evict pod as it would violate the pod's "
            "disruption budget. (The disruption budget cache needs 1 healthy pods and has 1 currently)") in out
    node = fake_api.get("Node", NODE)
    assert node["spec"]["unschedulable"] is True
    assert fake_api.get("Pod", "notebook-0", "team-a") is None
    assert fake_api.get("Pod", "cache-5d8f7b9c4-x2x7q", "web") is not None
    saved = orjson.loads((backups / f"{NODE}.json").read_bytes())
    assert (saved["kind"], saved["version"], saved["node"], saved["uid"], saved["state"]) == (
        "MigrationRecord", 2, NODE, original["metadata"]["uid"], "under way")
    assert saved["before"] == {"labels": original["metadata"]["labels"], "taints": [], "unschedulable": False}
    assert [(c["step"], c["what"], c.get("key"), c.get("before"), c.get("after")) for c in saved["changes"]] == [
        ("cordon", "unschedulable", None, False, True), ("drain", "evicted", "team-a/notebook-0", None, None)]
    states = _states(capsys, kubeconfig, backups)
    assert (states["save"], states["cordon"], states["drain"]) == ("done", "done", "next")

    # The disruption controller sees the notebook's replacement ready elsewhere: one disruption allowed. The
    # labels go, the device plugin's DaemonSet gets its affinity, operands=false goes; the operator is slow.
    fake_api.patch("PodDisruptionBudget", "cache", {"status": {"disruptionsAllowed": 1}}, "web")
    code, out = _run(capsys, *live, "--apply", "--timeout", "1s")
    assert code == 1, out
    assert "drain: evicted web/cache-5d8f7b9c4-x2x7q" in out
    assert "labels: removed nvidia.com/cuda.driver-version.full, " in out
    assert ("plugin: daemonset kube-system/nvidia-device-plugin-daemonset no longer runs on nodes where the GPU "
            "Operator deploys its own device plugin (nvidia.com/gpu.deploy.device-plugin=true)") in out
    assert "operator: removed nvidia.com/gpu.deploy.operands=false" in out
    assert "operator: waiting: the GPU Operator has not set nvidia.com/gpu.present=true yet" in out
    assert fake_api.get("PodDisruptionBudget", "cache", "web")["status"]["disruptionsAllowed"] == 0
    labels = fake_api.get("Node", NODE)["metadata"]["labels"]
    assert not any(key.startswith(("nvidia.com/cuda.", "nvidia.com/gpu.p", "nvidia.com/gpu.c", "nvidia.com/gpu.m"))
                   for key in labels)
    assert "nvidia.com/gpu.deploy.operands" not in labels and labels["pool"] == "training"
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert label_writers(fake_api.get("Node", NODE)).by_hand(labels) == {}
    # Each of the chart's terms keeps what it selects, and leaves out where the operator runs its own plugin.
    terms = _affinity(fake_api)["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    chart_terms = chart_affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    exclusion = {"key": "nvidia.com/gpu.deploy.device-plugin", "operator": "NotIn", "values": ["true"]}
    assert terms == [{"matchExpressions": [*term["matchExpressions"], exclusion]} for term in chart_terms]
    code, out = _run(capsys, *live)
    assert "5. [done] plugin:" in out
    assert ("affinity in place on daemonset kube-system/nvidia-device-plugin-daemonset: kube-system/nvidia-device-"
            f"plugin-daemonset-{NODE} leaves the node when the operator labels it") in out

    # The GPU Operator takes the node. The old plugin's pod is still there (the DaemonSet controller is slow):
    # the plan says so, and does not show the patch again.
    _take_the_node(fake_api)
    code, out = _run(capsys, *live, "--apply", "--timeout", "1s")
    assert code == 1, out
    assert ("plugin: waiting: affinity in place on daemonset kube-system/nvidia-device-plugin-daemonset, waiting for "
            "its pod to leave: the DaemonSet controller deletes "
            f"kube-system/nvidia-device-plugin-daemonset-{NODE}") in out
    code, out = _run(capsys, *live)
    plugin = out.split("5. [next] plugin:", 1)[1].split("6. [", 1)[0]
    assert f"$ kubectl -n kube-system wait pod/nvidia-device-plugin-daemonset-{NODE} --for=delete" in plugin
    assert "patch daemonset" not in plugin

    # The DaemonSet controller deletes it; the validator is not Ready yet.
    fake_api.delete("Pod", f"nvidia-device-plugin-daemonset-{NODE}", "kube-system")
    code, out = _run(capsys, *live)
    assert code == 1
    assert "7. [next] validator:" in out
    assert f"gpu-operator/nvidia-operator-validator-{NODE} is not Ready yet" in out
    assert "6. [done] operator:" in out

    # The validator passes: --apply uncordons, and the migration is complete, and recorded so.
    fake_api.patch("Pod", f"nvidia-operator-validator-{NODE}",
                   {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
                   "gpu-operator")
    code, out = _run(capsys, *live, "--apply", "--timeout", "1s")
    assert code == 0, out
    assert f"uncordon: {NODE} uncordoned" in out and "migration complete" in out
    assert not fake_api.get("Node", NODE)["spec"]["unschedulable"]
    assert orjson.loads((backups / f"{NODE}.json").read_bytes())["state"] == "complete"
    code, out = _run(capsys, *live)
    assert code == 0 and f"{NODE}: migration complete (recorded in {backups / (NODE + '.json')}" in out
    writers = label_writers(fake_api.get("Node", NODE))
    assert writers.written_by("nvidia.com/gpu.present", "gpu-operator")
    assert writers.written_by("nvidia.com/gpu.deploy.driver", "driver-manager")

    # Others write since: GPU Feature Discovery publishes a removed label with the value it had, and one with
    # another value; the kubelet a zone; someone a taint.
    fake_api.patch_labels("Node", NODE, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                         "nvidia.com/gpu.memory": "81920"}, manager="nfd-master")
    fake_api.patch_labels("Node", NODE, {"topology.kubernetes.io/zone": "zone-b"}, manager="kubelet")
    taint = {"key": "example.com/maintenance", "value": "bios", "effect": "NoSchedule"}
    fake_api.patch("Node", NODE, {"spec": {"taints": [taint]}})

    # The way back puts back what the migration changed, and only that.
    code, out = _run(capsys, *live, "--undo")
    assert code == 0, out
    node = fake_api.get("Node", NODE)
    labels = node["metadata"]["labels"]
    removed = {k: v for k, v in original["metadata"]["labels"].items() if k not in ("nvidia.com/gpu.memory",)}
    assert {k: labels.get(k) for k in removed} == removed  # operands=false too
    assert labels["nvidia.com/gpu.memory"] == "81920"  # changed since: left
    assert labels["topology.kubernetes.io/zone"] == "zone-b" and labels["nvidia.com/gpu.deploy.driver"] == \
        "pre-installed"  # others' labels stay (the operator removes its own once it sees operands=false)
    assert node["spec"]["taints"] == [taint] and node["spec"]["unschedulable"] is False
    assert _affinity(fake_api) == chart_affinity
    assert f"{NODE}: put back what the migration changed, as recorded in " in out
    assert "  label nvidia.com/gpu.deploy.operands=false" in out
    assert "  daemonset kube-system/nvidia-device-plugin-daemonset: affinity as before the migration" in out
    assert ("  left as it is, changed since the migration wrote it: label nvidia.com/gpu.memory (the migration "
            "removed it; now 81920)") in out
    assert "nvidia.com/gpu.product" not in out  # GFD published the value it had: nothing to put back
    assert "pods it evicted are not brought back (2: team-a/notebook-0, web/cache-5d8f7b9c4-x2x7q)" in out
    assert orjson.loads((backups / f"{NODE}.json").read_bytes())["state"] == "undone"
    code, out = _run(capsys, *live, "--undo")
    assert code == 0 and "was put back already" in out and "nothing to do" in out


def test_undo_keeps_the_affinity_that_keeps_two_plugins_apart(fake_api: FakeApiServer, tmp_path: Path,
                                                              capsys: Capture) -> None:
    """Undone half way, after the DaemonSet's affinity: another node runs the operator's device plugin, so
    taking the affinity off would put the old plugin beside it there. It stays, and the output says why;
    the cordon and the labels go back."""
    original = _cluster(fake_api)
    fake_api.patch("PodDisruptionBudget", "cache", {"status": {"disruptionsAllowed": 1}}, "web")
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    live = ["--kubeconfig", str(kubeconfig), "--backup-dir", str(tmp_path / "m"), "--timeout", "1s"]
    code, out = _run(capsys, *live, "--apply")
    assert code == 1 and "plugin: daemonset kube-system/nvidia-device-plugin-daemonset no longer runs" in out, out
    patched = _affinity(fake_api)
    fake_api.add(with_label_writers(make_node("h100-managed", "h100", labels={
        "nvidia.com/gpu.deploy.device-plugin": "true", "feature.node.kubernetes.io/pci-10de.present": "true"})))
    code, out = _run(capsys, *live, "--undo")
    assert code == 0, out
    assert ("daemonset kube-system/nvidia-device-plugin-daemonset: affinity kept: without it, its pods would run "
            "beside the operator's device plugin on h100-managed (nvidia.com/gpu.deploy.device-plugin=true)") in out
    assert _affinity(fake_api) == patched
    node = fake_api.get("Node", NODE)
    assert node["metadata"]["labels"] == original["metadata"]["labels"]
    assert node["spec"]["unschedulable"] is False and "uncordoned (the migration cordoned it)" in out


def test_a_way_back_of_the_first_format_still_undoes(fake_api: FakeApiServer, tmp_path: Path,
                                                     capsys: Capture) -> None:
    """A file saved by an earlier gpu-placement (the whole label map, taint list and schedulable state, as a
    JSON patch): --undo works out what that migration changed (the GPU labels it removed, the cordon) and
    puts back only that; labels and taints written since stay."""
    from gpu_placement.survey.migrate import backup_patch

    original = _cluster(fake_api)
    backups = tmp_path / "migrate"
    backups.mkdir()
    (backups / f"{NODE}.json").write_bytes(orjson.dumps(backup_patch(original)))
    hand = sorted(label_writers(original).by_hand(original["metadata"]["labels"]))
    fake_api.patch("Node", NODE, {"spec": {"unschedulable": True}})  # what that migration did
    fake_api.patch_labels("Node", NODE, {**dict.fromkeys(hand), "nvidia.com/gpu.deploy.operands": None},
                          manager="gpu-placement-migrate")
    fake_api.patch_labels("Node", NODE, {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.driver": "true"},
                          manager="gpu-operator")  # and what came since
    taint = {"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}
    fake_api.patch("Node", NODE, {"spec": {"taints": [taint]}})
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    code, out = _run(capsys, "--kubeconfig", str(kubeconfig), "--backup-dir", str(backups), "--undo")
    assert code == 0, out
    node = fake_api.get("Node", NODE)
    assert node["metadata"]["labels"] == {**original["metadata"]["labels"], "nvidia.com/gpu.deploy.driver": "true"}
    assert node["spec"]["taints"] == [taint] and node["spec"]["unschedulable"] is False
    assert "uncordoned (the migration cordoned it)" in out and "label nvidia.com/gpu.deploy.operands=false" in out
    assert orjson.loads((backups / f"{NODE}.json").read_bytes())["state"] == "undone"


def test_apply_changes_nothing_without_its_own_way_back(fake_api: FakeApiServer, tmp_path: Path,
                                                       capsys: Capture) -> None:
    """A saved file of another node object of that name (recreated since) is never overwritten, and
    nothing is cordoned without a way back."""
    _cluster(fake_api)
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    backups = tmp_path / "migrate"
    backups.mkdir()
    other = copy.deepcopy(fake_api.get("Node", NODE))
    other["metadata"]["uid"] = "an-older-node"
    (backups / f"{NODE}.json").write_bytes(orjson.dumps([{"op": "test", "path": "/metadata/uid",
                                                          "value": "an-older-node"},
                                                         {"op": "add", "path": "/metadata/labels", "value": {}}]))
    code, out = _run(capsys, "--kubeconfig", str(kubeconfig), "--backup-dir", str(backups), "--apply")
    assert code == 3
    assert "holds the way back of another node object named h100-train-hand (uid an-older-node" in out
    assert not fake_api.get("Node", NODE)["spec"].get("unschedulable")
    assert orjson.loads((backups / f"{NODE}.json").read_bytes())[0]["value"] == "an-older-node"


def test_no_way_back_no_change(fake_api: FakeApiServer, tmp_path: Path, capsys: Capture) -> None:
    """Where the way back cannot be written, nothing happens to the node."""
    _cluster(fake_api)
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, out = _run(capsys, "--kubeconfig", str(kubeconfig), "--backup-dir", str(blocker / "migrate"), "--apply")
    assert code == 3
    assert f"cannot save the way back in {blocker / 'migrate' / (NODE + '.json')}" in out
    assert "nothing was changed" in out
    assert not fake_api.get("Node", NODE)["spec"].get("unschedulable")


def test_one_node_at_a_time(fake_api: FakeApiServer, tmp_path: Path, capsys: Capture) -> None:
    """A node whose migration is under way (cordoned since its way back was saved) holds the others back."""
    _cluster(fake_api)
    busy = fake_api.add(with_label_writers(make_node("h100-other", "h100", unschedulable=True)))
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    backups = tmp_path / "migrate"
    backups.mkdir()
    uncordoned = {**busy, "spec": {**busy["spec"], "unschedulable": False}}
    from gpu_placement.survey.migrate import backup_patch

    (backups / "h100-other.json").write_bytes(orjson.dumps(backup_patch(uncordoned)))
    code, out = _run(capsys, "--kubeconfig", str(kubeconfig), "--backup-dir", str(backups), "--apply")
    assert code == 3
    assert "the migration of h100-other is not finished" in out and "one node at a time" in out
    assert not (backups / f"{NODE}.json").exists()


def test_a_pod_without_a_controller_blocks_the_drain(fake_api: FakeApiServer, tmp_path: Path,
                                                     capsys: Capture) -> None:
    """kubectl drain refuses a pod no controller recreates (without --force): so does the migration,
    after saving and cordoning, and says what to do."""
    _cluster(fake_api)
    fake_api.add(make_pod("team-a", "scratch", node=NODE))
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    # The plan names the blocker and every pod the drain evicts once it is gone, not the blocker alone.
    code, out = _run(capsys, "--kubeconfig", str(kubeconfig), "--backup-dir", str(tmp_path / "m"))
    drain = out.split("3. [pending] drain:", 1)[1].split("4. [", 1)[0]
    assert ("team-a/scratch declares no controller: evicted, it is gone for good, so kubectl drain refuses it without "
            "--force; move or delete it yourself; then 2 pods to evict: team-a/notebook-0, web/cache-5d8f7b9c4-x2x7q "
            "(PodDisruptionBudget web/cache: 0 disruptions allowed now)") in drain
    code, out = _run(capsys, "--kubeconfig", str(kubeconfig), "--backup-dir", str(tmp_path / "m"), "--apply")
    assert code == 3
    assert "drain: team-a/scratch declares no controller: evicted, it is gone for good" in out
    assert fake_api.get("Pod", "scratch", "team-a") is not None


def test_the_plan_from_a_snapshot(tmp_path: Path, capsys: Capture) -> None:
    """The plan reads a snapshot too (read-only: --apply needs a live cluster)."""
    snapshot = tmp_path / "cluster.json"
    assert main(["demo", "--write-snapshot", str(snapshot)]) == 0
    capsys.readouterr()
    code, out = _run(capsys, "--snapshot", str(snapshot), "--backup-dir", str(tmp_path / "m"))
    assert code == 1 and "1. [next] save:" in out and "5. [pending] plugin:" in out
    code, out = _run(capsys, "--snapshot", str(snapshot), "--apply")
    assert code == 2 and "--apply and --undo change a live cluster" in out
    assert main(["migrate", "h100-single", "--snapshot", str(snapshot)]) == 0
    assert "nothing to migrate" in capsys.readouterr().out
    assert main(["migrate", "cpu-1", "--snapshot", str(snapshot)]) == 2
    assert "gpu-placement migrate: cpu-1 has no GPU: " in capsys.readouterr().err


def test_the_operator_pods_of_the_demo_stay_through_the_drain(tmp_path: Path, capsys: Capture) -> None:
    """The GPU Operator's pods are DaemonSet pods, as in a real cluster: the drain of the hand-labelled node
    leaves its validator alone instead of calling it a pod without a controller."""
    snapshot = tmp_path / "cluster.json"
    assert main(["demo", "--write-snapshot", str(snapshot)]) == 0
    capsys.readouterr()
    code = main(["migrate", "l40s-relabelled", "--snapshot", str(snapshot), "--backup-dir", str(tmp_path / "m")])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "declares no controller" not in out
    drain = out.split("3. [pending] drain:", 1)[1].split("4. [", 1)[0]
    assert "no pod to evict (DaemonSet pods stay)" in drain


def test_a_node_without_a_gpu_is_refused_before_anything(fake_api: FakeApiServer, tmp_path: Path,
                                                          capsys: Capture) -> None:
    """A CPU node (one name away from a GPU node, or labelled to keep the operator off) has nothing to migrate:
    no plan of cordon and drain, no way back written, no cordon."""
    _cluster(fake_api)
    cpu = fake_api.add(with_label_writers(make_node("cpu-1", None)))
    fake_api.add(with_label_writers(make_node("cpu-2", None, labels={"nvidia.com/gpu.deploy.operands": "false"})))
    fake_api.add(_owned(make_pod("web", "api-0", node="cpu-1", labels={"app": "api"}), "StatefulSet", "api"))
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    backups = tmp_path / "migrate"
    for node in ("cpu-1", "cpu-2"):
        for action in ((), ("--apply",)):
            code = main(["migrate", node, "--kubeconfig", str(kubeconfig), "--backup-dir", str(backups), *action])
            captured = capsys.readouterr()
            assert code == 2, captured
            assert captured.out == ""
            assert captured.err.startswith(f"gpu-placement migrate: {node} has no GPU: no NVIDIA PCI device labelled "
                                           "by NFD (feature.node.kubernetes.io/pci-10de.present), no NVIDIA GPU label")
            assert "there is nothing to migrate; nothing was changed (is it the node you meant?" in captured.err
    assert not backups.exists()
    assert fake_api.get("Node", "cpu-1") == cpu and fake_api.get("Pod", "api-0", "web") is not None
    assert not fake_api.get("Node", "cpu-2")["spec"].get("unschedulable")


def test_without_the_gpu_operator_nothing_is_changed(fake_api: FakeApiServer, tmp_path: Path,
                                                      capsys: Capture) -> None:
    """Every precondition is checked before the first write: with no ClusterPolicy the migration would cordon
    and drain the node, then wait for an operator that is not there. It does not start."""
    original = _cluster(fake_api, operator=False)
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    backups = tmp_path / "migrate"
    code, out = _run(capsys, "--kubeconfig", str(kubeconfig), "--backup-dir", str(backups))
    assert code == 1
    assert "1. [blocked] save:" in out
    assert "cannot start, nothing is changed: the GPU Operator is not installed (no ClusterPolicy)" in out
    code, out = _run(capsys, "--kubeconfig", str(kubeconfig), "--backup-dir", str(backups), "--apply")
    assert code == 3, out
    assert out.startswith("gpu-placement migrate: save: cannot start, nothing is changed: the GPU Operator is not "
                          "installed (no ClusterPolicy): install it first")
    assert not backups.exists()
    assert fake_api.get("Node", NODE)["metadata"]["labels"] == original["metadata"]["labels"]
    assert not fake_api.get("Node", NODE)["spec"].get("unschedulable")
    assert fake_api.get("Pod", "notebook-0", "team-a") is not None
    assert not [r for r in fake_api.requests_log if r.method in ("POST", "PATCH", "PUT", "DELETE")]


def test_without_nfd_on_the_node_nothing_is_changed(fake_api: FakeApiServer, tmp_path: Path,
                                                     capsys: Capture) -> None:
    """The GPU Operator deploys only where NFD labelled an NVIDIA PCI device: without that label the
    migration would stop after the drain, so it does not start."""
    _cluster(fake_api)
    fake_api.patch_labels("Node", NODE, {"feature.node.kubernetes.io/pci-10de.present": None}, manager="nfd-master")
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    code, out = _run(capsys, "--kubeconfig", str(kubeconfig), "--backup-dir", str(tmp_path / "m"), "--apply")
    assert code == 3, out
    assert "cannot start, nothing is changed: NFD has not labelled the node " \
           "feature.node.kubernetes.io/pci-10de.present=true, which the GPU Operator needs" in out
    assert not (tmp_path / "m").exists() and not fake_api.get("Node", NODE)["spec"].get("unschedulable")


def test_the_operator_step_checks_the_operator_before_it_writes(fake_api: FakeApiServer, tmp_path: Path,
                                                                capsys: Capture) -> None:
    """Under way, the ClusterPolicy gone (an operator uninstalled meanwhile): the operator step keeps
    nvidia.com/gpu.deploy.operands=false and says why, rather than removing it and then finding no operator."""
    _cluster(fake_api)
    fake_api.patch("PodDisruptionBudget", "cache", {"status": {"disruptionsAllowed": 1}}, "web")
    fake_api.delete("DaemonSet", "nvidia-device-plugin-daemonset", "kube-system")  # not readable: a person's step
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    live = ["--kubeconfig", str(kubeconfig), "--backup-dir", str(tmp_path / "m"), "--timeout", "1s"]
    code, out = _run(capsys, *live, "--apply")
    assert code == 1 and "plugin: a step for a person" in out, out
    assert "Give its DaemonSet an affinity that leaves out nodes where the operator deploys its own" in out
    fake_api.delete("Pod", f"nvidia-device-plugin-daemonset-{NODE}", "kube-system")
    fake_api.delete("ClusterPolicy", "cluster-policy")
    code, out = _run(capsys, *live, "--apply")
    assert code == 1, out
    assert "operator: waiting: the GPU Operator is not installed (no ClusterPolicy)" in out
    assert "nvidia.com/gpu.deploy.operands=false stays on the node until it is" in out
    assert "removed nvidia.com/gpu.deploy.operands" not in out
    assert fake_api.get("Node", NODE)["metadata"]["labels"]["nvidia.com/gpu.deploy.operands"] == "false"


def test_a_node_migrated_before_and_cordoned_now_holds_nothing_back(fake_api: FakeApiServer, tmp_path: Path,
                                                                     capsys: Capture) -> None:
    """Two nodes: the hand-labelled one migrated to the end, then cordoned months later for maintenance. That
    cordon is not a migration under way: the hand-installed node's migration starts. While that one is under
    way (its record says so), a third waits for it."""
    _cluster(fake_api)
    relabelled = next(o for o in survey_objects() if o["kind"] == "Node" and o["metadata"]["name"] == HAND_LABELLED)
    fake_api.add(relabelled)
    fake_api.add(validator_pod(HAND_LABELLED))
    spare = fake_api.add(with_label_writers(make_node("h100-spare", "h100"), by_hand=("nvidia.com/gpu.product",)))
    fake_api.add(validator_pod("h100-spare"))
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    backups = tmp_path / "migrate"
    live = ["--kubeconfig", str(kubeconfig), "--backup-dir", str(backups), "--timeout", "1s"]

    assert main(["migrate", HAND_LABELLED, *live, "--apply"]) == 0
    out = capsys.readouterr().out
    assert f"{HAND_LABELLED}: migration complete" in out and f"uncordon: {HAND_LABELLED} uncordoned" in out
    fake_api.patch("Node", HAND_LABELLED, {"spec": {"unschedulable": True}})  # kubectl cordon, for a BIOS update

    code, out = _run(capsys, *live, "--apply")
    assert code == 3, out  # the cache's budget stops the drain, as in the first test: the migration started
    assert "is not finished" not in out
    assert f"save: the way back is in {backups / (NODE + '.json')}" in out and f"cordon: {NODE} cordoned" in out

    code = main(["migrate", "h100-spare", *live, "--apply"])
    err = capsys.readouterr().err
    assert code == 3
    assert err.startswith(f"gpu-placement migrate: the migration of {NODE} is not finished (recorded under way in "
                          f"{backups / (NODE + '.json')} since ")
    assert f"one node at a time; finish it (gpu-placement migrate {NODE} --apply --backup-dir {backups})" in err
    assert fake_api.get("Node", "h100-spare") == spare and not (backups / "h100-spare.json").exists()

    # Undone, it holds nothing back either.
    assert main(["migrate", NODE, *live, "--undo"]) == 0
    capsys.readouterr()
    assert main(["migrate", "h100-spare", *live, "--apply"]) == 0
    assert "h100-spare: migration complete" in capsys.readouterr().out


def test_the_commands_shown_wait_as_long_as_the_timeout(tmp_path: Path, capsys: Capture) -> None:
    """The plan's kubectl drain and kubectl wait wait as long as --timeout says (default 10 minutes)."""
    snapshot = tmp_path / "cluster.json"
    assert main(["demo", "--write-snapshot", str(snapshot)]) == 0
    capsys.readouterr()
    for given, shown in ((None, "10m"), ("30s", "30s"), ("90s", "90s"), ("2h", "2h")):
        code, out = _run(capsys, "--snapshot", str(snapshot), "--backup-dir", str(tmp_path / "m"),
                         *(("--timeout", given) if given else ()))
        assert code == 1
        assert f"$ kubectl drain {NODE} --ignore-daemonsets --delete-emptydir-data --timeout={shown}\n" in out
        assert f"spec.nodeName={NODE} --for=condition=Ready --timeout={shown}\n" in out
        assert "--timeout=15m" not in out


def test_odd_way_back_files_are_read_without_a_crash(fake_api: FakeApiServer, tmp_path: Path,
                                                     capsys: Capture) -> None:
    """What a person can leave in the folder: not JSON, JSON of another shape, a record with wrong types. Each
    is a sentence and exit 3 (or read around), never a traceback."""
    original = _cluster(fake_api)
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    backups = tmp_path / "migrate"
    backups.mkdir()
    live = ["--kubeconfig", str(kubeconfig), "--backup-dir", str(backups)]
    path = backups / f"{NODE}.json"
    for text, said in ((b"not json", "not a saved way back"), (b'{"a": 1}', "not a saved way back"),
                       (b"[1, 2]", "not a saved way back")):
        path.write_bytes(text)
        code, out = _run(capsys, *live, "--undo")
        assert code == 3 and said in out, out
    path.write_bytes(orjson.dumps({"kind": "MigrationRecord", "uid": original["metadata"]["uid"], "state": 7,
                                   "before": {"labels": ["x"], "taints": "y"},
                                   "changes": [None, 5, {"what": "label"}, {"what": "label", "key": "nvidia.com/x",
                                                                            "before": "1", "after": None}]}))
    code, out = _run(capsys, *live, "--undo")
    assert code == 0, out
    assert "label nvidia.com/x=1" in out and fake_api.get("Node", NODE)["metadata"]["labels"]["nvidia.com/x"] == "1"
