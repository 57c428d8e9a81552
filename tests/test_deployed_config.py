"""`explain` and `nodes` judge with the configuration the running service uses: the chart's ConfigMap,
found by label in the cluster (or the snapshot), unless `--config FILE` says otherwise; they say which.

Against the fake API server through a kubeconfig, as a platform engineer runs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gpu_placement.app.cli import build_parser, main
from gpu_placement.app.demo import DEMO_CONFIG, demo_config_map
from gpu_placement.samples.cluster import demo_objects, make_pod
from tests.fakeapi import FakeApiServer

POOLED = make_pod("team-a", "train-0", gpus={"nvidia.com/gpu": 1})  # team-a: gpu-placement.io/pools=training


def _config_map(config: dict[str, Any], name: str = "gpu-placement-config", ns: str = "gpu-placement"
                ) -> dict[str, Any]:
    cm = demo_config_map()
    cm["metadata"] |= {"name": name, "namespace": ns}
    cm["data"]["config.yaml"] = yaml.safe_dump(config)
    return cm


@pytest.fixture
def kubeconfig(fake_api: FakeApiServer, tmp_path: Path) -> Path:
    fake_api.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    fake_api.load(demo_objects())
    return fake_api.write_kubeconfig(tmp_path / "kubeconfig")


def _explain(kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    file = tmp_path / "pod.json"
    file.write_bytes(orjson.dumps(POOLED))
    status = main(["explain", str(file), "--kubeconfig", str(kubeconfig), "-o", "json", *args])
    answer = dict(orjson.loads(capsys.readouterr().out))
    assert status == answer["exit_status"] and status in (0, 3, 4)  # 3: denied, 4: no node (explain.md)
    return answer


def test_the_chart_configmap_decides_and_the_answer_says_so(fake_api: FakeApiServer, kubeconfig: Path,
                                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: a pool `training` in the chart's configuration and a namespace annotated
    pools=training. With built-in defaults explain said DENIED ('the configuration defines no pools')
    for a pod the cluster admits."""
    fake_api.add(demo_config_map())
    answer = _explain(kubeconfig, tmp_path, capsys)
    assert answer["configuration"] == "ConfigMap gpu-placement/gpu-placement-config in context fake"
    assert answer["webhook"]["allowed"] is True
    patch = {op["path"]: op.get("value") for op in answer["webhook"]["patch"]}
    assert patch["/spec/nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "training"}


def test_without_the_configmap_the_defaults_are_used_and_named(kubeconfig: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    answer = _explain(kubeconfig, tmp_path, capsys)
    assert answer["configuration"].startswith(
        "built-in defaults: no ConfigMap labelled app.kubernetes.io/part-of=gpu-placement with config.yaml in "
        "context fake")
    assert answer["webhook"]["allowed"] is False
    assert "the configuration defines no pools" in answer["webhook"]["message"]


def test_config_file_overrides_the_cluster(fake_api: FakeApiServer, kubeconfig: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.add(demo_config_map())
    file = tmp_path / "mine.yaml"
    file.write_text(yaml.safe_dump({**DEMO_CONFIG, "mode": "audit", "pools": {}}))
    answer = _explain(kubeconfig, tmp_path, capsys, "--config", str(file))
    assert answer["configuration"] == f"--config {file}"
    assert answer["webhook"]["allowed"] is True and answer["webhook"]["warnings"]  # audit: warns, never denies


def test_nodes_reads_the_deployed_validator_setting(fake_api: FakeApiServer, kubeconfig: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """validator.required=false in the chart: a node without a Ready validator is ready, as the service sees it."""
    assert main(["nodes", "--kubeconfig", str(kubeconfig)]) == 0
    out, err = capsys.readouterr()
    assert _verdict(out, "h100-not-validated") == "NotValidated" and "configuration: built-in defaults" in err
    fake_api.add(_config_map({**DEMO_CONFIG, "validator": {"required": False}}))
    assert main(["nodes", "--kubeconfig", str(kubeconfig)]) == 0
    out, err = capsys.readouterr()
    assert _verdict(out, "h100-not-validated") == "ready"
    assert err.strip() == "configuration: ConfigMap gpu-placement/gpu-placement-config in context fake"


def _verdict(table: str, node: str) -> str:
    return next(line.split()[1] for line in table.splitlines() if line.startswith(node + " "))


def test_a_forbidden_cluster_wide_list_falls_back_to_the_chart_namespace(
        fake_api: FakeApiServer, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.add(demo_config_map())
    fake_api.fail_next(1, 403, method="GET", path="/api/v1/configmaps")
    answer = _explain(kubeconfig, tmp_path, capsys)
    assert answer["configuration"] == "ConfigMap gpu-placement/gpu-placement-config in context fake"
    assert fake_api.count("list", "/api/v1/namespaces/gpu-placement/configmaps") == 1


def test_refused_configmaps_say_so_and_name_the_way_out(fake_api: FakeApiServer, kubeconfig: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.add(demo_config_map())
    fake_api.fail_next(1, 403, method="GET", path="/api/v1/configmaps")
    fake_api.fail_next(1, 403, method="GET", path="/api/v1/namespaces/gpu-placement/configmaps")
    assert main(["nodes", "--kubeconfig", str(kubeconfig)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("configuration: built-in defaults: ConfigMaps could not be read (GET /api/v1/configmaps "
                          "(context fake): HTTP 403 Forbidden")
    assert err.strip().endswith("pass --config FILE with the deployed configuration")


def test_two_releases_or_a_broken_configmap_are_refused_with_the_fix(
        fake_api: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.add(demo_config_map())
    fake_api.add(_config_map({"mode": "audit"}, "other-config", "default"))
    assert main(["nodes", "--kubeconfig", str(kubeconfig)]) == 2
    err = capsys.readouterr().err
    assert ("2 gpu-placement configurations in context fake (default/other-config, "
            "gpu-placement/gpu-placement-config): choose one with --config FILE") in err
    fake_api.delete("ConfigMap", "other-config", "default")
    fake_api.add(_config_map({"mode": "loud"}, "gpu-placement-config", "default"))
    fake_api.delete("ConfigMap", "gpu-placement-config", "gpu-placement")
    assert main(["nodes", "--kubeconfig", str(kubeconfig)]) == 2
    assert ("ConfigMap default/gpu-placement-config (config.yaml) in context fake: mode must be one of enforce, "
            "audit") in capsys.readouterr().err


def test_the_snapshot_carries_the_configuration_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--write-snapshot", str(tmp_path / "demo.json")]) == 0
    file = tmp_path / "pod.json"
    file.write_bytes(orjson.dumps(POOLED))
    assert main(["explain", str(file), "--snapshot", str(tmp_path / "demo.json")]) == 0
    out = capsys.readouterr().out
    assert f"configuration: ConfigMap gpu-placement/gpu-placement-config in snapshot {tmp_path / 'demo.json'}" in out
    assert "\n  allowed" in out


def test_config_has_help_text() -> None:
    parser = build_parser()
    for command in ("explain", "nodes"):
        sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        text = sub.format_help()
        assert "--config FILE" in text and "the deployed one, the chart's ConfigMap" in " ".join(text.split())
