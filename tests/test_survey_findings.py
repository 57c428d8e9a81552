"""A test per survey finding code (docs/survey.md): the smallest cluster that shows it, what the
finding names and says, and the near miss that must not raise it."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.base.config import Config, parse_config
from gpu_placement.samples.cluster import (
    driver_labels,
    driver_pod,
    make_node,
    make_pod,
    namespace,
    validator_pod,
    with_label_writers,
)
from gpu_placement.survey.findings import CODES, Finding
from gpu_placement.survey.run import Survey, run_survey

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parent.parent


def survey(objects: list[Obj], config: Config | None = None, deployed: bool = True) -> Survey:
    objects = [with_label_writers(o) if o["kind"] == "Node" and "managedFields" not in o["metadata"] else o
               for o in objects]
    return run_survey(core_from_objects(config or Config(), objects), objects, deployed=deployed)


def found(result: Survey, code: str) -> list[Finding]:
    return [f for f in result.findings if f.code == code]


def managed(name: str, base: str = "h100", **kwargs: Any) -> list[Obj]:
    """A node the GPU Operator manages: its labels and validator pod."""
    return [make_node(name, base, **kwargs), validator_pod(name)]


def owned(pod: Obj, kind: str, name: str) -> Obj:
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind, "name": name, "controller": True}]
    return pod


def deployment(ns: str, name: str, image: str = "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04",
               selector: dict[str, str] | None = None) -> Obj:
    pod = make_pod(ns, name, gpus={"nvidia.com/gpu": 1}, image=image)
    spec = {**pod["spec"], "restartPolicy": "Always", **({"nodeSelector": selector} if selector else {})}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


def quota_ns(name: str) -> Obj:
    return namespace(name, {"gpu-placement.io/quota": "nvidia.com/gpu=8"})


def test_unmanaged_node() -> None:
    hand = make_node("hand-1", None, labels={"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product":
                                             "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.deploy.operands": "false"},
                     allocatable={"nvidia.com/gpu": "8"})
    result = survey([*managed("gpu-1"), with_label_writers(hand, by_hand=("nvidia.com/gpu.present",
                                                                          "nvidia.com/gpu.product"))])
    [finding] = found(result, "UnmanagedNode")
    assert finding.nodes == ("hand-1",)
    assert "hand-1 (8x NVIDIA-H100-80GB-HBM3, driver unknown, published by device plugin, 2 GPU labels set by " \
           "kubectl-label)" in finding.what
    assert "gpu-placement migrate NODE" in finding.fix
    assert {node.name: node.management for node in result.nodes} == {"gpu-1": "gpu-operator",
                                                                     "hand-1": "not managed"}


def test_hand_set_labels() -> None:
    node = with_label_writers(make_node("gpu-1", "h100"), by_hand=("nvidia.com/gpu.product", "nvidia.com/gpu.count"))
    result = survey([node, validator_pod("gpu-1"), *managed("gpu-2")])
    [finding] = found(result, "HandSetLabels")
    assert finding.nodes == ("gpu-1",)
    assert "2 of its GPU labels were last written by kubectl-label" in finding.what
    assert "kubectl label node gpu-1 nvidia.com/gpu.count- nvidia.com/gpu.product-" in finding.fix
    # Without managedFields nobody can tell: a note, not a finding.
    bare = make_node("gpu-3", "h100")
    result = run_survey(core_from_objects(Config(), [bare, validator_pod("gpu-3")]), [bare, validator_pod("gpu-3")],
                        deployed=True)
    assert not found(result, "HandSetLabels") and "HandSetLabels was not checked" in result.notes[0]


def written_by(node: Obj, managers: dict[str, str]) -> Obj:
    """The node with managedFields as its writers leave them, these keys last written by these managers."""
    node = with_label_writers(node)
    for entry in node["metadata"]["managedFields"]:
        for key in managers:
            entry["fieldsV1"]["f:metadata"]["f:labels"].pop(f"f:{key}", None)
    for manager in sorted(set(managers.values())):
        node["metadata"]["managedFields"].append({
            "manager": manager, "operation": "Update", "apiVersion": "v1", "time": "2026-01-05T09:00:00Z",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {
                f"f:{key}": {} for key, who in managers.items() if who == manager}}}})
    return node


def test_hand_set_labels_are_grouped_bounded_and_only_nvidias() -> None:
    """Written at registration (the kubelet's --node-labels of a node pool, Karpenter's NodePool) is not by
    hand; NFD's CPU, kernel and USB labels are no GPU labels; nodes with the same labels by the same hand are
    one finding; its command stays short however many labels; its alternative says it drains the node."""
    cpu = {"feature.node.kubernetes.io/cpu-cpuid.AVX": "kubectl-label",
           "feature.node.kubernetes.io/kernel-version.full": "kubectl-label",
           "feature.node.kubernetes.io/usb-ef_0b1f_03ee.present": "kubectl-label"}
    objects = [written_by(make_node("eks-1", "h100"), {"nvidia.com/gpu.present": "kubelet"}), validator_pod("eks-1"),
               written_by(make_node("karp-1", "h100"), {"nvidia.com/gpu.present": "karpenter"}),
               validator_pod("karp-1"),
               written_by(make_node("nfd-1", "h100", labels=dict.fromkeys(cpu, "true")), cpu), validator_pod("nfd-1")]
    for name in ("old-1", "old-2", "old-3"):  # one pool labelled by hand once
        objects += [written_by(make_node(name, "h100"), {"nvidia.com/gpu.product": "kubectl-label",
                                                         "feature.node.kubernetes.io/pci-10de.present":
                                                         "kubectl-label"}), validator_pod(name)]
    keys = [f"nvidia.com/custom.label-{i:03d}" for i in range(138)]
    many = make_node("many-1", "h100", labels=dict.fromkeys(keys, "x" * 40))
    objects += [written_by(many, dict.fromkeys(keys, "kubectl-label")), validator_pod("many-1")]
    result = survey(objects)
    findings = found(result, "HandSetLabels")
    assert [f.nodes for f in findings] == [("many-1",), ("old-1", "old-2", "old-3")]
    many_finding, old = findings
    assert old.labels == ("feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.product")
    assert old.what.startswith("old-1, old-2, old-3 are managed by the GPU Operator, but 2 of their GPU labels were "
                               "last written by kubectl-label")
    assert ("kubectl label node old-1 old-2 old-3 feature.node.kubernetes.io/pci-10de.present- "
            "nvidia.com/gpu.product-") in old.fix
    assert "cordons and drains the node" in old.fix
    assert len(many_finding.labels) == 138 and "and 130 more" in many_finding.what
    assert len(many_finding.fix) < 600 and "nvidia.com/custom.label-137" not in many_finding.fix
    jq = """gpu-placement survey -o json | jq -r '.findings[] | select(.code == "HandSetLabels")"""
    assert jq in many_finding.fix
    assert {node.name for node in result.nodes if node.hand_labels} == {"old-1", "old-2", "old-3", "many-1"}


