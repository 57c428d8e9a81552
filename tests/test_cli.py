"""The command line as a user runs it: the installed console script, its output and exit status."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import yaml

from gpu_placement.app.cli import build_parser, main
from gpu_placement.app.demo import write_snapshot
from gpu_placement.samples.cluster import make_pod

SCRIPT = str(Path(sys.executable).with_name("gpu-placement"))


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.json"
    write_snapshot(str(path))
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60, check=False)


def test_nodes_prints_one_line_per_node_with_verdicts(snapshot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nodes", "--snapshot", str(snapshot), "-o", "wide"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["NODE", "STATE", "PRODUCT"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert len(rows) == 22  # the demo's 20 and the survey's two (demo_cluster.survey_objects)
    assert rows["h100-train-hand"].split()[1] == "NotValidated"  # installed by hand: no operator validator
    assert rows["h100-upgrading"].split()[1] == "DriverUpgrade"
    assert rows["h100-not-validated"].split()[1] == "NotValidated"
    assert rows["h100-bad-label"].split()[1] == "BadLabel"
    assert "nvidia.com/gpu.memory='abc'" in rows["h100-bad-label"]
    assert rows["a100-vgpu"].split()[1:3] == ["ready", "GRID-A100-40C"]
    assert "580.126.09" in rows["a100-vgpu"] and "13.0" in rows["a100-vgpu"]
    assert "652472/163118" in rows["h100-train-1"]  # 8 x 81559 MiB, 6 GPUs held by pretrain-0


@pytest.mark.parametrize(("args", "message"), [
    (["nodes", "--snapshot", "/does/not/exist"], "/does/not/exist: no such file or folder"),
    (["serve", "--extender-listen", "nope"], "is not HOST:PORT"),
    (["serve", "--components", "scheduler"], "components are extender and/or webhook"),
    (["serve", "--ca-overlap", "10"], "'10' is not a positive duration such as 90s"),
    (["serve", "--ca-lifetime", "0s"], "'0s' is not a positive duration"),
    (["serve", "--manage-certs", "--ca-lifetime", "60s"], "--renew-ca-before must be shorter than --ca-lifetime"),
])
def test_bad_usage_exits_2_with_one_line(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert message in result.stderr


def test_snapshot_that_does_not_parse_names_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"kind": "List", "items": [')
    result = run("nodes", "--snapshot", str(bad))
    assert result.returncode == 2
    assert result.stderr.startswith(f"gpu-placement nodes: {bad}: not valid JSON")
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_config_names_the_key(tmp_path: Path, snapshot: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("mode: loud\n")
    result = run("nodes", "--snapshot", str(snapshot), "--config", str(config))
    assert result.returncode == 2
    assert "mode must be one of enforce, audit, got 'loud'" in result.stderr


def test_explain_rejects_a_file_that_is_not_a_pod(tmp_path: Path, snapshot: Path) -> None:
    pod_file = tmp_path / "svc.yaml"
    pod_file.write_text("kind: Service\nspec: {}\n")
    result = run("explain", str(pod_file), "--snapshot", str(snapshot))
    assert result.returncode == 2
    assert "svc.yaml: a Service without a name: no pod template found" in result.stderr


def test_explain_shows_webhook_change_and_every_node(tmp_path: Path, snapshot: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    pod = make_pod("research", "cuda13", gpus={"nvidia.com/gpu": 1},
                   image="nvcr.io/nvidia/cuda:13.0.0-devel-ubuntu24.04")
    pod_file = tmp_path / "pod.json"
    pod_file.write_bytes(orjson.dumps(pod))
    assert main(["explain", str(pod_file), "--snapshot", str(snapshot)]) == 0
    out = capsys.readouterr().out
    assert "webhook:" in out and "/spec/tolerations" in out and "allowed" in out
    # which rule applies to each CUDA need: the namespace's floor is strict, the image's minor-compatible
    assert ("needs 1x nvidia.com/gpu; CUDA >= 12.4 (namespace default, strict); CUDA >= 13.0.0 (image tag of "
            "container main, minor-version compatible)") in out
    assert "would go to a100-vgpu" in out
    rows = {line.split()[0]: line.split()[1] for line in out.split("NODE ", 1)[1].splitlines()[1:] if line}
    assert rows["a100-vgpu"] == "pass"
    assert rows["h100-single"] == "DriverTooOld"
    assert rows["v100-legacy"] == "ComputeCapability"  # CUDA 13 on Volta: no driver fixes that
    assert len(rows) == 22


def _options_without_help(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += _options_without_help(sub, (*path, name))
        elif not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"gpu-placement {' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_option_of_every_command_says_what_it_does() -> None:
    """B8 of the wave 5 trial: `certs --help` listed --out, --service and --namespace with nothing beside them."""
    assert _options_without_help(build_parser()) == []


def test_certs_help_describes_each_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["certs", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--out DIR folder to write ca.crt, tls.crt and tls.key (0600) into" in text
    assert "--service NAME the webhook's Service: the certificate names NAME, NAME.NS, NAME.NS.svc" in text
    assert "--namespace NS the namespace of that Service" in text


JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "media"},
       "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
           {"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}


@pytest.mark.parametrize("command", [["explain", "POD"], ["nodes"], ["rollout"], ["survey"], ["migrate", "h100-1"],
                                     ["serve", "--components", "extender"]])
def test_a_file_that_is_not_a_snapshot_is_refused(command: list[str], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The wave 5 trial: a Job's YAML as --snapshot gave `0/0 nodes are available` (explain) and a
    SelectorMatchesNoGpuNode finding (survey), judged against a cluster without nodes."""
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(JOB))
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(make_pod("media", "p", gpus={"nvidia.com/gpu": 1})))
    args = [str(tmp_path / "pod.yaml") if word == "POD" else word for word in command]
    assert main([*args, "--snapshot", str(tmp_path / "train.yaml")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"gpu-placement {command[0]}: no nodes in {tmp_path / 'train.yaml'} (it holds 1 Job): is "
                            "it a snapshot? Make one with gpu-placement demo --write-snapshot FILE, or kubectl get "
                            "nodes,pods,namespaces,configmaps -A -o json > cluster.json\n")


def test_a_pod_list_is_no_snapshot_either_and_namespaces_needs_only_namespaces(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = {"apiVersion": "v1", "kind": "PodList", "items": [make_pod("media", "p", gpus={"nvidia.com/gpu": 1})]}
    (tmp_path / "pods.json").write_text(orjson.dumps(pods).decode())
    assert main(["explain", "pod/p", "-n", "media", "--snapshot", str(tmp_path / "pods.json")]) == 2
    assert capsys.readouterr().err.startswith(f"gpu-placement explain: no nodes in {tmp_path / 'pods.json'} (it holds "
                                              "1 Pod): is it a snapshot?")
    assert main(["namespaces", "--snapshot", str(tmp_path / "pods.json")]) == 2
    assert capsys.readouterr().err.startswith(f"gpu-placement namespaces: no namespaces in {tmp_path / 'pods.json'} "
                                              "(it holds 1 Pod): is it a snapshot?")
    spaces = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "annotations": {
            "gpu-placement.io/quota": "nvidia.com/gpu=4"}}}]}
    (tmp_path / "namespaces.json").write_text(orjson.dumps(spaces).decode())
    assert main(["namespaces", "--snapshot", str(tmp_path / "namespaces.json")]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:3] == ["team-a", "opted-in", "-"]
