"""kube-scheduler's own node filters, as `explain` applies them before the extender's verdicts: the
plugins' logic and their exact sentences (k8s.io/kubernetes v1.37.2, pkg/scheduler/framework/plugins),
and the FitError message built from them. tests/e2e/test_22_explain.py holds the same answers against
the real kube-scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gpu_placement.app.cli import main
from gpu_placement.decide.kubefilters import KubeNodes, fit_error, pod_requests, unmodelled
from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod

AFFINITY = "node(s) didn't match Pod's node affinity/selector"
TAINT = "node(s) had untolerated taint(s)"


def node(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
         allocatable: dict[str, str] | None = None, unschedulable: bool = False) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints or [], "unschedulable": unschedulable},
            "status": {"allocatable": allocatable or {"pods": "110", "cpu": "8", "memory": "32Gi",
                                                      "nvidia.com/gpu": "8"}}}


def pod(spec: dict[str, Any], name: str = "p", node_name: str | None = None, phase: str = "Pending"
        ) -> dict[str, Any]:
    spec = {"containers": [{"name": "main"}], **spec}
    if node_name:
        spec["nodeName"] = node_name
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ns"}, "spec": spec, "status": {"phase": phase}}


def verdicts(objects: list[dict[str, Any]], spec: dict[str, Any]) -> dict[str, str]:
    found = KubeNodes.from_objects(objects).filter(pod(spec))
    return {name: ", ".join(v.reasons) if v else "pass" for name, v in found.verdicts.items()}


def test_node_selector_and_required_affinity() -> None:
    nodes = [node("a", {"pool": "training", "zone": "1", "gpus": "8"}), node("b", {"pool": "inference"}), node("c")]
    assert verdicts(nodes, {"nodeSelector": {"pool": "training"}}) == {"a": "pass", "b": AFFINITY, "c": AFFINITY}

    def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
        return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": list(terms)}}}}

    def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
        return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}

    assert verdicts(nodes, affinity(expr("pool", "In", "inference", "x")))["b"] == "pass"
    assert verdicts(nodes, affinity(expr("pool", "NotIn", "training"))) == {"a": AFFINITY, "b": "pass", "c": "pass"}
    assert verdicts(nodes, affinity(expr("zone", "Exists")))["c"] == AFFINITY
    assert verdicts(nodes, affinity(expr("zone", "DoesNotExist")))["c"] == "pass"
    assert verdicts(nodes, affinity(expr("gpus", "Gt", "4")))["a"] == "pass"
    assert verdicts(nodes, affinity(expr("gpus", "Lt", "4")))["a"] == AFFINITY
    assert verdicts(nodes, affinity(expr("pool", "Bogus", "x"))) == {n: AFFINITY for n in "abc"}  # fails its term
    # Terms are ORed; an empty term selects nothing, and no terms at all match no node.
    assert verdicts(nodes, affinity(expr("pool", "In", "training"), expr("pool", "In", "inference")))["b"] == "pass"
    assert verdicts(nodes, affinity({})) == {n: AFFINITY for n in "abc"}
    # nodeSelector and affinity both hold.
    both = {"nodeSelector": {"zone": "1"}, **affinity(expr("pool", "In", "inference"))}
    assert verdicts(nodes, both) == {n: AFFINITY for n in "abc"}


def test_node_names_in_affinity_narrow_in_prefilter() -> None:
    nodes = [node("a"), node("b"), node("c")]
    by_name = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}}}}
    assert verdicts(nodes, by_name) == {"a": "node(s) didn't satisfy plugin(s) [NodeAffinity]", "b": "pass",
                                        "c": "node(s) didn't satisfy plugin(s) [NodeAffinity]"}
    # A pod that names its node and affinity to another: PreFilter fails for the whole cycle.
    found = KubeNodes.from_objects(nodes).filter(pod({**by_name, "nodeName": "a"}))
    assert found.prefilter == "node(s) didn't satisfy plugin(s) [NodeAffinity NodeName] simultaneously"
    assert fit_error(3, [], found.prefilter) == ("0/3 nodes are available: node(s) didn't satisfy plugin(s) "
                                                 "[NodeAffinity NodeName] simultaneously.")


def test_taints_and_tolerations() -> None:
    nodes = [node("gpu", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
             node("dedicated", taints=[{"key": "dedicated", "value": "training", "effect": "NoExecute"}]),
             node("soft", taints=[{"key": "spot", "effect": "PreferNoSchedule"}])]
    assert verdicts(nodes, {}) == {"gpu": TAINT, "dedicated": TAINT, "soft": "pass"}  # PreferNoSchedule: scoring only
    gpu = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    assert verdicts(nodes, gpu)["gpu"] == "pass"
    wrong_value = {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "inference"}]}
    assert verdicts(nodes, wrong_value)["dedicated"] == TAINT
    right = {"tolerations": [{"key": "dedicated", "value": "training"}]}  # operator defaults to Equal
    assert verdicts(nodes, right)["dedicated"] == "pass"
    everything = {"tolerations": [{"operator": "Exists"}]}
    assert set(verdicts(nodes, everything).values()) == {"pass"}
    # Gt/Lt tolerations are behind an alpha gate that is off: they tolerate nothing.
    numeric = node("n", taints=[{"key": "level", "value": "5", "effect": "NoSchedule"}])
    assert verdicts([numeric], {"tolerations": [{"key": "level", "operator": "Gt", "value": "1"}]})["n"] == TAINT


def test_cordoned_nodes_unless_the_unschedulable_taint_is_tolerated() -> None:
    nodes = [node("cordoned", unschedulable=True)]
    assert verdicts(nodes, {}) == {"cordoned": "node(s) were unschedulable"}
    tolerates = {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                  "effect": "NoSchedule"}]}
    assert verdicts(nodes, tolerates) == {"cordoned": "pass"}


def test_resource_fit_counts_the_pods_bound_there() -> None:
    gpus = {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
    bound = [pod(gpus, f"b{i}", "full") for i in range(4)] + [pod(gpus, "done", "half", "Succeeded")] + \
        [pod(gpus, f"h{i}", "half") for i in range(3)]
    nodes = [node("full"), node("half"), node("tiny", allocatable={"pods": "110", "nvidia.com/gpu": "1"}),
             node("cpu", allocatable={"pods": "110", "cpu": "8"})]
    found = KubeNodes.from_objects([*nodes, *bound]).filter(pod(gpus))
    assert {n: v.reasons if v else () for n, v in found.verdicts.items()} == {
        "full": ("Insufficient nvidia.com/gpu",), "half": (), "tiny": ("Insufficient nvidia.com/gpu",),
        "cpu": ("Insufficient nvidia.com/gpu",)}
    assert found.verdicts["full"].detail == "nvidia.com/gpu asks 2, 0 free of 8"  # type: ignore[union-attr]
    # The pod being explained never stands in its own way.
    again = KubeNodes.from_objects([*nodes, *bound], leave_out="ns/b0").filter(pod(gpus))
    assert again.verdicts["full"] is None
    crowded = KubeNodes.from_objects([node("n", allocatable={"pods": "1"}), pod({}, "other", "n")])
    assert crowded.filter(pod({})).verdicts["n"].reasons == ("Too many pods",)  # type: ignore[union-attr]
    big = {"containers": [{"name": "m", "resources": {"requests": {"cpu": "9", "memory": "64Gi"}}}]}
    assert verdicts([node("n")], big) == {"n": "Insufficient cpu, Insufficient memory"}


def test_requests_as_kube_scheduler_adds_them() -> None:
    spec = {"containers": [{"name": "a", "resources": {"requests": {"cpu": "500m"}, "limits": {"nvidia.com/gpu": 1}}},
                           {"name": "b", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}}],
            "initContainers": [{"name": "setup", "resources": {"requests": {"cpu": "2"}}},
                               {"name": "sidecar", "restartPolicy": "Always",
                                "resources": {"requests": {"cpu": "100m", "nvidia.com/gpu": "1"}}}],
            "overhead": {"cpu": "50m"}}
    # app containers and sidecars: 850m, 2 GPUs; the init container with the sidecars before it: 2000m.
    assert pod_requests(spec) == {"cpu": 2050, "memory": 2**30, "nvidia.com/gpu": 2}
    assert pod_requests({**spec, "resources": {"requests": {"cpu": "3", "memory": "2Gi"}}}) == {
        "cpu": 3050, "memory": 2 * 2**30, "nvidia.com/gpu": 2}  # pod-level requests replace cpu and memory


def test_the_fit_error_message_counts_reasons_sorted_as_strings() -> None:
    reasons = [[AFFINITY]] * 10 + [["DriverTooOld: driver too old"]] * 2 + [["Insufficient cpu", "Too many pods"]]
    assert fit_error(13, reasons) == ("0/13 nodes are available: 1 Insufficient cpu, 1 Too many pods, "
                                      f"10 {AFFINITY}, 2 DriverTooOld: driver too old.")


def test_what_explain_does_not_check_is_named() -> None:
    spec = {"containers": [{"name": "m", "ports": [{"containerPort": 80, "hostPort": 8080}]}],
            "topologySpreadConstraints": [{"maxSkew": 1}], "schedulingGates": [{"name": "kueue"}]}
    assert unmodelled(spec) == ["host ports (NodePorts)", "topologySpreadConstraints (PodTopologySpread)",
                                "scheduling gates: kube-scheduler does not try the pod until they are removed"]
    assert unmodelled({"containers": [{"name": "m"}]}) == []


# -- through `explain`, on a snapshot -------------------------------------------------------------------
@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    objects = [namespace("team"),
               make_node("h100-a", "h100"), make_node("h100-b", "h100"),
               make_node("h100-cordoned", "h100", unschedulable=True),
               make_node("h100-dedicated", "h100"), make_node("h100-full", "h100")]
    objects[4]["spec"]["taints"].append({"key": "dedicated", "value": "research", "effect": "NoSchedule"})
    for name in ("h100-a", "h100-b", "h100-cordoned", "h100-dedicated", "h100-full"):
        objects.append(validator_pod(name))
    objects.append(make_pod("team", "hog", gpus={"nvidia.com/gpu": 1}, node="h100-full"))
    path = tmp_path / "cluster.json"
    path.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    return path


def _explain(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, Any],
             *args: str) -> str:
    file = tmp_path / "pod.json"
    file.write_bytes(orjson.dumps(make_pod("team", "new", gpus={"nvidia.com/gpu": 1}, **spec)))
    status = main(["explain", str(file), "--snapshot", str(snapshot), *args])
    out = capsys.readouterr().out
    assert status == (4 if "  no node can take it" in out else 0)  # 4: admitted, no node (docs/explain.md)
    return out


def test_a_selector_no_node_has_leaves_the_pod_pending_as_kube_scheduler_would(
        snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: `nodeSelector: {pool: training}` on a cluster with no such node. Without
    kube-scheduler's filters, explain named a node the pod could never go to."""
    file = tmp_path / "pod.json"
    pinned = make_pod("team", "new", gpus={"nvidia.com/gpu": 1})
    pinned["spec"]["nodeSelector"] = {"pool": "training"}
    file.write_bytes(orjson.dumps(pinned))
    assert main(["explain", str(file), "--snapshot", str(snapshot)]) == 4
    out = capsys.readouterr().out
    assert "would go to" not in out and "  no node can take it" in out
    assert ("kube-scheduler: 0 of 5 nodes pass its own filters and go to the extender; it keeps 3 for NodeAffinity, "
            "1 for NodeUnschedulable, 1 for TaintToleration") in out  # the filters run in the profile's order
    assert ("  kube-scheduler would report: 0/5 nodes are available: 1 node(s) had untolerated taint(s), 1 node(s) "
            f"were unschedulable, 3 {AFFINITY}.") in out
    row = next(line for line in out.splitlines() if line.startswith("h100-a "))
    assert row.split()[1] == "NodeAffinity"
    assert row.endswith(f"{AFFINITY} [nodeSelector pool=training; the node has no pool label]")