def test_gpus_not_published() -> None:
    result = survey([*managed("a10g", "a10g-unregistered", allocatable={"nvidia.com/gpu": "0"}), *managed("gpu-1")])
    [finding] = found(result, "GpusNotPublished")
    assert finding.nodes == ("a10g",)
    assert "kubectl -n gpu-operator get pods -o wide --field-selector spec.nodeName=NODE" in finding.fix


def test_driver_skew_outside_a_rollout() -> None:
    config = parse_config({"pools": {"train": {"nodeSelector": {"pool": "train"}}}})
    old = {"pool": "train", **driver_labels("535.129.03", "12.2")}
    new = {"pool": "train", **driver_labels("550.54.15", "12.4")}
    result = survey([*managed("a", labels=old), *managed("b", labels=new), *managed("c", labels=new)], config)
    [finding] = found(result, "DriverSkew")
    assert finding.nodes == ("a", "b", "c")
    assert finding.what.startswith("pool train runs 2 driver versions with no rollout under way: 550.54.15 on b, c; "
                                   "535.129.03 on a")
    # The old node waits for the operator's upgrade controller: a rollout, not skew.
    pending = {**old, "nvidia.com/gpu-driver-upgrade-state": "upgrade-required"}
    assert not found(survey([*managed("a", labels=pending), *managed("b", labels=new)], config), "DriverSkew")


