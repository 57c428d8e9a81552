"""`explain` takes what users write, any object with a pod template, and says when a pod that exists
went around gpu-placement, and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gpu_placement.app.cli import main
from gpu_placement.app.demo import demo_config_map
from gpu_placement.base.config import Config
from gpu_placement.decide.bypass import Webhook, bypass_reasons
from gpu_placement.facts.workloads import WorkloadError, pods_of
from gpu_placement.samples.cluster import demo_objects, make_pod
from tests.fakeapi import FakeApiServer
from tests.support.explain import GPU_POD, HOOK, _created

TEMPLATE = {"metadata": {"labels": {"app": "train"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                     "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}


def workload(kind: str, spec: dict[str, Any], api_version: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": "train", "namespace": "research"},
            "spec": spec}


WORKLOADS = {
    "Deployment": workload("Deployment", {"replicas": 3, "template": TEMPLATE}),
    "StatefulSet": workload("StatefulSet", {"replicas": 2, "template": TEMPLATE}),
    "ReplicaSet": workload("ReplicaSet", {"replicas": 1, "template": TEMPLATE}),
    "DaemonSet": workload("DaemonSet", {"template": TEMPLATE}),
    "Job": workload("Job", {"parallelism": 4, "template": TEMPLATE}, "batch/v1"),
    "CronJob": workload("CronJob", {"schedule": "@daily", "jobTemplate": {"spec": {"template": TEMPLATE}}},
                        "batch/v1"),
}
PYTORCHJOB = workload("PyTorchJob", {"pytorchReplicaSpecs": {
    "Master": {"replicas": 1, "template": TEMPLATE},
    "Worker": {"replicas": 4, "template": {**TEMPLATE, "spec": {**TEMPLATE["spec"], "containers": [
        {**TEMPLATE["spec"]["containers"][0], "resources": {"limits": {"nvidia.com/gpu": 8}}}]}}}}},
    "kubeflow.org/v1")


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_every_controller_kind_gives_the_pod_it_would_create(kind: str) -> None:
    [found] = pods_of(WORKLOADS[kind])
    pod = found.pod
    assert pod["kind"] == "Pod" and pod["metadata"]["namespace"] == "research"
    assert pod["spec"]["containers"][0]["image"] == "nvcr.io/nvidia/pytorch:24.05-py3"
    owner = pod["metadata"]["ownerReferences"][0]
    assert owner["controller"] is True
    assert owner["kind"] == {"Deployment": "ReplicaSet", "CronJob": "Job"}.get(kind, kind)
    name = pod["metadata"].get("name") or pod["metadata"]["generateName"]
    assert name == ("train-0" if kind == "StatefulSet" else "train-")


def test_daemonset_pods_get_the_controllers_tolerations() -> None:
    [found] = pods_of(WORKLOADS["DaemonSet"])
    keys = {(t["key"], t["effect"]) for t in found.pod["spec"]["tolerations"]}
    assert ("node.kubernetes.io/unschedulable", "NoSchedule") in keys and ("node.kubernetes.io/not-ready",
                                                                           "NoExecute") in keys
    assert "one such pod per node" in found.note


def test_unknown_kinds_are_searched_for_templates() -> None:
    master, worker = pods_of(PYTORCHJOB)
    assert master.where == "PyTorchJob research/train (spec.pytorchReplicaSpecs.Master.template)"
    assert worker.replicas == 4 and worker.pod["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
    with pytest.raises(WorkloadError, match="a Service without a name: no pod template found"):
        pods_of({"kind": "Service", "spec": {"ports": []}})
    with pytest.raises(WorkloadError, match=r"Deployment train has no pod template at spec\.template"):
        pods_of({"kind": "Deployment", "metadata": {"name": "train"}, "spec": {}})


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.json"
    path.write_bytes(orjson.dumps({"kind": "List", "items": [*demo_objects(), demo_config_map()]}))
    return path


def test_explain_a_job_yaml(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`explain job.yaml` answered 'expected a Pod with a spec, found Job'."""
    file = tmp_path / "job.yaml"
    file.write_text(yaml.safe_dump(WORKLOADS["Job"]))
    assert main(["explain", str(file), "--snapshot", str(snapshot)]) == 3  # research's quota of 2 takes 2 of the 4
    out = capsys.readouterr().out
    assert out.startswith("pod research/train-\nworkload: Job research/train (spec.template), 4 replicas\n")
    assert "\n  allowed" in out and "extender: needs 1x nvidia.com/gpu" in out


