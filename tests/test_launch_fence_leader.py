"""Launch fences kept in the cluster (docs/rules.md, LaunchFailures): the Lease holder writes each fence on its
Node, a replica started after the failed pods are gone still refuses the node, the Node's Events say when a
fence began and what lifted it, and the metrics count them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from gpu_placement.base.config import Config
from gpu_placement.base.timestamps import format_time
from gpu_placement.controllers.events import EventWriter, watch_fences
from gpu_placement.controllers.launch_fences import FenceSettings, LaunchFenceWriter
from gpu_placement.decide.placement import Placement
from gpu_placement.observe import metrics
from gpu_placement.samples.cluster import make_pod, namespace, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import FakeApiServer
from tests.support.fence import failed, node, ready_validator
from tests.support.live import FAST
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)
FENCE = "gpu-placement.io/launch-fence"
QUICK = FenceSettings(lease_name="fences-lock", lease_seconds=1, renew_seconds=0.05, settle_seconds=0.0,
                      writes_per_second=1000, burst=1000)
GPU = "nvidia.com/gpu"


class Replica:
    """One process's view of the fake API server, its placement, and the fence leader (stepped by hand)."""

    def __init__(self, fake: FakeApiServer, identity: str) -> None:
        self.config = Config()
        self.view = ClusterView(self.config)
        self.api = fake.api_client()
        self.source = LiveSource(self.view, Ingest(self.config), self.api, FAST)
        self.source.start()
        wait_for(lambda: self.source.ready, what="the first full lists")
        self.placement = Placement(self.view, self.config)
        self.fences = self.placement.fences
        self.leader = LaunchFenceWriter(self.api, self.fences, "gpu-placement", identity, QUICK)

    def refused(self) -> dict[str, str]:
        result = self.placement.filter(self.placement.requirements(make_pod("team", "next", gpus={GPU: 1})),
                                       ["n1", "n2"])
        return {**result.failed, **result.unresolvable}

    def stop(self) -> None:
        self.leader.stop()
        self.source.stop()
        self.api.close()


@pytest.fixture
def cluster() -> Iterator[tuple[FakeApiServer, Callable[[str], Replica], float]]:
    fake = FakeApiServer().start()
    now = time.time()
    for obj in (namespace("gpu-placement"), namespace("gpu-operator"), namespace("team"), node("n1"), node("n2"),
                validator_pod("n1"), validator_pod("n2"), failed("a", now - 30, where="n1")):
        fake.add(obj, keep_created=True)
    made: list[Replica] = []

    def replica(identity: str) -> Replica:
        made.append(Replica(fake, identity))
        return made[-1]

    yield fake, replica, now
    for one in made:
        one.stop()
    fake.stop()


def annotation(fake: FakeApiServer, name: str) -> dict[str, Any] | None:
    found = ((fake.get("Node", name) or {}).get("metadata", {}).get("annotations") or {}).get(FENCE)
    return orjson.loads(found) if found else None


def test_the_leader_writes_the_fence_and_a_restart_keeps_it_when_the_pods_are_gone(
        cluster: tuple[FakeApiServer, Callable[[str], Replica], float]) -> None:
    fake, replica, now = cluster
    first = replica("replica-a")
    first.leader.step()
    assert annotation(fake, "n1") is None and first.refused() == {}  # one failure: nothing to write
    fake.add(failed("b", now - 20, where="n1"), keep_created=True)
    wait_for(lambda: "n1" in first.refused(), what="the fence in the view")
    fenced = first.refused()["n1"]
    assert fenced.startswith("LaunchFailures: 2 nvidia.com/gpu pods in a row failed to start on the node")
    first.leader.step()
    assert metrics.LAUNCH_FENCE_LEADING.labels("fences-lock")._value.get() == 1
    assert annotation(fake, "n1") == {"bootID": "boot-1", "resources": {GPU: {
        "cause": "device_plugin", "count": 2, "since": format_time(now - 30), "last": format_time(now - 20)}}}
    assert annotation(fake, "n2") is None

    for name in ("a", "b"):  # the Job controller deletes its failed pods
        fake.delete("Pod", name, "team")
    wait_for(lambda: "team/a" not in first.view.pods and "team/b" not in first.view.pods, what="the pods gone")
    second = replica("replica-b")  # a restart, or a standby: it reads the Node
    assert first.refused() == second.refused() == {"n1": fenced}
    second.leader.step()  # the standby writes nothing: it does not hold the Lease
    first.leader.step()
    assert first.leader.writes == 1 and second.leader.writes == 0


def test_events_and_metrics_say_when_a_fence_began_and_what_lifted_it(
        cluster: tuple[FakeApiServer, Callable[[str], Replica], float]) -> None:
    fake, replica, now = cluster
    first = replica("replica-a")
    writer = EventWriter(first.api, "replica-a")
    writer.start()
    watch_fences(first.fences, writer)
    before = {event: metrics.LAUNCH_FENCE_CHANGES.labels(event)._value.get() for event in ("fenced", "lifted")}
    try:
        fake.add(failed("b", now - 20, where="n1"), keep_created=True)
        wait_for(lambda: "n1" in first.refused(), what="the fence in the view")
        gauges = {sample.labels.get("cause", sample.name): sample.value
                  for family in first.fences.families() for sample in family.samples}
        assert gauges["device_plugin"] == 1 and gauges["cuda_init"] == 0
        assert gauges["gpu_placement_launch_fenced_nodes"] == 1
        first.leader.step()

        fake.add(ready_validator("n1", time.time()), keep_created=True)  # the GPU Operator revalidated n1
        wait_for(lambda: first.refused() == {}, what="the fence lifted")
        first.leader.step()  # and records the lift: the failures before it never count again
        clear = annotation(fake, "n1")
        assert clear is not None and set(clear["resources"][GPU]) == {"clear"}
        writer.drain()
        notes = [(e["type"], e["reason"], e["note"]) for e in fake.list("Event")
                 if e["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}]
        assert notes[0][:2] == ("Warning", "GpuLaunchFenced")
        assert notes[0][2].startswith("gpu-placement keeps nvidia.com/gpu pods off node n1: 2 nvidia.com/gpu pods "
                                      "in a row failed to start on the node for the node's reasons (device_plugin")
        assert notes[1] == ("Normal", "GpuLaunchFenceLifted", "gpu-placement takes nvidia.com/gpu pods on node n1 "
                            "again: the GPU Operator revalidated the node (a validator pod turned Ready) after 2 "
                            "failed to start (device_plugin)")
        assert len(notes) == 2
        assert {event: metrics.LAUNCH_FENCE_CHANGES.labels(event)._value.get() - before[event]
                for event in before} == {"fenced": 1, "lifted": 1}
    finally:
        writer.stop()


def test_the_writer_judges_the_node_whose_pods_changed_only(
        cluster: tuple[FakeApiServer, Callable[[str], Replica], float]) -> None:
    """A pass after a failed pod on n1 judges n1, not every node (gpu_placement/controllers/node_writer.py)."""
    fake, replica, now = cluster
    first = replica("replica-a")
    first.leader.step()
    assert first.leader.judged == 2 and first.leader.writes == 0  # the first pass: every node
    fake.add(failed("b", now - 20, where="n1"), keep_created=True)
    wait_for(lambda: "n1" in first.refused(), what="the fence in the view")
    first.leader.step()
    assert first.leader.judged == 3 and first.leader.writes == 1 and annotation(fake, "n1") is not None