def test_driver_too_old_for_workloads() -> None:
    old = driver_labels("470.256.02", "11.4")
    objects = [*managed("v100", labels=old), *managed("h100"), quota_ns("team"),
               deployment("team", "train", image="pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime")]
    [finding] = found(survey(objects), "DriverTooOldForWorkloads")
    assert finding.nodes == ("v100",) and finding.workloads == ("team/Deployment/train",)
    assert "needs CUDA >= 12.4 (image tag of container main" in finding.what
    assert "runs driver 470.256.02 (CUDA 11.4)" in finding.what
    assert "Upgrade the driver on these nodes to 550.54.14 or later (CUDA 12.4)" in finding.fix
    # Selected out of the workload's reach: no finding.
    objects[-1]["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "h100"}
    assert not found(survey(objects), "DriverTooOldForWorkloads")
    # Two old drivers: each named with its own nodes (t4 runs 510, v100 470), never paired by position.
    objects[-1]["spec"]["template"]["spec"].pop("nodeSelector")
    objects += managed("t4", labels=driver_labels("510.73.08", "11.7"))
    [finding] = found(survey(objects), "DriverTooOldForWorkloads")
    assert finding.nodes == ("t4", "v100")
    assert "t4, v100 are in their node selection and offer their GPU resources, but run driver 470.256.02 " \
           "(CUDA 11.4) on v100; 510.73.08 (CUDA 11.7) on t4:" in finding.what


def test_operator_pod_restarts() -> None:
    now = time.time()
    version = "550.54.15"
    fresh = driver_pod("gpu-1", version, now - 3600, restarts=4, restarted_at=now - 600)
    stale = driver_pod("gpu-2", version, now - 9 * 86400, restarts=1, restarted_at=now - 8 * 86400)
    result = survey([*managed("gpu-1"), *managed("gpu-2"), fresh, stale])
    [finding] = found(result, "OperatorPodRestarts")
    assert finding.nodes == ("gpu-1",)
    assert finding.workloads == ("gpu-operator/Pod/nvidia-driver-daemonset-gpu-1",)
    assert "4 restarts, the last 10 minutes ago" in finding.what
    assert "kubectl -n NS logs POD -c nvidia-driver-ctr --previous" in finding.fix


def test_untainted_gpu_node() -> None:
    bare = make_node("gpu-1", "h100")
    bare["spec"] = {}
    cache = owned(make_pod("web", "cache-7c9d8f-abcde", node="gpu-1", image="redis:7",
                           labels={"app": "cache", "pod-template-hash": "7c9d8f"}), "ReplicaSet", "cache-7c9d8f")
    result = survey([bare, validator_pod("gpu-1"), *managed("gpu-2"), cache])
    [finding] = found(result, "UntaintedGpuNode")
    assert finding.nodes == ("gpu-1",) and finding.workloads == ("web/Deployment/cache",)
    assert "kubectl taint node NODE nvidia.com/gpu:NoSchedule" in finding.fix


def test_untolerated_taint() -> None:
    objects = [*managed("gpu-1"), *managed("gpu-2")]
    objects[0]["spec"]["taints"].append({"key": "maintenance", "value": "bios", "effect": "NoSchedule"})
    [finding] = found(survey(objects), "UntoleratedTaint")
    assert finding.nodes == ("gpu-1",) and "taint maintenance=bios:NoSchedule on gpu-1" in finding.what
    assert "kubectl taint node NODE maintenance-" in finding.fix
    # A pool of the configuration tolerates it: meant, not forgotten.
    config = parse_config({"pools": {"m": {"nodeSelector": {"x": "y"}, "tolerations": [
        {"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}]}}})
    assert not found(survey(objects, config), "UntoleratedTaint")


def test_selector_matches_no_gpu_node() -> None:
    objects = [*managed("gpu-1"), quota_ns("team"),
               deployment("team", "render", selector={"nvidia.com/gpu.product": "NVIDIA-A10"})]
    [finding] = found(survey(objects), "SelectorMatchesNoGpuNode")
    assert finding.workloads == ("team/Deployment/render",)
    assert "nodeSelector nvidia.com/gpu.product=NVIDIA-A10" in finding.what
    assert "(GPU nodes have nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3)" in finding.what
    objects[-1]["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
    assert not found(survey(objects), "SelectorMatchesNoGpuNode")
    objects[-1]["spec"]["template"]["spec"]["nodeSelector"] = {"team": "render"}
    assert "(no GPU node has team)" in found(survey(objects), "SelectorMatchesNoGpuNode")[0].what


def test_bypassed_gpu_placement() -> None:
    pod = make_pod("team", "sim-0", gpus={"nvidia.com/gpu": 1}, node="gpu-1",
                   annotations={"gpu-placement.io/admitted": "{}"})
    pod["spec"]["schedulerName"] = "volcano"
    objects = [*managed("gpu-1"), quota_ns("team"), pod]
    [finding] = found(survey(objects), "BypassedGpuPlacement")
    assert finding.workloads == ("team/Pod/sim-0",)
    assert finding.what.startswith("GPU pods that went around gpu-placement (scheduler)")
    assert "Remove their schedulerName or set it to gpu-placement" in finding.fix
    result = survey(objects, deployed=False)  # gpu-placement not in the cluster: every pod goes around it
    assert not found(result, "BypassedGpuPlacement") and "BypassedGpuPlacement was not checked" in result.notes[-1]


def test_gpu_use_without_quota() -> None:
    pod = make_pod("lab", "notebook-0", gpus={"nvidia.com/gpu": 2}, node="gpu-1")
    objects = [*managed("gpu-1"), namespace("lab"), pod]
    [finding] = found(survey(objects), "GpuUseWithoutQuota")
    assert finding.workloads == ("lab/Pod/notebook-0",)
    assert "kubectl annotate namespace lab gpu-placement.io/quota=nvidia.com/gpu=2" in finding.fix
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": "lab"},
             "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}}
    assert not found(survey([*objects, quota]), "GpuUseWithoutQuota")


def test_odd_objects_are_surveyed_without_a_crash() -> None:
    """What anyone can write into a snapshot (or an API server that stores what it is given): nulls and
    wrong types where objects are expected. The survey reads around them and renders every form."""
    from gpu_placement.survey.page import survey_html
    from gpu_placement.survey.report import survey_json, survey_markdown, survey_text

    odd: list[Obj] = [
        *managed("gpu-1"),
        {"kind": "Node", "metadata": {"name": "n2", "labels": None, "managedFields": [
            None, {"manager": 5}, {"manager": "x", "fieldsV1": {"f:metadata": {"f:labels": ["a"]}}}]},
         "spec": {"taints": [None, "x", {"key": "k", "effect": "NoSchedule"}]},
         "status": {"capacity": {"nvidia.com/gpu": "abc"}}},
        {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "ownerReferences": "nope"}, "spec": None,
         "status": None},
        {"kind": "Pod", "metadata": {"name": "q", "namespace": "ns", "ownerReferences": [{"controller": True}]},
         "spec": {"nodeName": "gpu-1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
         "status": {"containerStatuses": [None, {"restartCount": "x"}]}},
        {"kind": "CronJob", "metadata": {"name": "c", "namespace": "ns"}, "spec": {"jobTemplate": "x"}},
        {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"spec": {"containers": [
            {"image": 5, "resources": {"limits": {"nvidia.com/gpu": "1"}}}], "tolerations": [None]}}}},
        {"kind": "ResourceQuota", "metadata": {"namespace": "ns"}, "spec": {"hard": ["x"]}},
        {"kind": "Namespace", "metadata": {"name": "ns", "annotations": None}},
        {"kind": "MutatingWebhookConfiguration", "metadata": {"labels": {"app.kubernetes.io/part-of": "gpu-placement"}},
         "webhooks": None}]
    result = run_survey(core_from_objects(Config(), odd), odd, deployed=True)
    assert [node.name for node in result.nodes] == ["gpu-1"]
    assert found(result, "GpuUseWithoutQuota")[0].workloads == ("ns/Pod/q",)
    for render in (survey_text, survey_markdown, survey_json, survey_html):
        assert render(result)


def test_every_code_has_a_test_and_a_doc() -> None:
    tests = Path(__file__).read_text()
    doc = (ROOT / "docs" / "survey.md").read_text()
    for code in CODES:
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", code).lower().replace("gpu_s_", "gpus_")
        assert f"def test_{snake}" in tests, code
        assert f"### `{code}`" in doc, code
