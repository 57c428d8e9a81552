"""`explain` says what a real cluster would do (issue 34, from the platform engineer's trial,
shared/review/ux-trial.md): a file's pod in a namespace the webhook never sees, `spec.nodeName`, another
scheduler, a namespace that does not exist; a workload added up against its quota and the room left;
misspelt pod annotations; and images from which no CUDA requirement can be inferred."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gpu_placement.app.cli import main
from gpu_placement.app.demo import write_snapshot
from gpu_placement.base.cuda import ngc_table
from gpu_placement.samples.cluster import make_pod, namespace

pytestmark = pytest.mark.timeout(120)

OPT_IN = ("defaultNamespacePolicy: deny\nnamespaceSelection: optIn\n"
          "pools:\n  training:\n    nodeSelector: {pool: training}\n")


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("snap") / "cluster.json"
    write_snapshot(str(path))
    return path


def explain(tmp_path: Path, capsys: pytest.CaptureFixture[str], obj: Any, *args: str) -> tuple[int, str]:
    file = tmp_path / "input.yaml"
    file.write_text(obj if isinstance(obj, str) else yaml.safe_dump_all(obj if isinstance(obj, list) else [obj]))
    status = main(["explain", str(file), *args])
    return status, capsys.readouterr().out


def gpu_pod(ns: str, name: str = "p", gpus: int = 2, image: str = "nvcr.io/nvidia/pytorch:24.05-py3",
            **spec: Any) -> dict[str, Any]:
    pod = make_pod(ns, name, gpus={"nvidia.com/gpu": gpus}, image=image)
    pod["spec"].update(spec)
    return pod


def test_a_namespace_not_opted_in_the_webhook_never_sees(snapshot: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """P1: with optIn and team-a unlabelled, explain showed the webhook's patch and 'would go to h100-train-1'."""
    config = tmp_path / "optin.yaml"
    config.write_text(OPT_IN)
    status, out = explain(tmp_path, capsys, gpu_pod("team-a"), "--snapshot", str(snapshot), "--config", str(config))
    assert ("  bypasses gpu-placement: namespace team-a is not opted in (namespaceSelection optIn: it has no label "
            "gpu-placement.io/enabled=true): the webhook never sees its pods") in out
    assert "webhook:\n  never called: the pod is created as written (see above)\n" in out
    assert "/spec/schedulerName" not in out and "allowed" not in out.split("kube-scheduler")[0]
    assert "extender (hypothetical: it never sees this pod; what it would decide if it did): needs 2x" in out
    # Unshaped, it tolerates no GPU taint: default-scheduler can only put it on the one GPU node nobody tainted,
    # the hand-installed one, which has no validator: unchecked by gpu-placement, and explain says so.
    assert ("  default-scheduler asks no extender: it places the pod on h100-train-hand, unchecked by "
            "gpu-placement") in out
    hypothetical = out.split("extender (hypothetical", 1)[1]
    assert "h100-train-hand      NotValidated      -      no nvidia-operator-validator pod on the node" in hypothetical
    assert status == 0


