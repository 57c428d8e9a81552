"""`gpu-placement rollout`: on a snapshot, on a live cluster (the fake API server, with its
ClusterPolicy), with XID figures from a real Prometheus; and the next wave as the GPU Operator's
upgrade controller counts it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.app.cli import main
from gpu_placement.app.demo import write_snapshot
from gpu_placement.base.config import parse_config
from gpu_placement.report.rollout import next_wave
from gpu_placement.samples.cluster import cluster_policy, demo_objects, driver_labels, make_node, wave_objects
from tests.fakeapi import FakeApiServer
from tests.prometheus import PrometheusServer, Series, openmetrics

STEP = 15.0


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.json"
    write_snapshot(str(path))
    return path


def rollout(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["rollout", *args, "-o", "json"]) == 0
    return dict(orjson.loads(capsys.readouterr().out))


def test_rollout_of_a_snapshot(snapshot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rollout", "--snapshot", str(snapshot)]) == 0
    text = capsys.readouterr().out
    # judged with the configuration the snapshot's chart ConfigMap holds (the demo's: strict)
    assert text.startswith("Driver soak: 60 minutes, strict (rollout.soakMinutes, rollout.soak)\n")
    assert "Configuration: ConfigMap gpu-placement/gpu-placement-config" in text
    assert "XID/NODE-HOUR: no telemetry (set telemetry.url in --config, or --prometheus URL)" in text
    report = rollout(capsys, "--snapshot", str(snapshot))
    newest = report["versions"][0]
    assert (newest["version"], newest["release"], newest["nodes"]) == ("580.126.09", "newest", 3)
    assert newest["states"] == {"done": 1, "pending": 0, "upgrading": 0, "soaking": 2, "failed": 0}
    nodes = {n["node"]: n for n in report["nodes"]}
    assert 40 * 60 - 120 < nodes["h100-batch-2"]["soakLeftSeconds"] <= 40 * 60  # Ready 20 minutes before the snapshot
    assert nodes["h100-batch-4"]["state"] == "pending" and nodes["h100-upgrading"]["state"] == "upgrading"
    assert report["canaryNamespaces"] == ["batch-canary"]
    assert report["nextWave"]["nodes"] == 0 and report["nextWave"]["pending"] == 2
    assert report["nextWave"]["target"] == "580.126.09"


def _wave(states: dict[str, str], unschedulable: tuple[str, ...] = ()) -> Any:
    nodes = [make_node(name, "h100", labels={"nvidia.com/gpu-driver-upgrade-state": state,
                                             **driver_labels("550.54.15", "12.4")},
                       unschedulable=name in unschedulable) for name, state in states.items()]
    return core_from_objects(parse_config({}), nodes).placement.rollout


def policy(**upgrade: Any) -> dict[str, Any]:
    obj = cluster_policy()
    obj["spec"]["driver"]["upgradePolicy"] = {"autoUpgrade": True, **upgrade}
    return obj


@pytest.mark.parametrize(("states", "unschedulable", "upgrade", "takes"), [
    # 8 nodes waiting, none in flight: maxParallelUpgrades 1 -> 1
    ({f"n{i}": "upgrade-required" for i in range(8)}, (), {"maxParallelUpgrades": 1}, 1),
    # maxParallelUpgrades 0 is "no limit": every waiting node, within maxUnavailable 25% of 8 = 2
    ({f"n{i}": "upgrade-required" for i in range(8)}, (), {"maxParallelUpgrades": 0, "maxUnavailable": "25%"}, 2),
    # 25% of 9 rounds up to 3
    ({f"n{i}": "upgrade-required" for i in range(9)}, (), {"maxParallelUpgrades": 0, "maxUnavailable": "25%"}, 3),
    # a failed node holds a parallel slot, like one in flight
    ({"a": "upgrade-failed", "b": "upgrade-required", "c": "upgrade-done"}, (), {"maxParallelUpgrades": 1}, 0),
    # two cordoned nodes already use maxUnavailable 2
    ({f"n{i}": "upgrade-required" for i in range(6)} | {"x": "upgrade-done", "y": "upgrade-done"}, ("x", "y"),
     {"maxParallelUpgrades": 4, "maxUnavailable": 2}, 0),
    # one cordoned of maxUnavailable 3: 2 more
    ({f"n{i}": "upgrade-required" for i in range(6)} | {"x": "upgrade-done"}, ("x",),
     {"maxParallelUpgrades": 4, "maxUnavailable": 3}, 2),
])
def test_the_next_wave_is_the_upgrade_controllers_arithmetic(states: dict[str, str], unschedulable: tuple[str, ...],
                                                             upgrade: dict[str, Any], takes: int) -> None:
    assert next_wave(_wave(states, unschedulable), policy(**upgrade))["nodes"] == takes


def test_the_next_wave_says_why_it_is_unknown_or_none() -> None:
    wave = _wave({"a": "upgrade-required"})
    assert next_wave(wave, None, "no ClusterPolicy CRD")["why"] == "unknown: no ClusterPolicy CRD"
    off = cluster_policy()
    off["spec"]["driver"]["upgradePolicy"]["autoUpgrade"] = False
    assert next_wave(wave, off)["nodes"] == 0 and "autoUpgrade is off" in next_wave(wave, off)["why"]
    crd = cluster_policy()
    crd["spec"]["driver"]["useNvidiaDriverCRD"] = True
    assert next_wave(wave, crd)["nodes"] is None


def test_rollout_of_the_live_cluster(fake_api: FakeApiServer, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The API server stamps every object it creates: to it these are new nodes, whose first driver
    soaks only while no other node runs that version past its soak."""
    fake_api.load(wave_objects())
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    report = rollout(capsys, "--kubeconfig", str(kubeconfig))
    assert report["versions"][0]["states"] == {"done": 0, "pending": 0, "upgrading": 0, "soaking": 2, "failed": 0}
    assert report["nextWave"]["why"].startswith("ClusterPolicy cluster-policy: maxParallelUpgrades 1 with 0 in flight")
    assert report["nextWave"]["nodes"] == 1
    # With a node that has run 580.126.09 for long (the demo's a100-vgpu), new nodes on it do not soak.
    fake_api.load(demo_objects())
    assert rollout(capsys, "--kubeconfig", str(kubeconfig))["versions"][0]["states"]["soaking"] == 0
    assert main(["rollout", "--kubeconfig", str(kubeconfig), "--snapshot", "x"]) == 2