def test_explain_a_pytorchjob_explains_each_replica_type(snapshot: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "pytorchjob.json"
    file.write_bytes(orjson.dumps(PYTORCHJOB))
    assert main(["explain", str(file), "--snapshot", str(snapshot), "-o", "json"]) == 3  # 33 GPUs, quota 2
    answer = orjson.loads(capsys.readouterr().out)
    assert answer["workload"] == "PyTorchJob research/train"
    master, worker = answer["pods"]
    assert master["workload"] == "PyTorchJob research/train (spec.pytorchReplicaSpecs.Master.template), 1 replica"
    assert master["needs"].startswith("1x nvidia.com/gpu") and worker["needs"].startswith("8x nvidia.com/gpu")


def test_a_daemonset_keeps_its_scheduler(snapshot: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "ds.yaml"
    file.write_text(yaml.safe_dump(WORKLOADS["DaemonSet"]))
    assert main(["explain", str(file), "--snapshot", str(snapshot), "-o", "json"]) == 0
    answer = orjson.loads(capsys.readouterr().out)
    assert not any(op["path"] == "/spec/schedulerName" for op in answer["webhook"]["patch"])
    assert "one such pod per node" in answer["workload"]


# -- pods that went around gpu-placement -------------------------------------------------------------
def test_a_pod_created_while_the_webhook_was_down() -> None:
    [unadmitted, scheduler] = bypass_reasons(_created(GPU_POD, "2026-02-01T00:00:00Z"), Config(), True, HOOK)
    assert unadmitted == (
        "no gpu-placement.io/admitted annotation: the webhook did not admit it: most likely it was created while no "
        "webhook replica answered (MutatingWebhookConfiguration gpu-placement has failurePolicy Ignore, so the API "
        "server created it unchanged); the webhook's logs and gpu_placement_requests_total around its "
        "creationTimestamp tell")
    assert scheduler.startswith("its schedulerName is default-scheduler, not gpu-placement (the webhook sets it only "
                                "on pods it admits): gpu-placement's extender never saw it")


def test_other_ways_around() -> None:
    before = bypass_reasons(_created(GPU_POD, "2026-01-01T00:00:00Z"), Config(), True, HOOK)[0]
    assert before.endswith("the pod was created at 2026-01-01T00:00:00Z, before MutatingWebhookConfiguration "
                           "gpu-placement (2026-01-10T00:00:00Z)")
    missing = bypass_reasons(GPU_POD, Config(), True, Webhook(None))[0]
    assert missing.endswith("there is no gpu-placement MutatingWebhookConfiguration in the cluster")
    exempt = make_pod("kube-system", "p", gpus={"nvidia.com/gpu": 1})
    assert bypass_reasons(exempt, Config(), True, HOOK)[0] == (
        "namespace kube-system is exempt (exemptNamespaces): the webhook never sees its pods")
    volcano = _created(GPU_POD, "2026-02-01T00:00:00Z", annotations={"gpu-placement.io/admitted": "{}"})
    volcano["spec"]["schedulerName"] = "volcano"
    assert bypass_reasons(volcano, Config(), True, HOOK) == [
        "its schedulerName is volcano, not gpu-placement (the webhook keeps a scheduler a pod names, other than "
        "default-scheduler): gpu-placement's extender never saw it, and its verdicts below are what it would have "
        "decided"]
    admitted = {**volcano, "spec": {**volcano["spec"], "schedulerName": "gpu-placement"}}
    assert bypass_reasons(admitted, Config(), True, HOOK) == []
    assert bypass_reasons(make_pod("research", "cpu"), Config(), False, HOOK) == []


def test_explain_of_a_live_pod_says_how_it_bypassed(fake_api: FakeApiServer, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.load([*demo_objects(), _created(GPU_POD, "2026-02-01T00:00:00Z")])
    fake_api.add({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                  "metadata": {"name": "gpu-placement", "labels": {"app.kubernetes.io/part-of": "gpu-placement"}},
                  "webhooks": [{"name": "mutate.gpu-placement.io", "failurePolicy": "Ignore",
                                "admissionReviewVersions": ["v1"], "sideEffects": "None",
                                "clientConfig": {"url": "https://example.invalid/mutate"}}]})
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    assert main(["explain", "pod/p", "-n", "research", "--kubeconfig", str(kubeconfig)]) == 0
    out = capsys.readouterr().out
    assert "  bypassed gpu-placement: no gpu-placement.io/admitted annotation: the webhook did not admit it: most " \
           "likely it was created while no webhook replica answered (MutatingWebhookConfiguration gpu-placement " \
           "has failurePolicy Ignore" in out
    assert "  bypassed gpu-placement: its schedulerName is default-scheduler, not gpu-placement" in out
