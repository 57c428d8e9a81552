"""The node writers' passes cost what changed (gpu_placement/controllers/node_writer.py): a pass after one node's
change judges that node, a validator pod's change marks its node, and every node is judged again on a new leader,
after a relist and every `resync_seconds`. Counted by the writer (`judged`) and on /metrics
(gpu_placement_node_writer_judged_nodes_total), never timed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_placement.base.config import Config, parse_config
from gpu_placement.controllers.refused_nodes import RefusedNodes, RefusedSettings
from gpu_placement.observe import metrics
from gpu_placement.samples.cluster import make_node, namespace, validator_pod
from gpu_placement.view.changed import ChangedNodes
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import FakeApiServer
from tests.support.live import FAST
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)
REFUSED = "gpu-placement.io/refused"
LABELLING: Config = parse_config({"refusedNodeLabel": True})
NODES = [f"gpu-{i:02d}" for i in range(12)]
LEASE = "judged-lock"


def settings(resync_seconds: float = 300.0) -> RefusedSettings:
    return RefusedSettings(lease_name=LEASE, lease_seconds=1, renew_seconds=0.05, settle_seconds=0.0,
                           writes_per_second=1000, burst=1000, resync_seconds=resync_seconds)


class Replica:
    def __init__(self, fake: FakeApiServer, identity: str, resync_seconds: float = 300.0,
                 clock: list[float] | None = None) -> None:
        self.view = ClusterView(LABELLING)
        self.api = fake.api_client()
        self.source = LiveSource(self.view, Ingest(LABELLING), self.api, FAST)
        self.source.start()
        wait_for(lambda: self.source.ready, what="the first full lists")
        now = clock
        self.writer = RefusedNodes(self.api, self.view, LABELLING, "gpu-placement", identity,
                                   settings(resync_seconds), **({"clock": lambda: now[0]} if now is not None else {}))

    def labelled(self, fake: FakeApiServer) -> None:
        """Wait until the view holds every label the fake API server holds (the writes' own Node events)."""
        wanted = {node["metadata"]["name"]: (node["metadata"].get("labels") or {}).get(REFUSED)
                  for node in fake.list("Node")}
        wait_for(lambda: {name: facts.refused for name, facts in self.view.nodes.items()} == wanted,
                 what="the labels in the view")

    def judging(self) -> int:
        """A pass; the nodes it judged."""
        before = self.writer.judged
        self.writer.step()
        return self.writer.judged - before

    def stop(self) -> None:
        self.writer.stop()
        self.source.stop()
        self.api.close()


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    for obj in (namespace("gpu-placement"), namespace("gpu-operator")):
        server.add(obj)
    for i, name in enumerate(NODES):
        server.add(make_node(name, "h100x8"))
        server.add(validator_pod(name, ready=i != 3))  # gpu-03: NotValidated
    yield server
    server.stop()


def label(fake: FakeApiServer, name: str) -> str | None:
    found = fake.get("Node", name) or {}
    return (found.get("metadata", {}).get("labels") or {}).get(REFUSED)


def settled(replica: Replica, fake: FakeApiServer) -> None:
    """The first pass (every node), its writes seen, and a pass over what they changed: nothing left due."""
    assert replica.judging() == len(NODES)
    replica.labelled(fake)
    replica.writer.step()
    assert replica.judging() == 0 and replica.writer.failures.errors == {}


def test_a_change_on_one_node_makes_the_writer_judge_that_node(fake: FakeApiServer) -> None:
    leader = Replica(fake, "replica-a")
    try:
        settled(leader, fake)
        assert label(fake, "gpu-03") == "NotValidated"
        changed = metrics.NODE_WRITER_JUDGED.labels(LEASE, "changed")._value.get()
        full = metrics.NODE_WRITER_JUDGED.labels(LEASE, "full")._value.get()
        writes = leader.writer.writes
        fake.patch("Node", "gpu-07", {"spec": {"unschedulable": True}})  # cordoned
        wait_for(lambda: leader.view.nodes["gpu-07"].unschedulable, what="the cordon in the view")
        assert "gpu-07" in leader.writer.changed and len(leader.writer.changed) == 1
        assert leader.judging() == 1
        assert label(fake, "gpu-07") == "NodeNotReady" and leader.writer.writes == writes + 1
        assert metrics.NODE_WRITER_JUDGED.labels(LEASE, "changed")._value.get() == changed + 1
        assert metrics.NODE_WRITER_JUDGED.labels(LEASE, "full")._value.get() == full
    finally:
        leader.stop()


def test_a_validator_pod_change_marks_its_node(fake: FakeApiServer) -> None:
    leader = Replica(fake, "replica-a")
    try:
        settled(leader, fake)
        fake.update(validator_pod("gpu-03"))  # revalidated: Ready
        wait_for(lambda: leader.view.validator_state("gpu-03").ready, what="the validator Ready in the view")
        assert "gpu-03" in leader.writer.changed and len(leader.writer.changed) == 1
        assert leader.judging() == 1
        assert label(fake, "gpu-03") is None
        fake.delete("Pod", "nvidia-operator-validator-gpu-05", "gpu-operator")  # no validator: refused
        wait_for(lambda: leader.view.validator_state("gpu-05").pod is None, what="the validator gone")
        leader.labelled(fake)  # gpu-03's label gone in the view too
        assert leader.judging() == 2  # gpu-03 (its own write came back) and gpu-05
        assert label(fake, "gpu-05") == "NotValidated"
    finally:
        leader.stop()


def test_a_new_leader_a_relist_and_the_period_judge_every_node(fake: FakeApiServer) -> None:
    clock = [1000.0]  # replica-b's loop clock: it renews, and resyncs, when the test says
    first, second = Replica(fake, "replica-a"), Replica(fake, "replica-b", resync_seconds=60.0, clock=clock)
    try:
        settled(second, fake)  # replica-b leads first: its first pass judged every node
        second.writer.lease.release()  # and loses the Lease (as to a pause longer than it)
        first.writer.step()
        assert first.writer.leading
        clock[0] += 1.0
        assert second.judging() == 0 and not second.writer.leading  # a standby judges nothing
        second.writer._wake.clear()
        fake.patch("Node", "gpu-01", {"spec": {"unschedulable": True}})  # while replica-a leads
        wait_for(lambda: second.view.nodes["gpu-01"].unschedulable, what="the cordon in the standby's view")
        assert not second.writer._wake.is_set()  # nor does it wake for it (a wake of a standby asks for the Lease)
        clock[0] += 1.0
        assert second.judging() == 0  # still a standby: what it heard is the leader's to write
        first.writer.stop()  # hands the Lease over
        clock[0] += 1.0
        assert second.judging() == len(NODES)  # leading again: every node, whatever happened meanwhile
        assert second.writer.leading and label(fake, "gpu-01") == "NodeNotReady"
        second.labelled(fake)
        second.writer.step()
        assert second.judging() == 0

        with second.view.lock:  # a relist, as the live source applies one: nothing differs
            nodes = list(second.view.nodes.values())
        second.view.replace_nodes(nodes)
        assert second.judging() == len(NODES)
        assert second.judging() == 0

        clock[0] += 61.0  # resync_seconds later, nothing heard: every node again
        assert second.judging() == len(NODES)
        assert second.judging() == 0
    finally:
        first.stop()
        second.stop()


def test_changed_nodes_marks_names_and_everything() -> None:
    changed = ChangedNodes()
    assert changed.take() is None  # every node, first
    changed.mark("a")
    changed.mark("b")
    changed.mark("a")
    assert changed.take() == {"a", "b"} and changed.take() == set()
    changed.mark("c")
    changed.mark(None)  # the view's "every node changed"
    assert "z" in changed and changed.take() is None and changed.take() == set()