def _series(now: float, node: str, metric: str, value: Any) -> Series:
    samples, at = [], now - 1800
    while at <= now - STEP:
        samples.append((at, float(value(now - at) if callable(value) else value)))
        at += STEP
    return metric, {"Hostname": node, "gpu": "0", "UUID": f"GPU-{node}"}, samples


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    now = time.time()
    series = [_series(now, f"h100-batch-{i}", "DCGM_FI_DEV_FB_FREE", 80000) for i in (1, 2, 3, 4)]
    series += [_series(now, "h100-batch-2", "DCGM_FI_DEV_XID_ERRORS", lambda age: 79 if age < 120 else 0),
               _series(now, "h100-batch-3", "DCGM_FI_DEV_XID_ERRORS", 0)]
    server = PrometheusServer(Path(tmp_path_factory.mktemp("prometheus")), openmetrics(series))
    yield server
    server.stop()


def test_xid_figures_come_from_prometheus_and_an_xid_fails_a_soak(
        snapshot: Path, prometheus: PrometheusServer, capsys: pytest.CaptureFixture[str]) -> None:
    report = rollout(capsys, "--snapshot", str(snapshot), "--prometheus", prometheus.url)
    assert report["telemetry"] == {"url": prometheus.url, "error": None}
    versions = {v["version"]: v for v in report["versions"]}
    # one XID event (79 two minutes ago) over the two 580 nodes with readings, in a 10-minute window
    assert versions["580.126.09"]["xidPerNodeHour"] == pytest.approx(3.0)
    assert versions["550.54.15"]["xidPerNodeHour"] == 0.0
    assert versions["580.126.09"]["states"]["failed"] == 1
    nodes = {n["node"]: n for n in report["nodes"]}
    assert nodes["h100-batch-2"]["why"] == "DCGM reported an XID error during the soak"
    assert nodes["h100-batch-3"]["state"] == "soaking"
    assert main(["rollout", "--snapshot", str(snapshot), "--prometheus", "http://127.0.0.1:9"]) == 0
    assert "XID/NODE-HOUR: Prometheus at http://127.0.0.1:9 failed" in capsys.readouterr().out
