"""Which namespace `explain FILE` judges a pod in: kubectl's (S3 and S5 of shared/review/ux-trial.md, wave 5).

`kubectl create -f` puts an object without a namespace in the kubeconfig context's namespace, and with
`--namespace` refuses an object that names another (k8s.io/cli-runtime pkg/resource/visitor.go,
RequireNamespace, used when the flag is given). explain used to judge the first as `default/...` and
the second under the flag's namespace. Against the fake API server, with a kubeconfig whose context
`ux-c` is in namespace research (quota 2 GPUs) while `default` has no GPU access.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from gpu_placement.app.cli import main
from gpu_placement.app.demo import demo_config_map
from gpu_placement.samples.cluster import demo_objects
from tests.fakeapi import FakeApiServer

pytestmark = pytest.mark.timeout(120)

MISMATCH = ("the namespace from the provided object \"media\" does not match the namespace \"research\". You must "
            "pass '--namespace=media' to perform this operation.")


def pod_file(path: Path, namespace: str | None = None) -> Path:
    meta = {"name": "dev-1", **({"namespace": namespace} if namespace else {})}
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [
        {"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
         "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}))
    return path


@pytest.fixture
def kubeconfig(fake_api: FakeApiServer, tmp_path: Path) -> Path:
    """The fake API server's kubeconfig with a second context, ux-c, whose namespace is research."""
    fake_api.load([*demo_objects(), demo_config_map()])
    config = fake_api.kubeconfig()
    context = {**config["contexts"][0]["context"], "namespace": "research"}
    config["contexts"].append({"name": "ux-c", "context": context})
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_a_file_without_a_namespace_is_judged_in_the_contexts(kubeconfig: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["explain", str(pod_file(tmp_path / "dev.yaml")), "--kubeconfig", str(kubeconfig),
                   "--context", "ux-c"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "pod research/dev-1"
    assert lines[1] == ("namespace: research, context ux-c's (the file names none and -n is not given, so kubectl "
                        "create -f would create it there)")
    assert "  allowed" in out and "DENIED" not in out and "default" not in out.split("webhook:")[0]
    assert status == 0

    main(["explain", str(tmp_path / "dev.yaml"), "--kubeconfig", str(kubeconfig), "--context", "ux-c", "-o", "json"])
    answer = orjson.loads(capsys.readouterr().out)
    assert answer["pod"] == "research/dev-1" and answer["namespace_chosen"].startswith("research, context ux-c's")


def test_the_files_own_namespace_wins_over_the_contexts(kubeconfig: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """kubectl create -f with an object in media and the context in research: created in media."""
    main(["explain", str(pod_file(tmp_path / "media.yaml", "media")), "--kubeconfig", str(kubeconfig),
          "--context", "ux-c"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "pod media/dev-1" and not lines[1].startswith("namespace:")


def test_minus_n_that_contradicts_the_file_is_refused_as_kubectl_refuses_it(
        kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = pod_file(tmp_path / "media.yaml", "media")
    status = main(["explain", str(path), "-n", "research", "--kubeconfig", str(kubeconfig)])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    assert captured.err == f"gpu-placement explain: {path}: {MISMATCH}\n"
    # A workload the same way; -n naming the file's own namespace is fine.
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "media"},
           "spec": {"template": yaml.safe_load(path.read_text()) | {"metadata": {}}}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert main(["explain", str(tmp_path / "job.yaml"), "-n", "research", "--snapshot", "unused.json"]) == 2
    assert capsys.readouterr().err == f"gpu-placement explain: {tmp_path / 'job.yaml'}: {MISMATCH}\n"
    assert main(["explain", str(path), "-n", "media", "--kubeconfig", str(kubeconfig)]) == 0
    assert capsys.readouterr().out.startswith("pod media/dev-1\n")


def test_a_snapshot_has_no_context_so_default_and_it_says_so(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--write-snapshot", str(tmp_path / "cluster.json")]) == 0
    status = main(["explain", str(pod_file(tmp_path / "dev.yaml")), "--snapshot", str(tmp_path / "cluster.json")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["pod default/dev-1", "namespace: default (the file names none and -n is not given; a "
                         "snapshot has no kubeconfig context, so default, as kubectl with a context without a "
                         "namespace; -n NS to judge it elsewhere)"]
    assert status == 3  # the demo cluster has no namespace default
