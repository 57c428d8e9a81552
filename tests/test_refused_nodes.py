"""Nodes refused before kube-scheduler's sample (config `refusedNodeLabel`, docs/performance.md): one replica
labels the nodes every GPU pod is refused on (`gpu-placement.io/refused: <code>`), and the webhook keeps the GPU
pods it routes to gpu-placement off them with a required node affinity merged into each of the pod's own terms."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.base.config import Config, Pool, parse_config
from gpu_placement.controllers.refused_nodes import RefusedNodes, RefusedSettings
from gpu_placement.facts.sharing import EXCLUSIVE
from gpu_placement.observe import metrics
from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from gpu_placement.web.patching import apply_patch
from tests.fakeapi import FakeApiServer
from tests.support.live import FAST
from tests.support.waiting import wait_for
from webhook.patches import gpu_patch

pytestmark = pytest.mark.timeout(60)
REFUSED = "gpu-placement.io/refused"
LABELLING: Config = parse_config({"refusedNodeLabel": True})
QUICK = RefusedSettings(lease_name="refused-lock", lease_seconds=1, renew_seconds=0.05, settle_seconds=0.0,
                        writes_per_second=1000, burst=1000)
NOT_REFUSED = {"key": REFUSED, "operator": "DoesNotExist"}
GPU = "nvidia.com/gpu"


# -- the label, written by the leader ---------------------------------------------------------------------------

class Replica:
    def __init__(self, fake: FakeApiServer, identity: str) -> None:
        self.view = ClusterView(LABELLING)
        self.api = fake.api_client()
        self.source = LiveSource(self.view, Ingest(LABELLING), self.api, FAST)
        self.source.start()
        wait_for(lambda: self.source.ready, what="the first full lists")
        self.writer = RefusedNodes(self.api, self.view, LABELLING, "gpu-placement", identity, QUICK)

    def stop(self) -> None:
        self.writer.stop()
        self.source.stop()
        self.api.close()


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    upgrading = make_node("upgrading", "h100x8", labels={"nvidia.com/gpu-driver-upgrade-state": "pod-restart-required"})
    for obj in (namespace("gpu-placement"), namespace("gpu-operator"), make_node("ok", "h100x8"),
                make_node("unvalidated", "h100x8"), upgrading, make_node("cpu-only", None),
                validator_pod("ok"), validator_pod("unvalidated", ready=False), validator_pod("upgrading")):
        server.add(obj)
    yield server
    server.stop()


def labels(fake: FakeApiServer) -> dict[str, str | None]:
    return {node["metadata"]["name"]: (node["metadata"].get("labels") or {}).get(REFUSED)
            for node in fake.list("Node")}


def test_the_leader_labels_refused_gpu_nodes_and_unlabels_them_when_the_reason_goes(fake: FakeApiServer) -> None:
    leader, standby = Replica(fake, "replica-a"), Replica(fake, "replica-b")
    try:
        leader.writer.step()
        assert leader.writer.leading
        assert labels(fake) == {"ok": None, "unvalidated": "NotValidated", "upgrading": "DriverUpgrade",
                                "cpu-only": None}  # a node without GPUs never fits a GPU pod anyway
        standby.writer.step()
        assert not standby.writer.leading and standby.writer.writes == 0  # one writer
        wait_for(lambda: leader.view.nodes["unvalidated"].refused == "NotValidated", what="the label in the view")
        writes = leader.writer.writes
        leader.writer.step()
        assert leader.writer.writes == writes  # nothing due: no patch
        # the validator turns Ready: the label goes
        fake.update(validator_pod("unvalidated"))
        wait_for(lambda: leader.view.validator_state("unvalidated").ready, what="the validator Ready in the view")
        leader.writer.step()
        assert labels(fake)["unvalidated"] is None and labels(fake)["upgrading"] == "DriverUpgrade"
    finally:
        leader.stop()
        standby.stop()


def test_a_refused_patch_is_retried_and_counted(fake: FakeApiServer) -> None:
    leader = Replica(fake, "replica-a")
    try:
        leader.writer._lead()
        fake.fail_next(1, status=403, message='nodes "unvalidated" is forbidden: cannot patch resource "nodes"',
                       method="PATCH", path="/api/v1/nodes/unvalidated")
        before = metrics.REFUSED_WRITES.labels("refused")._value.get()
        leader.writer.step()
        assert metrics.REFUSED_WRITES.labels("refused")._value.get() == before + 1
        assert list(leader.writer.failures.errors) == ["unvalidated"] and labels(fake)["upgrading"] == "DriverUpgrade"
        leader.writer.step()
        assert labels(fake)["unvalidated"] == "NotValidated" and not leader.writer.failures.errors
    finally:
        leader.stop()


# -- the affinity, injected by the webhook ------------------------------------------------------------------

def shaped(pod: dict[str, Any], config: Config = LABELLING, pools: tuple[Pool, ...] = (),
           keep_scheduler: bool = False) -> dict[str, Any]:
    """The pod after the webhook's GPU patch; the patch of the shaped pod is empty (idempotent)."""
    ops = gpu_patch(pod, ((GPU, 1),), EXCLUSIVE, pools, None, config, keep_scheduler=keep_scheduler)
    after = apply_patch(copy.deepcopy(pod), ops)
    again = gpu_patch(after, ((GPU, 1),), EXCLUSIVE, pools, None, config, keep_scheduler=keep_scheduler)
    assert again == []
    return after