def test_a_label_true_with_a_capital_opts_nothing_in(snapshot: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "optin.yaml"
    config.write_text(OPT_IN)
    capital = namespace("team-b", {"gpu-placement.io/quota": "nvidia.com/gpu=4"}, {"gpu-placement.io/enabled": "True"})
    status, out = explain(tmp_path, capsys, [capital, gpu_pod("team-b")], "--snapshot", str(snapshot),
                          "--config", str(config))
    assert ("namespace team-b is not opted in (namespaceSelection optIn: it is labelled gpu-placement.io/enabled=True, "
            "and only the exact value true opts in (label values are case-sensitive)): the webhook never sees its "
            "pods; kubectl label --overwrite namespace team-b gpu-placement.io/enabled=true") in out
    assert status == 0  # placed, unchecked, on the untainted hand-installed node (above)


def test_an_exempt_namespace(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`-n kube-system` printed 'webhook: no change / allowed' and an extender verdict."""
    _status, out = explain(tmp_path, capsys, gpu_pod("kube-system"), "--snapshot", str(snapshot))
    assert ("bypasses gpu-placement: namespace kube-system is exempt (exemptNamespaces): the webhook never sees this "
            "pod, so it is not shaped and gets no GPU checks") in out
    assert "never called" in out and "extender (hypothetical" in out


def test_another_scheduler(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = gpu_pod("research", gpus=1, schedulerName="volcano",
                  tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    status, out = explain(tmp_path, capsys, pod, "--snapshot", str(snapshot))
    assert ("its schedulerName stays volcano, not gpu-placement (the webhook keeps a scheduler a pod names, other "
            "than default-scheduler): gpu-placement's extender never sees it") in out
    assert "  volcano asks no extender: it places the pod on one of these" in out
    assert ", were the pod sent to gpu-placement" in out and status == 0


@pytest.mark.parametrize(("node", "says", "code"), [
    ("h100-not-validated", "node h100-not-validated exists but gpu-placement keeps GPU pods off it (NotValidated: the "
                           "nvidia-operator-validator pod on the node is not Ready", 5),
    ("h100-trian-1", "no node named h100-trian-1: no kubelet runs the pod; it stays Pending until "
                     "kube-controller-manager's pod garbage collector deletes it, about 40 s later", 4),
    ("h100-single", "node h100-single exists and gpu-placement would take GPU pods there (ready), but the pod skips "
                    "its per-pod checks", 0),
])
def test_node_name_bypasses_every_scheduler(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            node: str, says: str, code: int) -> None:
    """P11: explain said kube-scheduler rejects a nodeName pod ('19 node(s) didn't satisfy plugin(s) [NodeName]')."""
    status, out = explain(tmp_path, capsys, gpu_pod("research", gpus=1, nodeName=node), "--snapshot", str(snapshot))
    assert f"kube-scheduler: never sees this pod (spec.nodeName is {node})" in out
    assert says in out
    assert "[NodeName]" not in out and status == code


def test_a_namespace_that_does_not_exist(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """P14: `-n tema-a` said 'has no GPU access: ask the platform team to set gpu-placement.io/quota'."""
    pod = gpu_pod("team-a")
    del pod["metadata"]["namespace"]  # a pod naming team-a with -n tema-a is refused, as kubectl refuses it
    status, out = explain(tmp_path, capsys, pod, "-n", "tema-a", "--snapshot", str(snapshot))
    assert ("  refused: namespace tema-a does not exist (not in the cluster or the snapshot): the API server refuses "
            'the pod (namespaces "tema-a" not found)') in out
    assert status == 3


def test_a_job_is_added_up_against_its_quota(snapshot: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """P4: a Job of 4 × 2 GPUs in vision (quota 4) was 'allowed'; the replica count was printed and not used."""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "sweep", "namespace": "vision"},
           "spec": {"parallelism": 4, "template": {"spec": gpu_pod("vision")["spec"]}}}
    status, out = explain(tmp_path, capsys, job, "--snapshot", str(snapshot))
    assert "workload Job vision/sweep: 4 pods × 2 nvidia.com/gpu = 8 nvidia.com/gpu" in out
    assert ("  quota of namespace vision: 4 nvidia.com/gpu (uses 0, 4 left): 2 of 4 pods are admitted, 2 denied (the "
            "Job controller retries them, with FailedCreate events on the Job, as quota frees)") in out
    assert status == 3


def test_a_pytorchjob_that_can_never_run_whole(snapshot: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """P4: 1 Master + 3 Workers × 8 GPUs in team-a (quota 16, 8 used): each block said 'allowed'."""
    template = {"spec": gpu_pod("team-a", gpus=8)["spec"]}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "llm", "namespace": "team-a"},
           "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template},
                                            "Worker": {"replicas": 3, "template": template}}}}
    status, out = explain(tmp_path, capsys, job, "--snapshot", str(snapshot), "-o", "json")
    answer = orjson.loads(out)
    lines = answer["summary"]["lines"]
    assert lines[0] == ("workload PyTorchJob team-a/llm: 1 pod × 8 nvidia.com/gpu (Master) + 3 pods × 8 nvidia.com/gpu "
                        "(Worker) = 32 nvidia.com/gpu")
    assert "1 of 4 pods are admitted, 3 denied" in lines[1]
    assert lines[2].startswith("  this PyTorchJob can never run all its replicas at once: it needs 32 nvidia.com/gpu, "
                               "more than the quota itself (16 nvidia.com/gpu)")
    assert answer["summary"]["denied_pods"] == 3 and status == answer["exit_status"] == 3


def test_a_deployment_that_fits(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "research"},
              "spec": {"replicas": 2, "template": {"spec": gpu_pod("research", gpus=1)["spec"]}}}
    status, out = explain(tmp_path, capsys, deploy, "--snapshot", str(snapshot))
    assert "workload Deployment research/web: 2 pods × 1 nvidia.com/gpu = 2 nvidia.com/gpu" in out
    assert "every pod is admitted" in out and "room: the nodes that pass have room for all 2 admitted pods now" in out
    assert status == 0


