"""A driver pod recreated with the driver the node already ran is a reinstall, not a change
(docs/rollouts.md, "What counts as a change"): the node does not soak, under `rollout.soak: strict`
no ordinary pod is refused there, and a real version change still soaks. What tells them apart is the
node's `gpu-placement.io/settled-driver`, written by one replica (the leader) and read by all, so a
replica that starts later, from the same objects, decides the same."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gpu_placement.app.cli import main
from gpu_placement.base.config import Config, parse_config
from gpu_placement.controllers.settled_drivers import SettledDrivers, SettledSettings
from gpu_placement.decide.placement import Placement
from gpu_placement.decide.rollout import Rollout
from gpu_placement.facts.soak import DONE, SOAKING, UPGRADING
from gpu_placement.observe import metrics
from gpu_placement.samples.cluster import driver_labels, driver_pod, make_node, make_pod, namespace, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import FakeApiServer
from tests.support.live import FAST
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)
DAY = 86400.0
OLD, NEW = ("550.54.15", "12.4"), ("580.126.09", "13.0")
SETTLED = "gpu-placement.io/settled-driver"
STRICT = {"rollout": {"soak": "strict"}}
QUICK = SettledSettings(lease_name="drivers-lock", lease_seconds=1, renew_seconds=0.05, settle_seconds=0.0,
                        writes_per_second=1000, burst=1000)


def gpu_node(name: str, driver: tuple[str, str], settled: str | None = None, created: float | None = None
             ) -> dict[str, Any]:
    node = make_node(name, "h100x8", labels=driver_labels(*driver), created=created or time.time() - 100 * DAY)
    if settled is not None:
        node["metadata"]["annotations"] = {SETTLED: settled}
    return node


def job(ns: str = "team") -> dict[str, Any]:
    pod = make_pod(ns, "train", gpus={"nvidia.com/gpu": 1}, image="nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04")
    del pod["status"]
    return pod


# -- as a user sees it: explain and rollout on a snapshot -------------------------------------------------------

def snapshot(tmp_path: Path) -> tuple[Path, Path]:
    """h100-a1: its driver pod replaced 10 minutes ago by one of the same 550.54.15 (a reinstall);
    h100-a2: moved from 550.54.15 to 580.126.09, Ready 10 minutes ago (a change); h100-a3: untouched."""
    now = time.time()
    objects = [namespace("team"), namespace("canary", {"gpu-placement.io/canary": "true"}), namespace("gpu-operator"),
               gpu_node("h100-a1", OLD, "550.54.15"), driver_pod("h100-a1", OLD[0], now - 360, created=now - 600),
               validator_pod("h100-a1"),
               gpu_node("h100-a2", NEW, "550.54.15"), driver_pod("h100-a2", NEW[0], now - 600, created=now - 900),
               validator_pod("h100-a2"),
               gpu_node("h100-a3", OLD, "550.54.15"), driver_pod("h100-a3", OLD[0], now - 40 * DAY),
               validator_pod("h100-a3")]
    cluster = tmp_path / "cluster.json"
    cluster.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    config = tmp_path / "strict.yaml"
    config.write_text(yaml.safe_dump(STRICT))
    return cluster, config


def test_explain_a_same_version_reinstall_refuses_no_ordinary_pod_under_strict_soak(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster, config = snapshot(tmp_path)
    pod = tmp_path / "train.yaml"
    pod.write_text(yaml.safe_dump(job()))
    assert main(["explain", str(pod), "--snapshot", str(cluster), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("h100-")}
    assert lines["h100-a1"].split()[1] == "pass", out  # reinstalled 550.54.15: no soak
    assert lines["h100-a3"].split()[1] == "pass", out
    assert lines["h100-a2"].split()[1] == "DriverSoaking", out
    assert ("driver 580.126.09 is new on the node and is soaking: only pods of namespaces annotated "
            'gpu-placement.io/canary="true" run on it until it has run 60 minutes there') in lines["h100-a2"], out
    assert "changed" not in out


def test_rollout_shows_the_reinstalled_node_done_and_the_changed_one_soaking(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster, config = snapshot(tmp_path)
    assert main(["rollout", "--snapshot", str(cluster), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("550.", "580."))}
    assert rows["550.54.15"][2:8] == ["2", "2", "0", "0", "0", "0"]  # nodes, done, pending, upgrading, soaking, failed
    assert rows["580.126.09"][2:8] == ["1", "0", "0", "0", "1", "0"]
    soaking = next(line for line in out.splitlines() if line.startswith("h100-a2"))
    assert "new on the node: it ran 550.54.15 before; canary namespaces first until the soak ends" in soaking
    assert not any(line.startswith(("h100-a1", "h100-a3")) for line in out.splitlines())  # done: not listed


# -- the leader writes it; every replica and every restart reads it ---------------------------------------------

class Replica:
    """One process's view of the fake API server, its rollout on a clock `ahead` seconds past the wall
    clock, placement with strict soak, and the settled drivers' leader loop (stepped by hand)."""

    def __init__(self, fake: FakeApiServer, identity: str, ahead: list[float]) -> None:
        self.config: Config = parse_config(STRICT)
        self.view = ClusterView(self.config)
        self.api = fake.api_client()
        self.source = LiveSource(self.view, Ingest(self.config), self.api, FAST)
        self.source.start()
        wait_for(lambda: self.source.ready, what="the first full lists")
        self.rollout = Rollout(self.view, self.config, clock=lambda: time.time() + ahead[0])
        self.placement = Placement(self.view, self.config, self.rollout)
        self.recorder = SettledDrivers(self.api, self.rollout, "gpu-placement", identity, QUICK)

    def states(self) -> dict[str, str]:
        self.rollout.expire()
        return {name: self.rollout.soak(name).state for name in ("n1", "n2")}

    def refused(self) -> dict[str, str]:
        result = self.placement.filter(self.placement.requirements(job()), ["n1", "n2"])
        return {**result.failed, **result.unresolvable}

    def stop(self) -> None:
        self.recorder.stop()
        self.source.stop()
        self.api.close()