def test_each_filter_keeps_its_node_and_the_best_is_one_kube_scheduler_could_pick(
        snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _explain(snapshot, tmp_path, capsys, {}, "-o", "json")
    answer = orjson.loads(out)
    rows = {row["node"]: row for row in answer["nodes"]}
    assert rows["h100-cordoned"]["reason"] == "NodeUnschedulable: node(s) were unschedulable"
    assert rows["h100-cordoned"]["stage"] == "kube-scheduler"
    assert rows["h100-dedicated"]["reason"] == f"TaintToleration: {TAINT}"
    assert rows["h100-dedicated"]["figures"] == "dedicated=research:NoSchedule"
    assert rows["h100-a"]["verdict"] == "pass" and rows["h100-a"]["stage"] == "extender"
    assert rows["h100-full"]["reason"] == "NodeResourcesFit: Insufficient nvidia.com/gpu"  # the hog holds its GPU
    assert rows["h100-full"]["figures"] == "nvidia.com/gpu asks 1, 0 free of 1"
    assert answer["best"]["node"] in ("h100-a", "h100-b")
    assert answer["kube_scheduler"] == {"checked": True, "message": None, "not_checked": []}


def test_when_nothing_fits_the_message_joins_both_stages(snapshot: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = _explain(snapshot, tmp_path, capsys, {"annotations": {"gpu-placement.io/min-driver": "999.0"}})
    assert ("kube-scheduler would report: 0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had "
            "untolerated taint(s), 1 node(s) were unschedulable, 2 DriverTooOld: driver 550.54.15 is older than "
            "999.0 (gpu-placement.io/min-driver).") in out