def test_misspelt_pod_annotations_are_named_with_the_key_meant(snapshot: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """P3: `gpu-product` and `gpumemory` were dropped without a word ("warnings": [])."""
    pod = gpu_pod("vision", gpus=1)
    pod["metadata"]["annotations"] = {"gpu-placement.io/gpu-product": "NVIDIA-A10G",
                                      "gpu-placement.io/gpumemory": "20Gi", "gpu-placement.io/pools": "training"}
    _status, out = explain(tmp_path, capsys, pod, "--snapshot", str(snapshot), "-o", "json")
    warnings = orjson.loads(out)["webhook"]["warnings"]
    assert ("annotation gpu-placement.io/gpu-product on pod vision/p is not read by gpu-placement, so the pod gets its "
            "namespace's defaults instead: did you mean gpu-placement.io/gpu-products?") in warnings
    assert any(w.endswith("did you mean gpu-placement.io/gpu-memory?") for w in warnings)
    assert ("annotation gpu-placement.io/pools on pod vision/p is a namespace annotation, not read on a pod: set it on "
            "the namespace (the platform team's), or remove it from the pod") in warnings


def test_a_misspelt_namespace_key_gets_the_closest_one(snapshot: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """P2: `gpu-placement.io/qouta` warned without a 'did you mean'."""
    typo = namespace("typo1", {"gpu-placement.io/qouta": "nvidia.com/gpu=4"})
    _status, out = explain(tmp_path, capsys, [typo, gpu_pod("typo1", gpus=8)], "--snapshot", str(snapshot))
    assert ("warning: annotation gpu-placement.io/qouta on namespace typo1 is not read by gpu-placement: did you mean "
            "gpu-placement.io/quota?") in out


NEWEST = ngc_table().newest  # 26.03 as of 2026-12-07


@pytest.mark.parametrize(("image", "why"), [
    ("nvcr.io/nvidia/pytorch:26.05-py3", "nvcr.io/nvidia/pytorch:26.05-py3: NGC release 26.05 is newer than "
                                         f"gpu-placement's table of NGC releases (its last is {NEWEST}; a platform "
                                         "engineer adds it to ngcReleases in the configuration)"),
    ("nvcr.io/nvidia/pytorch:25.07-py3", "nvcr.io/nvidia/pytorch:25.07-py3: NGC release 25.07 is not in "
                                         f"gpu-placement's table of NGC releases (22.09 to {NEWEST}, "),
    ("vllm/vllm-openai:v0.6.3", "vllm/vllm-openai:v0.6.3: vLLM tags name the vLLM release, not the CUDA it was built "
                                "with"),
    ("nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3.3", "NIM tags name the model's release, not its CUDA"),
    ("ghcr.io/acme/train:v2", "ghcr.io/acme/train:v2: its tag names no CUDA version"),
])
def test_no_cuda_inferred_is_said_with_the_fix(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               image: str, why: str) -> None:
    """P8: new NGC releases, vLLM and NIM images got no CUDA requirement and no note saying so."""
    _status, out = explain(tmp_path, capsys, gpu_pod("vision", gpus=1, image=image), "--snapshot", str(snapshot))
    line = next(line for line in out.splitlines() if line.startswith("  no CUDA requirement inferred"))
    assert why in line
    assert line.endswith("no node's driver is checked against the images: set gpu-placement.io/cuda on the pod (e.g. "
                         "\"12.4\", the CUDA its image was built with) or NVIDIA_REQUIRE_CUDA in the container's env")


def test_cu_variant_tags_and_a_new_ngc_release_are_inferred(snapshot: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    _, out = explain(tmp_path, capsys, gpu_pod("vision", gpus=1, image="vllm/vllm-openai:v0.11.0-cu130"),
                          "--snapshot", str(snapshot))
    assert "CUDA >= 13.0 (image tag of container main (cu130), minor-version compatible)" in out
    assert "no CUDA requirement inferred" not in out
    _status, out = explain(tmp_path, capsys, gpu_pod("vision", gpus=1, image="nvcr.io/nvidia/pytorch:26.03-py3"),
                          "--snapshot", str(snapshot))
    assert "NGC pytorch 26.03 of container main, CUDA 13.2.0 by the NGC support matrix" in out