def terms(pod: dict[str, Any]) -> list[list[dict[str, Any]]]:
    required = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [term.get("matchExpressions", []) for term in required["nodeSelectorTerms"]]


def gpu_pod(affinity: dict[str, Any] | None = None) -> dict[str, Any]:
    pod = make_pod("team", "train", gpus={GPU: 1})
    pod["spec"].pop("nodeName", None)
    if affinity is not None:
        pod["spec"]["affinity"] = affinity
    return pod


def test_a_gpu_pod_gets_one_term_requiring_the_label_absent() -> None:
    pod = shaped(gpu_pod())
    assert terms(pod) == [[NOT_REFUSED]]
    assert pod["spec"]["schedulerName"] == "gpu-placement"


def test_every_term_of_the_pods_own_affinity_gets_it() -> None:
    """Terms are ORed, expressions ANDed: the exclusion goes into each term, none is added or lost."""
    zone_a = {"key": "zone", "operator": "In", "values": ["a"]}
    big = {"key": "size", "operator": "Gt", "values": ["4"]}
    own = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [zone_a]}, {"matchExpressions": [big], "matchFields": [
                {"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [big]}}]}}
    pod = shaped(gpu_pod(copy.deepcopy(own)))
    assert terms(pod) == [[zone_a, NOT_REFUSED], [big, NOT_REFUSED]]
    required = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"][1]["matchFields"] == own["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][1]["matchFields"]
    assert pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == \
        own["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]


def test_several_pools_each_term_gets_it() -> None:
    pools = (Pool("training", {"pool": "training"}, ()), Pool("inference", {"pool": "inference"}, ()))
    pod = shaped(gpu_pod(), pools=pools)
    assert terms(pod) == [[{"key": "pool", "operator": "In", "values": ["training"]}, NOT_REFUSED],
                          [{"key": "pool", "operator": "In", "values": ["inference"]}, NOT_REFUSED]]


def test_off_or_not_our_scheduler_no_affinity() -> None:
    """Without refusedNodeLabel; a DaemonSet's pod (kube-scheduler's default scheduler places it: gpu-placement
    never refused a node to it); a pod another scheduler places."""
    assert "affinity" not in shaped(gpu_pod(), Config())["spec"]
    assert "affinity" not in shaped(gpu_pod(), keep_scheduler=True)["spec"]
    other = gpu_pod()
    other["spec"]["schedulerName"] = "volcano"
    assert "affinity" not in shaped(other)["spec"]



# -- explain: what a labelled node is refused for ---------------------------------------------------------------

def test_explain_gives_gpu_placements_reason_for_a_node_kept_out_by_the_label() -> None:
    """kube-scheduler's message says "didn't match Pod's node affinity/selector" for a labelled node; explain
    keeps that (its prediction of the message) and gives the node's own reason beside it. A label that lags a
    node verified since says so; a node the pod's own selector keeps out is not blamed on the label."""
    from gpu_placement.app.assembly import core_from_objects
    from gpu_placement.app.explain import Context, explain
    from gpu_placement.decide.kubefilters import KubeNodes

    labelled = {REFUSED: "NotValidated"}
    objects = [make_node("good", "h100x8", labels={"pool": "a"}), validator_pod("good"),
               make_node("unverified", "h100x8", labels={"pool": "a", **labelled}), validator_pod("unverified", False),
               make_node("lagging", "h100x8", labels={"pool": "a", **labelled}), validator_pod("lagging"),
               make_node("elsewhere", "h100x8", labels={"pool": "b", **labelled}), validator_pod("elsewhere", False)]
    core = core_from_objects(LABELLING, objects)
    pod = gpu_pod()
    pod["spec"]["nodeSelector"] = {"pool": "a"}
    found = explain(core, pod, "team", context=Context(nodes=KubeNodes.from_objects(objects)))
    rows = {v.node: v for v in found.verdicts}
    assert rows["good"].passed
    affinity = "NodeAffinity: node(s) didn't match Pod's node affinity/selector"
    assert [rows[name].reason for name in ("unverified", "lagging", "elsewhere")] == [affinity] * 3
    assert rows["unverified"].detail.startswith(f"{REFUSED}=NotValidated, gpu-placement's reason: NotValidated: the "
                                                "nvidia-operator-validator pod on the node is not Ready"), rows
    assert rows["lagging"].detail == (f"{REFUSED}=NotValidated, gpu-placement's reason: none now (it passes the "
                                      "node); the label goes with its next patch")
    assert rows["elsewhere"].detail == "nodeSelector pool=a; the node has pool=b"