@pytest.fixture
def cluster() -> Iterator[tuple[FakeApiServer, Callable[[str], Replica], list[float]]]:
    fake = FakeApiServer().start()
    now = time.time()
    for obj in (namespace("gpu-placement"), namespace("gpu-operator"), namespace("team"),
                gpu_node("n1", OLD), gpu_node("n2", OLD), validator_pod("n1"), validator_pod("n2"),
                driver_pod("n1", OLD[0], now - 40 * DAY), driver_pod("n2", OLD[0], now - 40 * DAY)):
        fake.add(obj, keep_created=True)
    ahead = [0.0]
    made: list[Replica] = []

    def replica(identity: str) -> Replica:
        made.append(Replica(fake, identity, ahead))
        return made[-1]

    yield fake, replica, ahead
    for one in made:
        one.stop()
    fake.stop()


def settled(fake: FakeApiServer, node: str) -> str | None:
    found = fake.get("Node", node)
    return ((found or {}).get("metadata", {}).get("annotations") or {}).get(SETTLED)


def reinstall(fake: FakeApiServer, node: str, version: str) -> None:
    """What `kubectl delete pod nvidia-driver-daemonset-...` (or the upgrade controller) and the
    DaemonSet do: the pod goes, a new one (new uid) installs the driver and turns Ready."""
    fake.delete("Pod", f"nvidia-driver-daemonset-{node}", "gpu-operator")
    now = time.time()
    fake.add(driver_pod(node, version, now - 30, created=now - 200), keep_created=True)


def _ready_lately(replica: Replica, node: str) -> bool:
    """The node's driver pod in the replica's view turned Ready in the last minute. Read once: between
    the old pod's delete and the new one's add the view has no driver pod for the node."""
    driver = replica.rollout._driver(node)
    return driver is not None and driver.ready_since is not None and driver.ready_since > time.time() - 60


