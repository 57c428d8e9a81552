"""`gpu-placement survey` from the command line: on a snapshot with operator-managed nodes, a
hand-installed node, a node with hand-set labels, driver skew, a forgotten taint and a workload whose
selector matches nothing (the demo cluster), and live against the fake API server."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gpu_placement.app.cli import main
from gpu_placement.app.demo import cluster_objects, demo_config_map, write_snapshot
from tests.fakeapi import FakeApiServer

Capture = pytest.CaptureFixture[str]


def survey(capsys: Capture, *args: str) -> tuple[int, str]:
    code = main(["survey", *args])
    return code, capsys.readouterr().out


@pytest.fixture
def snapshot(tmp_path: Path, capsys: Capture) -> Path:
    path = tmp_path / "cluster.json"
    write_snapshot(str(path))
    capsys.readouterr()
    return path


def test_the_survey_lists_each_problem_with_its_code_and_fix(snapshot: Path, capsys: Capture) -> None:
    code, out = survey(capsys, "--snapshot", str(snapshot), "-o", "json")
    assert code == 1  # findings: CI fails
    report = orjson.loads(out)
    assert set(report) >= {"inventory", "findings"}
    for finding in report["findings"]:
        assert set(finding) >= {"code", "nodes", "workloads", "fix"} and finding["fix"].endswith(".")
        assert all(ref.count("/") == 2 for ref in finding["workloads"])  # NS/KIND/NAME
    by_code = {f["code"]: f for f in report["findings"]}
    assert by_code["UnmanagedNode"]["nodes"] == ["h100-train-hand"]
    assert by_code["HandSetLabels"]["nodes"] == ["l40s-relabelled"]
    assert by_code["DriverSkew"]["nodes"] == ["h100-train-1", "h100-train-hand"]
    assert by_code["UntoleratedTaint"]["nodes"] == ["l40s-relabelled"]
    assert by_code["SelectorMatchesNoGpuNode"]["workloads"] == ["research/CronJob/nightly-eval"]
    training = next(g for g in report["inventory"] if g["pool"] == "training")
    assert (training["nodes"], training["gpus"]) == (3, 24)
    assert training["drivers"] == {"535.129.03": 2, "535.104.05": 1}
    assert training["management"] == {"gpu-operator, pre-installed driver": 2, "not managed": 1}
    operator = {n["node"]: n for g in report["inventory"] for n in g["nodeDetails"]}
    assert operator["h100-batch-2"]["management"] == "gpu-operator"
    assert operator["t4-shared"]["sharing"] == "time-slicing x8"
    assert operator["h100-mig"]["mig"] == "mixed 2x1g.10gb+1x2g.20gb+1x3g.40gb"
    assert report["configuration"].startswith("ConfigMap gpu-placement/gpu-placement-config")


def test_text_and_markdown(snapshot: Path, capsys: Capture) -> None:
    code, text = survey(capsys, "--snapshot", str(snapshot))
    assert code == 1 and text.startswith("GPU CLUSTER SURVEY: 21 GPU nodes (45 GPUs) in 2 pools and 14 without a "
                                         "pool, 1 other node; 10 findings\n")
    assert "- UnmanagedNode: GPUs allocatable with no GPU Operator component on the node: h100-train-hand" in text
    code, markdown = survey(capsys, "--snapshot", str(snapshot), "-o", "markdown")
    assert code == 1
    assert [line for line in markdown.splitlines() if line.startswith("## ")] == [
        "## Inventory", "## Pool batch", "## Pool training", "## Nodes without a pool", "## Findings (10)"]
    assert "| `DriverSkew` | h100-train-1, h100-train-hand |" in markdown


def test_no_findings_exit_0(tmp_path: Path, capsys: Capture) -> None:
    objects = [o for o in cluster_objects() if o["kind"] == "Namespace" or (
        o["kind"] in ("Node", "Pod") and "h100-batch-1" in str(o["metadata"].get("name")))]
    path = tmp_path / "one.json"
    path.write_bytes(orjson.dumps({"kind": "List", "items": [*objects, demo_config_map()]}))
    code, out = survey(capsys, "--snapshot", str(path))
    assert code == 0, out
    assert "FINDINGS (0;" in out and "  none" in out
    assert out.startswith("GPU CLUSTER SURVEY: 1 GPU node (1 GPU) in 1 pool, 0 other nodes; 0 findings\n")
    for obj in objects:  # the same node without its pool
        obj["metadata"].get("labels", {}).pop("pool", None)
    path.write_bytes(orjson.dumps({"kind": "List", "items": [*objects, demo_config_map()]}))
    code, out = survey(capsys, "--snapshot", str(path))
    assert out.startswith("GPU CLUSTER SURVEY: 1 GPU node (1 GPU), none in a pool, 0 other nodes; "), out


def test_live_survey_reads_what_it_may_and_says_what_it_could_not(fake_api: FakeApiServer, tmp_path: Path,
                                                                  capsys: Capture) -> None:
    """A user whose role lists neither Deployments nor CronJobs: the survey says so, and surveys the rest (the
    hand-installed node is found from its managedFields, as the API server keeps them)."""
    fake_api.load([o for o in cluster_objects() if o["kind"] in ("Namespace", "Node", "Pod", "ClusterPolicy")])
    fake_api.add(demo_config_map())
    fake_api.add_user("auditor-token", "auditor", (), cluster=(
        "namespaces", "nodes", "pods", "configmaps", "resourcequotas", "statefulsets", "daemonsets", "jobs",
        "clusterpolicies", "mutatingwebhookconfigurations"))
    kubeconfig = fake_api.user_kubeconfig(tmp_path / "kubeconfig", "auditor-token", "default")
    code, out = survey(capsys, "--kubeconfig", str(kubeconfig), "-o", "json")
    assert code == 1
    report = orjson.loads(out)
    assert {"Deployments not read (not allowed to list them): the checks that read them ran without them",
            "CronJobs not read (not allowed to list them): the checks that read them ran without them"
            } <= set(report["notes"])
    codes = {f["code"] for f in report["findings"]}
    assert {"UnmanagedNode", "HandSetLabels", "DriverSkew", "UntoleratedTaint"} <= codes
    assert "SelectorMatchesNoGpuNode" not in codes  # the CronJob could not be read
    assert report["configuration"].startswith("ConfigMap gpu-placement/gpu-placement-config in context")


def test_survey_and_nodes_show_the_same_state_and_ready_counts_what_takes_gpu_pods(snapshot: Path,
                                                                                  capsys: Capture) -> None:
    """One decision for the state of a node: the survey says canary-only for a soaking driver under strict
    soak, upgrade-due, no-driver-labels, as `gpu-placement nodes` does. The ready count leaves out a node
    whose maintenance taint no GPU pod tolerates."""
    code, out = survey(capsys, "--snapshot", str(snapshot), "-o", "json")
    assert code == 1
    report = orjson.loads(out)
    surveyed = {n["node"]: n["state"] for g in report["inventory"] for n in g["nodeDetails"]}
    assert main(["nodes", "--snapshot", str(snapshot), "-o", "json"]) == 0
    listed = {r["node"]: r["state"] for r in orjson.loads(capsys.readouterr().out)["nodes"]}
    assert surveyed == {name: listed[name] for name in surveyed}
    assert (surveyed["h100-batch-2"], surveyed["h100-batch-3"]) == ("canary-only", "canary-only")  # soaking
    assert (surveyed["h100-batch-4"], surveyed["l4-no-driver-labels"]) == ("upgrade-due", "no-driver-labels")
    ready = sorted(name for name, state in surveyed.items() if state == "ready")
    assert "l40s-relabelled" in ready  # as gpu-placement's rules see it; its maintenance taint keeps pods off
    assert report["readyNodes"] == len(ready) - 1
    code, html = survey(capsys, "--snapshot", str(snapshot), "-o", "html")
    assert code == 1
    assert f'<b>{len(ready) - 1}</b>ready</div>' in html
