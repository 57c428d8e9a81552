"""`explain` for a developer bound to one namespace (issue 34, P9 of shared/review/ux-trial.md): it
used to stop at the first 403 (`GET /api/v1/namespaces ... cannot list resource "namespaces" ... at the
cluster scope`); now it reads what the user may, and says what it could not see. And `explain KIND/NAME`
for any workload in the cluster, a CRD's included, found through discovery. The fake API server answers
403s as kube-apiserver's RBAC does (tests/fakeapi.py add_user)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gpu_placement.app.cli import main
from gpu_placement.app.demo import demo_config_map
from gpu_placement.samples.cluster import demo_objects, make_pod
from tests.fakeapi import FakeApiServer

pytestmark = pytest.mark.timeout(120)

WAITING = make_pod("team-a", "train-waiting", gpus={"nvidia.com/gpu": 1},
                   image="nvcr.io/nvidia/cuda:13.0.0-runtime-ubuntu24.04")


@pytest.fixture
def cluster(fake_api: FakeApiServer) -> FakeApiServer:
    fake_api.load([*demo_objects(), WAITING, demo_config_map()])
    return fake_api


def test_a_namespace_scoped_developer_gets_an_answer_and_what_it_could_not_see(
        cluster: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only team-a's objects, and nodes cluster-wide (what the gpu-placement-explain ClusterRole adds to a
    namespace's `view`): the pod is judged; pods elsewhere and the chart's ConfigMap are said to be unseen."""
    cluster.add_user("alice-token", "alice", ["team-a"], cluster=["nodes"])
    kubeconfig = cluster.user_kubeconfig(tmp_path / "alice", "alice-token", "team-a")
    status = main(["explain", "pod/train-waiting", "--kubeconfig", str(kubeconfig), "-o", "json"])
    answer = orjson.loads(capsys.readouterr().out)
    assert status == answer["exit_status"] and answer["pod"] == "team-a/train-waiting"
    assert len(answer["nodes"]) == 16  # every node judged
    unseen = answer["could_not_see"]
    assert any(line.startswith('namespaces other than team-a (namespaces is forbidden: User "alice" cannot list '
                               'resource "namespaces" in API group "" at the cluster scope)') for line in unseen)
    assert any(line.startswith("pods outside namespace team-a (") and "nodes may look freer than they are" in line
               for line in unseen)
    assert answer["configuration"].startswith("built-in defaults: ConfigMaps could not be read (")


def test_without_nodes_it_says_so_instead_of_failing(cluster: FakeApiServer, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cluster.add_user("bob-token", "bob", ["team-a"])
    kubeconfig = cluster.user_kubeconfig(tmp_path / "bob", "bob-token", "team-a")
    main(["explain", "pod/train-waiting", "--kubeconfig", str(kubeconfig)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and err == ""
    assert ('could not see: nodes (nodes is forbidden: User "bob" cannot list resource "nodes" in API group "" at the '
            "cluster scope): no node can be judged; ask the platform team for the gpu-placement-explain ClusterRole "
            "(docs/explain.md, Permissions)") in out
    assert main(["nodes", "--kubeconfig", str(kubeconfig)]) == 0
    assert "could not see: nodes (" in capsys.readouterr().err


def test_a_user_with_no_rights_in_the_namespace_either(cluster: FakeApiServer, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    cluster.add_user("eve-token", "eve", [])
    kubeconfig = cluster.user_kubeconfig(tmp_path / "eve", "eve-token", "team-a")
    status = main(["explain", "pod/train-waiting", "--kubeconfig", str(kubeconfig)])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert ('pods "train-waiting" is forbidden: User "eve" cannot get resource "pods" in API group "" in the '
            'namespace "team-a"') in err


@pytest.mark.parametrize(("word", "obj"), [
    ("deploy", {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 2}}),
    ("job", {"apiVersion": "batch/v1", "kind": "Job", "spec": {"parallelism": 3}}),
    ("sts", {"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"replicas": 1}}),
    ("cronjob", {"apiVersion": "batch/v1", "kind": "CronJob", "spec": {"schedule": "@daily", "jobTemplate": {
        "spec": {}}}}),
    ("pytorchjob", {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {"pytorchReplicaSpecs": {
        "Worker": {"replicas": 2}}}}),
])
def test_kind_slash_name_for_any_workload_in_the_cluster(cluster: FakeApiServer, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str], word: str,
                                                        obj: dict) -> None:
    """`explain deploy/x` was 'deploy/x: cannot read: No such file or directory'."""
    template = {"spec": {k: v for k, v in WAITING["spec"].items() if k in ("containers", "restartPolicy")}}
    spec = obj["spec"]
    holder = spec["jobTemplate"]["spec"] if "jobTemplate" in spec else (
        spec["pytorchReplicaSpecs"]["Worker"] if "pytorchReplicaSpecs" in spec else spec)
    holder["template"] = template
    cluster.add({**obj, "metadata": {"name": "train", "namespace": "team-a"}})
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    status = main(["explain", f"{word}/train", "-n", "team-a", "--kubeconfig", str(kubeconfig), "-o", "json"])
    answer = orjson.loads(capsys.readouterr().out)
    assert status == answer["exit_status"]
    assert answer["workload"].startswith(f"{obj['kind']} team-a/train (")
    missing = main(["explain", f"{word}/nope", "-n", "team-a", "--kubeconfig", str(kubeconfig)])
    assert missing == 2 and "team-a/nope not found (context fake)" in capsys.readouterr().err
    unknown = main(["explain", "widget/nope", "--kubeconfig", str(kubeconfig)])
    assert unknown == 2 and "no kind the API server serves is called widget" in capsys.readouterr().err


def _explain_role(values: dict) -> list[dict]:
    import helm_python
    import yaml

    from tests.support.chart import CHART, offline

    with helm_python.Chart.load(CHART) as chart:
        files = chart.render(offline(values), name="gpu-placement", namespace="gpu-placement")
    return [doc for path, text in files.items() if path.endswith("explain-rbac.yaml")
            for doc in yaml.safe_load_all(text) if doc]


def test_the_charts_explain_role_is_what_explain_needs(cluster: FakeApiServer, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """explain.md named no permissions and the chart shipped no role (P9). Off by default; on, a user with
    the rendered roles plus `view` in team-a gets every node judged with the deployed configuration."""
    assert _explain_role({}) == []
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _explain_role({"explainRole": {"create": True}})}
    role = docs[("ClusterRole", "gpu-placement-explain")]
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in role["rules"])  # read-only
    cluster_wide = {r for rule in role["rules"] for r in rule["resources"]}
    assert "pods" not in cluster_wide and {"nodes", "namespaces"} <= cluster_wide
    assert docs[("Role", "gpu-placement-explain")]["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]
    cluster.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    cluster.add_user("carol-token", "carol", ["team-a", "gpu-placement"], cluster=cluster_wide)
    kubeconfig = cluster.user_kubeconfig(tmp_path / "carol", "carol-token", "team-a")
    main(["explain", "pod/train-waiting", "--kubeconfig", str(kubeconfig), "-o", "json"])
    answer = orjson.loads(capsys.readouterr().out)
    assert len(answer["nodes"]) == 16
    assert answer["configuration"] == "ConfigMap gpu-placement/gpu-placement-config in context fake"
    assert [line.split(" (", 1)[0] for line in answer["could_not_see"]] == ["pods outside namespace team-a"]
    with_pods = _explain_role({"explainRole": {"create": True, "podsClusterWide": True}})
    assert any("pods" in rule["resources"] for d in with_pods if d["kind"] == "ClusterRole" for rule in d["rules"])