def test_the_leader_records_settled_drivers_and_a_reinstall_does_not_soak(
        cluster: tuple[FakeApiServer, Callable[[str], Replica], list[float]]) -> None:
    fake, replica, _ = cluster
    first = replica("replica-a")
    first.recorder.step()
    assert (settled(fake, "n1"), settled(fake, "n2")) == ("550.54.15", "550.54.15")
    assert metrics.SETTLED_DRIVER_LEADING.labels("drivers-lock")._value.get() == 1

    reinstall(fake, "n1", OLD[0])  # same driver, new pod
    wait_for(lambda: first.states()["n1"] == DONE and _ready_lately(first, "n1"), what="the new driver pod in the view")
    assert first.refused() == {}  # strict soak, ordinary pod: both nodes take it

    # A replica started now (a restart, or a standby) reads the same objects and decides the same.
    second = replica("replica-b")
    assert second.states() == first.states() == {"n1": DONE, "n2": DONE}
    assert second.refused() == {}


def test_a_version_change_still_soaks_everywhere_and_settles_after_its_soak(
        cluster: tuple[FakeApiServer, Callable[[str], Replica], list[float]]) -> None:
    fake, replica, ahead = cluster
    first = replica("replica-a")
    first.recorder.step()
    fake.patch_labels("Node", "n2", driver_labels(*NEW))  # GFD relabels once the new driver is loaded
    reinstall(fake, "n2", NEW[0])
    wait_for(lambda: first.states()["n2"] == SOAKING, what="n2 soaking")
    first.recorder.step()
    assert settled(fake, "n2") == "550.54.15"  # soaking is not settled: nothing written
    second = replica("replica-b")
    assert second.states() == first.states() == {"n1": DONE, "n2": SOAKING}
    refused = first.refused()
    assert list(refused) == ["n2"] and refused["n2"].startswith("DriverSoaking: driver 580.126.09 is new on the node")
    assert second.refused() == refused
    assert first.rollout.soak("n2").why == "new on the node: it ran 550.54.15 before"

    first.recorder.step()
    judged = first.recorder.judged
    ahead[0] = 3601.0  # past the soak: done, and now recorded as the node's settled driver
    first.recorder.step()  # the clock alone ended it: the pass judges that node only
    assert settled(fake, "n2") == "580.126.09" and first.recorder.judged == judged + 1
    assert first.states()["n2"] == DONE
    wait_for(lambda: second.view.nodes["n2"].settled_driver == (580, 126, 9), what="the annotation in the view")
    reinstall(fake, "n2", NEW[0])  # and a reinstall of the new driver is no change either
    wait_for(lambda: _ready_lately(second, "n2"), what="the new pod")
    assert second.states()["n2"] == DONE


def test_a_node_upgrading_or_with_labels_behind_its_pod_is_not_recorded(
        cluster: tuple[FakeApiServer, Callable[[str], Replica], list[float]]) -> None:
    fake, replica, _ = cluster
    first = replica("replica-a")
    reinstall(fake, "n1", NEW[0])  # the pod runs 580 while GFD still labels 550: upgrading
    wait_for(lambda: first.states()["n1"] == UPGRADING, what="n1 upgrading")
    first.recorder.step()
    assert settled(fake, "n1") is None and settled(fake, "n2") == "550.54.15"


def test_a_refused_patch_is_retried_and_counted(
        cluster: tuple[FakeApiServer, Callable[[str], Replica], list[float]]) -> None:
    fake, replica, _ = cluster
    first = replica("replica-a")
    first.recorder._lead()  # take the Lease first
    # the refusal is for n1's patch alone: on a slow machine the step renews the Lease first
    fake.fail_next(1, status=403, message="nodes \"n1\" is forbidden: cannot patch resource \"nodes\"",
                   method="PATCH", path="/api/v1/nodes/n1")
    before = metrics.SETTLED_DRIVER_WRITES.labels("refused")._value.get()
    first.recorder.step()
    assert metrics.SETTLED_DRIVER_WRITES.labels("refused")._value.get() == before + 1
    assert list(first.recorder.failures.errors) == ["n1"] and settled(fake, "n2") == "550.54.15"
    first.recorder.step()
    assert settled(fake, "n1") == "550.54.15" and not first.recorder.failures.errors
